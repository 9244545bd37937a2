"""``fleetenv report RUN.jsonl --html report.html``: one self-contained HTML page (what
it shows, top to bottom: docs/reports.md). Inline CSS, inline SVG, one small inline
script: it opens offline and loads nothing (its Content-Security-Policy forbids any fetch).
"""

from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

from fleetenv.core.redaction import scrub_secrets
from fleetenv.core.rendering import OUTCOMES, ImageBudget, outcome_of, render_transcript
from fleetenv.core.types import RolloutResult
from fleetenv.reports.assets import CSS, SCRIPT, content_security_policy
from fleetenv.reports.data import RunData
from fleetenv.reports.plots import Bar, bar_chart, histogram
from fleetenv.rollouts.metrics import percentile, summarize

__all__ = ["MAX_IMAGE_MB", "page", "render_html", "write_html"]

#: Default megabytes of screenshots a report embeds (``fleetenv report --max-image-mb``).
MAX_IMAGE_MB = 50.0


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def page(title: str, body: str) -> str:
    """The page shell every report uses (inline CSS, the one script, the CSP), without
    any secret this process registered (a report written by the run that echoed it)."""
    return scrub_secrets(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{content_security_policy()}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main><script>{SCRIPT}</script></body></html>\n")


def render_html(run: RunData, *, max_image_mb: float = MAX_IMAGE_MB) -> str:
    """The whole report page for ``run``, with at most ``max_image_mb`` of screenshots
    (in episode order; the rest are notes, and the summary says how many)."""
    images = ImageBudget(int(max_image_mb * 1e6))
    episodes = _episodes(run, images)
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"<h1>fleetenv report: {escape(run.name)}</h1>",
        f'<p class="sub">{len(run.results)} episodes over {len(run.tasks)} tasks · '
        f"generated {escape(generated)}</p>",
        _summary(run),
        _skipped_images(images),
        _manifest(run.manifest),
        "<h2>Tasks</h2>",
        '<p class="note">Click a task to show its episodes.</p>',
        _task_table(run),
        "<h2>Distributions</h2>",
        _plots(run),
        episodes,
    ]
    return page(f"fleetenv report: {run.name}", "".join(body))


