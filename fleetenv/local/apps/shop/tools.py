"""The shop app's MCP tools (served at ``{root}mcp``).

Same rules as the helpdesk: one unit of work per call (a refused request rolls back), the
frozen clock on every write, ``MAX(id) + 1`` for new rows. Amounts are integer cents in and
out; a formatted ``"$1,234.56"`` string is added next to them for readability.
"""

from __future__ import annotations

import re
import sqlite3
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field

from fleetenv.local.apps.base import DbFactory, add_tools
from fleetenv.local.apps.shop.data import NOW, order_amounts
from fleetenv.local.apps.toolkit import (
    AppError,
    Where,
    customer_by_email,
    money,
    next_id,
    one,
    one_or_refuse,
    rows,
    scalar,
    tool_errors,
)

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server import MCPServer

Category = Literal["audio", "computing", "home", "kitchen", "outdoor", "fitness"]
OrderStatus = Literal["pending", "paid", "shipped", "delivered", "cancelled", "refunded"]
RefundReason = Literal["damaged", "not_received", "wrong_item", "customer_request", "other"]
Tier = Literal["bronze", "silver", "gold"]

#: Allowed manual status changes. Refunds go through refund_order.
TRANSITIONS = {
    "pending": ("paid", "cancelled"),
    "paid": ("shipped", "cancelled"),
    "shipped": ("delivered",),
    "delivered": (),
    "cancelled": (),
    "refunded": (),
}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class OrderLine(BaseModel):
    """One line of a new order."""

    sku: Annotated[str, Field(description="Product SKU, e.g. 'AUD-107'.")]
    quantity: Annotated[int, Field(description="Units to order.", ge=1, le=20)] = 1


class StockAdjustment(BaseModel):
    """A change to one product's on-hand stock."""

    sku: Annotated[str, Field(description="Product SKU.")]
    delta: Annotated[
        int, Field(description="Units to add (positive) or remove (negative).", ge=-500, le=500)
    ]


def product_by_sku(conn: sqlite3.Connection, sku: str) -> dict[str, Any]:
    return one_or_refuse(conn, "SELECT * FROM products WHERE upper(sku) = upper(?)",
                         [sku.strip()], f"no product with SKU {sku!r}; find SKUs with "
                         "search_products")


def on_hand(conn: sqlite3.Connection, product_id: int) -> int:
    """Units of a product in stock now."""
    return int(scalar(conn, "SELECT on_hand FROM inventory WHERE product_id = ?", [product_id]))


def order_row(conn: sqlite3.Connection, order_id: int) -> dict[str, Any]:
    return one_or_refuse(conn, "SELECT * FROM orders WHERE id = ?", [order_id],
                         f"no order #{order_id}; find order ids with list_orders")


def refunded_cents(conn: sqlite3.Connection, order_id: int) -> int:
    return int(scalar(conn, "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds "
                      "WHERE order_id = ?", [order_id]))


def order_detail(conn: sqlite3.Connection, order_id: int) -> dict[str, Any]:
    """An order with its customer, lines, refunds and what is still refundable."""
    order = order_row(conn, order_id)
    customer = one(conn, "SELECT id, name, email, city, country, loyalty_tier FROM customers "
                   "WHERE id = ?", [order["customer_id"]])
    lines = rows(
        conn,
        """
        SELECT i.id, p.sku, p.name, i.quantity, i.unit_price_cents,
               i.quantity * i.unit_price_cents AS line_total_cents
        FROM order_items i JOIN products p ON p.id = i.product_id
        WHERE i.order_id = ? ORDER BY i.id
        """,
        [order_id],
    )
    refunds = rows(conn, "SELECT id, amount_cents, reason, restocked, note, created_at "
                   "FROM refunds WHERE order_id = ? ORDER BY id", [order_id])
    for refund in refunds:
        refund["restocked"] = bool(refund["restocked"])
    refunded = sum(r["amount_cents"] for r in refunds)
    refundable = 0
    if order["status"] in ("paid", "shipped", "delivered"):
        refundable = order["total_cents"] - refunded
    fields = ("id", "status", "placed_at", "shipping_method", "subtotal_cents",
              "discount_cents", "shipping_cents", "total_cents", "coupon_code", "updated_at")
    return {**{k: order[k] for k in fields}, "total": money(order["total_cents"]),
            "customer": customer, "items": lines, "refunds": refunds,
            "refunded_cents": refunded, "refundable_cents": refundable}


