"""The sample apps fleetenv.local serves (their tasks: ``fleetenv.bundled_tasks_path()``).

``APPS`` maps an env key (what tasks name in ``env_id``) to its :class:`AppSpec`. Importing
this package does not import mcp; apps import it only when a server registers their tools.
"""

from __future__ import annotations

from fleetenv.local.apps.base import AppSpec, DbFactory
from fleetenv.local.apps.computer import lazy_computer
from fleetenv.local.apps.helpdesk import data as helpdesk_data
from fleetenv.local.apps.helpdesk import tools as helpdesk_tools
from fleetenv.local.apps.shop import data as shop_data
from fleetenv.local.apps.shop import tools as shop_tools

__all__ = ["APPS", "AppSpec", "DbFactory"]

HELPDESK = AppSpec(
    key="helpdesk",
    name="Helpdesk",
    description=(
        "Customer-support ticketing: search, triage, assign, tag, reply to and resolve "
        "tickets for ~160 customers handled by 13 agents in three teams."
    ),
    versions=("v1",),
    data={helpdesk_data.DATA_KEY: helpdesk_data.DATA_VERSIONS},
    build_database=helpdesk_data.build_database,
    register_tools=helpdesk_tools.register_tools,
    register_computer=lazy_computer("Helpdesk", "fleetenv.local.apps.helpdesk.ui:HelpdeskScreen"),
)
SHOP = AppSpec(
    key="shop",
    name="Shop",
    description=(
        "An online store's back office: catalogue and stock for 60 products, 200 customers, "
        "360 orders with items, coupons and refunds."
    ),
    versions=("v1",),
    data={shop_data.DATA_KEY: shop_data.DATA_VERSIONS},
    build_database=shop_data.build_database,
    register_tools=shop_tools.register_tools,
    register_computer=lazy_computer("Shop Admin", "fleetenv.local.apps.shop.ui:ShopScreen"),
)

APPS: dict[str, AppSpec] = {spec.key: spec for spec in (HELPDESK, SHOP)}
