"""``fleetenv evaluate``: score tasks with Fleet's harness jobs, k rollouts per model.

Each task of the file is imported, run as one job of ``--k`` rollouts per ``--model``,
polled to its end, and its per-model scores printed (mean over graded rollouts; a rollout
whose grade is unknown is counted apart, never as 0). ``--job ID`` collects a job started
earlier (one that outlived ``--timeout``) instead.

Runs on Fleet when ``FLEET_API_KEY`` is set, else on the embedded local Fleet, whose
harness has no LLM: its models are ``reference`` (replays the task's reference solution,
the default there) and ``noop`` (does nothing).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fleetenv.cli.run import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", metavar="TASKS", nargs="?", default=None,
                        help="task file: a JSON array, {\"tasks\": [...]} or JSONL")
    parser.add_argument("--k", type=positive_int, default=4, metavar="K",
                        help="rollouts per model (default 4)")
    parser.add_argument("--model", action="append", default=None, dest="models",
                        metavar="MODEL",
                        help="model to evaluate, e.g. anthropic/claude-sonnet-4.5 (repeat "
                        "for several; default: Fleet's default model, or 'reference' on the "
                        "local Fleet)")
    parser.add_argument("--task", action="append", default=None, dest="task_keys",
                        metavar="KEY", help="evaluate only this task (repeat for several)")
    parser.add_argument("--max-steps", type=positive_int, default=None, metavar="N",
                        help="agent steps per rollout (default: Fleet's)")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS",
                        help="give up waiting for one job after this long (default 1800); "
                        "the job keeps running and --job collects it later")
    parser.add_argument("--poll", type=float, default=10.0, metavar="SECONDS",
                        help="longest pause between two polls of a job (default 10)")
    parser.add_argument("--job", default=None, metavar="JOB_ID",
                        help="collect the results of this existing job instead")
    parser.add_argument("--json", action="store_true",
                        help="print each result as one JSON line")


def run(args: argparse.Namespace) -> int:
    from fleetenv.core.errors import ConfigurationError
    from fleetenv.core.task_files import load_tasks
    from fleetenv.core.tasks import select_tasks
    from fleetenv.fleet.evaluator import EvaluationResult, Evaluator

    evaluator = Evaluator(k=args.k, models=args.models, max_steps=args.max_steps,
                          timeout_s=args.timeout, poll_interval_s=args.poll)
    if args.job is not None:
        _show(evaluator.wait(args.job), as_json=args.json)
        return 0
    if args.tasks is None:
        raise ConfigurationError("name a task file (or --job ID)", field="TASKS",
                                 hint="fleetenv evaluate tasks.json --k 4")
    tasks = load_tasks(args.tasks)
    if args.task_keys:
        tasks = select_tasks(tasks, args.task_keys)
    results: list[EvaluationResult] = []
    for task in tasks:
        result = evaluator.evaluate(task)
        results.append(result)
        _show(result, as_json=args.json)
    return 0


def _show(result: Any, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_dict(), default=str), flush=True)
        return
    print(f"{result.task_key or '(job)'}  job {result.job_id}  {result.status}  "
          f"{result.seconds:.1f} s", flush=True)
    for scores in result.models.values():
        print(f"  {scores.line()}", flush=True)
