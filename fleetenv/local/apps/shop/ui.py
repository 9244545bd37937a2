"""The shop's admin web UI behind the ``computer`` tool: an order list and an order page.

State (screen, filters, scroll, focus, typed text) lives on the object, one per instance;
everything shown is read from the database on every render. Refunds made here use the
reason ``customer_request`` and refund everything still refundable.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from fleetenv.local.apps import widgets as w
from fleetenv.local.apps.list_screen import ListDetailScreen
from fleetenv.local.apps.screen import BLUE, NAVY, RED, Canvas
from fleetenv.local.apps.shop.data import NOW
from fleetenv.local.apps.shop.tools import order_detail, refund, set_order_status
from fleetenv.local.apps.toolkit import money
from fleetenv.local.apps.widgets import Hotspot

_ITEM_COLUMNS = (("SKU", 8, 7), ("Product", 104, 26), ("Qty", 440, 3), ("Price", 500, 11))


@dataclass
class ShopScreen(ListDetailScreen):
    """UI state of one instance's shop admin app."""

    APP_TITLE = "Shop Admin"
    LIST_TITLE = "Orders"
    RECORD_NOUN = "Order"
    TODAY = NOW[:10]
    STATUS_TABS = ("All", "Paid", "Shipped", "Delivered", "Refunded")
    LIST_COLUMNS = (
        ("#", 8, 4),
        ("Placed", 68, 10),
        ("Status", 200, 9),
        ("Customer", 320, 22),
        ("Total", 608, 13),
    )
    LIST_FROM = "FROM orders o JOIN customers c ON c.id = o.customer_id"
    LIST_SELECT = "o.id, o.placed_at, o.status, c.name, o.total_cents"
    ID_COLUMN = "o.id"
    STATUS_COLUMN = "o.status"
    SEARCH_COLUMNS = ("c.name", "c.email")
    SEARCH_PLACEHOLDER = "Search customer or #order"

    def _signed_in_as(self, conn: sqlite3.Connection) -> str:
        return "admin"

    def _list_cells(self, row: dict[str, Any]) -> list[str]:
        return [str(row["id"]), row["placed_at"][:10], row["status"], row["name"],
                money(row["total_cents"])]

    def _render_record(
        self, conn: sqlite3.Connection, canvas: Canvas, record_id: int
    ) -> list[Hotspot | None]:
        order = order_detail(conn, record_id)
        status = order["status"]
        customer = order["customer"]
        spots: list[Hotspot | None] = [w.button(canvas, 16, 48, 96, "< Back", "button:back")]
        w.label(canvas, 124, 54, f"Status: {status}", color=NAVY)
        lines = (
            f"Customer: {customer['name']} <{customer['email']}>",
            f"Placed: {order['placed_at'][:16].replace('T', ' ')}   "
            f"Shipping: {order['shipping_method']}",
        )
        for index, line in enumerate(lines):
            w.label(canvas, 16, 88 + index * 22, line, max_chars=64)
        items = order["items"]
        cells = [
            [i["sku"], i["name"], str(i["quantity"]), money(i["unit_price_cents"])]
            for i in items[:5]
        ]
        w.table(canvas, 140, _ITEM_COLUMNS, cells, [i["id"] for i in items[:5]], "item")
        more = len(items) - 5
        top = 140 + 26 * (len(cells) + 1) + 10
        if more > 0:
            w.label(canvas, 16, top, f"... and {more} more line(s)")
            top += 22
        coupon = f" ({order['coupon_code']})" if order["coupon_code"] else ""
        totals = (
            f"Subtotal: {money(order['subtotal_cents'])}   "
            f"Discount{coupon}: -{money(order['discount_cents'])}",
            f"Shipping: {money(order['shipping_cents'])}   Total: {order['total']}",
            f"Refunded: {money(order['refunded_cents'])}   "
            f"Refundable: {money(order['refundable_cents'])}",
        )
        for index, line in enumerate(totals):
            w.label(canvas, 16, top + index * 22, line, max_chars=64)
        refundable = order["refundable_cents"] > 0
        actions = (  # (x, y, width, label, target, value, enabled, colour)
            (16, 470, 180, "Mark paid", "button:status", "paid", status == "pending", BLUE),
            (206, 470, 180, "Mark shipped", "button:status", "shipped", status == "paid", BLUE),
            (396, 470, 192, "Mark delivered", "button:status", "delivered",
             status == "shipped", BLUE),
            (598, 470, 186, "Cancel order", "button:status", "cancelled",
             status in ("pending", "paid"), RED),
            (16, 514, 228, "Refund all", "button:refund", "keep", refundable, RED),
            (254, 514, 228, "Refund+restock", "button:refund", "restock", refundable, RED),
        )
        for x, y, width, text, target, value, enabled, color in actions:
            spots.append(w.button(canvas, x, y, width, text, target, value, enabled=enabled,
                                  color=color))
        return spots

    def _record_action(
        self, conn: sqlite3.Connection, record_id: int, target: str, value: object
    ) -> None:
        if target == "button:status":
            set_order_status(conn, record_id, str(value))
            self.message = f"Order #{record_id} is now {value}."
        elif target == "button:refund":
            result = refund(conn, record_id, "customer_request", None, value == "restock",
                            "Refunded from the admin UI")
            self.message = f"Refunded {result['amount']} on order #{record_id}."
