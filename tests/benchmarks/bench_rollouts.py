"""Parallel rollouts: fleetenv's Runner (thread pool + one loop thread) vs pure asyncio.

The workload, identical for both: N concurrent episodes (default 64), each making M
sequential calls (default 20) of a cheap read tool of the helpdesk app
(``ticket_stats(group_by="status")``, ~0.3 kB of output), against the local Fleet's MCP
servers running in a SEPARATE PROCESS (``LocalFleet(in_process=False)``), so the server's
CPU does not compete with the client's for this process's GIL.

  (a) fleetenv: ``Runner(workers=N).run(...)`` with the default thread executor; the policy
      is an ordinary synchronous object returning one ``ToolCall`` per turn, so every call
      goes through ``run_episode`` -> ``FleetEnv.step`` -> the loop thread -> MCP, and its
      result is rendered into chat messages, as in a real rollout.
  (b) baseline: a pure asyncio program using ``mcp`` directly: one
      ``streamable_http_client`` + ``ClientSession`` per episode, ``asyncio.gather`` over
      the episodes. Its instances are provisioned through the control plane with
      fleet-python.

What is timed: the TOOL-CALL PHASE only, for both. Provisioning, session setup, grading
and deletion are excluded: (a) holds every episode at a barrier on its first turn (after
reset: instance up, MCP session open, tools listed) and times from the barrier's release
to the return of the last episode's M-th call; (b) opens every session first and times
the ``gather``. Throughput = N * M / that time. Rounds alternate the order (ab, ba, ...)
so machine noise hits both alike; the reported figure is the median over rounds.

During (a) a sampler records ``threading.active_count()`` (minus the sampler itself) and
the threads named ``fleetenv-loop`` (must be exactly one).

    python tests/benchmarks/bench_rollouts.py [--episodes 64] [--calls 20] [--rounds 3]
        [--profile]

``--profile`` runs one extra (a) round with the loop thread under cProfile and a stack
sampler, and prints where the time goes. The last line printed is
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from fleetenv import runtime
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.event_bus import EventBus
from fleetenv.core.tasks import Task
from fleetenv.core.types import Done, ToolCall
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import PolicyContext, Reply
from fleetenv.rollouts.runner import Runner

TOOL = "ticket_stats"
ARGUMENTS = {"group_by": "status"}
LOOP_THREAD_NAME = "fleetenv-loop"
BARRIER_TIMEOUT_S = 120.0
PHASE_TIMEOUT_S = 300.0

TASK = Task(key="bench-ticket-stats", env_key="helpdesk", data_key="helpdesk-seed",
            data_version="v1", prompt="Count the tickets by status, many times.")


# ----------------------------------------------------------------------------- (a) fleetenv

class BarrierPolicy:
    """One ``ToolCall`` per turn for ``calls`` turns, then ``Done``.

    Turn 0 waits at a barrier shared by all episodes, so the timed phase starts when
    every episode is ready (instance provisioned, MCP open) and provisioning, which the
    runner staggers on purpose (``max_creating_instances``), is not in the number.
    """

    def __init__(self, episodes: int, calls: int) -> None:
        self.calls = calls
        self.barrier = threading.Barrier(episodes, action=self._released,
                                         timeout=BARRIER_TIMEOUT_S)
        self.started: float | None = None
        self.ended: list[float] = []
        self.cpu_s = 0.0
        self._cpu_started = 0.0
        self._lock = threading.Lock()

    def _released(self) -> None:
        self.started = time.perf_counter()
        self._cpu_started = time.process_time()

    def act(self, context: PolicyContext) -> Reply:
        if context.turn == 0:
            self.barrier.wait()
        if context.turn < self.calls:
            return Reply.from_actions([ToolCall(TOOL, dict(ARGUMENTS))])
        with self._lock:
            self.ended.append(time.perf_counter())
            if len(self.ended) == self.barrier.parties:
                self.cpu_s = time.process_time() - self._cpu_started
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


def fleetenv_round(runner: Runner, episodes: int, calls: int) -> tuple[float, float]:
    """One round of (a): (seconds, CPU seconds of this process) of the tool-call phase."""
    policy = BarrierPolicy(episodes, calls)
    results = list(runner.run([TASK], policy, samples_per_task=episodes))
    failed = [r for r in results if r.error or r.tool_calls != calls or r.tool_errors]
    if failed or len(results) != episodes:
        example = failed[0] if failed else None
        raise SystemExit(f"fleetenv round failed: {len(failed)} bad of {len(results)}; "
                         f"e.g. error={example and example.error} "
                         f"tool_calls={example and example.tool_calls} "
                         f"tool_errors={example and example.tool_error_messages[:1]}")
    assert policy.started is not None and len(policy.ended) == episodes
    return max(policy.ended) - policy.started, policy.cpu_s


# ----------------------------------------------------------------------------- (b) asyncio

class RawSessions:
    """N raw mcp sessions on a plain asyncio loop driven from the main thread.

    Each session is entered and exited by its own owner task (anyio cancel scopes must
    be left by the task that entered them); rounds only await calls on them.
    """

    def __init__(self, urls: list[str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.urls = urls
        self.sessions: list[ClientSession] = []
        self._stop: asyncio.Event | None = None
        self._owners: list[asyncio.Task[None]] = []

    async def _own(self, url: str, ready: asyncio.Future[ClientSession]) -> None:
        assert self._stop is not None
        try:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
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
        self.sessions = list(await asyncio.wait_for(asyncio.gather(*readies), 120))

    def open(self) -> RawSessions:
        self.loop.run_until_complete(self._open())
        return self

    async def _episode(self, session: ClientSession, calls: int) -> None:
        for _ in range(calls):
            result = await session.call_tool(TOOL, dict(ARGUMENTS))
            if result.is_error:
                raise RuntimeError(f"tool error: {result.content}")

    async def _round(self, calls: int) -> tuple[float, float]:
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.wait_for(
            asyncio.gather(*(self._episode(s, calls) for s in self.sessions)),
            PHASE_TIMEOUT_S)
        return time.perf_counter() - started, time.process_time() - cpu

    def round(self, calls: int) -> tuple[float, float]:
        return self.loop.run_until_complete(self._round(calls))

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._owners:
            self.loop.run_until_complete(asyncio.wait_for(
                asyncio.gather(*self._owners, return_exceptions=True), 60))
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
                envs.append(future.result(timeout=120))
        yield [f"{env.urls.root}mcp" for env in envs]
    finally:
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()
        client._httpx_client.close()


# ----------------------------------------------------------------------------- profiling

class LoopSampler:
    """Samples the loop thread's stack (``sys._current_frames``) to see where it spends
    its time: py-spy is not available, and cProfile cannot attach to a running thread."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-profiler", daemon=True)

    def _run(self) -> None:
        loop_ids = [t.ident for t in threading.enumerate() if t.name == LOOP_THREAD_NAME]
        while not self._stop.is_set():
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
            self._stop.wait(self.interval_s)

    def __enter__(self) -> LoopSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def report(self, top: int = 25) -> str:
        lines = [f"loop thread: {self.samples} samples (inclusive share of samples)"]
        for key, count in self.counts.most_common(top):
            lines.append(f"  {count / max(self.samples, 1):6.1%}  {key}")
        return "\n".join(lines)


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", "fleetenv/", "lib/python3"):
        if marker in filename:
            return filename[filename.index(marker):]
    return filename


