"""How an episode looks: its outcome, its transcript as HTML, and the notebook displays.

Everything in a transcript is untrusted, so every string goes through :func:`html.escape`,
and an image is shown only from an inline ``data:image/...;base64,`` URL of a raster
format (never SVG, which can carry script, nor a remote URL, which would reach the
network). Inline styles only: a notebook may drop ``<style>`` blocks. Pure functions of
plain data, read by attribute from the classes they draw (``Observation``,
``RolloutResult``), which call them; the reports build their pages with them.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from html import escape
from typing import Any

from fleetenv.core.redaction import scrub_secrets

__all__ = [
    "OUTCOMES",
    "ImageBudget",
    "image_bytes",
    "observation_html",
    "outcome_of",
    "render_transcript",
    "result_html",
    "safe_image_url",
    "summary_html",
]

#: Every episode has exactly one outcome; the report filters on these.
OUTCOMES = ("passed", "failed", "ungraded", "error")


def outcome_of(result: Any) -> str:
    """A ``RolloutResult``'s outcome: ``error`` (the rollout failed), ``passed`` (graded,
    reward >= 1), ``failed`` (graded, below 1) or ``ungraded`` (the verifier could not
    grade it)."""
    if result.error is not None:
        return "error"
    if result.graded and result.reward is not None:
        return "passed" if result.passed else "failed"
    return "ungraded"


# ----- transcripts ---------------------------------------------------------------------

_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|jpg|gif|webp);base64,[A-Za-z0-9+/=\s]+")
#: Longest text part shown whole; longer ones are cut with a note (the file has it all).
MAX_TEXT_CHARS = 40_000


class ImageBudget:
    """How many bytes of inline images a page may still embed. Screenshots dominate a
    report's size (a computer-use run of a few hundred episodes holds hundreds of MB of
    them), so past the budget an image becomes a note; the results file keeps them all."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.left = max_bytes
        self.skipped = 0

    def take(self, url: str) -> bool:
        if len(url) <= self.left:
            self.left -= len(url)
            return True
        self.skipped += 1
        return False


def safe_image_url(url: object) -> str | None:
    """``url`` when it is an inline raster image, else ``None``."""
    if isinstance(url, str) and _DATA_IMAGE.fullmatch(url):
        return url
    return None


def _text(text: str) -> str:
    if len(text) > MAX_TEXT_CHARS:
        cut = len(text) - MAX_TEXT_CHARS
        text = text[:MAX_TEXT_CHARS] + f"\n… ({cut} more characters in the results file)"
    return f"<pre>{escape(text)}</pre>"


