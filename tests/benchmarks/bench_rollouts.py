"""Parallel rollouts, the tool-call phase: fleetenv's Runner vs raw ``mcp`` programs.

The workload, identical for every side: N concurrent episodes (default 64), each making
M sequential calls (default 20) of a cheap read tool of the helpdesk app
(``ticket_stats(group_by="status")``, ~0.3 kB of output), against the local Fleet's MCP
servers running in a SEPARATE PROCESS (``LocalFleet(in_process=False)``), so the server's
CPU does not compete with the client's for this process's GIL.

  (a) fleetenv: ``Runner(workers=N, mode=...)`` for each ``--mode``. Thread mode: a
      synchronous policy returning one ``ToolCall`` per turn, so every call goes
      ``run_episode`` -> ``FleetEnv.step`` -> the loop thread -> MCP, and its result is
      rendered into chat messages, as in a real rollout. Asyncio mode: the same policy
      with ``async def act``, so whole episodes are coroutines on fleetenv's loop.
  (b) plain raw: a pure asyncio program using ``mcp`` directly: one
      ``streamable_http_client`` + ``ClientSession`` per episode, ``asyncio.gather`` over
      the episodes, ``mcp``'s default HTTP client (a new TCP connection per request, an
      SSL context per session).
  (c) expert raw: the same program with the fixes a careful expert would make
      (``raw_expert.py``: keep-alive as fleetenv does it, one SSL context).
  The raw programs' instances are provisioned through the control plane with
  fleet-python.

What is timed: the TOOL-CALL PHASE only. Provisioning, session setup, grading and
deletion are excluded: (a) holds every episode at a barrier on its first turn (after
reset: instance up, MCP session open, tools listed) and times from the barrier's release
to the return of the last episode's M-th call, and holds every episode at a second
barrier after its M-th call, so no session is ended, graded or deleted inside the window;
(b) and (c) open every session first (new ones each round, as each fleetenv episode
opens its own) and time the ``gather``. Throughput = N * M / that
time. The order of the variants rotates from round to round so machine noise hits all
alike; figures are medians over rounds. Ratio = fleetenv calls/s / raw calls/s in the
same round (above 1: fleetenv is faster), the median over rounds.

Per variant, over the same window (``instruments.Probe``): client CPU per call (this
process; fleetenv's loop thread and its other threads apart), event-loop iterations per
call on the loop that does the I/O, wake-ups of that loop per call by another thread (the
self-pipe byte of ``call_soon_threadsafe``) and by itself (asyncio's finalizer of an
async generator dropped unfinished writes that byte too), generation-0 garbage
collections per 1,000 calls, net allocated blocks per call, HTTP requests and new TCP
connections per call, and the local Fleet server's CPU per call (its process).

``--gc-threshold N`` sets ``gc.set_threshold(N)`` for the whole run (every variant alike):
what the collector's default (700) costs each side. ``--hog N`` runs N busy-loop
processes (one per core is "the machine is busy") during the measured rounds (not the
warm-up) and reports the load they made. ``--episodes`` takes a comma-separated list
(e.g. ``64,256``). During (a) a sampler records the peak
thread count and the threads named ``fleetenv-loop`` (must be exactly one).

    python tests/benchmarks/bench_rollouts.py [--episodes 64[,256]] [--calls 20]
        [--rounds 3] [--mode threads|asyncio|both] [--hog N] [--gc-threshold N]
        [--profile [--profile-dir D]]

``--profile`` then runs one more (a) round per mode at the first size with the loop
thread under cProfile (thread CPU time) and a stack sampler, the episode threads under
cProfile too (thread mode), and one round of each raw program under cProfile, and prints
where the time goes. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for instruments, raw_expert

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

from instruments import (
    LOOP_THREAD_NAME,
    CpuHog,
    LoopCounters,
    Probe,
    WireCounter,
    machine,
    per_call,
    profile_report,
    run_on_fleetenv_loop,
)
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from raw_expert import expert_http_client

from fleetenv import (
    Done,
    EventBus,
    FleetConfig,
    LocalFleet,
    PolicyContext,
    Reply,
    Runner,
    Task,
    ToolCall,
    resolve_config,
)

TOOL = "ticket_stats"
ARGUMENTS = {"group_by": "status"}
BARRIER_TIMEOUT_S = 300.0
PHASE_TIMEOUT_S = 600.0
MODES = ("threads", "asyncio")
RAW = ("raw", "raw-expert")

TASK = Task(key="bench-ticket-stats", env_key="helpdesk", data_key="helpdesk-seed",
            data_version="v1", prompt="Count the tickets by status, many times.")


# ----------------------------------------------------------------------------- (a) fleetenv

class _Timed:
    """The timed window of a fleetenv round: from the start barrier's release (every
    episode ready: instance provisioned, MCP open) to the last episode's last call
    returning. Provisioning, which the runner staggers on purpose, is not in the number;
    nor is teardown: every episode waits at an end barrier after its last call, so no
    episode ends its session, is graded or deleted inside the window (the raw programs
    tear down after their ``gather`` too)."""

    def __init__(self, episodes: int, calls: int) -> None:
        self.episodes = episodes
        self.calls = calls
        self.started: Probe | None = None
        self.ended: Probe | None = None
        self.profilers: list[Any] = []  # per episode thread, with profile_threads
        self.profile_threads = False
        #: Called as the window opens and closes (in the barrier's last thread: an
        #: episode thread in thread mode, the loop thread in asyncio mode).
        self.on_start: Callable[[], None] | None = None
        self.on_end: Callable[[], None] | None = None

    def _release(self) -> None:
        if self.on_start is not None:
            self.on_start()
        self.started = Probe.take()

    def _end(self) -> None:
        self.ended = Probe.take()
        if self.on_end is not None:
            self.on_end()

    @property
    def delta(self) -> Probe:
        assert self.started is not None and self.ended is not None, "round did not finish"
        return self.ended - self.started


class BarrierPolicy(_Timed):
    """Thread mode: one ``ToolCall`` per turn for ``calls`` turns, then ``Done``; turn 0
    waits at a barrier shared by all episodes."""

    def __init__(self, episodes: int, calls: int) -> None:
        super().__init__(episodes, calls)
        self.start = threading.Barrier(episodes, action=self._release,
                                       timeout=BARRIER_TIMEOUT_S)
        self.end = threading.Barrier(episodes, action=self._end, timeout=PHASE_TIMEOUT_S)
        self._lock = threading.Lock()

    def act(self, context: PolicyContext) -> Reply:
        if context.turn == 0:
            self.start.wait()
            if self.profile_threads:
                self._start_thread_profile()
        if context.turn < self.calls:
            return Reply.from_actions([ToolCall(TOOL, dict(ARGUMENTS))])
        if self.profile_threads:
            _stop_thread_profile()
        self.end.wait()
        return Reply.from_actions([Done()])

    def _start_thread_profile(self) -> None:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        _thread_profiler.profiler = profiler
        with self._lock:
            self.profilers.append(profiler)
        profiler.enable()


_thread_profiler = threading.local()


def _stop_thread_profile() -> None:
    profiler = getattr(_thread_profiler, "profiler", None)
    if profiler is not None:
        profiler.disable()
        _thread_profiler.profiler = None


class AsyncBarrierPolicy(_Timed):
    """Asyncio mode: the same policy as `BarrierPolicy`, as ``async def act``, so it runs
    on fleetenv's loop with the episodes (one loop: no lock needed)."""

    def __init__(self, episodes: int, calls: int) -> None:
        super().__init__(episodes, calls)
        self.arrived = {"start": 0, "end": 0}
        self.released: dict[str, asyncio.Event] = {}

    async def _barrier(self, name: str, action: Callable[[], None], timeout: float) -> None:
        released = self.released.setdefault(name, asyncio.Event())  # made on the loop
        self.arrived[name] += 1
        if self.arrived[name] == self.episodes:
            action()
            released.set()
        else:
            await asyncio.wait_for(released.wait(), timeout)

    async def act(self, context: PolicyContext) -> Reply:
        if context.turn == 0:
            await self._barrier("start", self._release, BARRIER_TIMEOUT_S)
        if context.turn < self.calls:
            return Reply.from_actions([ToolCall(TOOL, dict(ARGUMENTS))])
        await self._barrier("end", self._end, PHASE_TIMEOUT_S)
        return Reply.from_actions([Done()])


