"""Client CPU of one tool call, layer by layer: where fleetenv's own cost per call is.

One episode, calls one after another (no concurrency, so no GIL contention and little
garbage collection: the cost of the code itself), against the local Fleet's MCP servers in
a SEPARATE PROCESS. In interleaved blocks of ``--calls`` calls of ``ticket_stats``, the
CPU of this process per call for:

  (0) expert raw: ``await ClientSession.call_tool`` on one session of the expert program
      of ``bench_rollouts.py`` (``raw_expert.py``: keep-alive, one SSL context), on a
      plain asyncio loop. The baseline.
  (1) ``MCPConnection.acall_tool``, awaited on fleetenv's loop: fleetenv's MCP layer
      (its HTTP client, the call's deadline and call id, the typed ``ToolResult``).
  (2) ``FleetEnv.step_async``, awaited on fleetenv's loop: the episode's step on top
      (arguments checked against the schema, the tool-error rule, the observation and
      its chat content, the episode's books and events).
  (3) ``FleetEnv.step`` from this thread: (2) plus the hand-off to the loop thread and back.

And, in the same blocks, what a hand-off alone costs, for comparison with (3) - (2):
``Runtime.call`` of an empty coroutine (fleetenv's hand-off: a task on the loop, its
outcome back through one lock), and the least any call into another thread's asyncio loop
can cost (``Runtime.call_soon`` of a lock's ``release``, the caller waiting on the lock:
one wake-up of the loop, one of the caller; no task, no outcome).

``--hog N`` runs N busy-loop processes meanwhile (one per core: a busy machine). On an idle
machine a wake-up of a thread whose core has gone idle costs far more CPU than on a busy
one, so the hand-off figures depend on it.

Each layer's figure is the median over blocks; ``vs expert`` is the baseline's CPU per
call over the layer's, in the same run (as every ratio of these benchmarks: above 1,
fleetenv is cheaper), ``+us`` what the layer adds to the one before it. The last line
printed is one JSON object.

    python tests/benchmarks/bench_call_layers.py [--calls 300] [--blocks 5] [--hog N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for bench_rollouts, instruments

from bench_rollouts import ARGUMENTS, TASK, TOOL, RawSessions, raw_instances
from instruments import CpuHog, machine

from fleetenv import FleetEnv, LocalFleet, ToolCall, resolve_config, runtime
from fleetenv.mcp import MCPConnection

LAYERS = ("expert", "MCPConnection.acall_tool", "FleetEnv.step_async", "FleetEnv.step")
HAND_OFFS = ("Runtime.call(empty coroutine)", "call_soon(lock.release) + wait")


def call() -> ToolCall:
    return ToolCall(name=TOOL, arguments=dict(ARGUMENTS))


def measure(calls: int, blocks: int, hogs: int) -> dict[str, list[float]]:
    """CPU seconds per call of every layer, one figure per block (after one warm-up)."""
    cpu: dict[str, list[float]] = {name: [] for name in LAYERS + HAND_OFFS}
    with LocalFleet(in_process=False) as fleet:
        config = resolve_config(api_key=fleet.token, base_url=fleet.base_url)
        with (raw_instances(fleet, 1) as urls,
              FleetEnv(TASK, config=config, max_steps=2 * (blocks + 1) * calls + 1,
                       episode_deadline_s=3600) as env,
              MCPConnection(urls[0]) as connection):
            raw = RawSessions(urls, expert=True).open()
            try:
                env.reset()
                loop = runtime.current()

                async def connection_calls() -> None:
                    for _ in range(calls):
                        await connection.acall_tool(TOOL, dict(ARGUMENTS), timeout_s=60)

                async def steps_async() -> None:
                    for _ in range(calls):
                        await env.step_async(call())

                def steps() -> None:
                    for _ in range(calls):
                        env.step(call())

                async def empty() -> None:
                    pass

                def hand_offs() -> None:
                    for _ in range(calls):
                        loop.call(empty)

                def wake_ups() -> None:
                    for _ in range(calls):
                        woken = threading.Lock()
                        woken.acquire()
                        loop.call_soon(woken.release)
                        woken.acquire()

                runs: dict[str, Callable[[], Any]] = {
                    "expert": lambda: raw.loop.run_until_complete(
                        raw.episode(raw.sessions[0], calls)),
                    "MCPConnection.acall_tool": lambda: loop.call(connection_calls),
                    "FleetEnv.step_async": lambda: loop.call(steps_async),
                    "FleetEnv.step": steps,
                    HAND_OFFS[0]: hand_offs,
                    HAND_OFFS[1]: wake_ups,
                }
                with CpuHog(hogs):
                    for block in range(blocks + 1):
                        for name, run in runs.items():
                            started = time.process_time()
                            run()
                            if block:  # block 0 warms every path up
                                cpu[name].append((time.process_time() - started) / calls)
            finally:
                raw.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls per block")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--hog", type=int, default=0, metavar="N",
                        help="N busy-loop processes while measuring (one per core: a busy "
                             "machine)")
    options = parser.parse_args()
    report: dict[str, Any] = {"machine": machine(), "calls": options.calls,
                              "blocks": options.blocks, "hog": options.hog, "layers": {}}
    print(f"machine: {report['machine']}", flush=True)
    cpu = measure(options.calls, options.blocks, options.hog)
    base = statistics.median(cpu["expert"])
    before = base
    print(f"\none episode, {options.calls} sequential calls of {TOOL} per block, median of "
          f"{options.blocks} interleaved blocks; client CPU per call"
          + (f"; {options.hog} busy-loop processes alongside" if options.hog else ""))
    print(f"  {'layer':26} {'CPU us':>7} {'vs expert':>9} {'+us':>6}")
    for name in LAYERS:
        median = statistics.median(cpu[name])
        row = {"cpu_us_per_call": round(median * 1e6, 1),
               "ratio_vs_expert": round(base / median, 3),
               "added_us": round((median - before) * 1e6, 1)}
        report["layers"][name] = row
        print(f"  {name:26} {row['cpu_us_per_call']:7.0f} {row['ratio_vs_expert']:9.3f} "
              f"{row['added_us'] if name != 'expert' else '':>6}")
        before = median
    print("  a hand-off alone, for comparison with the step's:")
    report["hand_offs"] = {}
    for name in HAND_OFFS:
        report["hand_offs"][name] = round(statistics.median(cpu[name]) * 1e6, 1)
        print(f"  {name:34} {report['hand_offs'][name]:7.0f} us")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
