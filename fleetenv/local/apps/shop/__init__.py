"""Shop: an online store (products, inventory, customers, orders, coupons, refunds)."""

from __future__ import annotations

from fleetenv.local.apps.base import AppSpec
from fleetenv.local.apps.computer import lazy_computer
from fleetenv.local.apps.shop.data import DATA_KEY, DATA_VERSIONS, build_database
from fleetenv.local.apps.shop.tools import register_tools

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
    register_computer=lazy_computer("Shop Admin", "fleetenv.local.apps.shop.ui:ShopScreen"),
)