class ThreadSampler:
    """Samples the thread count and the loop threads every few milliseconds."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.peak_threads = 0
        self.loop_threads: set[int] = set()
        self.max_loop_threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            threads = threading.enumerate()
            self.peak_threads = max(self.peak_threads, len(threads) - 1)  # not the sampler
            loops = [t.ident for t in threads if t.name == LOOP_THREAD_NAME]
            self.loop_threads.update(i for i in loops if i is not None)
            self.max_loop_threads = max(self.max_loop_threads, len(loops))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ThreadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def make_runner(config: FleetConfig, mode: str, episodes: int) -> Runner:
    return Runner(workers=episodes, mode=mode, config=config, events=EventBus(sinks=[]),
                  progress=False)


def fleetenv_round(runner: Runner, mode: str, episodes: int, calls: int,
                   *, thread_profilers: list[Any] | None = None,
                   on_start: Callable[[], None] | None = None,
                   on_end: Callable[[], None] | None = None,
                   failures: list[str] | None = None) -> Probe:
    """One round of (a): the counters' change over the tool-call phase. With
    ``thread_profilers`` (thread mode), each episode thread's cProfile (over the window)
    is added to it; ``on_start`` / ``on_end`` run as the window opens and closes. Failed
    tool calls are added to ``failures`` (the round still counts: every episode made its
    calls); without it, and for any episode that did not make them all, the run stops."""
    policy: _Timed = (BarrierPolicy(episodes, calls) if mode == "threads"
                      else AsyncBarrierPolicy(episodes, calls))
    policy.profile_threads = thread_profilers is not None
    policy.on_start, policy.on_end = on_start, on_end
    results = list(runner.run([TASK], policy, samples_per_task=episodes))
    failed = [r for r in results if r.error or r.tool_calls != calls]
    if failed or len(results) != episodes:
        example = failed[0] if failed else None
        raise SystemExit(f"fleetenv/{mode} round failed: {len(failed)} bad of "
                         f"{len(results)}; e.g. error={example and example.error} "
                         f"tool_calls={example and example.tool_calls} "
                         f"tool_errors={example and example.tool_error_messages[:1]}")
    erred = [r for r in results if r.tool_errors]
    if erred:
        message = (f"fleetenv/{mode}: {len(erred)} of {episodes} episodes had a failed tool "
                   f"call, e.g. {erred[0].tool_error_messages[0]}")
        if failures is None:
            raise SystemExit(message)
        failures.append(message)
        print(message, flush=True)
    if thread_profilers is not None:
        thread_profilers.extend(policy.profilers)
    return policy.delta


# ----------------------------------------------------------------------------- (b), (c) raw

class RoundFailed(Exception):
    """A raw program's round broke: one of its sessions died (``mcp`` ends a whole session
    when one of its HTTP requests raises); the message names what killed it."""


def _leaf(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio's task groups wrap what they raise)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class RawSessions:
    """N raw mcp sessions on a plain asyncio loop driven from the main thread; with
    ``expert``, each through `raw_expert.expert_http_client` (keep-alive, one SSL
    context), else through ``mcp``'s default client.

    Each session is entered and exited by its own owner task (anyio cancel scopes must
    be left by the task that entered them); rounds only await calls on them.
    """

    def __init__(self, urls: list[str], *, expert: bool) -> None:
        self.loop = asyncio.new_event_loop()
        self.urls = urls
        self.expert = expert
        self.sessions: list[ClientSession] = []
        self._stop: asyncio.Event | None = None
        self._owners: list[asyncio.Task[None]] = []

    async def _own(self, url: str, ready: asyncio.Future[ClientSession]) -> None:
        assert self._stop is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                http = (await stack.enter_async_context(expert_http_client())
                        if self.expert else None)
                read, write = await stack.enter_async_context(
                    streamable_http_client(url, http_client=http))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                await session.list_tools()
                ready.set_result(session)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    async def _open(self) -> None:
        self._stop = asyncio.Event()
        readies = []
        for url in self.urls:
            ready: asyncio.Future[ClientSession] = self.loop.create_future()
            self._owners.append(self.loop.create_task(self._own(url, ready)))
            readies.append(ready)
        self.sessions = list(await asyncio.wait_for(asyncio.gather(*readies), 300))

    def open(self) -> RawSessions:
        self.loop.run_until_complete(self._open())
        return self

    async def episode(self, session: ClientSession, calls: int) -> None:
        for _ in range(calls):
            result = await session.call_tool(TOOL, dict(ARGUMENTS))
            if result.is_error:
                raise RuntimeError(f"tool error: {result.content}")

    async def timed(self, calls: int) -> Probe:
        started = Probe.take()
        episodes = [asyncio.ensure_future(self.episode(s, calls)) for s in self.sessions]
        try:
            await asyncio.wait_for(asyncio.gather(*episodes), PHASE_TIMEOUT_S)
        except Exception as exc:
            for episode in episodes:
                episode.cancel()
            await asyncio.gather(*episodes, return_exceptions=True)
            await asyncio.sleep(0)  # let the owners of dead sessions finish
            dead = [_leaf(owner.exception()) for owner in self._owners
                    if owner.done() and not owner.cancelled() and owner.exception()]
            raise RoundFailed(f"{_leaf(exc)!r}; {len(dead)} of {len(self.sessions)} sessions "
                              f"died, e.g. of {dead[0]!r}" if dead else repr(exc)) from exc
        return Probe.take() - started

    def round(self, calls: int) -> Probe:
        """One timed round on sessions opened for it and closed after it (both untimed),
        as every fleetenv episode opens its own and ends it: a session's first call pays
        ``mcp``'s compiling of the tool's output schema, on both sides, and no variant's
        garbage collections walk the open sessions of another."""
        self.reopen()
        try:
            return self.loop.run_until_complete(self.timed(calls))
        finally:
            self._close_sessions()

    def reopen(self) -> None:
        """Close every session (the dead ones included) and open them all again."""
        self._close_sessions()
        self.open()

    def _close_sessions(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._owners:
            self.loop.run_until_complete(asyncio.wait_for(
                asyncio.gather(*self._owners, return_exceptions=True), 120))
        self._owners, self.sessions = [], []

    def close(self) -> None:
        self._close_sessions()
        self.loop.close()


@contextlib.contextmanager
def raw_instances(fleet: LocalFleet, count: int) -> Iterator[list[str]]:
    """``count`` helpdesk instances made with fleet-python; yields their MCP URLs."""
    client = fleet.client(timeout=60.0)
    envs: list[Any] = []
    try:
        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(client.make, "helpdesk", data_key="helpdesk-seed:v1")
                       for _ in range(count)]
            for future in futures:
                envs.append(future.result(timeout=300))
        yield [f"{env.urls.root}mcp" for env in envs]
    finally:
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()
        with contextlib.suppress(Exception):
            client._httpx_client.close()


# ----------------------------------------------------------------------------- one size

def run_size(fleet: LocalFleet, episodes: int, calls: int, modes: list[str],
             options: argparse.Namespace) -> dict[str, Any]:
    """Every variant at one size, ``options.rounds`` rotating rounds; the size's report."""
    config = resolve_config(api_key=fleet.token, base_url=fleet.base_url,
                            max_live_instances=max(64, episodes),
                            max_creating_instances=16)
    calls_total = episodes * calls
    probes: dict[str, list[Probe]] = collections.defaultdict(list)
    with contextlib.ExitStack() as stack:
        urls = stack.enter_context(raw_instances(fleet, episodes))
        raws = {name: RawSessions(urls, expert=name == "raw-expert") for name in RAW}
        for raw in raws.values():
            stack.callback(raw.close)
        runners = {mode: stack.enter_context(make_runner(config, mode, episodes))
                   for mode in modes}
        threads = stack.enter_context(ThreadSampler())
        failures: list[str] = []
        variants: list[tuple[str, Callable[[int, int], Probe]]] = [
            (f"fleetenv/{mode}", lambda n, m, mode=mode: fleetenv_round(
                runners[mode], mode, n, m, failures=failures))
            for mode in modes]
        variants += [(name, lambda _n, m, raw=raw: raw.round(m)) for name, raw in raws.items()]
        for _name, run in variants:  # warm up every path
            run(min(episodes, 8), 2)
        def attempt(name: str, run: Callable[[int, int], Probe]) -> Probe:
            """One round of a variant; a raw program's broken round is run once more (on
            fresh sessions, as every round), and the failure reported."""
            try:
                return run(episodes, calls)
            except RoundFailed as exc:
                failures.append(f"{name}: a round failed and was run again on fresh "
                                f"sessions: {exc}")
                print(f"{name}: the round failed ({exc}); it is run once more", flush=True)
                return run(episodes, calls)

        with CpuHog(options.hog) as hog:
            for index in range(options.rounds):
                rotation = index % len(variants)
                for name, run in variants[rotation:] + variants[:rotation]:
                    probes[name].append(attempt(name, run))
                print(f"{episodes} x {calls}, round {index + 1}: " + ", ".join(
                    f"{name} {calls_total / probes[name][-1].wall:.0f} calls/s"
                    for name, _ in variants), flush=True)
    rows = {name: summary(rounds, episodes, calls, on_loop_thread=name.startswith("fleetenv"))
            for name, rounds in probes.items()}
    for mode in modes:  # the median of each round's ratio: a slow drift hits a round's pair alike
        fleet_rounds = probes[f"fleetenv/{mode}"]
        for raw in RAW:
            rows[f"fleetenv/{mode}"][f"ratio_vs_{raw.replace('-', '_')}"] = statistics.median(
                b.wall / a.wall for a, b in zip(fleet_rounds, probes[raw], strict=True))
    report = {"rows": {name: rounded(row) for name, row in rows.items()}, "load": hog.report,
              "failures": failures,
              "peak_threads": threads.peak_threads,
              "loop_threads": len(threads.loop_threads),
              "max_loop_threads_at_once": threads.max_loop_threads}
    print_size(episodes, calls, options, report)
    return report


