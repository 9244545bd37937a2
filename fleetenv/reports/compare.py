"""``fleetenv report A.jsonl B.jsonl``: what got better or worse from run A to run B.

Task by task: pass rate and mean reward in each run, their change, and a verdict (the
verdicts: docs/reports.md, "Comparing two runs"). When both results files carry a run
manifest, the fields that differ are listed as warnings above the table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from typing import Any

from fleetenv.reports.data import RunData, TaskStats
from fleetenv.reports.html import page

__all__ = ["Comparison", "TaskDelta", "compare_runs"]

#: Manifest fields that do not make two runs incomparable (they differ every run).
_PER_RUN_FIELDS = frozenset({
    "record", "started_at", "finished_at", "resumed", "run_tag", "command", "tasks_file",
    "task_keys", "results", "output",
})
#: A pass-rate or mean-reward move smaller than this is "same" (float noise).
_EPSILON = 1e-9


@dataclass(frozen=True)
class TaskDelta:
    """One task in both runs."""

    task_key: str
    a: TaskStats | None
    b: TaskStats | None
    verdict: str

    @property
    def pass_rate_delta(self) -> float | None:
        if self.a is None or self.b is None or None in (self.a.pass_rate, self.b.pass_rate):
            return None
        return float(self.b.pass_rate or 0.0) - float(self.a.pass_rate or 0.0)

    @property
    def reward_delta(self) -> float | None:
        if (self.a is None or self.b is None
                or None in (self.a.mean_reward, self.b.mean_reward)):
            return None
        return float(self.b.mean_reward or 0.0) - float(self.a.mean_reward or 0.0)


@dataclass
class Comparison:
    """The task-by-task comparison of run ``a`` (before) with run ``b`` (after)."""

    a: RunData
    b: RunData
    tasks: list[TaskDelta]
    warnings: list[str] = field(default_factory=list)

    def verdicts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for task in self.tasks:
            counts[task.verdict] = counts.get(task.verdict, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        def side(stats: TaskStats | None) -> dict[str, Any] | None:
            return None if stats is None else {
                "episodes": stats.episodes, "graded": stats.graded, "passed": stats.passed,
                "pass_rate": stats.pass_rate, "mean_reward": stats.mean_reward,
                "errors": stats.errors}
        return {
            "a": str(self.a.path), "b": str(self.b.path), "warnings": list(self.warnings),
            "verdicts": self.verdicts(),
            "tasks": [{"task_key": t.task_key, "verdict": t.verdict, "a": side(t.a),
                       "b": side(t.b), "pass_rate_delta": t.pass_rate_delta,
                       "reward_delta": t.reward_delta} for t in self.tasks],
        }

    def format_table(self) -> str:
        """The comparison as a text table (what ``fleetenv report A B`` prints)."""
        lines = [f"A: {self.a.path}  ({len(self.a.results)} episodes)",
                 f"B: {self.b.path}  ({len(self.b.results)} episodes)"]
        lines += [f"warning: {w}" for w in self.warnings]
        counts = self.verdicts()
        order = ("new failure", "worse", "better", "fixed", "same", "ungraded",
                 "only in A", "only in B")
        lines.append(", ".join(f"{counts[v]} {v}" for v in order if v in counts))
        lines.append("")
        header = ("task", "pass A", "pass B", "Δ pass", "reward A", "reward B", "Δ reward",
                  "verdict")
        rows = [header] + [(
            t.task_key, _pct(t.a.pass_rate if t.a else None),
            _pct(t.b.pass_rate if t.b else None), _signed_pct(t.pass_rate_delta),
            _num(t.a.mean_reward if t.a else None), _num(t.b.mean_reward if t.b else None),
            _signed(t.reward_delta), t.verdict) for t in self.tasks]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            cells = [row[0].ljust(widths[0])]
            cells += [cell.rjust(widths[i + 1]) for i, cell in enumerate(row[1:-1])]
            cells.append(row[-1])
            lines.append("  ".join(cells).rstrip())
        return "\n".join(lines)

    def render_html(self) -> str:
        """The comparison as a self-contained page (same shell as the run report)."""
        counts = self.verdicts()
        cards = "".join(
            f'<div class="card"><div class="v" id="count-{v.replace(" ", "-")}">{n}</div>'
            f'<div class="k">{escape(v)}</div></div>' for v, n in sorted(counts.items()))
        warnings = "".join(f'<p class="error-box">warning: {escape(w)}</p>'
                           for w in self.warnings)
        head = ("<tr><th>task</th><th>pass A</th><th>pass B</th><th>Δ pass</th>"
                "<th>reward A</th><th>reward B</th><th>Δ reward</th><th>verdict</th></tr>")
        rows = []
        for t in self.tasks:
            css = ("worse" if t.verdict in ("worse", "new failure")
                   else "better" if t.verdict in ("better", "fixed") else "")
            rows.append(
                f'<tr class="{css}" data-verdict="{escape(t.verdict, quote=True)}">'
                f"<td>{escape(t.task_key)}</td>"
                f"<td>{_pct(t.a.pass_rate if t.a else None)}</td>"
                f"<td>{_pct(t.b.pass_rate if t.b else None)}</td>"
                f"<td>{_signed_pct(t.pass_rate_delta)}</td>"
                f"<td>{_num(t.a.mean_reward if t.a else None)}</td>"
                f"<td>{_num(t.b.mean_reward if t.b else None)}</td>"
                f"<td>{_signed(t.reward_delta)}</td><td>{escape(t.verdict)}</td></tr>")
        body = (f"<h1>fleetenv comparison</h1><p class=\"sub\">A: {escape(str(self.a.path))} "
                f"({len(self.a.results)} episodes) → B: {escape(str(self.b.path))} "
                f"({len(self.b.results)} episodes)</p>{warnings}"
                f'<div class="cards">{cards}</div><h2>Tasks</h2>'
                f'<table id="compare">{head}{"".join(rows)}</table>')
        return page("fleetenv comparison", body)


def compare_runs(a: RunData, b: RunData) -> Comparison:
    """Compare run ``a`` (before) with run ``b`` (after), task by task; worst news first."""
    keys = sorted({t.task_key for t in a.tasks} | {t.task_key for t in b.tasks})
    deltas = [TaskDelta(key, a.task(key), b.task(key), _verdict(a.task(key), b.task(key)))
              for key in keys]
    rank = {"new failure": 0, "worse": 1, "fixed": 2, "better": 3, "ungraded": 4,
            "only in A": 5, "only in B": 6, "same": 7}
    deltas.sort(key=lambda d: (rank.get(d.verdict, 9), d.task_key))
    return Comparison(a=a, b=b, tasks=deltas, warnings=_warnings(a, b))


def _verdict(a: TaskStats | None, b: TaskStats | None) -> str:
    if a is None:
        return "only in B"
    if b is None:
        return "only in A"
    if a.pass_rate is None or b.pass_rate is None:
        return "ungraded"
    if a.passed and not b.passed:
        return "new failure"
    if not a.passed and b.passed:
        return "fixed"
    move = b.pass_rate - a.pass_rate
    if abs(move) <= _EPSILON:
        move = (b.mean_reward or 0.0) - (a.mean_reward or 0.0)
    if move > _EPSILON:
        return "better"
    if move < -_EPSILON:
        return "worse"
    return "same"


def _warnings(a: RunData, b: RunData) -> list[str]:
    warnings = []
    only_a = {t.task_key for t in a.tasks} - {t.task_key for t in b.tasks}
    only_b = {t.task_key for t in b.tasks} - {t.task_key for t in a.tasks}
    if only_a or only_b:
        warnings.append(f"the runs did not run the same tasks ({len(only_a)} only in A, "
                        f"{len(only_b)} only in B)")
    if a.manifest is None or b.manifest is None:
        missing = " and ".join(n for n, r in (("A", a), ("B", b)) if r.manifest is None)
        warnings.append(f"no run manifest in {missing}: cannot check that the runs used the "
                        "same task file, versions and settings")
        return warnings
    left_fields, right_fields = _flat(a.manifest), _flat(b.manifest)
    for key in sorted(set(left_fields) | set(right_fields)):
        left, right = left_fields.get(key), right_fields.get(key)
        if left != right:
            warnings.append(f"{key} differs: A {_short(left)}, B {_short(right)}")
    return warnings


def _flat(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's comparable fields, nested objects one level down as ``a.b``."""
    flat: dict[str, Any] = {}
    for key, value in manifest.items():
        if key in _PER_RUN_FIELDS:
            continue
        if isinstance(value, dict):
            flat.update({f"{key}.{sub}": item for sub, item in value.items()})
        else:
            flat[key] = value
    return flat


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _signed_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.0f} pt"
