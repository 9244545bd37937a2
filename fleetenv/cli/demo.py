"""``fleetenv demo``: every bundled task, several samples each, on the embedded local Fleet.

This is the end-to-end check for a fresh machine: no account, no key, no model. It starts
the embedded local Fleet, plays each bundled task's reference solution N times in
parallel (provision an instance, open MCP, call the tools, grade with the task's verifier,
delete the instance), prints the summary table and writes one JSON line per episode.

It exits 0 only when every bundled task was solved in every sample (reward 1.0), else 1
and names the tasks that were not. The bundled tasks exist only on the local Fleet, so a
``FLEET_API_KEY`` in the environment is ignored here (use ``fleetenv run`` for Fleet).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from fleetenv.cli.run import add_run_options

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.config import FleetConfig
    from fleetenv.core.types import RolloutResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser, samples_default=3)


def run(args: argparse.Namespace) -> int:
    from fleetenv.cli.run import execute
    from fleetenv.core.task_files import bundled_tasks_path, load_tasks
    from fleetenv.rollouts.policy_spec import PolicySpec

    config = demo_config()
    tasks = load_tasks(bundled_tasks_path())
    print(f"running {len(tasks)} bundled task(s) x {args.samples} sample(s), "
          f"{args.workers} in parallel, with the reference policy on the embedded local "
          "Fleet", file=sys.stderr)
    results, _ = execute(tasks, PolicySpec("reference"), config=config, samples=args.samples,
                         workers=args.workers, out=args.out, max_steps=None, command="demo")
    unsolved = unsolved_tasks([task.key for task in tasks], results, args.samples)
    if unsolved:
        print(f"{len(unsolved)} of {len(tasks)} bundled task(s) not solved in every sample: "
              + ", ".join(unsolved), file=sys.stderr)
        for key, why in unsolved.items():
            print(f"  {key}: {why}", file=sys.stderr)
        return 1
    print(f"all {len(tasks)} bundled tasks solved in all {args.samples} sample(s)")
    return 0


def demo_config() -> FleetConfig:
    """Always the embedded local Fleet: the bundled tasks exist nowhere else.

    A ``FLEET_API_KEY`` in the environment is ignored (with a note on stderr), and so is
    ``FLEET_BASE_URL``: the demo must not quietly run against a real Fleet account.
    """
    from fleetenv.core.config import ENV_API_KEY, resolve_config

    if os.environ.get(ENV_API_KEY, "").strip():
        print(f"note: {ENV_API_KEY} is set, but the demo's tasks exist only on the embedded "
              "local Fleet, so it runs there; use 'fleetenv run' for Fleet", file=sys.stderr)
    start_local_fleet_quietly()
    return resolve_config(use_local=True, environ={})


def start_local_fleet_quietly() -> None:
    """Start the embedded local Fleet without its "no Fleet API key configured" notice:
    the demo runs locally by design (with or without a key, see the note above), and its
    own first line already says where it runs."""
    from fleetenv.fleet.backend import local_fleet

    logger = logging.getLogger("fleetenv")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        local_fleet()
    finally:
        logger.setLevel(level)


def unsolved_tasks(keys: list[str], results: list[RolloutResult],
                   samples: int) -> dict[str, str]:
    """Task key -> why it is not solved, for each task short of ``samples`` passes."""
    passes = dict.fromkeys(keys, 0)
    why: dict[str, str] = {}
    for result in results:
        if result.passed:
            passes[result.task_key] = passes.get(result.task_key, 0) + 1
        elif result.task_key not in why:
            reason = ((result.error or {}).get("message") or result.grade_reason
                      or f"reward {result.reward}")
            why[result.task_key] = f"sample {result.sample}: {reason}"
    return {key: why.get(key, f"{passes[key]} of {samples} sample(s) finished")
            for key in keys if passes[key] < samples}