def summary(rounds: list[Probe], episodes: int, calls: int, *,
            on_loop_thread: bool) -> dict[str, float]:
    """Medians over rounds: calls/s and every per-call figure."""
    per_round = [per_call(delta, episodes * calls, on_loop_thread=on_loop_thread)
                 for delta in rounds]
    row = {key: statistics.median(r[key] for r in per_round) for key in per_round[0]}
    row["calls_per_s"] = episodes * calls / statistics.median(d.wall for d in rounds)
    return row


def rounded(row: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 3) for key, value in row.items()}


def print_size(episodes: int, calls: int, options: argparse.Namespace,
               report: dict[str, Any]) -> None:
    rows = report["rows"]
    print(f"\n{episodes} concurrent episodes x {calls} calls of {TOOL}; tool-call phase only; "
          f"median of {options.rounds} rotating round(s); load: {report['load']}")
    print(f"  {'variant':18s} {'calls/s':>8s} {'vs raw':>7s} {'vs expert':>9s} "
          f"{'CPU ms/call':>11s} {'(loop)':>7s} {'(other)':>7s} {'iter/call':>9s} "
          f"{'wake/call':>9s} {'(self)':>6s} {'gc0/1k':>7s} {'gc ms':>6s} {'conn/call':>9s} "
          f"{'server ms':>9s}")
    for name, row in rows.items():
        vs_raw = f"{row['ratio_vs_raw']:.3f}" if "ratio_vs_raw" in row else ""
        vs_expert = f"{row['ratio_vs_raw_expert']:.3f}" if "ratio_vs_raw_expert" in row else ""
        loop = f"{row['loop_cpu_ms_per_call']:.2f}" if "loop_cpu_ms_per_call" in row else ""
        other = (f"{row['other_threads_cpu_ms_per_call']:.2f}"
                 if "other_threads_cpu_ms_per_call" in row else "")
        print(f"  {name:18s} {row['calls_per_s']:8.0f} {vs_raw:>7s} {vs_expert:>9s} "
              f"{row['cpu_ms_per_call']:11.2f} {loop:>7s} {other:>7s} "
              f"{row['loop_iterations_per_call']:9.2f} "
              f"{row['cross_thread_wakeups_per_call']:9.2f} "
              f"{row['own_thread_wakeups_per_call']:6.2f} {row['gc0_per_1000_calls']:7.1f} "
              f"{row['gc_ms_per_call']:6.3f} "
              f"{row['connections_per_call']:9.3f} {row['server_cpu_ms_per_call']:9.2f}")
    print(f"  peak threads during the rounds: {report['peak_threads']}; "
          f"'{LOOP_THREAD_NAME}' threads seen: {report['loop_threads']} "
          f"(at most {report['max_loop_threads_at_once']} at once)", flush=True)
    for failure in report["failures"]:
        print(f"  failure: {failure}", flush=True)


