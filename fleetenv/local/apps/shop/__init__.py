"""Shop: an online store (products, inventory, customers, orders, coupons, refunds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetenv.local.apps.base import AppSpec, DbFactory
from fleetenv.local.apps.shop.data import DATA_KEY, DATA_VERSIONS, build_database
from fleetenv.local.apps.shop.tools import register_tools

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server import MCPServer


def register_computer(server: MCPServer, db: DbFactory) -> None:
    """Add the ``computer`` tool showing the shop's admin UI."""
    from fleetenv.local.apps.computer import register_computer_tool
    from fleetenv.local.apps.shop.ui import ShopScreen

    register_computer_tool(server, db, ShopScreen, "Shop Admin")


SPEC = AppSpec(
    key="shop",
    name="Shop",
    description=(
        "An online store's back office: catalogue and stock for 60 products, 200 customers, "
        "360 orders with items, coupons and refunds."
    ),
    versions=("v1",),
    data={DATA_KEY: DATA_VERSIONS},
    build_database=build_database,
    register_tools=register_tools,
    register_computer=register_computer,
)