def restock_order(conn: sqlite3.Connection, order_id: int) -> None:
    """Put every unit of an order back on the shelf."""
    lines = rows(conn, "SELECT product_id, quantity FROM order_items WHERE order_id = ?",
                 [order_id])
    for line in lines:
        conn.execute("UPDATE inventory SET on_hand = on_hand + ?, updated_at = ? "
                     "WHERE product_id = ?", [line["quantity"], NOW, line["product_id"]])


def set_order_status(conn: sqlite3.Connection, order_id: int, status: str) -> dict[str, Any]:
    """Apply a manual status change (shared by the tool and the UI)."""
    order = order_row(conn, order_id)
    allowed = TRANSITIONS[order["status"]]
    if status not in allowed:
        options = ", ".join(allowed) or "none (use refund_order for refunds)"
        raise AppError(f"order #{order_id} is {order['status']}; it can change to: {options}")
    if status == "cancelled":
        restock_order(conn, order_id)
    conn.execute("UPDATE orders SET status = ?, updated_at = ? WHERE id = ?",
                 [status, NOW, order_id])
    return order_detail(conn, order_id)


def refund(
    conn: sqlite3.Connection, order_id: int, reason: str, amount_cents: int | None,
    restock: bool, note: str | None,
) -> dict[str, Any]:
    """Record a refund; a refund of everything left marks the order refunded."""
    order = order_row(conn, order_id)
    if order["status"] not in ("paid", "shipped", "delivered"):
        raise AppError(
            f"order #{order_id} is {order['status']}; only paid, shipped or delivered "
            "orders can be refunded (cancel pending orders instead)"
        )
    remaining = order["total_cents"] - refunded_cents(conn, order_id)
    amount = remaining if amount_cents is None else amount_cents
    if not 0 < amount <= remaining:
        raise AppError(
            f"refund of {amount} cents is not possible for order #{order_id}: "
            f"{remaining} cents ({money(remaining)}) are still refundable"
        )
    full = amount == remaining
    if restock and not full:
        raise AppError(
            "restock=true is only allowed when refunding everything that is left; "
            "refund the full remaining amount or set restock=false"
        )
    refund_id = next_id(conn, "refunds")
    conn.execute("INSERT INTO refunds VALUES (?, ?, ?, ?, ?, ?, ?)",
                 [refund_id, order_id, amount, reason, int(restock), note, NOW])
    if restock:
        restock_order(conn, order_id)
    if full:
        conn.execute("UPDATE orders SET status = 'refunded', updated_at = ? WHERE id = ?",
                     [NOW, order_id])
    return {"refund_id": refund_id, "amount_cents": amount, "amount": money(amount),
            "order": order_detail(conn, order_id)}


def _check_date(value: str | None, name: str) -> None:
    if value is not None and not _DATE.match(value):
        raise AppError(f"{name} must be a date like 2025-05-31, got {value!r}")


