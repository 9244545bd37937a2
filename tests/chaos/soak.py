"""Soak: thousands of episodes back to back; does this process grow?

    python tests/chaos/soak.py --episodes 2000 [--workers 4]

Episodes replay the bundled tasks' reference solutions through the runner against a
``LocalFleet`` in a separate process (so only fleetenv's own memory is measured). Resident
memory (VmRSS) and open file descriptors of this process are sampled after every tenth of
the run. The target is no growth trend: from the end of the first quarter (warm: imports,
pools and caches filled) to the end, growth under 20 MB and under 10 descriptors.

The LAST line is JSON: ``{"episodes", "rss_mb": {"start", "quarter", "middle", "end"},
"fds": {...}, "rss_growth_mb", "fd_growth", "failed", "passed"}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from itertools import cycle, islice

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.core.event_bus import EventBus
from fleetenv.local import LocalFleet
from fleetenv.rollouts.runner import Runner

RSS_LIMIT_MB = 20.0
FD_LIMIT = 10


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> int:
    parser = argparse.ArgumentParser(description="fleetenv soak test")
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    tasks = [t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use"]
    samples: dict[str, tuple[float, int]] = {}
    checkpoints = {0: "start", args.episodes // 4: "quarter", args.episodes // 2: "middle"}
    failed = 0
    started = time.monotonic()

    def sample(label: str) -> None:
        gc.collect()
        samples[label] = (rss_mb(), open_fds())
        rss, fds = samples[label]
        print(f"{label:>8}: {rss:8.1f} MB  {fds:4d} fds  "
              f"({time.monotonic() - started:6.1f} s)", flush=True)

    with LocalFleet(in_process=False) as fleet:
        config = fleetenv.resolve_config(api_key=fleet.token, base_url=fleet.base_url)
        # No event sinks: the soak measures fleetenv, not a log handler's buffers. The
        # bus still does its per-rollout accounting, which is part of what is measured.
        done = 0
        sample("start")
        chunk = max(1, args.episodes // 10)
        with Runner(workers=args.workers, config=config, progress=False,
                    events=EventBus(sinks=[])) as runner:
            while done < args.episodes:
                batch = list(islice(cycle(tasks), done, done + min(chunk, args.episodes - done)))
                for result in runner.run(batch, "reference"):
                    failed += not result.passed
                done += len(batch)
                for at, label in checkpoints.items():
                    if done - len(batch) < at <= done and label not in samples:
                        sample(label)
        sample("end")
    start_rss, start_fds = samples["quarter"]
    end_rss, end_fds = samples["end"]
    summary = {
        "episodes": args.episodes,
        "rss_mb": {k: round(v[0], 1) for k, v in samples.items()},
        "fds": {k: v[1] for k, v in samples.items()},
        "rss_growth_mb": round(end_rss - start_rss, 1),
        "fd_growth": end_fds - start_fds,
        "failed": failed,
        "wall_s": round(time.monotonic() - started, 1),
    }
    summary["passed"] = (summary["rss_growth_mb"] < RSS_LIMIT_MB
                         and summary["fd_growth"] < FD_LIMIT and failed == 0)
    print(json.dumps(summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
