"""The three ways an agent acts on a Fleet environment (see :class:`Modality`)."""

from __future__ import annotations

import difflib

from fleetenv.core.types import Modality

__all__ = ["MODALITIES", "Modality", "suggest_modality"]

#: The accepted modality strings, in documentation order.
MODALITIES: tuple[str, ...] = Modality.values()


def suggest_modality(value: str) -> str | None:
    """The accepted modality closest to ``value`` (for "did you mean" hints), if any."""
    cleaned = value.strip().lower().replace("-", "_")
    matches = difflib.get_close_matches(cleaned, MODALITIES, n=1, cutoff=0.5)
    return matches[0] if matches else None