def register_tools(server: MCPServer, db: DbFactory) -> None:
    """Add the shop tools to one instance's MCP server."""

    def search_products(
        query: Annotated[
            str | None, Field(description="Case-insensitive text found in the name or SKU.")
        ] = None,
        category: Annotated[Category | None, Field(description="Only this category.")] = None,
        max_price_cents: Annotated[
            int | None, Field(description="Only products costing at most this.", ge=1)
        ] = None,
        in_stock_only: Annotated[bool, Field(description="Hide products with no stock.")] = False,
        include_inactive: Annotated[
            bool, Field(description="Also list discontinued products.")
        ] = False,
        sort: Annotated[
            Literal["name", "price_asc", "price_desc", "stock_asc"],
            Field(description="Result order."),
        ] = "name",
        limit: Annotated[int, Field(description="Maximum results.", ge=1, le=60)] = 20,
    ) -> dict[str, Any]:
        """Search the catalogue; each product comes with its price and on-hand stock."""
        with tool_errors(), db() as conn:
            where = Where()
            if query:
                where.like(("p.name", "p.sku"), query)
            if category:
                where.add("p.category = ?", category)
            if max_price_cents is not None:
                where.add("p.price_cents <= ?", max_price_cents)
            if in_stock_only:
                where.add("v.on_hand > 0")
            if not include_inactive:
                where.add("p.active = 1")
            order = {"name": "p.name", "price_asc": "p.price_cents, p.name",
                     "price_desc": "p.price_cents DESC, p.name",
                     "stock_asc": "v.on_hand, p.name"}[sort]
            found = rows(
                conn,
                f"""
                SELECT p.sku, p.name, p.category, p.price_cents, p.active,
                       v.on_hand, v.reorder_level
                FROM products p JOIN inventory v ON v.product_id = p.id
                {where.sql} ORDER BY {order} LIMIT ?
                """,
                [*where.args, limit],
            )
            for product in found:
                product["price"] = money(product["price_cents"])
                product["active"] = bool(product["active"])
            return {"products": found}

    def get_product(
        sku: Annotated[str, Field(description="Product SKU, e.g. 'KIT-114'.")],
    ) -> dict[str, Any]:
        """Get one product with stock, reorder level, bin and units sold (non-cancelled orders)."""
        with tool_errors(), db() as conn:
            product = product_by_sku(conn, sku)
            stock = one(conn, "SELECT on_hand, reorder_level, bin, updated_at FROM inventory "
                        "WHERE product_id = ?", [product["id"]])
            sold = scalar(conn, "SELECT COALESCE(SUM(i.quantity), 0) FROM order_items i JOIN "
                          "orders o ON o.id = i.order_id WHERE i.product_id = ? AND "
                          "o.status != 'cancelled'", [product["id"]])
            return {**product, "active": bool(product["active"]),
                    "price": money(product["price_cents"]), "inventory": stock,
                    "units_sold": sold}

    def find_customers(
        query: Annotated[
            str | None, Field(description="Case-insensitive text found in the name or email.")
        ] = None,
        tier: Annotated[Tier | None, Field(description="Only this loyalty tier.")] = None,
        limit: Annotated[int, Field(description="Maximum results.", ge=1, le=50)] = 20,
    ) -> dict[str, Any]:
        """Find customers with their order count and lifetime spend (non-cancelled orders)."""
        with tool_errors(), db() as conn:
            where = Where()
            if query:
                where.like(("c.name", "c.email"), query)
            if tier:
                where.add("c.loyalty_tier = ?", tier)
            found = rows(
                conn,
                f"""
                SELECT c.id, c.name, c.email, c.city, c.country, c.loyalty_tier,
                       COUNT(o.id) AS orders,
                       COALESCE(SUM(CASE WHEN o.status != 'cancelled' THEN o.total_cents END), 0)
                           AS lifetime_spend_cents
                FROM customers c LEFT JOIN orders o ON o.customer_id = c.id
                {where.sql} GROUP BY c.id ORDER BY c.name, c.id LIMIT ?
                """,
                [*where.args, limit],
            )
            return {"customers": found}

    def list_orders(
        customer_email: Annotated[
            str | None, Field(description="Only orders of this customer.")
        ] = None,
        status: Annotated[OrderStatus | None, Field(description="Only this status.")] = None,
        placed_from: Annotated[
            str | None, Field(description="Only orders placed on or after this date (YYYY-MM-DD).")
        ] = None,
        placed_to: Annotated[
            str | None, Field(description="Only orders placed on or before this date (YYYY-MM-DD).")
        ] = None,
        sort: Annotated[
            Literal["newest", "oldest", "total_desc"], Field(description="Result order.")
        ] = "newest",
        limit: Annotated[int, Field(description="Page size.", ge=1, le=50)] = 20,
        offset: Annotated[int, Field(description="Rows to skip (paging).", ge=0)] = 0,
    ) -> dict[str, Any]:
        """List orders (newest first by default) with customer, status, item count and total."""
        with tool_errors(), db() as conn:
            _check_date(placed_from, "placed_from")
            _check_date(placed_to, "placed_to")
            where = Where()
            if customer_email:
                where.add("o.customer_id = ?", customer_by_email(conn, customer_email)["id"])
            if status:
                where.add("o.status = ?", status)
            if placed_from:
                where.add("substr(o.placed_at, 1, 10) >= ?", placed_from)
            if placed_to:
                where.add("substr(o.placed_at, 1, 10) <= ?", placed_to)
            order = {"newest": "o.placed_at DESC, o.id DESC", "oldest": "o.placed_at, o.id",
                     "total_desc": "o.total_cents DESC, o.id"}[sort]
            total = scalar(conn, f"SELECT COUNT(*) FROM orders o {where.sql}", where.args)
            found = rows(
                conn,
                f"""
                SELECT o.id, o.status, o.placed_at, c.name AS customer_name,
                       c.email AS customer_email, o.total_cents,
                       (SELECT SUM(quantity) FROM order_items WHERE order_id = o.id) AS units
                FROM orders o JOIN customers c ON c.id = o.customer_id
                {where.sql} ORDER BY {order} LIMIT ? OFFSET ?
                """,
                [*where.args, limit, offset],
            )
            for row in found:
                row["total"] = money(row["total_cents"])
            return {"total": total, "offset": offset, "orders": found}

    def get_order(
        order_id: Annotated[int, Field(description="The order number, e.g. 5123.")],
    ) -> dict[str, Any]:
        """Get one order with customer, line items, amounts, refunds and refundable amount."""
        with tool_errors(), db() as conn:
            return order_detail(conn, order_id)

    def place_order(
        customer_email: Annotated[str, Field(description="Email of an existing customer.")],
        items: Annotated[
            list[OrderLine], Field(description="Products and quantities.", min_length=1)
        ],
        coupon_code: Annotated[
            str | None, Field(description="Optional active, unexpired coupon code.")
        ] = None,
        shipping_method: Annotated[
            Literal["standard", "express"],
            Field(description="standard: 5.99, free from 50.00; express: 14.99."),
        ] = "standard",
    ) -> dict[str, Any]:
        """Place a paid order for a customer: takes stock, applies the coupon, prices shipping."""
        with tool_errors(), db() as conn:
            customer = customer_by_email(conn, customer_email)
            skus = [line.sku.strip().upper() for line in items]
            if len(set(skus)) != len(skus):
                raise AppError("each SKU may appear once; merge repeated lines into one quantity")
            priced = []
            for line in items:
                product = product_by_sku(conn, line.sku)
                if not product["active"]:
                    raise AppError(f"{product['sku']} ({product['name']}) is discontinued")
                in_stock = on_hand(conn, product["id"])
                if in_stock < line.quantity:
                    raise AppError(
                        f"only {in_stock} of {product['sku']} ({product['name']}) in stock, "
                        f"{line.quantity} requested"
                    )
                priced.append((product, line.quantity))
            percent = 0
            code = None
            if coupon_code:
                coupon = one_or_refuse(conn, "SELECT * FROM coupons WHERE upper(code) = upper(?)",
                                       [coupon_code.strip()], f"no coupon {coupon_code!r}")
                if not coupon["active"] or coupon["expires_on"] < NOW[:10]:
                    raise AppError(f"coupon {coupon['code']} is inactive or expired")
                if coupon["times_used"] >= coupon["max_uses"]:
                    raise AppError(f"coupon {coupon['code']} has no uses left")
                percent, code = coupon["percent_off"], coupon["code"]
                conn.execute("UPDATE coupons SET times_used = times_used + 1 WHERE id = ?",
                             [coupon["id"]])
            subtotal = sum(p["price_cents"] * q for p, q in priced)
            discount, shipping, total = order_amounts(subtotal, percent, shipping_method)
            order_id = next_id(conn, "orders")
            conn.execute("INSERT INTO orders VALUES (?, ?, 'paid', ?, ?, ?, ?, ?, ?, ?, ?)",
                         [order_id, customer["id"], NOW, shipping_method, subtotal, discount,
                          shipping, total, code, NOW])
            for product, quantity in priced:
                conn.execute("INSERT INTO order_items VALUES (?, ?, ?, ?, ?)",
                             [next_id(conn, "order_items"), order_id, product["id"], quantity,
                              product["price_cents"]])
                conn.execute("UPDATE inventory SET on_hand = on_hand - ?, updated_at = ? "
                             "WHERE product_id = ?", [quantity, NOW, product["id"]])
            return order_detail(conn, order_id)

    def update_order_status(
        order_id: Annotated[int, Field(description="The order number.")],
        status: Annotated[
            Literal["paid", "shipped", "delivered", "cancelled"],
            Field(
                description="pending->paid|cancelled, paid->shipped|cancelled, "
                "shipped->delivered. Cancelling puts the items back in stock."
            ),
        ],
    ) -> dict[str, Any]:
        """Move an order along its lifecycle (refunds go through refund_order)."""
        with tool_errors(), db() as conn:
            return set_order_status(conn, order_id, status)

    def refund_order(
        order_id: Annotated[int, Field(description="The order number.")],
        reason: Annotated[RefundReason, Field(description="Why the money is returned.")],
        amount_cents: Annotated[
            int | None,
            Field(description="Amount to refund; leave out to refund everything left.", ge=1),
        ] = None,
        restock: Annotated[
            bool,
            Field(description="Put all items back in stock (only with a full refund)."),
        ] = False,
        note: Annotated[str | None, Field(description="Optional note for the record.")] = None,
    ) -> dict[str, Any]:
        """Refund a paid, shipped or delivered order in full or in part.

        Refunding everything that is left marks the order 'refunded'.
        """
        with tool_errors(), db() as conn:
            return refund(conn, order_id, reason, amount_cents, restock, note)

    def adjust_inventory(
        adjustments: Annotated[
            list[StockAdjustment], Field(description="Stock changes to apply.", min_length=1)
        ],
        reason: Annotated[
            Literal["received", "damaged", "count_correction"],
            Field(description="Why stock changes (for the stock log)."),
        ],
    ) -> dict[str, Any]:
        """Add or remove on-hand stock for one or more SKUs, all or nothing."""
        with tool_errors(), db() as conn:
            result = []
            seen: set[str] = set()
            for change in adjustments:
                product = product_by_sku(conn, change.sku)
                if product["sku"] in seen:
                    raise AppError(f"{product['sku']} appears twice; combine its deltas")
                seen.add(product["sku"])
                if change.delta == 0:
                    raise AppError(f"delta for {product['sku']} is 0; nothing to change")
                before = on_hand(conn, product["id"])
                if before + change.delta < 0:
                    raise AppError(
                        f"{product['sku']} has {before} on hand; cannot remove {-change.delta}"
                    )
                conn.execute("UPDATE inventory SET on_hand = ?, updated_at = ? "
                             "WHERE product_id = ?", [before + change.delta, NOW, product["id"]])
                result.append({"sku": product["sku"], "before": before,
                               "after": before + change.delta})
            return {"reason": reason, "adjusted": result}

    def create_coupon(
        code: Annotated[
            str,
            Field(
                description="Upper-case letters and digits, 4-16 chars.",
                pattern=r"^[A-Z0-9]{4,16}$",
            ),
        ],
        percent_off: Annotated[int, Field(description="Discount in percent.", ge=1, le=90)],
        expires_on: Annotated[str, Field(description="Last valid day, YYYY-MM-DD.")],
        max_uses: Annotated[int, Field(description="How many orders may use it.", ge=1)] = 100,
    ) -> dict[str, Any]:
        """Create a new active percentage coupon."""
        with tool_errors(), db() as conn:
            _check_date(expires_on, "expires_on")
            if expires_on < NOW[:10]:
                raise AppError(f"expires_on {expires_on} is in the past (today is {NOW[:10]})")
            if scalar(conn, "SELECT 1 FROM coupons WHERE code = ?", [code]):
                raise AppError(f"coupon {code} already exists; pick another code")
            coupon_id = next_id(conn, "coupons")
            conn.execute("INSERT INTO coupons VALUES (?, ?, ?, 1, ?, ?, 0)",
                         [coupon_id, code, percent_off, expires_on, max_uses])
            return one(conn, "SELECT * FROM coupons WHERE id = ?", [coupon_id]) or {}

    add_tools(server, (search_products, get_product, find_customers, list_orders, get_order,
                       place_order, update_order_status, refund_order, adjust_inventory,
                       create_coupon),
              read_only=("search_products", "get_product", "find_customers", "list_orders",
                         "get_order"))
