"""Helpdesk: a support-ticketing app (customers, agents, tickets, comments, tags, SLAs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetenv.local.apps.base import AppSpec, DbFactory
from fleetenv.local.apps.helpdesk.data import DATA_KEY, DATA_VERSIONS, build_database
from fleetenv.local.apps.helpdesk.tools import register_tools

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server import MCPServer


def register_computer(server: MCPServer, db: DbFactory) -> None:
    """Add the ``computer`` tool showing the helpdesk web UI."""
    from fleetenv.local.apps.computer import register_computer_tool
    from fleetenv.local.apps.helpdesk.ui import HelpdeskScreen

    register_computer_tool(server, db, HelpdeskScreen, "Helpdesk")


SPEC = AppSpec(
    key="helpdesk",
    name="Helpdesk",
    description=(
        "Customer-support ticketing: search, triage, assign, tag, reply to and resolve "
        "tickets for ~160 customers handled by 13 agents in three teams."
    ),
    versions=("v1",),
    data={DATA_KEY: DATA_VERSIONS},
    build_database=build_database,
    register_tools=register_tools,
    register_computer=register_computer,
)
