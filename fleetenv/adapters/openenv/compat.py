"""The previous client's names that ported code relies on besides its classes.

- Its environment variables (:data:`ENV_ALIASES`, :data:`TOOL_DEADLINE_ENV`), read as
  fleetenv's at the drop-in's first use, once per process; fleetenv's own name wins, and
  each alias used is logged once (docs/porting.md#environment-variables).
- ``ValueError`` where the original raised one, so ``except ValueError`` in ported code
  still catches it.
"""

from __future__ import annotations

import functools
import logging
import math
import os

from fleetenv.core.errors import ConfigurationError, ToolNotFoundError
from fleetenv.fleet.leases import LEASE_API_KEY_ENV, LEASE_API_URL_ENV

__all__ = [
    "ENV_ALIASES",
    "TOOL_DEADLINE_ENV",
    "DropInConfigurationError",
    "DropInToolNotFoundError",
    "env_aliases",
]

logger = logging.getLogger("fleetenv.openenv")

#: The original's variable names and the fleetenv variable each one stands for; for one
#: fleetenv variable, the first alias that is set is used.
ENV_ALIASES = (
    ("BROWSER_API_BASE_URL", LEASE_API_URL_ENV),
    ("FLEET_TEAM_API_KEY", LEASE_API_KEY_ENV),
    ("BROWSER_API_TOKEN", LEASE_API_KEY_ENV),
)
#: The original's per-call tool deadline (its default was 90 s).
TOOL_DEADLINE_ENV = "FLEET_CALL_TOOL_DEADLINE_S"


class DropInConfigurationError(ConfigurationError, ValueError):
    """A configuration mistake the original reported as a ``ValueError``."""

    retryable = False


class DropInToolNotFoundError(ToolNotFoundError, ValueError):
    """No endpoint serves the tool (the original raised ``ValueError``)."""

    retryable = False


@functools.cache
def env_aliases() -> float | None:
    """Read the original's variables (once per process): copy the browser-lease ones to
    fleetenv's names where those are unset; return the tool deadline
    (``FLEET_CALL_TOOL_DEADLINE_S``), or ``None`` when it is not set."""
    for alias, name in ENV_ALIASES:
        value = os.environ.get(alias, "").strip()
        if value and not os.environ.get(name, "").strip():
            os.environ[name] = value
            logger.info("reading the previous Fleet client's %s as %s", alias, name)
    raw = os.environ.get(TOOL_DEADLINE_ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:  # raised, so not cached: read again
        raise DropInConfigurationError(
            f"{TOOL_DEADLINE_ENV}={raw!r:.40} is not a positive number of seconds",
            hint=f"set {TOOL_DEADLINE_ENV} to e.g. 90, or unset it")
    logger.info("reading the previous Fleet client's %s=%g as the drop-in's tool deadline",
                TOOL_DEADLINE_ENV, seconds)
    return seconds
