"""The embedded local Fleet, started at most once per process, on first use.

It stands in for Fleet itself, which is one shared service however many sessions talk to
it; so, unlike settings, it is process-wide. It is announced once in the log.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.local import LocalFleet

__all__ = ["local_fleet"]

logger = logging.getLogger("fleetenv")

_lock = threading.Lock()
_local: LocalFleet | None = None


def local_fleet() -> LocalFleet:
    """The process's embedded local Fleet (started on first use)."""
    global _local
    with _lock:
        if _local is None or not _local.running:
            from fleetenv.local import LocalFleet

            fleet = LocalFleet()
            fleet.start()
            _local = fleet
            logger.info(
                "no Fleet API key configured (FLEET_API_KEY): using the embedded local Fleet "
                "at %s with its sample apps (%s)", fleet.base_url, ", ".join(_app_keys()),
            )
        return _local


def _app_keys() -> list[str]:
    try:
        from fleetenv.local.apps import APPS

        return sorted(APPS)
    except Exception:  # the announcement must never break startup
        return []
