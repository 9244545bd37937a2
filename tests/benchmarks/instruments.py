"""What the benchmarks measure with, beyond wall time: shared by the bench_*.py scripts.

* `Probe`: one snapshot of this process's counters (CPU, the fleetenv loop thread's CPU,
  event-loop iterations, cross-thread wake-ups of a loop, garbage collections, allocated
  blocks, HTTP requests and TCP connections); the difference of two is a phase's cost.
* `LoopCounters`: counts asyncio loop iterations and self-pipe writes per loop thread,
  by wrapping two methods of asyncio's own classes (a benchmark only; a Python
  call and a dict update per iteration, about 0.2 us, against milliseconds per tool call).
* `WireCounter`: counts HTTP requests and new TCP connections at the transports.
* `CpuHog`: N busy-loop processes, the "machine is busy" condition.
* `machine()`: cores, CPU model, Python, load average, for the figures.
* `package_of`: the package a profiled function's file belongs to.
* `run_on_fleetenv_loop`: the one place a benchmark reaches into fleetenv's internals.

Only the standard library and what the benchmarks already import (asyncio's internals,
httpcore's transports) are touched; fleetenv's code is not patched.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOP_THREAD_NAME = "fleetenv-loop"


# ----------------------------------------------------------------------------- fleetenv

def run_on_fleetenv_loop(async_fn: Callable[[], Awaitable[None]]) -> None:
    """Run ``async_fn()`` on fleetenv's loop thread and wait (to switch cProfile on or off
    there: cProfile profiles the thread that enables it)."""
    from fleetenv import runtime

    runtime.current().call(async_fn)


def loop_thread_ident() -> int | None:
    """The thread id of fleetenv's loop thread (found by its documented name), if running."""
    for thread in threading.enumerate():
        if thread.name == LOOP_THREAD_NAME:
            return thread.ident
    return None


def thread_cpu_s(ident: int | None) -> float:
    """CPU seconds of the thread ``ident`` so far (0 for ``None`` or a thread gone)."""
    if ident is None:
        return 0.0
    with contextlib.suppress(OSError, ValueError):
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    return 0.0


def loop_thread_cpu_s() -> float:
    """CPU seconds of fleetenv's loop thread so far (0 when it is not running)."""
    return thread_cpu_s(loop_thread_ident())


# ----------------------------------------------------------------------------- counters

class LoopCounters:
    """Per thread that runs an asyncio loop: its iterations (``BaseEventLoop._run_once``
    calls, one ``select`` each) and the self-pipe bytes written to wake its loop
    (``_write_to_self``, i.e. ``call_soon_threadsafe``), told apart by who wrote them:
    another thread (a cross-thread hand-off) or the loop's own thread (asyncio does that
    for every async generator dropped unfinished: its finalizer hook schedules the
    ``aclose()`` with ``call_soon_threadsafe``). Installed once per process."""

    installed: LoopCounters | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.iterations: dict[int, int] = {}  # thread id -> iterations (one writer each)
        self.cross: dict[int, int] = {}  # thread id of the loop -> writes from other threads
        self.own: dict[int, int] = {}  # thread id of the loop -> writes from itself
        self.thread_of_loop: dict[int, int] = {}  # id(loop) -> the thread running it

    @classmethod
    def install(cls) -> LoopCounters:
        if cls.installed is not None:
            return cls.installed
        import asyncio.base_events
        import asyncio.selector_events

        counters = cls.installed = cls()
        run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
        write_to_self = asyncio.selector_events.BaseSelectorEventLoop._write_to_self  # type: ignore[attr-defined]
        iterations, threads = counters.iterations, counters.thread_of_loop

        def counted_run_once(loop: Any) -> None:
            ident = threading.get_ident()
            iterations[ident] = iterations.get(ident, 0) + 1
            threads[id(loop)] = ident
            run_once(loop)

        def counted_write_to_self(loop: Any) -> None:
            owner = threads.get(id(loop))
            if owner is not None:
                counts = counters.own if owner == threading.get_ident() else counters.cross
                with counters._lock:  # any thread may write to any loop
                    counts[owner] = counts.get(owner, 0) + 1
            write_to_self(loop)

        asyncio.base_events.BaseEventLoop._run_once = counted_run_once  # type: ignore[attr-defined]
        asyncio.selector_events.BaseSelectorEventLoop._write_to_self = counted_write_to_self  # type: ignore[attr-defined]
        return counters

    def of_thread(self, ident: int | None) -> tuple[int, int, int]:
        """(iterations, wake-ups from other threads, wake-ups from itself) of the loop(s)
        thread ``ident`` runs."""
        if ident is None:
            return 0, 0, 0
        with self._lock:
            return (self.iterations.get(ident, 0), self.cross.get(ident, 0),
                    self.own.get(ident, 0))




