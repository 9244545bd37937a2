"""``fleetenv report``: the summary of a results file written by ``run`` or ``demo``.

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


def add_parser(subparsers: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help_text, description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results", type=Path, metavar="RESULTS.jsonl",
                        help="a results file written by 'fleetenv run' or 'fleetenv demo'")
    parser.add_argument("--k", type=positive_int, action="append", default=None, metavar="K",
                        dest="ks", help="report pass@K (repeat for several, e.g. --k 1 --k 3)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    from fleetenv.rollouts.metrics import summarize
    from fleetenv.rollouts.results import read_results

    if not args.results.is_file():
        raise ConfigurationError("results file not found", file=str(args.results),
                                 hint="pass the .jsonl path that 'fleetenv run' printed")
    results = read_results(args.results)
    if not results:
        raise ConfigurationError("the results file has no results", file=str(args.results),
                                 hint="it is written as episodes finish; was the run "
                                 "interrupted before the first one?")
    per_task = Counter(r.task_key for r in results)
    fewest = min(per_task.values())
    ks = tuple(sorted(set(args.ks))) if args.ks else tuple(sorted({1, fewest}))
    summary = summarize(results, ks=ks)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        print(summary.format_table())
    return 0
