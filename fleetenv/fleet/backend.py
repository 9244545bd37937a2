"""Which Fleet an episode talks to: real Fleet (a key is configured) or the embedded
local one (no key), and the shared client and provisioner for it.

Clients are cached per (base URL, key) for the life of the process: a ``fleet.Fleet``
owns an HTTP connection pool, and the previous client built a new one per call and never
closed it. The embedded local Fleet is started at most once per process, on first use,
and announced once in the log.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetenv.core.config import FleetConfig
from fleetenv.fleet import limits
from fleetenv.fleet.client import FleetClient
from fleetenv.fleet.provisioning import Provisioner

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.local import LocalFleet

logger = logging.getLogger("fleetenv")

_lock = threading.Lock()
_backends: dict[tuple[str, str], Backend] = {}
_local: LocalFleet | None = None


@dataclass(frozen=True)
class Backend:
    """A Fleet control plane plus what talks to it."""

    base_url: str
    client: FleetClient
    provisioner: Provisioner
    is_local: bool

    def __repr__(self) -> str:
        kind = "local" if self.is_local else "fleet"
        return f"Backend({kind} {self.base_url})"


def get_backend(config: FleetConfig) -> Backend:
    """The shared backend for ``config`` (starting the local Fleet if needed)."""
    limits.configure(max_creating=config.max_creating_instances,
                     max_live=config.max_live_instances)
    if config.use_local:
        local = _local_fleet()
        base_url, api_key, is_local = local.base_url, local.token, True
    else:
        assert config.api_key is not None  # resolve_config guarantees it
        base_url, api_key, is_local = config.base_url, config.api_key.get_secret_value(), False
    key = (base_url, hashlib.sha256(api_key.encode()).hexdigest())
    with _lock:
        backend = _backends.get(key)
        if backend is None:
            client = FleetClient(api_key, base_url, timeout=max(60.0, config.verifier_timeout_s),
                                 connect_timeout=config.connect_timeout_s)
            provisioner = Provisioner(client, budget_s=config.provision_budget_s,
                                      backoff=config.backoff())
            backend = _backends[key] = Backend(base_url, client, provisioner, is_local)
        return backend


def local_fleet() -> LocalFleet:
    """The process's embedded local Fleet (started on first use)."""
    return _local_fleet()


def _local_fleet() -> LocalFleet:
    global _local
    with _lock:
        if _local is None or not _local.running:
            from fleetenv.local import LocalFleet

            fleet = LocalFleet()
            fleet.start()
            _local = fleet
            apps = ", ".join(_app_keys())
            logger.info(
                "no Fleet API key configured (FLEET_API_KEY): using the embedded local Fleet "
                "at %s with its sample apps (%s)", fleet.base_url, apps,
            )
        return _local


def _app_keys() -> list[str]:
    try:
        from fleetenv.local.apps import APPS

        return sorted(APPS)
    except Exception:  # the announcement must never break startup
        return []
