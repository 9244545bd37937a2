"""One episode's transcript as HTML: messages, tool calls, tool results and screenshots.

Everything in a transcript is untrusted (a tool result is whatever the app or a web
page returned), so every string goes through :func:`html.escape`, and an image is shown
only when its URL is an inline ``data:image/...;base64,`` URL of a raster format (never
SVG, which can carry script, and never a remote URL, which would reach the network).
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any

__all__ = ["ImageBudget", "render_transcript", "safe_image_url"]

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