# ----------------------------------------------------------------------------- profiling

class LoopSampler:
    """Samples the loop thread's stack (``sys._current_frames``) to see where it spends
    its time: py-spy is not available, and cProfile cannot attach to a running thread."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.active = False  # sample only while set
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-profiler", daemon=True)

    def _run(self) -> None:
        loop_ids = [t.ident for t in threading.enumerate() if t.name == LOOP_THREAD_NAME]
        while not self._stop.wait(self.interval_s):
            if not self.active:
                continue
            frames = sys._current_frames()
            for ident in loop_ids:
                frame = frames.get(ident)
                if frame is None:
                    continue
                self.samples += 1
                stack = traceback.extract_stack(frame)
                seen: set[str] = set()
                for entry in stack:
                    key = f"{_short_path(entry.filename)}:{entry.name}"
                    if key not in seen:  # inclusive counts, once per sample
                        self.counts[key] += 1
                        seen.add(key)

    def __enter__(self) -> LoopSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def report(self, top: int = 25) -> str:
        lines = [f"loop thread: {self.samples} stack samples (inclusive share of samples, "
                 "idle in select included)"]
        for key, count in self.counts.most_common(top):
            lines.append(f"  {count / max(self.samples, 1):6.1%}  {key}")
        return "\n".join(lines)


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", "fleetenv/", "lib/python3"):
        if marker in filename:
            return filename[filename.index(marker):]
    return filename


def profile_mode(config: FleetConfig, mode: str, episodes: int, calls: int,
                 directory: Path | None) -> dict[str, Any]:
    """One more (a) round with the loop thread under cProfile (enabled from inside the
    loop thread: cProfile profiles the thread that enables it), its stack sampled, and in
    thread mode each episode thread under its own cProfile; all over the timed window
    only (not the sessions' setup and teardown). Profiling slows the round; only shares
    and counts matter."""
    import cProfile

    profiler = cProfile.Profile(time.thread_time)

    async def enable() -> None:
        profiler.enable()

    async def disable() -> None:
        profiler.disable()

    def switch(on: bool) -> None:
        sampler.active = on
        if mode == "threads":  # the barrier's action runs in an episode thread
            run_on_fleetenv_loop(enable if on else disable)
        elif on:  # ... in asyncio mode, on the loop thread itself
            profiler.enable()
        else:
            profiler.disable()

    threads: list[Any] = []
    with make_runner(config, mode, episodes) as runner:
        fleetenv_round(runner, mode, min(episodes, 8), 2)  # warm up
        with LoopSampler() as sampler:
            delta = fleetenv_round(runner, mode, episodes, calls,
                                   thread_profilers=threads if mode == "threads" else None,
                                   on_start=lambda: switch(True), on_end=lambda: switch(False))
    total = episodes * calls
    print(f"\n=== fleetenv/{mode}, {episodes} x {calls}, profiled: process CPU "
          f"{delta.cpu / total * 1e3:.2f} ms per call, loop thread "
          f"{delta.loop_cpu / total * 1e3:.2f} ms, other threads "
          f"{(delta.cpu - delta.loop_cpu) / total * 1e3:.2f} ms")
    print(sampler.report())
    report = {"loop": profile_report([profiler], total, f"fleetenv/{mode} loop thread",
                                     save_as=_pstats(directory, f"fleetenv-{mode}-loop"))}
    if threads:
        report["episode_threads"] = profile_report(
            threads, total, f"fleetenv/{mode} episode threads (all {len(threads)})",
            save_as=_pstats(directory, f"fleetenv-{mode}-episode-threads"))
    return report


def _pstats(directory: Path | None, name: str) -> Path | None:
    return directory / f"{name}.pstats" if directory is not None else None


def profile_raw(raw: RawSessions, name: str, episodes: int, calls: int,
                directory: Path | None) -> dict[str, Any]:
    import cProfile

    profiler = cProfile.Profile(time.thread_time)
    raw.reopen()  # the timed part only, as in the measured rounds
    profiler.enable()
    try:
        raw.loop.run_until_complete(raw.timed(calls))
    finally:
        profiler.disable()
    return profile_report([profiler], episodes * calls, f"{name} (its only thread)",
                          save_as=_pstats(directory, name))


def run_profiles(fleet: LocalFleet, episodes: int, calls: int, modes: list[str],
                 directory: Path | None) -> dict[str, Any]:
    config = resolve_config(api_key=fleet.token, base_url=fleet.base_url,
                            max_live_instances=max(64, episodes), max_creating_instances=16)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    report = {f"fleetenv/{mode}": profile_mode(config, mode, episodes, calls, directory)
              for mode in modes}
    with raw_instances(fleet, episodes) as urls:
        for name, expert in (("raw", False), ("raw-expert", True)):
            raw = RawSessions(urls, expert=expert).open()
            try:
                raw.round(2)  # warm up
                report[name] = profile_raw(raw, name, episodes, calls, directory)
            finally:
                raw.close()
    return report


# ----------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", default="64",
                        help="concurrent episodes; a comma-separated list runs each size")
    parser.add_argument("--calls", type=int, default=20, help="tool calls per episode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=[*MODES, "both"], default="threads",
                        help="the Runner mode(s) to measure")
    parser.add_argument("--hog", type=int, default=0, metavar="N",
                        help="N busy-loop processes during the measured rounds "
                             "(one per core: a busy machine)")
    parser.add_argument("--gc-threshold", type=int, default=0, metavar="N",
                        help="gc.set_threshold(N) for the whole run (every variant alike): "
                             "how much the collector's default of 700 costs")
    parser.add_argument("--profile", action="store_true",
                        help="then profile one round of each variant at the first size "
                             "(--rounds 0: only that)")
    parser.add_argument("--profile-dir", type=Path, metavar="DIR",
                        help="with --profile: also save each profile there (.pstats)")
    options = parser.parse_args()
    sizes = [int(size) for size in options.episodes.split(",") if size.strip()]
    modes = list(MODES) if options.mode == "both" else [options.mode]
    calls = options.calls

    LoopCounters.install()
    WireCounter.install()
    if options.gc_threshold:
        gc.set_threshold(options.gc_threshold)
    report: dict[str, Any] = {"machine": machine(), "calls": calls, "rounds": options.rounds,
                              "modes": modes, "hog": options.hog,
                              "gc_threshold": gc.get_threshold()[0], "sizes": {}}
    print(f"machine: {report['machine']}", flush=True)
    with LocalFleet(in_process=False, instance_limit=4 * max(sizes) + 16) as fleet:
        for episodes in sizes if options.rounds > 0 else []:
            report["sizes"][str(episodes)] = run_size(fleet, episodes, calls, modes, options)
        if options.profile:
            report["profile"] = run_profiles(fleet, sizes[0], calls, modes, options.profile_dir)
    if report["sizes"]:  # the first size and mode, against plain raw
        report["ratio"] = report["sizes"][str(sizes[0])]["rows"][f"fleetenv/{modes[0]}"][
            "ratio_vs_raw"]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
