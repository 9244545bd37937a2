"""Whole episodes at scale: fleetenv's Runner (thread and asyncio modes) vs pure asyncio.

The workload, identical on every side: N concurrent episodes of the helpdesk app, each
creating an instance, opening its MCP tools, making M sequential calls of a cheap read
tool (``ticket_stats(group_by="status")``), ending the session and deleting the instance,
against ONE local Fleet running in a CHILD process (``LocalFleet(in_process=False)``), so
the server's CPU does not compete with the client's for this process's GIL.

  * fleetenv: ``Runner(workers=N, mode=...)`` with a synchronous policy returning one
    ``ToolCall`` per turn (``run_episode`` -> ``FleetEnv.step`` -> MCP, results rendered
    to chat messages as in a real rollout). Each mode the installed Runner offers is run;
    a Runner without ``mode=`` runs its only (thread) mode, with a printed note.
  * asyncio: fleet-python's ASYNC client to create and delete the instance, a raw
    ``mcp`` ``streamable_http_client`` + ``ClientSession`` for the tools, and
    ``asyncio.gather`` over the episodes. Creation is capped at the same number in
    flight as fleetenv's ``max_creating_instances`` (``--creating``). ``mcp``'s default
    HTTP client: a new TCP connection per request, an SSL context per session.
  * asyncio-expert: the same program with the fixes a careful expert would make
    (``raw_expert.py``: keep-alive as fleetenv does it, one SSL context), so that
    fleetenv's lead is not the baseline's handicap.

Per size the variants run interleaved (the order rotates from batch to batch;
``--rounds`` batches each, medians reported), and for each the script prints: wall time
and the ratios asyncio time / fleetenv time against both programs (> 1: fleetenv is
faster; the median of each round's ratio), client CPU per tool call (this process's CPU
over the whole phase divided by the tool calls; for fleetenv also the loop thread's
share), the local Fleet's CPU per tool call (its child process, over the whole
episodes), HTTP requests and TCP connections per episode (counted at the HTTP transports
every side uses: httpcore2 for MCP, httpcore for fleet-python, urllib3 for fleetenv's
manager API), peak threads, peak RSS growth per episode, and failed episodes.

``--open-only N`` measures holding N episodes open instead (reset done, MCP session open,
nothing called): fleetenv envs of one ``Session`` opened with ``reset_async`` on one
asyncio loop (``--opening`` at once) against
raw sessions opened the same way (``--skip-asyncio``: fleetenv only), reporting the time
to open them all, memory per open episode (RSS after a ``gc.collect``; ``--tracemalloc``
adds the traced Python heap), file descriptors and threads, per episode and in all
(``--gc-freeze``: the heap is frozen every 100 opened episodes, see docs/performance.md). The
``RLIMIT_NOFILE`` is raised first (the Fleet child inherits it): the hard limit too when
run as root, else a note says which limit stops the run.

    python tests/benchmarks/bench_scale.py [--sizes 1,16,64,256,1024] [--calls 12]
        [--rounds 1]
    python tests/benchmarks/bench_scale.py --open-only 2000
    python tests/benchmarks/bench_scale.py --profile 16

``--profile N`` runs one batch of N episodes per side under cProfile timing thread CPU
(fleetenv's loop thread; the asyncio program's only thread) and prints where the CPU of
a tool call goes, by package and by function.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for bench_rollouts, instruments

import fleet
from bench_rollouts import ThreadSampler
from instruments import (
    WireCounter,
    children_cpu_s,
    loop_thread_cpu_s,
    machine,
    profile_report,
    run_on_fleetenv_loop,
)
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from raw_expert import expert_http_client

import fleetenv
from fleetenv import (
    Done,
    EventBus,
    FleetConfig,
    FleetEnv,
    LocalFleet,
    PolicyContext,
    Reply,
    Runner,
    Session,
    Task,
    ToolCall,
    resolve_config,
)

TOOL = "ticket_stats"
ARGUMENTS = {"group_by": "status"}
ENV_KEY = "helpdesk"
DATA_KEY = "helpdesk-seed:v1"
PHASE_TIMEOUT_S = 1800.0

#: The raw asyncio programs: (name, expert). The expert one keeps connections alive and
#: shares one SSL context (raw_expert.py).
RAW = (("asyncio", False), ("asyncio-expert", True))

TASK = Task(key="bench-scale", env_key="helpdesk", data_key="helpdesk-seed",
            data_version="v1", prompt="Count the tickets by status, many times.")


# ----------------------------------------------------------------------------- counting

class Sampler(ThreadSampler):
    """``ThreadSampler`` (peak threads) that also records the peak RSS."""

    def __init__(self, interval_s: float = 0.01) -> None:
        super().__init__(interval_s)
        self.peak_rss = rss_bytes()

    def _run(self) -> None:
        while not self._stop.is_set():
            threads = threading.enumerate()
            self.peak_threads = max(self.peak_threads, len(threads) - 1)
            self.peak_rss = max(self.peak_rss, rss_bytes())
            self._stop.wait(self.interval_s)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ----------------------------------------------------------------------------- fleetenv

class CallsPolicy:
    """``calls`` turns of one ``ToolCall`` each, then ``Done``."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    def act(self, context: PolicyContext) -> Reply:
        if context.turn < self.calls:
            return Reply.from_actions([ToolCall(TOOL, dict(ARGUMENTS))])
        return Reply.from_actions([Done()])


