"""Reports on results files: an HTML page per run and the comparison of two runs, as
``fleetenv report`` makes them (docs/reports.md, with their use from Python).
"""

from __future__ import annotations

from fleetenv.core.rendering import OUTCOMES, outcome_of
from fleetenv.reports.compare import Comparison, TaskDelta, compare_runs
from fleetenv.reports.data import RunData, TaskStats, ToolStats, load_run
from fleetenv.reports.html import render_html, write_html

__all__ = [
    "OUTCOMES",
    "Comparison",
    "RunData",
    "TaskDelta",
    "TaskStats",
    "ToolStats",
    "compare_runs",
    "load_run",
    "outcome_of",
    "render_html",
    "write_html",
]
