"""``fleetenv report``: look at a run, or compare two.

``fleetenv report RUN.jsonl`` prints the summary and a per-task table;
``--html report.html`` also writes one self-contained page (summary, per-task table,
reward / episode-time / per-tool charts, every episode's transcript, filterable by task
and outcome). ``fleetenv report A.jsonl B.jsonl`` compares run A with run B task by task
(pass rate and mean reward deltas, new failures), as text, or as a page with ``--html``.

pass@k is the unbiased estimate from each task's n graded samples (the chance that at
least one of k samples drawn from the n passes, i.e. has reward 1.0), averaged over the
tasks with at least k graded samples. Without ``--k`` it reports pass@1 and pass@n for
the smallest n any task ran.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from fleetenv.cli.run import positive_int
from fleetenv.core.errors import ConfigurationError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, nargs="+", metavar="RESULTS.jsonl",
                        help="a results file written by 'fleetenv run' or 'fleetenv demo'; "
                        "two files: compare the first run (A) with the second (B)")
    parser.add_argument("--k", type=positive_int, action="append", default=None, metavar="K",
                        dest="ks", help="report pass@K (repeat for several, e.g. --k 1 --k 3)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--html", type=Path, default=None, metavar="REPORT.html",
                        help="also write a self-contained HTML report to this file")
    parser.add_argument("--max-image-mb", type=non_negative_float, default=None,
                        metavar="MB", help="screenshots the HTML report embeds, at most "
                        "(default 50; 0: none); past it, a note per screenshot")
    parser.add_argument("--events", type=Path, action="append", default=None,
                        metavar="EVENTS.jsonl",
                        help="the run's events file (a JsonlSink's), for per-tool "
                        "latencies; with two runs, give it twice (A's, then B's)")


def non_negative_float(text: str) -> float:
    """argparse type: a finite number of at least 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number of at least 0")
    return value


def run(args: argparse.Namespace) -> int:
    from fleetenv.reports import load_run

    files: list[Path] = list(args.results)
    if len(files) > 2:
        raise ConfigurationError(f"report takes one results file or two, got {len(files)}",
                                 hint="fleetenv report RUN.jsonl, or fleetenv report "
                                 "A.jsonl B.jsonl to compare two runs")
    events: list[Path] = list(args.events or [])
    if len(events) > len(files):
        raise ConfigurationError(f"{len(events)} --events files for {len(files)} results "
                                 "file(s)", hint="give at most one --events per results file, "
                                 "in the same order")
    runs = [load_run(file, events=events[i] if i < len(events) else None)
            for i, file in enumerate(files)]
    if len(runs) == 2:
        return _compare(runs[0], runs[1], args)
    return _report(runs[0], args)


def _report(run_data: Any, args: argparse.Namespace) -> int:
    from fleetenv.reports import write_html
    from fleetenv.rollouts.metrics import summarize

    results = run_data.results
    per_task = Counter(r.task_key for r in results)
    fewest = min(per_task.values())
    ks = tuple(sorted(set(args.ks))) if args.ks else tuple(sorted({1, fewest}))
    summary = summarize(results, ks=ks)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        print(summary.format_table())
        print()
        print(_task_table(run_data))
    if args.html is not None:
        from fleetenv.reports.html import MAX_IMAGE_MB

        limit = MAX_IMAGE_MB if args.max_image_mb is None else args.max_image_mb
        written = write_html(run_data, args.html, max_image_mb=limit)
        print(f"HTML report: {written}")
    return 0


def _compare(a: Any, b: Any, args: argparse.Namespace) -> int:
    from fleetenv.reports import compare_runs

    comparison = compare_runs(a, b)
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2, sort_keys=True))
    else:
        print(comparison.format_table())
    if args.html is not None:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(comparison.render_html(), encoding="utf-8")
        print(f"HTML comparison: {args.html}")
    return 0


def _task_table(run_data: Any) -> str:
    header = ("task", "episodes", "passed", "pass", "reward", "variance", "errors", "time")
    rows = [header]
    for t in run_data.tasks:
        rows.append((t.task_key, str(t.episodes), f"{t.passed}/{t.graded}",
                     "-" if t.pass_rate is None else f"{t.pass_rate:.0%}",
                     "-" if t.mean_reward is None else f"{t.mean_reward:.3f}",
                     "-" if t.reward_variance is None else f"{t.reward_variance:.3f}",
                     str(t.errors),
                     "-" if t.mean_time_s is None else f"{t.mean_time_s:.2f} s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join([row[0].ljust(widths[0])]
                  + [cell.rjust(widths[i + 1]) for i, cell in enumerate(row[1:])]).rstrip()
        for row in rows)