class WireCounter:
    """Counts HTTP requests and new TCP connections at the transports both sides use.

    Patched once for the whole process (a benchmark only): httpcore2 (httpx2, which
    ``mcp`` and fleetenv's MCP use), httpcore (httpx, fleet-python's clients) and urllib3
    (``requests``, fleetenv's manager API). Phases run one after another, so a phase's
    counts are the difference of two snapshots.
    """

    installed: WireCounter | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.connections = 0

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.requests, self.connections

    def _bump(self, requests: int = 0, connections: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.connections += connections

    @classmethod
    def install(cls) -> WireCounter:
        if cls.installed is not None:
            return cls.installed
        import httpcore
        import httpcore2
        import urllib3.connection
        import urllib3.connectionpool
        from httpcore._backends.anyio import AnyIOBackend as AnyIO1
        from httpcore._backends.sync import SyncBackend
        from httpcore2._backends.anyio import AnyIOBackend as AnyIO2

        counter = cls.installed = cls()

        def wrap_async(owner: Any, name: str, kind: str) -> None:
            original = getattr(owner, name)

            async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
                counter._bump(**{kind: 1})
                return await original(self, *args, **kwargs)

            setattr(owner, name, counted)

        def wrap_sync(owner: Any, name: str, kind: str) -> None:
            original = getattr(owner, name)

            def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
                counter._bump(**{kind: 1})
                return original(self, *args, **kwargs)

            setattr(owner, name, counted)

        wrap_async(httpcore2.AsyncConnectionPool, "handle_async_request", "requests")
        wrap_async(httpcore.AsyncConnectionPool, "handle_async_request", "requests")
        wrap_sync(httpcore.ConnectionPool, "handle_request", "requests")
        wrap_sync(urllib3.connectionpool.HTTPConnectionPool, "urlopen", "requests")
        wrap_async(AnyIO2, "connect_tcp", "connections")
        wrap_async(AnyIO1, "connect_tcp", "connections")
        wrap_sync(SyncBackend, "connect_tcp", "connections")
        wrap_sync(urllib3.connection.HTTPConnection, "_new_conn", "connections")
        return counter


class GcTimer:
    """Time spent in the garbage collector, all generations, from ``gc.callbacks``."""

    seconds = 0.0
    _started = 0.0

    @classmethod
    def install(cls) -> None:
        if cls._callback not in gc.callbacks:
            gc.callbacks.append(cls._callback)

    @classmethod
    def _callback(cls, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            cls._started = time.perf_counter()
        else:
            cls.seconds += time.perf_counter() - cls._started


@dataclass(frozen=True)
class Probe:
    """This process's counters at one moment; ``b - a`` is what happened in between.

    ``loop_*`` are fleetenv's loop thread's; ``main_*`` the main thread's (where the raw
    asyncio programs run their loop). ``gc0`` counts generation-0 collections: CPython
    3.11 collects when GC-tracked allocations minus deallocations pass 700, so
    ``700 * gc0`` is a lower bound on the container objects allocated (short-lived ones
    that die before the next collection cancel out). ``blocks`` is
    ``sys.getallocatedblocks()``: the NET change (what a phase kept), not the churn.
    ``gc_s`` is the time spent collecting garbage (`GcTimer`, installed by the first
    probe). ``children_cpu`` is the CPU of this process's descendants but the `CpuHog` ones: the
    local Fleet's server, when it runs in a child process.
    """

    wall: float
    cpu: float
    loop_cpu: float
    loop_iterations: int
    loop_cross_wakeups: int
    loop_own_wakeups: int
    main_iterations: int
    main_cross_wakeups: int
    main_own_wakeups: int
    gc0: int
    gc_s: float
    blocks: int
    requests: int
    connections: int
    children_cpu: float

    @classmethod
    def take(cls) -> Probe:
        GcTimer.install()
        loop_ident = loop_thread_ident()
        counters = LoopCounters.installed
        loop_counts = counters.of_thread(loop_ident) if counters else (0, 0, 0)
        main_counts = (counters.of_thread(threading.main_thread().ident) if counters
                       else (0, 0, 0))
        wire = WireCounter.installed.snapshot() if WireCounter.installed else (0, 0)
        return cls(wall=time.perf_counter(), cpu=time.process_time(),
                   loop_cpu=thread_cpu_s(loop_ident),
                   loop_iterations=loop_counts[0], loop_cross_wakeups=loop_counts[1],
                   loop_own_wakeups=loop_counts[2], main_iterations=main_counts[0],
                   main_cross_wakeups=main_counts[1], main_own_wakeups=main_counts[2],
                   gc0=gc.get_stats()[0]["collections"], gc_s=GcTimer.seconds,
                   blocks=sys.getallocatedblocks(),
                   requests=wire[0], connections=wire[1], children_cpu=children_cpu_s())

    def __sub__(self, other: Probe) -> Probe:
        return Probe(**{name: getattr(self, name) - getattr(other, name)
                        for name in self.__dataclass_fields__})


def per_call(delta: Probe, calls: int, *, on_loop_thread: bool) -> dict[str, float]:
    """A phase's costs per tool call. ``on_loop_thread``: the phase's loop is fleetenv's
    loop thread (else the main thread's, the raw programs')."""
    where = "loop" if on_loop_thread else "main"
    row = {
        "cpu_ms_per_call": delta.cpu / calls * 1e3,
        "loop_iterations_per_call": getattr(delta, f"{where}_iterations") / calls,
        "cross_thread_wakeups_per_call": getattr(delta, f"{where}_cross_wakeups") / calls,
        "own_thread_wakeups_per_call": getattr(delta, f"{where}_own_wakeups") / calls,
        "gc0_per_1000_calls": delta.gc0 / calls * 1e3,
        "gc_ms_per_call": delta.gc_s / calls * 1e3,
        "net_blocks_per_call": delta.blocks / calls,
        "requests_per_call": delta.requests / calls,
        "connections_per_call": delta.connections / calls,
        "server_cpu_ms_per_call": delta.children_cpu / calls * 1e3,
    }
    if on_loop_thread:
        row["loop_cpu_ms_per_call"] = delta.loop_cpu / calls * 1e3
        row["other_threads_cpu_ms_per_call"] = (delta.cpu - delta.loop_cpu) / calls * 1e3
    return row


# ----------------------------------------------------------------------------- load

_HOG = "while True:\n    pass\n"
#: Pids of the running hogs (not counted as the server's CPU).
_hog_pids: set[int] = set()


@dataclass
class CpuHog:
    """``processes`` busy-loop processes (at normal priority) while the block runs; one
    per core is "a CPU hog running alongside". Reports the load during the block: the
    share of all cores busy (``/proc/stat``, whoever used them: this benchmark, the
    local Fleet, the hogs, other users), the load averages, and the share of a core each
    hog got."""

    processes: int
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _started: float = 0.0
    _cpu_times: tuple[int, int] = (0, 0)
    report: dict[str, Any] = field(default_factory=dict)

    def __enter__(self) -> CpuHog:
        self.report = {"processes": self.processes, "loadavg_before": _loadavg()}
        self._started = time.perf_counter()
        self._cpu_times = _machine_cpu_times()
        for _ in range(self.processes):
            self._procs.append(subprocess.Popen([sys.executable, "-c", _HOG]))
            _hog_pids.add(self._procs[-1].pid)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._started
        cpu = sum(_process_cpu_s(proc.pid) for proc in self._procs)
        (busy, total), (busy0, total0) = _machine_cpu_times(), self._cpu_times
        busy, total = busy - busy0, total - total0
        if total > 0:
            self.report["machine_busy"] = round(busy / total, 2)
        self.report["loadavg_after"] = _loadavg()  # the 1-minute figure lags a little
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        _hog_pids.difference_update(proc.pid for proc in self._procs)
        self._procs.clear()
        self.report["seconds"] = round(wall, 1)
        if self.processes:
            # the share of a core each hog got: 1.0 = it never waited
            self.report["hog_core_share"] = round(cpu / (wall * self.processes), 2)


def _process_cpu_s(pid: int) -> float:
    """utime + stime of a process still running (Linux /proc; 0 elsewhere)."""
    stat = _proc_stat(pid)
    return (stat[1] + stat[2]) / os.sysconf("SC_CLK_TCK") if stat else 0.0


def _proc_stat(pid: int | str) -> tuple[int, int, int] | None:
    """(ppid, utime, stime) of a process from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[11]), int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def children_cpu_s() -> float:
    """CPU seconds so far of this process's descendants, the hogs and theirs excepted
    (Linux /proc; 0 elsewhere). Descendants that exited are not counted."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return 0.0
    stats = {int(pid): stat for pid in pids if (stat := _proc_stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _utime, _stime) in stats.items():
        children.setdefault(ppid, []).append(pid)
    ticks = 0
    todo = [pid for pid in children.get(os.getpid(), []) if pid not in _hog_pids]
    while todo:
        pid = todo.pop()
        ticks += stats[pid][1] + stats[pid][2]
        todo.extend(children.get(pid, []))
    return ticks / os.sysconf("SC_CLK_TCK")


def _machine_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot (Linux /proc/stat; zeros elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def _loadavg() -> list[float]:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cores": os.cpu_count(), "cpu": model,
            "python": platform.python_version(), "loadavg": _loadavg()}


_PACKAGES = ("fleetenv", "mcp_types", "mcp", "httpx2", "httpcore2", "httpx", "httpcore",
             "h11", "anyio", "pydantic", "pydantic_core", "fleet", "asyncio", "json", "ssl",
             "socket", "selectors", "threading", "concurrent")


def package_of(filename: str) -> str:
    """The package a profiled function's file belongs to, for "where the time goes"."""
    if filename.startswith(("~", "<")):
        return "builtins (C)"
    parts = filename.replace("\\", "/").split("/")
    for marker in ("site-packages", "fleetenv"):
        if marker in parts:
            index = parts.index(marker)
            name = parts[index + 1] if marker == "site-packages" else "fleetenv"
            return name.split(".")[0]
    for package in _PACKAGES:
        if package in parts or f"{package}.py" in parts:
            return package
    return "stdlib/other"


def profile_report(profiles: list[Any], calls: int, title: str, top: int = 20,
                   save_as: Path | None = None) -> dict[str, Any]:
    """Print where the CPU went (cProfile with a thread-CPU timer): by package (own time)
    and the top functions by own and by cumulative time; returns ms per tool call by
    package and the Python function calls per tool call."""
    import pstats

    stats = pstats.Stats(profiles[0])
    for more in profiles[1:]:
        stats.add(more)
    if save_as is not None:
        stats.dump_stats(save_as)
    by_package: dict[str, float] = {}
    rows = []
    for (filename, line, name), (_cc, _nc, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        package = package_of(filename)
        by_package[package] = by_package.get(package, 0.0) + tottime
        rows.append((tottime, cumtime, f"{Path(filename).name}:{line}({name})", package))
    total = sum(by_package.values()) or 1e-9
    function_calls = stats.total_calls / calls  # type: ignore[attr-defined]
    print(f"\n{title}: {total / calls * 1e3:.2f} ms CPU per tool call (profiled), "
          f"{function_calls:.0f} Python function calls per tool call; by package (own time):")
    shares = {}
    for package, seconds in sorted(by_package.items(), key=lambda item: -item[1]):
        shares[package] = round(seconds / calls * 1e3, 3)
        if seconds / total >= 0.01:
            print(f"  {seconds / calls * 1e3:6.3f} ms  {seconds / total:5.1%}  {package}")
    print("  top functions by own time (ms per tool call):")
    for tottime, _cum, where, package in sorted(rows, reverse=True)[:top]:
        print(f"  {tottime / calls * 1e3:6.3f} ms  {package:12s} {where}")
    print("  top functions by cumulative time (ms per tool call):")
    for _tot, cumtime, where, package in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"  {cumtime / calls * 1e3:6.3f} ms  {package:12s} {where}")
    return {"ms_per_call_by_package": shares,
            "python_function_calls_per_call": round(function_calls, 1)}
