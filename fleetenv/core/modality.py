"""The three ways an agent acts on a Fleet environment.

The modality decides which MCP endpoints an episode expects, the image type and TTL of
the instance, and whether observations carry screenshots, so a typo in it must fail when
the task is loaded, not surface later as a shorter tool list.
"""

from __future__ import annotations

import difflib
from typing import Literal, get_args

__all__ = ["MODALITIES", "Modality", "suggest_modality"]

Modality = Literal["tool_use", "computer_use", "browser_use"]

MODALITIES: tuple[str, ...] = get_args(Modality)


def suggest_modality(value: str) -> str | None:
    """The accepted modality closest to ``value`` (for "did you mean" hints), if any."""
    matches = difflib.get_close_matches(value.strip().lower().replace("-", "_"), MODALITIES,
                                        n=1, cutoff=0.5)
    return matches[0] if matches else None
