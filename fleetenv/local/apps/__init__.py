"""The sample apps fleetenv.local serves (their tasks: ``fleetenv.bundled_tasks_path()``).

``APPS`` maps an env key (what tasks name in ``env_id``) to its :class:`AppSpec`. Importing
this package does not import mcp; apps import it only when a server registers their tools.
"""

from __future__ import annotations

from fleetenv.local.apps.base import AppSpec, DbFactory
from fleetenv.local.apps.helpdesk import SPEC as HELPDESK
from fleetenv.local.apps.shop import SPEC as SHOP

__all__ = ["APPS", "AppSpec", "DbFactory"]

APPS: dict[str, AppSpec] = {spec.key: spec for spec in (HELPDESK, SHOP)}
