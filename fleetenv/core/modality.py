"""The three ways an agent acts on a Fleet environment (see :class:`Modality`)."""

from __future__ import annotations

from fleetenv.core.vocabulary import Modality, suggest

__all__ = ["MODALITIES", "Modality", "suggest_modality"]

#: The accepted modality strings, in documentation order.
MODALITIES: tuple[str, ...] = Modality.values()


def suggest_modality(value: str) -> str | None:
    """The accepted modality closest to ``value`` (for "did you mean" hints), if any."""
    return suggest(value, Modality)
