"""The shop's admin web UI behind the ``computer`` tool: an order list and an order page.

State (screen, filters, scroll, focus, typed text) lives on the object, one per instance;
everything shown is read from the database on every render. Refunds made here use the
reason ``customer_request`` and refund everything still refundable.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from fleetenv.local.apps import widgets as w
from fleetenv.local.apps.computer import Hotspot
from fleetenv.local.apps.screen import GREEN, NAVY, PALE_GREEN, RED, Canvas
from fleetenv.local.apps.shop.data import NOW
from fleetenv.local.apps.shop.tools import order_detail, refund, set_order_status
from fleetenv.local.apps.toolkit import AppError, money, rows, scalar

PAGE_ROWS = 14
STATUS_TABS = ("All", "Paid", "Shipped", "Delivered", "Refunded")
_LIST_COLUMNS = (
    ("#", 8, 4),
    ("Placed", 68, 10),
    ("Status", 200, 9),
    ("Customer", 320, 22),
    ("Total", 608, 13),
)
_ITEM_COLUMNS = (("SKU", 8, 7), ("Product", 104, 26), ("Qty", 440, 3), ("Price", 500, 11))


@dataclass
class ShopScreen:
    """UI state of one instance's shop admin app."""

    screen: str = "list"
    order_id: int | None = None
    status_tab: str = "All"
    search_text: str = ""
    applied_search: str = ""
    offset: int = 0
    focus: str | None = None
    message: str = ""
    _total: int = 0

    def render(self, conn: sqlite3.Connection, canvas: Canvas) -> list[Hotspot]:
        if self.screen == "order" and self.order_id is not None:
            w.header(canvas, f"Shop Admin - Order #{self.order_id}", f"admin | {NOW[:10]}")
            spots = self._render_order(conn, canvas)
        else:
            w.header(canvas, "Shop Admin - Orders", f"admin | {NOW[:10]}")
            spots = self._render_list(conn, canvas)
        if self.message:
            canvas.fill(16, 566, 768, 26, PALE_GREEN)
            canvas.text(24, 570, self.message[:62], GREEN, PALE_GREEN, 2)
        return [s for s in spots if s is not None]

    def _filters(self) -> tuple[str, list[object]]:
        where: list[str] = []
        args: list[object] = []
        if self.status_tab != "All":
            where.append("o.status = ?")
            args.append(self.status_tab.lower())
        query = self.applied_search.strip()
        if query:
            like = f"%{query}%"
            cond = "(c.name LIKE ? OR c.email LIKE ?"
            args.extend([like, like])
            if query.lstrip("#").isdigit():
                cond += " OR o.id = ?"
                args.append(int(query.lstrip("#")))
            where.append(cond + ")")
        return (f"WHERE {' AND '.join(where)}" if where else ""), args

    def _render_list(self, conn: sqlite3.Connection, canvas: Canvas) -> list[Hotspot | None]:
        spots: list[Hotspot | None] = [
            w.text_field(
                canvas,
                16,
                50,
                560,
                self.search_text,
                "field:search",
                focused=self.focus == "search",
                placeholder="Search customer or #order",
            ),
            w.button(canvas, 588, 50, 96, "Search", "button:search"),
            w.button(
                canvas,
                692,
                50,
                92,
                "Clear",
                "button:clear",
                enabled=bool(self.search_text or self.applied_search),
            ),
        ]
        spots.extend(w.tabs(canvas, 16, 90, 144, STATUS_TABS, self.status_tab, "tab"))
        clause, args = self._filters()
        base = "FROM orders o JOIN customers c ON c.id = o.customer_id"
        self._total = int(scalar(conn, f"SELECT COUNT(*) {base} {clause}", args))
        self.offset = max(0, min(self.offset, max(self._total - PAGE_ROWS, 0)))
        found = rows(
            conn,
            f"SELECT o.id, o.placed_at, o.status, c.name, o.total_cents {base} {clause} "
            "ORDER BY o.id LIMIT ? OFFSET ?",
            [*args, PAGE_ROWS, self.offset],
        )
        cells = [
            [str(r["id"]), r["placed_at"][:10], r["status"], r["name"], money(r["total_cents"])]
            for r in found
        ]
        spots.extend(w.table(canvas, 126, _LIST_COLUMNS, cells, [r["id"] for r in found], "row"))
        if self._total:
            shown = f"Rows {self.offset + 1}-{self.offset + len(found)} of {self._total}"
        else:
            shown = "No orders match"
        w.label(canvas, 16, 530, shown)
        spots.append(
            w.button(canvas, 560, 524, 108, "< Prev", "button:prev", enabled=self.offset > 0)
        )
        spots.append(
            w.button(
                canvas,
                676,
                524,
                108,
                "Next >",
                "button:next",
                enabled=self.offset + PAGE_ROWS < self._total,
            )
        )
        return spots

    def _render_order(self, conn: sqlite3.Connection, canvas: Canvas) -> list[Hotspot | None]:
        assert self.order_id is not None
        order = order_detail(conn, self.order_id)
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
        spots += [
            w.button(
                canvas,
                16,
                470,
                180,
                "Mark paid",
                "button:status",
                "paid",
                enabled=status == "pending",
            ),
            w.button(
                canvas,
                206,
                470,
                180,
                "Mark shipped",
                "button:status",
                "shipped",
                enabled=status == "paid",
            ),
            w.button(
                canvas,
                396,
                470,
                192,
                "Mark delivered",
                "button:status",
                "delivered",
                enabled=status == "shipped",
            ),
            w.button(
                canvas,
                598,
                470,
                186,
                "Cancel order",
                "button:status",
                "cancelled",
                enabled=status in ("pending", "paid"),
                color=RED,
            ),
            w.button(
                canvas,
                16,
                514,
                228,
                "Refund all",
                "button:refund",
                "keep",
                enabled=refundable,
                color=RED,
            ),
            w.button(
                canvas,
                254,
                514,
                228,
                "Refund+restock",
                "button:refund",
                "restock",
                enabled=refundable,
                color=RED,
            ),
        ]
        return spots

    def click(self, conn: sqlite3.Connection, spot: Hotspot) -> None:
        self.message = ""
        target = spot.target
        if target.startswith("field:"):
            self.focus = target.removeprefix("field:")
            return
        self.focus = None
        if target == "row":
            self.screen, self.order_id = "order", int(spot.value or 0)
        elif target == "tab":
            self.status_tab, self.offset = str(spot.value), 0
        elif target == "button:search":
            self.applied_search, self.offset = self.search_text, 0
        elif target == "button:clear":
            self.search_text = self.applied_search = ""
            self.offset = 0
        elif target == "button:prev":
            self.offset = max(self.offset - PAGE_ROWS, 0)
        elif target == "button:next":
            self.offset += PAGE_ROWS
        elif target == "button:back":
            self.screen, self.order_id = "list", None
        elif self.order_id is None:
            raise AppError(f"{target} needs an open order; click a row first")
        elif target == "button:status":
            set_order_status(conn, self.order_id, str(spot.value))
            self.message = f"Order #{self.order_id} is now {spot.value}."
        elif target == "button:refund":
            result = refund(
                conn,
                self.order_id,
                "customer_request",
                None,
                spot.value == "restock",
                "Refunded from the admin UI",
            )
            self.message = f"Refunded {result['amount']} on order #{self.order_id}."

    def type_text(self, conn: sqlite3.Connection, text: str) -> None:
        if self.focus != "search":
            raise AppError("no text field is focused; click the search box first")
        self.search_text = (self.search_text + text)[:60]

    def key(self, conn: sqlite3.Connection, key: str) -> None:
        if key == "Escape":
            if self.focus:
                self.focus = None
            elif self.screen == "order":
                self.screen, self.order_id = "list", None
        elif key == "Enter" and self.focus == "search":
            self.applied_search, self.offset = self.search_text, 0
        elif key == "Backspace" and self.focus == "search":
            self.search_text = w.edit_text(self.search_text, key)
        elif key in ("PageDown", "PageUp", "Home", "End"):
            step = {"PageDown": PAGE_ROWS, "PageUp": -PAGE_ROWS, "Home": -(10**6), "End": 10**6}
            self.offset = max(self.offset + step[key], 0)

    def scroll(self, conn: sqlite3.Connection, direction: str, amount: int) -> None:
        if self.screen == "list":
            self.offset = max(self.offset + (amount if direction == "down" else -amount), 0)