def runner_modes() -> list[str]:
    """The Runner modes to measure: both when ``Runner(mode=)`` exists, else threads."""
    if "mode" in inspect.signature(Runner.__init__).parameters:
        return ["threads", "asyncio"]
    print("note: this Runner has no mode= argument; measuring its thread mode only",
          flush=True)
    return ["threads"]


def fleetenv_phase(config: FleetConfig, mode: str, episodes: int, calls: int) -> dict[str, Any]:
    options: dict[str, Any] = {"workers": episodes, "config": config,
                               "events": EventBus(sinks=[]), "progress": False}
    if "mode" in inspect.signature(Runner.__init__).parameters:
        options["mode"] = mode
    started, cpu, loop_cpu = time.perf_counter(), time.process_time(), loop_thread_cpu_s()
    with Runner(**options) as runner:
        results = list(runner.run([TASK], CallsPolicy(calls), samples_per_task=episodes))
    seconds = time.perf_counter() - started
    failed = [r for r in results if r.error or r.tool_calls != calls or r.tool_errors]
    if failed:
        example = failed[0]
        print(f"  fleetenv/{mode}: {len(failed)} failed, e.g. error={example.error!r} "
              f"tool_calls={example.tool_calls} errors={example.tool_error_messages[:1]}",
              flush=True)
    return {"seconds": seconds, "cpu_s": time.process_time() - cpu,
            "loop_cpu_s": loop_thread_cpu_s() - loop_cpu,
            "failed": len(failed) + episodes - len(results)}


# ----------------------------------------------------------------------------- asyncio

async def raw_episode(client: Any, creating: asyncio.Semaphore, calls: int,
                      expert: bool) -> None:
    async with creating:
        env = await client.make(ENV_KEY, data_key=DATA_KEY)
    try:
        async with contextlib.AsyncExitStack() as stack:
            # expert: keep-alive and one SSL context (raw_expert.py); else mcp's default
            http = await stack.enter_async_context(expert_http_client()) if expert else None
            read, write = await stack.enter_async_context(
                streamable_http_client(f"{env.urls.root}mcp", http_client=http))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            await session.list_tools()
            for _ in range(calls):
                result = await session.call_tool(TOOL, dict(ARGUMENTS))
                if result.is_error:
                    raise RuntimeError(f"tool error: {result.content}")
    finally:
        await env.close()


async def raw_batch(fleet_url: str, token: str, episodes: int, calls: int,
                    creating: int, expert: bool) -> int:
    client = fleet.AsyncFleet(api_key=token, base_url=fleet_url, max_retries=0, timeout=120.0)
    limit = asyncio.Semaphore(creating)
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(raw_episode(client, limit, calls, expert) for _ in range(episodes)),
                       return_exceptions=True), PHASE_TIMEOUT_S)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        print(f"  asyncio{'-expert' if expert else ''}: {len(failed)} failed, "
              f"e.g. {failed[0]!r}", flush=True)
    with contextlib.suppress(Exception):
        await client.client.httpx_client.aclose()
    return len(failed)


def asyncio_phase(fleet_url: str, token: str, episodes: int, calls: int,
                  creating: int, expert: bool = False) -> dict[str, Any]:
    started, cpu = time.perf_counter(), time.process_time()
    failed = asyncio.run(raw_batch(fleet_url, token, episodes, calls, creating, expert))
    return {"seconds": time.perf_counter() - started, "cpu_s": time.process_time() - cpu,
            "failed": failed}


