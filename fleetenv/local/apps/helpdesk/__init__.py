"""Helpdesk: a support-ticketing app (customers, agents, tickets, comments, tags, SLAs)."""

from __future__ import annotations

from fleetenv.local.apps.base import AppSpec
from fleetenv.local.apps.computer import lazy_computer
from fleetenv.local.apps.helpdesk.data import DATA_KEY, DATA_VERSIONS, build_database
from fleetenv.local.apps.helpdesk.tools import register_tools

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
    register_computer=lazy_computer("Helpdesk", "fleetenv.local.apps.helpdesk.ui:HelpdeskScreen"),
)