def write_html(run: RunData, path: str | os.PathLike[str], *,
               max_image_mb: float = MAX_IMAGE_MB) -> Path:
    """Write the report for ``run`` to ``path`` (parents created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(run, max_image_mb=max_image_mb), encoding="utf-8")
    return out


def _skipped_images(images: ImageBudget) -> str:
    if not images.skipped:
        return ""
    return (f'<p class="note">{images.skipped} screenshot(s) not embedded: the page holds '
            f"at most {images.max_bytes / 1e6:g} MB of them (<code>--max-image-mb</code> "
            "sets it). The results file has them all.</p>")


def _card(value: str, key: str, ident: str = "") -> str:
    attr = f' id="{ident}"' if ident else ""
    return (f'<div class="card"><div class="v"{attr}>{escape(value)}</div>'
            f'<div class="k">{escape(key)}</div></div>')


def _ks(run: RunData) -> tuple[int, ...]:
    per_task = Counter(r.task_key for r in run.results)
    return tuple(sorted({1, min(per_task.values())}))


def _summary(run: RunData) -> str:
    summary = summarize(run.results, ks=_ks(run))
    outcomes = run.outcomes()
    cards = [
        _card(str(summary.rollouts), "episodes", "count-episodes"),
        _card(str(summary.tasks), "tasks", "count-tasks"),
        _card(str(outcomes["passed"]), "passed", "count-passed"),
        _card(str(outcomes["failed"]), "failed", "count-failed"),
        _card(str(outcomes["ungraded"]), "ungraded", "count-ungraded"),
        _card(str(outcomes["error"]), "errors", "count-error"),
        _card(_pct(summary.pass_rate), f"pass rate ({summary.passed}/{summary.graded} graded)"),
        _card(_num(summary.mean_reward), "mean reward (graded)"),
    ]
    cards += [_card(_num(p.value), p.label) for p in summary.pass_at_k]
    cards.append(_card(_pct(summary.tool_error_rate),
                       f"tool-error rate ({summary.tool_errors}/{summary.tool_calls})"))
    cards.append(_card(_secs(summary.total_s.p50), "episode time p50"))
    return f'<div class="cards">{"".join(cards)}</div>'


def _manifest(manifest: dict[str, Any] | None) -> str:
    if not manifest:
        return ('<p class="note">This results file has no run manifest (versions, task '
                "file hash, policy settings).</p>")
    rows = []
    for key, value in manifest.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                                default=str, sort_keys=True)
        rows.append(f"<dt>{escape(str(key))}</dt><dd>{escape(text)}</dd>")
    return (f'<details><summary>Run manifest</summary><dl class="meta">{"".join(rows)}'
            "</dl></details>")


def _task_table(run: RunData) -> str:
    head = ("<tr><th>task</th><th>episodes</th><th>passed / graded</th><th>pass rate</th>"
            "<th>mean reward</th><th>variance</th><th>errors</th><th>tool errors</th>"
            "<th>mean time</th></tr>")
    rows = []
    for t in run.tasks:
        css = "good" if t.pass_rate == 1.0 else "bad" if t.pass_rate == 0.0 or (
            t.graded == 0 and t.errors) else ""
        key = escape(t.task_key, quote=True)
        rows.append(
            f'<tr class="task-row {css}" data-task="{key}"><td>{escape(t.task_key)}</td>'
            f"<td>{t.episodes}</td><td>{t.passed} / {t.graded}</td><td>{_pct(t.pass_rate)}</td>"
            f"<td>{_num(t.mean_reward)}</td><td>{_num(t.reward_variance)}</td>"
            f"<td>{t.errors}</td><td>{t.tool_errors}</td><td>{_secs(t.mean_time_s)}</td></tr>")
    return f'<table id="tasks">{head}{"".join(rows)}</table>'


def _plots(run: RunData) -> str:
    rewards = [r.reward for r in run.results if r.graded and r.reward is not None]
    in_unit = all(0.0 <= r <= 1.0 for r in rewards)
    times = [r.timings["total_s"] for r in run.results if "total_s" in r.timings]
    charts = [
        histogram(rewards, title="Reward (graded episodes)", bins=10,
                  lo=0.0 if in_unit else None, hi=1.0 if in_unit else None),
        histogram(times, title="Episode time", unit=" s", bins=12),
        bar_chart([Bar(t.name, t.calls, t.errors,
                       f"{t.calls} calls, {t.errors} errors ({_pct(t.error_rate)})")
                   for t in run.tools], title="Tool calls and errors per tool",
                  legend=("calls", "errors")),
    ]
    timed = [t for t in run.tools if t.latencies_s]
    if timed:
        charts.append(bar_chart(
            [Bar(t.name, percentile(t.latencies_s, 50), 0.0,
                 f"p50 {percentile(t.latencies_s, 50):.3f} s, "
                 f"p90 {percentile(t.latencies_s, 90):.3f} s")
             for t in sorted(timed, key=lambda t: -percentile(t.latencies_s, 50))],
            title="Tool latency per tool (p50)"))
    else:
        charts.append('<figure class="plot"><figcaption>Tool latency per tool</figcaption>'
                      '<p class="empty">This results file has no tool timings (it was '
                      "written before they were recorded): pass the run's events file "
                      "(<code>--events EVENTS.jsonl</code>, written by a "
                      "<code>JsonlSink</code>) to chart them.</p></figure>")
    return f'<div class="plots">{"".join(charts)}</div>'


def _episodes(run: RunData, images: ImageBudget) -> str:
    task_options = "".join(f'<option value="{escape(t.task_key, quote=True)}">'
                           f"{escape(t.task_key)} ({t.episodes})</option>" for t in run.tasks)
    counts = run.outcomes()
    outcome_options = "".join(f'<option value="{o}">{o} ({counts[o]})</option>'
                              for o in OUTCOMES)
    head = (f'<h2 id="episodes">Episodes</h2><div class="filters">'
            f'<label>Task <select id="filter-task"><option value="">all tasks</option>'
            f"{task_options}</select></label>"
            f'<label>Outcome <select id="filter-outcome"><option value="">all outcomes</option>'
            f"{outcome_options}</select></label>"
            f'<span><span id="shown-count">{len(run.results)}</span> of '
            f"{len(run.results)} shown</span></div>")
    return head + "".join(_episode(index, r, images) for index, r in enumerate(run.results))


def _episode(index: int, result: RolloutResult, images: ImageBudget) -> str:
    outcome = outcome_of(result)
    total = result.timings.get("total_s")
    reward = "-" if result.reward is None else f"{result.reward:g}"
    summary = (f'<span class="badge {outcome}">{outcome}</span>'
               f"<strong>{escape(result.task_key)}</strong> · sample {result.sample} · "
               f"reward {escape(reward)} · {escape(str(result.stop_reason or '-'))} · "
               f"{result.turns} turns · {result.tool_calls} calls · {_secs(total)}")
    meta = {
        "rollout": result.rollout_id, "env": result.env_key, "instance": result.instance_id,
        "policy": result.policy, "grade": f"{result.grade_status}"
        + (f" ({result.grade_reason})" if result.grade_reason else ""),
        "final answer": result.final_answer,
        "timings": ", ".join(f"{k} {v:.3f} s" for k, v in result.timings.items()),
    }
    if result.partial_reward is not None:
        meta["partial reward"] = f"{result.partial_reward:g}"
    if result.app_scores:
        meta["app scores"] = ", ".join(f"{k} {v:g}" for k, v in result.app_scores.items())
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>"
                   for k, v in meta.items() if v not in (None, ""))
    parts = [f'<dl class="meta">{rows}</dl>']
    if result.error:
        parts.append(f'<div class="error-box"><strong>{escape(result.error.get("type", ""))}'
                     f"</strong><pre>{escape(result.error.get('message', ''))}</pre></div>")
    if result.tool_error_messages:
        items = "".join(f"<li>{escape(m)}</li>" for m in result.tool_error_messages)
        parts.append(f"<details><summary>Tool errors ({len(result.tool_error_messages)})"
                     f"</summary><ul>{items}</ul></details>")
    parts.append(render_transcript(result.transcript, result.tool_error_messages, images))
    verifier = []
    if result.verifier_stdout:
        verifier.append(f"<h4>verifier output</h4><pre>{escape(result.verifier_stdout)}</pre>")
    if result.verifier_error:
        verifier.append(f"<h4>verifier error</h4><pre>{escape(result.verifier_error)}</pre>")
    if verifier:
        parts.append(f'<div class="verifier">{"".join(verifier)}</div>')
    return (f'<details class="episode" id="episode-{index}" '
            f'data-task="{escape(result.task_key, quote=True)}" data-outcome="{outcome}">'
            f'<summary>{summary}</summary><div class="episode-body">{"".join(parts)}</div>'
            "</details>")
