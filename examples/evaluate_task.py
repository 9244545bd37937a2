"""Score a task with Fleet's harness jobs: k rollouts per model, per-model scores.

Runs on the embedded local Fleet when FLEET_API_KEY is not set (no account needed):

    python examples/evaluate_task.py

The evaluator imports the task (prompt, verifier, environment), starts one harness job
of k rollouts for each model, polls it with backoff until it ends or the deadline
passes, and reads each rollout's verifier score. Fleet runs real models in its harness;
the local Fleet has no LLM, so its harness offers two stand-ins: ``reference`` replays
the task's reference solution and ``noop`` does nothing. On Fleet, name real models,
e.g. ``models=["anthropic/claude-sonnet-4.5"]``.
"""

from __future__ import annotations

import sys

import fleetenv
from fleetenv import bundled_tasks_path

TASK_KEY = "helpdesk-assign-api-ticket"


def main() -> int:
    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.key == TASK_KEY)
    print(f"task {task.key}: {task.prompt}\n")

    result = fleetenv.evaluate_task(task, k=4, models=["reference", "noop"],
                                    poll_interval_s=1.0, timeout_s=120)
    print(f"job {result.job_id} {result.status} in {result.seconds:.1f} s "
          f"({result.num_sessions} rollouts, {result.num_errors} without a score)")
    for scores in result.models.values():
        # A rollout whose grade is unknown has score None: counted apart, never as 0.0.
        print(" ", scores.line())
    return 0 if result.models["reference"].mean == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
