"""The sample apps fleetenv.local serves, and the tasks bundled with them.

``APPS`` maps an env key (what tasks name in ``env_id``) to its :class:`AppSpec`. Importing
this package does not import mcp; apps import it only when a server registers their tools.
"""

from __future__ import annotations

import pathlib

from fleetenv.local.apps.base import AppSpec, DbFactory
from fleetenv.local.apps.helpdesk import SPEC as HELPDESK
from fleetenv.local.apps.shop import SPEC as SHOP

__all__ = ["APPS", "AppSpec", "DbFactory", "bundled_tasks_path"]

APPS: dict[str, AppSpec] = {spec.key: spec for spec in (HELPDESK, SHOP)}


def bundled_tasks_path() -> pathlib.Path:
    """The JSON array of tasks (Fleet export format) written against these apps."""
    return pathlib.Path(__file__).with_name("tasks.json")
