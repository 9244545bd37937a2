"""RayRunner throughput by node count: the same batch on one Ray node and spread over N.

A Ray cluster of N nodes on this machine (``ray.cluster_utils.Cluster``: a raylet each,
``--cpus-per-node`` CPUs, the object store capped), and one LocalFleet in a SEPARATE
PROCESS (as Fleet would be), which every node reaches on 127.0.0.1. Each round runs the
same batch (every bundled tool-use task, ``--samples`` times, reference policy, end to
end) through ``RayRunner(workers=W, per_worker=P)``, twice:

  (1) its W workers all on the head node (a resource only the head node has);
  (N) its W workers spread over the N nodes (RayRunner's own placement).

Rounds alternate the order. The clock runs from the workers being up to the last result.
Reported per node count: median batch seconds and episodes per second, and the ratio
(N)/(1) of episodes per second. On one machine the nodes share its cores, so this measures
what spreading costs (a ratio near 1.0), not what more machines add.

    python tests/benchmarks/bench_ray_nodes.py [--nodes 2] [--workers 4] [--rounds 3]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from fleetenv import bundled_tasks_path, runtime
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.event_bus import EventBus
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import ScriptedPolicy
from fleetenv.rollouts.ray_runner import RayRunner

REFERENCE = ScriptedPolicy.reference()
#: A resource only the head node has: asking for a sliver of it pins a worker there.
HEAD_ONLY = "bench_head_node"


def batch(config: FleetConfig, tasks: list[Task], options: argparse.Namespace,
          worker_options: dict[str, Any]) -> float:
    """One batch: wall seconds from the workers being up to the last result. Exits if any
    episode fails."""
    with RayRunner(workers=options.workers, per_worker=options.per_worker, config=config,
                   events=EventBus(sinks=[]), progress=False,
                   worker_options=worker_options) as runner:
        runner.worker_pids()  # the workers are up
        started = time.perf_counter()
        results = list(runner.run(tasks, REFERENCE, samples_per_task=options.samples))
        wall = time.perf_counter() - started
    failed = [r for r in results if r.error is not None or r.reward != 1.0]
    if failed or len(results) != len(tasks) * options.samples:
        example = failed[0] if failed else None
        raise SystemExit(f"batch failed: {len(failed)} bad of {len(results)}; e.g. "
                         f"{example and example.task_key}: error={example and example.error}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--per-worker", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--object-store-mb", type=int, default=80)
    options = parser.parse_args()
    if options.nodes < 2:
        parser.error("--nodes must be at least 2 (one node is the baseline)")

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": options.cpus_per_node,
            "object_store_memory": options.object_store_mb * 1024 * 1024}
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"]
    variants = {1: {"resources": {HEAD_ONLY: 0.001}}, options.nodes: {}}
    walls: dict[int, list[float]] = {count: [] for count in variants}
    cluster = Cluster(initialize_head=True, head_node_args={
        **node, "include_dashboard": False, "resources": {HEAD_ONLY: 1}})
    try:
        for _ in range(options.nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        with LocalFleet(in_process=False) as fleet:
            config = resolve_config(api_key=fleet.token, base_url=fleet.base_url)
            batch(config, tasks[:2], argparse.Namespace(**{**vars(options), "samples": 1}),
                  {})  # warm up: imports, first instances, verifier workers
            for index in range(options.rounds):
                order = list(variants) if index % 2 == 0 else list(reversed(variants))
                for count in order:
                    walls[count].append(batch(config, tasks, options, variants[count]))
                print(f"round {index + 1}: " + ", ".join(
                    f"{count} node(s) {walls[count][-1]:.2f} s" for count in variants),
                    flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        runtime.shutdown()

    episodes = len(tasks) * options.samples
    rows = {str(count): {"batch_s": round(statistics.median(w), 3),
                         "episodes_per_s": round(episodes / statistics.median(w), 2)}
            for count, w in walls.items()}
    ratio = rows[str(options.nodes)]["episodes_per_s"] / rows["1"]["episodes_per_s"]
    print(f"\nworkload: {episodes} episodes ({len(tasks)} tool-use tasks x {options.samples}),"
          f" RayRunner(workers={options.workers}, per_worker={options.per_worker}); "
          f"median of {options.rounds} interleaved rounds; {os.cpu_count()} cores shared "
          "by every node")
    for count, row in rows.items():
        print(f"({count}) {count} node(s): {row['batch_s']:7.2f} s per batch, "
              f"{row['episodes_per_s']:6.2f} episodes/s")
    print(f"ratio ({options.nodes})/(1), episodes per second: {ratio:.2f}")
    print(json.dumps({"episodes": episodes, "workers": options.workers,
                      "per_worker": options.per_worker, "nodes": rows,
                      "ratio_vs_one_node": round(ratio, 2)}))


if __name__ == "__main__":
    main()
