"""Rich display in Jupyter and IPython: ``_repr_html_`` / ``_repr_png_`` bodies.

An observation shows its step, tool, error and text, with screenshots as images; a
rollout result shows its outcome, reward, timings, error and a collapsible transcript; a
summary shows its table. The classes' ``_repr_*_`` methods call these (imported lazily,
so ``import fleetenv`` stays cheap). Everything is escaped: transcripts are untrusted.
Inline styles only: a notebook may drop ``<style>`` blocks and must not be restyled.
"""

from __future__ import annotations

import base64
import binascii
from html import escape
from typing import TYPE_CHECKING, Any

from fleetenv.core.redaction import scrub_secrets
from fleetenv.reports.transcript import render_transcript, safe_image_url

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.types import Observation, RolloutResult
    from fleetenv.rollouts.metrics import Summary

__all__ = ["image_bytes", "observation_html", "result_html", "summary_html"]

_BOX = ("font-family:system-ui,sans-serif;font-size:13px;border:1px solid #dde1ea;"
        "border-radius:6px;padding:6px 10px;max-width:960px")
_PRE = ("white-space:pre-wrap;max-height:300px;overflow:auto;background:#f8f9fb;"
        "padding:4px 6px;margin:4px 0;font-size:12px")
_COLORS = {"passed": "#1a7f37", "failed": "#c62828", "ungraded": "#9a6700",
           "error": "#8250df"}
_TEXT_CHARS = 4000


def image_bytes(content: list[dict[str, Any]], mime: str) -> bytes | None:
    """The last inline image of type ``mime`` (``image/png``, ``image/jpeg``) in chat
    content parts, decoded; ``None`` when there is none."""
    prefix = f"data:{mime};base64,"
    for part in reversed(content):
        if not isinstance(part, dict) or part.get("type") != "image_url":
            continue
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str) and url.startswith(prefix):
            try:
                return base64.b64decode(url[len(prefix):], validate=False)
            except (binascii.Error, ValueError):
                return None
    return None


def _badge(text: str, color: str) -> str:
    return (f'<span style="background:{color};color:#fff;border-radius:9px;padding:0 7px;'
            f'font-size:11px">{escape(text)}</span>')


def observation_html(obs: Observation) -> str:
    """One observation: what step, which tool, whether it failed, its text and images."""
    head = [f"<b>{escape(obs.task_key)}</b>", f"step {obs.step}"]
    if obs.tool_name:
        head.append(f"tool <code>{escape(obs.tool_name)}</code>")
    if obs.is_error:
        head.append(_badge("error", "#c62828"))
    parts = [f'<div style="{_BOX}"><div>{" · ".join(head)}</div>']
    if obs.step == 0 and obs.prompt:
        parts.append(f'<pre style="{_PRE}">{escape(obs.prompt[:_TEXT_CHARS])}</pre>')
    if obs.error:
        parts.append(f'<div style="color:#c62828">{escape(obs.error[:_TEXT_CHARS])}</div>')
    if obs.parse_error:
        parts.append(f'<div style="color:#c62828">{escape(obs.parse_error[:_TEXT_CHARS])}'
                     "</div>")
    for part in obs.content:
        if part.get("type") == "text":
            text = str(part.get("text", ""))
            cut = f"\n… ({len(text) - _TEXT_CHARS} more characters)" if len(
                text) > _TEXT_CHARS else ""
            parts.append(f'<pre style="{_PRE}">{escape(text[:_TEXT_CHARS] + cut)}</pre>')
        elif part.get("type") == "image_url":
            image = part.get("image_url")
            url = safe_image_url(image.get("url") if isinstance(image, dict) else image)
            if url is not None:
                parts.append(f'<img style="max-width:100%;max-height:480px" alt="screenshot" '
                             f'src="{escape(url, quote=True)}">')
    if not obs.content and obs.step:
        parts.append('<div style="color:#5d6678">(no content)</div>')
    count = len(obs.tools)
    parts.append(f'<div style="color:#5d6678;font-size:11px">{count} '
                 f'tool{"" if count == 1 else "s"} offered</div></div>')
    return "".join(parts)


def result_html(result: RolloutResult) -> str:
    """One rollout: outcome, reward, counters, timings, error, then its transcript."""
    from fleetenv.reports.data import outcome_of

    outcome = outcome_of(result)
    reward = "-" if result.reward is None else f"{result.reward:g}"
    line = (f"{_badge(outcome, _COLORS[outcome])} <b>{escape(result.task_key)}</b> · "
            f"sample {result.sample} · reward {escape(reward)} · "
            f"{escape(str(result.stop_reason or '-'))} · {result.turns} turns · "
            f"{result.tool_calls} calls, {result.tool_errors} tool errors")
    timings = ", ".join(f"{escape(k)} {v:.2f} s" for k, v in result.timings.items())
    parts = [f'<div style="{_BOX}"><div>{line}</div>']
    if timings:
        parts.append(f'<div style="color:#5d6678;font-size:12px">{timings}</div>')
    if result.error:
        parts.append(f'<div style="color:#c62828">{escape(result.error.get("type", ""))}: '
                     f"{escape(result.error.get('message', '')[:_TEXT_CHARS])}</div>")
    if result.verifier_stdout or result.verifier_error:
        text = (result.verifier_stdout or "") + (result.verifier_error or "")
        parts.append(f"<details><summary>verifier output</summary>"
                     f'<pre style="{_PRE}">{escape(text[:_TEXT_CHARS])}</pre></details>')
    if result.transcript:
        parts.append(f"<details><summary>transcript ({len(result.transcript)} messages)"
                     f"</summary>{render_transcript(result.transcript, result.tool_error_messages)}"
                     "</details>")
    parts.append("</div>")
    return scrub_secrets("".join(parts))  # like repr(result): no registered secret


def summary_html(summary: Summary) -> str:
    """The summary's table, as ``format_table()`` lays it out."""
    return (f'<div style="{_BOX}"><b>fleetenv summary</b>'
            f'<pre style="{_PRE};max-height:none">{escape(summary.format_table())}</pre></div>')