def profile_round(config: FleetConfig, episodes: int, calls: int) -> None:
    """One more (a) round with the loop thread under cProfile (enabled from inside the
    loop thread: cProfile profiles the thread that enables it) and the loop sampled, to
    see where the client's CPU goes. Profiling slows the round; only shares matter."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()

    async def enable() -> None:
        profiler.enable()

    async def disable() -> None:
        profiler.disable()

    policy = BarrierPolicy(episodes, calls)
    with Runner(workers=episodes, config=config, events=EventBus(sinks=[]),
                progress=False) as runner, LoopSampler() as sampler:
        runtime.current().call(enable)
        try:
            list(runner.run([TASK], policy, samples_per_task=episodes))
        finally:
            runtime.current().call(disable)
    print(sampler.report())
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(30)
        print(f"\nloop thread, cProfile by {order}:")
        print(text.getvalue()[-6000:])


# ----------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20, help="tool calls per episode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    options = parser.parse_args()
    n, m = options.episodes, options.calls

    fleetenv_s: list[float] = []
    asyncio_s: list[float] = []
    fleetenv_cpu: list[float] = []
    asyncio_cpu: list[float] = []
    with LocalFleet(in_process=False, instance_limit=4 * n + 16) as fleet:
        config = resolve_config(api_key=fleet.token, base_url=fleet.base_url,
                                max_live_instances=max(64, n),
                                max_creating_instances=16)
        with raw_instances(fleet, n) as urls:
            raw = RawSessions(urls).open()
            try:
                with (
                    Runner(workers=n, config=config, events=EventBus(sinks=[]),
                           progress=False) as runner,
                    ThreadSampler() as threads,
                ):
                    fleetenv_round(runner, min(n, 8), 2)  # warm up both paths
                    raw.round(2)
                    for index in range(options.rounds):
                        order = ("a", "b") if index % 2 == 0 else ("b", "a")
                        for variant in order:
                            seconds, cpu = (fleetenv_round(runner, n, m) if variant == "a"
                                            else raw.round(m))
                            (fleetenv_s if variant == "a" else asyncio_s).append(seconds)
                            (fleetenv_cpu if variant == "a" else asyncio_cpu).append(cpu)
                        print(f"round {index + 1}: fleetenv {n * m / fleetenv_s[-1]:.0f} "
                              f"calls/s ({fleetenv_cpu[-1] / (n * m) * 1e3:.2f} ms CPU/call), "
                              f"asyncio {n * m / asyncio_s[-1]:.0f} calls/s "
                              f"({asyncio_cpu[-1] / (n * m) * 1e3:.2f} ms CPU/call)",
                              flush=True)
            finally:
                raw.close()
        if options.profile:
            profile_round(config, n, m)
    runtime.shutdown()

    fleet_rate = n * m / statistics.median(fleetenv_s)
    raw_rate = n * m / statistics.median(asyncio_s)
    print(f"\nworkload: {n} concurrent episodes x {m} calls of {TOOL}; tool-call phase only; "
          f"median of {options.rounds} interleaved rounds")
    print(f"(a) fleetenv Runner (threads={n}):  {fleet_rate:8.0f} calls/s")
    print(f"(b) asyncio + mcp (gather):      {raw_rate:8.0f} calls/s")
    print(f"ratio (a)/(b): {fleet_rate / raw_rate:.3f}")
    print(f"client CPU per call in this process (median): fleetenv "
          f"{statistics.median(fleetenv_cpu) / (n * m) * 1e3:.2f} ms, asyncio "
          f"{statistics.median(asyncio_cpu) / (n * m) * 1e3:.2f} ms")
    print(f"peak threads in this process during (a): {threads.peak_threads}; "
          f"'{LOOP_THREAD_NAME}' threads seen: {len(threads.loop_threads)} "
          f"(at most {threads.max_loop_threads} at once)")
    print(json.dumps({
        "fleetenv_calls_per_s": round(fleet_rate, 1),
        "asyncio_calls_per_s": round(raw_rate, 1),
        "ratio": round(fleet_rate / raw_rate, 3),
        "peak_threads": threads.peak_threads,
        "loop_threads": len(threads.loop_threads),
        "episodes": n,
    }))


if __name__ == "__main__":
    main()