def _content(content: Any, images: ImageBudget | None = None) -> str:
    """A message's ``content``: a string, a list of OpenAI parts, or nothing."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _text(content) if content else ""
    if not isinstance(content, list):
        return _text(json.dumps(content, ensure_ascii=False, default=str))
    out = []
    for part in content:
        if not isinstance(part, dict):
            out.append(_text(str(part)))
        elif part.get("type") == "text":
            out.append(_text(str(part.get("text", ""))))
        elif part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            safe = safe_image_url(url)
            if safe is not None and images is not None and not images.take(safe):
                out.append(f'<p class="note">[screenshot not embedded: the page\'s image '
                           f"budget ({images.max_bytes / 1e6:g} MB) is spent; the results "
                           "file has it]</p>")
            elif safe is not None:
                out.append(f'<img class="shot" alt="screenshot" loading="lazy" '
                           f'src="{escape(safe, quote=True)}">')
            else:
                shown = str(url)[:200]
                out.append(f'<p class="note">[image not embedded: {escape(shown)}]</p>')
        else:
            out.append(_text(json.dumps(part, ensure_ascii=False, default=str)))
    return "".join(out)


def _arguments(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return str(raw)
    return json.dumps(raw, ensure_ascii=False, indent=2, default=str)


def _calls(calls: Any) -> str:
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            out.append(_text(json.dumps(call, ensure_ascii=False, default=str)))
            continue
        name = str(function.get("name", "?"))
        call_id = str(call.get("id") or "")
        out.append(f'<div class="call">→ <code>{escape(name)}</code> '
                   f'<span class="note">{escape(call_id)}</span>'
                   f"{_text(_arguments(function.get('arguments')))}</div>")
    return "".join(out)


def render_transcript(messages: list[dict[str, Any]], tool_errors: list[str],
                      images: ImageBudget | None = None) -> str:
    """The messages in order; a tool message whose text starts like a reported tool error
    is marked as one. Inline images within ``images`` (default: all)."""
    names: dict[str, str] = {}
    out = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(f'<div class="msg">{_text(str(message))}</div>')
            continue
        role = str(message.get("role", "?"))
        css = role if role in ("user", "assistant", "tool", "system") else "other"
        label = role
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    names[str(call.get("id"))] = str(call["function"].get("name", "?"))
        if role == "tool":
            name = names.get(str(message.get("tool_call_id")), "")
            label = f"tool result · {name}" if name else "tool result"
            text = _plain(message.get("content"))
            if text.startswith("Error:") or any(
                    e.startswith(f"{name}(): ") and e[len(name) + 4:][:60] in text
                    for e in tool_errors):
                css += " tool-error"
        body = _content(message.get("content"), images)
        if role == "assistant":
            body += _calls(message.get("tool_calls"))
        out.append(f'<div class="msg {css}"><div class="role">{escape(label)}</div>'
                   f"{body}</div>")
    return "".join(out) or '<p class="note">(no transcript)</p>'


def _plain(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return ""


# ----- notebook displays ---------------------------------------------------------------

_BOX = ("font-family:system-ui,sans-serif;font-size:13px;border:1px solid #dde1ea;"
        "border-radius:6px;padding:6px 10px;max-width:960px")
_PRE = ("white-space:pre-wrap;max-height:300px;overflow:auto;background:#f8f9fb;"
        "padding:4px 6px;margin:4px 0;font-size:12px")
_COLORS = {"passed": "#1a7f37", "failed": "#c62828", "ungraded": "#9a6700",
           "error": "#8250df"}
#: Longest text a notebook display shows (the results file has it all).
_SHOWN_CHARS = 4000


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


def observation_html(obs: Any) -> str:
    """One ``Observation``: what step, which tool, whether it failed, its text and images."""
    head = [f"<b>{escape(obs.task_key)}</b>", f"step {obs.step}"]
    if obs.tool_name:
        head.append(f"tool <code>{escape(obs.tool_name)}</code>")
    if obs.is_error:
        head.append(_badge("error", "#c62828"))
    parts = [f'<div style="{_BOX}"><div>{" · ".join(head)}</div>']
    if obs.step == 0 and obs.prompt:
        parts.append(f'<pre style="{_PRE}">{escape(obs.prompt[:_SHOWN_CHARS])}</pre>')
    if obs.error:
        parts.append(f'<div style="color:#c62828">{escape(obs.error[:_SHOWN_CHARS])}</div>')
    if obs.parse_error:
        parts.append(f'<div style="color:#c62828">{escape(obs.parse_error[:_SHOWN_CHARS])}'
                     "</div>")
    for part in obs.content:
        if part.get("type") == "text":
            text = str(part.get("text", ""))
            cut = f"\n… ({len(text) - _SHOWN_CHARS} more characters)" if len(
                text) > _SHOWN_CHARS else ""
            parts.append(f'<pre style="{_PRE}">{escape(text[:_SHOWN_CHARS] + cut)}</pre>')
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


def result_html(result: Any) -> str:
    """One rollout (a ``RolloutResult``): outcome, reward, counters, timings, error, then
    its transcript."""
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
                     f"{escape(result.error.get('message', '')[:_SHOWN_CHARS])}</div>")
    if result.verifier_stdout or result.verifier_error:
        text = (result.verifier_stdout or "") + (result.verifier_error or "")
        parts.append(f"<details><summary>verifier output</summary>"
                     f'<pre style="{_PRE}">{escape(text[:_SHOWN_CHARS])}</pre></details>')
    if result.transcript:
        parts.append(f"<details><summary>transcript ({len(result.transcript)} messages)"
                     f"</summary>{render_transcript(result.transcript, result.tool_error_messages)}"
                     "</details>")
    parts.append("</div>")
    return scrub_secrets("".join(parts))  # like repr(result): no registered secret


def summary_html(table: str) -> str:
    """A summary's table, as its ``format_table()`` lays it out."""
    return (f'<div style="{_BOX}"><b>fleetenv summary</b>'
            f'<pre style="{_PRE};max-height:none">{escape(table)}</pre></div>')
