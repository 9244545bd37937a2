"""How the drop-in shows a tool result: the original's ``obs["observation"]``.

A JSON object or list the tool printed arrives parsed, a failed call as
``{"error": message}``, images as chat content parts; any other text exactly as returned
(``"null"`` stays ``"null"``). The typed result stays in ``info["typed_result"]``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["legacy_value", "parse_json_container"]


def parse_json_container(text: str) -> Any:
    """``text`` parsed when it is a JSON object or list; otherwise ``text`` unchanged.

    Scalars are not parsed on purpose: a tool that printed ``null`` or ``42`` said a
    string.
    """
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return text
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return text
    return value if isinstance(value, dict | list) else text


def legacy_value(content: Sequence[dict[str, Any]], error: str | None) -> Any:
    """The original's ``obs["observation"]`` for chat content ``content`` (and ``error``).

    ``{"error": message}`` for a failed call; ``{}`` when there is nothing to show; the
    content parts (texts and ``image_url`` parts, in order) when there are images; the
    one text, parsed when it is a JSON object or list; several texts as a list of strings.
    """
    if error is not None:
        return {"error": error}
    if not content:
        return {}
    if any(part.get("type") == "image_url" for part in content):
        return [dict(part) for part in content]
    texts = [str(part.get("text", "")) for part in content if part.get("type") == "text"]
    if not texts:
        return {}
    if len(texts) == 1:
        return parse_json_container(texts[0])
    return texts
