"""A whole batch end to end: every bundled task once through ``Runner``, parallel vs serial.

Each episode is a full rollout with the reference policy: provision an instance, open its
MCP session, replay the reference solution, grade with the task's verifier, delete the
instance. The local Fleet runs in a SEPARATE PROCESS (``LocalFleet(in_process=False)``),
as a remote Fleet would, so its CPU does not compete with the runner's for this GIL.

  (a) ``Runner(workers=N)`` (default 8) over all bundled tasks (22 of them);
  (b) the baseline: ``Runner(workers=1)``, the same episodes one after another.

Rounds alternate the order (ab, ba, ...) so machine noise hits both alike. Reported: the
median batch wall time of each, the speedup (b)/(a), and the median episode time
(``RolloutResult.timings["total_s"]``) in each mode. The tests used to assert that (a)
finishes under 30 s; that is a property of the machine, so it is measured here.

    python tests/benchmarks/bench_runner_batch.py [--workers 8] [--rounds 3]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from fleetenv import bundled_tasks_path, runtime
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.event_bus import EventBus
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import ScriptedPolicy
from fleetenv.rollouts.runner import Runner

REFERENCE = ScriptedPolicy.reference()


def batch(config: FleetConfig, tasks: list[Task], workers: int) -> tuple[float, list[float]]:
    """One batch: (wall seconds, each episode's total seconds). Exits if any episode fails."""
    started = time.perf_counter()
    with Runner(workers=workers, config=config, events=EventBus(sinks=[]),
                progress=False) as runner:
        results = list(runner.run(tasks, REFERENCE))
    wall = time.perf_counter() - started
    failed = [r for r in results if r.error is not None or r.reward != 1.0]
    if failed or len(results) != len(tasks):
        example = failed[0] if failed else None
        raise SystemExit(f"batch with workers={workers} failed: {len(failed)} bad of "
                         f"{len(results)}; e.g. {example and example.task_key}: "
                         f"error={example and example.error} reward={example and example.reward}")
    return wall, [r.timings["total_s"] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()

    tasks = load_tasks(bundled_tasks_path())
    walls: dict[str, list[float]] = {"a": [], "b": []}
    episodes: dict[str, list[float]] = {"a": [], "b": []}
    workers = {"a": options.workers, "b": 1}
    with LocalFleet(in_process=False) as fleet:
        config = resolve_config(api_key=fleet.token, base_url=fleet.base_url)
        batch(config, tasks[:2], 2)  # warm up: imports, first instances, verifier workers
        for index in range(options.rounds):
            for variant in ("a", "b") if index % 2 == 0 else ("b", "a"):
                wall, totals = batch(config, tasks, workers[variant])
                walls[variant].append(wall)
                episodes[variant] += totals
            print(f"round {index + 1}: (a) {walls['a'][-1]:.2f} s, (b) {walls['b'][-1]:.2f} s",
                  flush=True)
    runtime.shutdown()

    a_s, b_s = statistics.median(walls["a"]), statistics.median(walls["b"])
    a_ep, b_ep = statistics.median(episodes["a"]), statistics.median(episodes["b"])
    print(f"\nworkload: {len(tasks)} bundled tasks, reference policy, end to end; "
          f"median of {options.rounds} interleaved rounds")
    print(f"(a) Runner(workers={options.workers}):  {a_s:7.2f} s per batch, "
          f"{a_ep:6.3f} s per episode")
    print(f"(b) Runner(workers=1):  {b_s:7.2f} s per batch, {b_ep:6.3f} s per episode")
    print(f"speedup (b)/(a): {b_s / a_s:.2f}x   episode slowdown under load (a)/(b): "
          f"{a_ep / b_ep:.2f}x")
    print(json.dumps({
        "tasks": len(tasks),
        "workers": options.workers,
        "parallel_batch_s": round(a_s, 3),
        "serial_batch_s": round(b_s, 3),
        "speedup": round(b_s / a_s, 2),
        "parallel_episode_s": round(a_ep, 3),
        "serial_episode_s": round(b_ep, 3),
    }))


if __name__ == "__main__":
    main()