# ----------------------------------------------------------------------------- one size

def measured(counter: WireCounter, episodes: int, calls: int,
             run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    gc.collect()
    requests0, connections0 = counter.snapshot()
    rss0, server0 = rss_bytes(), children_cpu_s()
    with Sampler() as sampler:
        row = run()
    requests1, connections1 = counter.snapshot()
    row.update(
        server_cpu_ms_per_call=(children_cpu_s() - server0) / (episodes * calls) * 1e3,
        requests_per_episode=(requests1 - requests0) / episodes,
        connections_per_episode=(connections1 - connections0) / episodes,
        cpu_ms_per_call=row["cpu_s"] / (episodes * calls) * 1e3,
        peak_threads=sampler.peak_threads,
        peak_rss_mb_per_episode=max(0, sampler.peak_rss - rss0) / episodes / 2**20,
    )
    if "loop_cpu_s" in row:
        row["loop_cpu_ms_per_call"] = row["loop_cpu_s"] / (episodes * calls) * 1e3
    return row


def run_sizes(options: argparse.Namespace, counter: WireCounter) -> dict[str, Any]:
    sizes = [int(size) for size in options.sizes.split(",") if size.strip()]
    modes = runner_modes()
    largest = max(sizes)
    report: dict[str, Any] = {"calls": options.calls, "rounds": options.rounds, "sizes": {}}
    with LocalFleet(in_process=False, instance_limit=2 * largest + 16) as local:
        config = resolve_config(api_key=local.token, base_url=local.base_url,
                                max_live_instances=max(64, largest),
                                max_creating_instances=options.creating)
        variants: list[tuple[str, Callable[[int], dict[str, Any]]]] = [
            (f"fleetenv/{mode}",
             lambda n, mode=mode: fleetenv_phase(config, mode, n, options.calls))
            for mode in modes]
        for name, expert in RAW:
            variants.append((name, lambda n, expert=expert: asyncio_phase(
                local.base_url, local.token, n, options.calls, options.creating, expert)))
        # warm up every path (imports, SSL context, the Fleet child's apps)
        for _name, run in variants:
            run(2)
        turn = 0
        for size in sizes:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
            for _ in range(options.rounds):
                rotation = turn % len(variants)
                turn += 1
                for name, run in variants[rotation:] + variants[:rotation]:
                    runs[name].append(measured(counter, size, options.calls,
                                               lambda run=run, size=size: run(size)))
            rows = {name: median_row(rounds) for name, rounds in runs.items()}
            for name, row in rows.items():  # the median of each round's ratio
                if name.startswith("fleetenv"):
                    for raw, _ in RAW:
                        row[f"ratio_vs_{raw.replace('-', '_')}"] = statistics.median(
                            b["seconds"] / a["seconds"]
                            for a, b in zip(runs[name], runs[raw], strict=True))
                    row["ratio"] = row["ratio_vs_asyncio"]
            print_size(size, options.calls, options.rounds, rows)
            report["sizes"][str(size)] = {name: rounded(row) for name, row in rows.items()}
    return report


def median_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every figure over rounds (of a count: the lower median, a count
    still; failures are summed)."""
    row = {key: (statistics.median_low if isinstance(value, int) else statistics.median)(
        r[key] for r in rounds) for key, value in rounds[0].items()}
    row["failed"] = sum(r["failed"] for r in rounds)
    return row


def print_size(size: int, calls: int, rounds: int, rows: dict[str, dict[str, Any]]) -> None:
    print(f"\n{size} concurrent episodes x {calls} calls (whole episodes; median of "
          f"{rounds} round{'s' if rounds > 1 else ''}):", flush=True)
    for name, row in rows.items():
        ratio = (f"  ratio {row['ratio_vs_asyncio']:.2f}, vs expert "
                 f"{row['ratio_vs_asyncio_expert']:.2f}" if "ratio" in row else "")
        loop = (f" (loop thread {row['loop_cpu_ms_per_call']:.2f})"
                if "loop_cpu_ms_per_call" in row else "")
        print(f"  {name:17s} {row['seconds']:7.2f} s{ratio}  CPU/call "
              f"{row['cpu_ms_per_call']:.2f} ms{loop}  server CPU/call "
              f"{row['server_cpu_ms_per_call']:.2f} ms  HTTP req/ep "
              f"{row['requests_per_episode']:.1f}  conns/ep "
              f"{row['connections_per_episode']:.2f}  peak threads {row['peak_threads']}  "
              f"peak RSS/ep {row['peak_rss_mb_per_episode']:.2f} MB  failed {row['failed']}",
              flush=True)


def rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {key: round(value, 3) if isinstance(value, float) else value
            for key, value in row.items()}


# ----------------------------------------------------------------------------- open only

#: File descriptors an open episode at rest holds in either process (this one, and the
#: Fleet child, which inherits this process's limits): its session's GET stream. The
#: spare covers the episodes opening and the pooled connections within their keep-alive
#: expiry (a few seconds' worth of episodes), and the process's own files.
FDS_PER_OPEN_EPISODE = 1
FDS_SPARE = 1024
#: With --gc-freeze, the heap is frozen each time this many more episodes are open.
FREEZE_EVERY = 100


def raise_fd_limit_for(episodes: int) -> tuple[int, str | None]:
    """Raise ``RLIMIT_NOFILE`` for ``episodes`` open episodes, before the Fleet child
    starts: the hard limit too when this process may (root with CAP_SYS_RESOURCE), up to
    ``fs.nr_open``; then the soft one to the hard one. Returns the soft limit and, when
    it may be short of what ``episodes`` need, which limit that is."""
    need = FDS_PER_OPEN_EPISODE * episodes + FDS_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    refused = ""
    if hard != resource.RLIM_INFINITY and hard < need:
        target = min(need, nr_open())
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, target)), target))
        except (ValueError, OSError) as exc:
            refused = f" (raising it was refused: {exc}; it needs root with CAP_SYS_RESOURCE)"
    soft = raise_fd_limit()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or soft >= need:
        return soft, None
    which = "fs.nr_open" if hard >= nr_open() else f"the hard limit{refused}"
    return soft, (f"RLIMIT_NOFILE {soft} (hard {hard}) may be short of the {need} file "
                  f"descriptors {episodes} open episodes can need (about "
                  f"{FDS_PER_OPEN_EPISODE} each, in this process and in the Fleet child): "
                  f"{which}; a run it stops fails with 'Too many open files'")


def nr_open() -> int:
    """The kernel's ceiling on RLIMIT_NOFILE (``fs.nr_open``; 1,048,576 by default)."""
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return 1 << 20


def process_fds_and_rss(pid: int) -> tuple[int, float]:
    """Open file descriptors and RSS (MB) of process ``pid`` (0, 0.0 if unreadable)."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/statm") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0, 0.0
    return fds, rss / 2**20


async def open_fleetenv(session: Session, count: int, opening: int,
                        progress: Callable[[int], None]) -> tuple[list[FleetEnv], int]:
    limit = asyncio.Semaphore(opening)
    envs: list[FleetEnv] = []
    failed = 0

    async def one() -> None:
        nonlocal failed
        env = FleetEnv(TASK, session=session)
        async with limit:
            try:
                await env.reset_async()
                envs.append(env)
                progress(len(envs))
            except Exception as exc:
                failed += 1
                if failed == 1:
                    print(f"  first failure: {exc!r}", flush=True)
                await env.close_async(grade=False)

    await asyncio.gather(*(one() for _ in range(count)))
    return envs, failed


async def hold_raw(fleet_url: str, token: str, count: int, opening: int,
                   measure: Callable[[int, int], None]) -> int:
    client = fleet.AsyncFleet(api_key=token, base_url=fleet_url, max_retries=0, timeout=300.0)
    limit = asyncio.Semaphore(opening)
    ready = 0
    failed = 0
    release = asyncio.Event()
    all_settled = asyncio.Event()

    def settled() -> None:
        if ready + failed == count:
            all_settled.set()

    async def one() -> None:
        nonlocal ready, failed
        env = None
        try:
            async with limit:
                env = await client.make(ENV_KEY, data_key=DATA_KEY)
                stack = contextlib.AsyncExitStack()
                read, write = await stack.enter_async_context(
                    streamable_http_client(f"{env.urls.root}mcp"))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                await session.list_tools()
            ready += 1
            settled()
            async with stack:
                await release.wait()
        except Exception as exc:
            failed += 1
            if failed == 1:
                print(f"  first raw failure: {exc!r}", flush=True)
            settled()
        finally:
            if env is not None:
                with contextlib.suppress(Exception):
                    await env.close()

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    await asyncio.wait_for(all_settled.wait(), PHASE_TIMEOUT_S)
    measure(ready, failed)
    release.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return failed


def run_open_only(options: argparse.Namespace) -> dict[str, Any]:
    """Hold ``--open-only`` episodes open: fleetenv, then (unless ``--skip-asyncio``) the
    raw asyncio program. Per side: time to open them all, memory per open episode (RSS
    growth after a ``gc.collect``, less tracemalloc's own memory; with ``--tracemalloc``
    also the Python heap that tracemalloc sees), file descriptors and threads (in all and
    per episode), failures; and the Fleet child's descriptors and RSS."""
    import tracemalloc

    count = options.open_only
    fd_limit, fd_short = raise_fd_limit_for(count)
    if fd_short:
        print(f"note: {fd_short}", flush=True)
    report: dict[str, Any] = {"open_only": count, "fd_limit": fd_limit,
                              "fd_limit_short": fd_short, "gc_freeze": options.gc_freeze}
    every = max(500, count // 10)
    with LocalFleet(in_process=False, instance_limit=count + 16) as local:
        child = getattr(local, "_child", None)  # the Fleet child, for its fds and RSS
        fleet_pid = child.pid if child is not None else 0
        config = resolve_config(api_key=local.token, base_url=local.base_url,
                                max_live_instances=count + 16,
                                max_creating_instances=options.creating)
        warm = FleetEnv(TASK, config=config, events=EventBus(sinks=[]))
        warm.reset()
        warm.close(grade=False)
        gc.collect()
        if options.tracemalloc:
            tracemalloc.start()
        rss0, fds0, threads0 = rss_bytes(), open_fds(), threading.active_count()
        fleet_fds0, fleet_rss0 = process_fds_and_rss(fleet_pid)
        started = time.perf_counter()

        def progress(opened: int) -> None:
            if options.gc_freeze and opened % FREEZE_EVERY == 0:
                gc.freeze()  # the open episodes are long-lived: out of the full collections
            if opened % every == 0:
                print(f"  {opened} open after {time.perf_counter() - started:.0f} s, "
                      f"RSS +{(rss_bytes() - rss0) / opened / 2**20:.3f} MB each, "
                      f"{(open_fds() - fds0) / opened:.2f} fds each, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)

        loop = asyncio.new_event_loop()
        session = Session(config, events=EventBus(sinks=[]))  # one, as a Runner has
        envs, failed = loop.run_until_complete(
            open_fleetenv(session, count, options.opening, progress))
        seconds = time.perf_counter() - started
        gc.collect()
        opened = max(1, len(envs))
        threads = threading.active_count()
        fleet_fds, fleet_rss = process_fds_and_rss(fleet_pid)
        # tracemalloc's own bookkeeping (a trace per block) is not the episodes' memory
        tracing = tracemalloc.get_tracemalloc_memory() if options.tracemalloc else 0
        row: dict[str, Any] = {
            "open": len(envs), "failed": failed, "seconds_to_open": round(seconds, 1),
            "mb_per_open_episode": round((rss_bytes() - rss0 - tracing) / opened / 2**20, 3),
            "fds": open_fds() - fds0,
            "fds_per_open_episode": round((open_fds() - fds0) / opened, 2),
            "threads": threads - threads0, "threads_total": threads,
            "threads_per_open_episode": round((threads - threads0) / opened, 4),
            "fleet_fds_per_open_episode": round((fleet_fds - fleet_fds0) / opened, 2),
            "fleet_mb_per_open_episode": round((fleet_rss - fleet_rss0) / opened, 3),
            "load_average": [round(load, 2) for load in os.getloadavg()],
        }
        if options.tracemalloc:
            row["traced_mb_per_open_episode"] = round(
                tracemalloc.get_traced_memory()[0] / opened / 2**20, 3)
            tracemalloc.stop()
        print(f"fleetenv: {row}", flush=True)
        if failed and fd_short:
            print(f"note: {failed} failed; {fd_short}", flush=True)
        report["fleetenv"] = row

        async def close_all(opened: list[FleetEnv]) -> None:
            await asyncio.gather(*(env.close_async(grade=False) for env in opened),
                                 return_exceptions=True)

        loop.run_until_complete(close_all(envs))
        session.close()
        loop.close()
        del envs
        gc.collect()
        if options.skip_asyncio:
            return report

        raw_row: dict[str, Any] = {}

        def measure(ready: int, failed: int) -> None:
            gc.collect()
            raw_row.update(open=ready, failed=failed,
                           seconds_to_open=round(time.perf_counter() - started1, 1),
                           mb_per_open_episode=round((rss_bytes() - rss1) / max(1, ready)
                                                     / 2**20, 3),
                           fds=open_fds() - fds1, threads=threading.active_count() - threads1)

        rss1, fds1, threads1 = rss_bytes(), open_fds(), threading.active_count()
        started1 = time.perf_counter()
        asyncio.run(hold_raw(local.base_url, local.token, count, options.opening, measure))
        print(f"asyncio:  {raw_row}", flush=True)
        report["asyncio"] = raw_row
    return report


# ----------------------------------------------------------------------------- profile

def run_profile(options: argparse.Namespace) -> dict[str, Any]:
    """One batch of each side with cProfile timing thread CPU: fleetenv's loop thread
    (and its worker threads' share of the process CPU), and the asyncio program."""
    import cProfile

    size, calls = options.profile, options.calls
    report: dict[str, Any] = {"profile": size, "calls": calls}
    with LocalFleet(in_process=False, instance_limit=2 * size + 16) as local:
        config = resolve_config(api_key=local.token, base_url=local.base_url,
                                max_live_instances=max(64, size),
                                max_creating_instances=options.creating)
        mode = runner_modes()[-1]
        fleetenv_phase(config, mode, 2, calls)  # warm up
        asyncio_phase(local.base_url, local.token, 2, calls, options.creating)
        profiler = cProfile.Profile(time.thread_time)

        async def enable() -> None:
            profiler.enable()

        async def disable() -> None:
            profiler.disable()

        run_on_fleetenv_loop(enable)
        try:
            row = fleetenv_phase(config, mode, size, calls)
        finally:
            run_on_fleetenv_loop(disable)
        total_calls = size * calls
        print(f"\nfleetenv/{mode}: process CPU {row['cpu_s'] / total_calls * 1e3:.2f} ms per "
              f"tool call, of which the loop thread "
              f"{row['loop_cpu_s'] / total_calls * 1e3:.2f} ms (profiled, so slower)")
        report["fleetenv_loop"] = profile_report(
            [profiler], total_calls, f"fleetenv/{mode} loop thread")["ms_per_call_by_package"]
        raw_profiler = cProfile.Profile(time.thread_time)
        raw_profiler.enable()
        try:
            asyncio_phase(local.base_url, local.token, size, calls, options.creating)
        finally:
            raw_profiler.disable()
        report["asyncio"] = profile_report(
            [raw_profiler], total_calls, "asyncio program")["ms_per_call_by_package"]
    return report


# ----------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,16,64,256,1024",
                        help="concurrent episodes, comma-separated")
    parser.add_argument("--calls", type=int, default=12, help="tool calls per episode")
    parser.add_argument("--rounds", type=int, default=1,
                        help="batches per size and variant (the figures are medians)")
    parser.add_argument("--creating", type=int, default=16,
                        help="instance creations in flight at once (both sides)")
    parser.add_argument("--open-only", type=int, default=0, metavar="N",
                        help="only measure holding N open episodes")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="only profile one batch of N episodes on each side")
    parser.add_argument("--opening", type=int, default=64,
                        help="with --open-only: episodes opening at once")
    parser.add_argument("--skip-asyncio", action="store_true",
                        help="with --open-only: measure fleetenv only, not the raw program")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="with --open-only: gc.freeze() the heap as fleetenv's episodes "
                             "open, so CPython's full collections skip the open episodes")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="with --open-only: also trace fleetenv's Python heap (slower)")
    options = parser.parse_args()
    fd_limit = raise_fd_limit()
    print(f"fleetenv from {Path(fleetenv.__file__).parent}; fd limit {fd_limit}; "
          f"{os.cpu_count()} CPUs", flush=True)
    counter = WireCounter.install()
    if options.open_only:
        report = run_open_only(options)
    elif options.profile:
        report = run_profile(options)
    else:
        report = run_sizes(options, counter)
    report["machine"] = machine()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
