"""The embedded local Fleet, started at most once per process, on first use.

It stands in for Fleet itself, which is one shared service however many sessions talk to
it; so, unlike settings, it is process-wide. It is announced once in the log.

This layer never imports ``fleetenv.local``, which sits on top of the stack: the top of
the package (``fleetenv/__init__.py``, which runs before any of its modules) registers
how to build it with :func:`use_local_fleet`, harness included.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from fleetenv.core.errors import ConfigurationError

__all__ = ["LocalBackend", "local_fleet", "use_local_fleet"]

logger = logging.getLogger("fleetenv")


class LocalBackend(Protocol):
    """What a session needs of the local Fleet (a ``fleetenv.local.LocalFleet``)."""

    base_url: str
    token: str

    @property
    def running(self) -> bool: ...


_lock = threading.Lock()
_start: Callable[[], tuple[LocalBackend, Sequence[str]]] | None = None
_local: LocalBackend | None = None


def use_local_fleet(start: Callable[[], tuple[LocalBackend, Sequence[str]]]) -> None:
    """Register how to start the local Fleet: ``start()`` returns it running, with the
    keys of the apps it serves (for the log)."""
    global _start
    _start = start


def local_fleet() -> LocalBackend:
    """The process's embedded local Fleet (started on first use)."""
    global _local
    with _lock:
        if _local is None or not _local.running:
            if _start is None:
                raise ConfigurationError(
                    "no local Fleet is registered (fleetenv/__init__.py registers it)",
                    hint="import fleetenv, or pass an API key to use Fleet")
            fleet, apps = _start()
            _local = fleet
            logger.info(
                "no Fleet API key configured (FLEET_API_KEY): using the embedded local Fleet "
                "at %s with its sample apps (%s)", fleet.base_url, ", ".join(apps))
        return _local
