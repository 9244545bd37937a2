"""Schema and deterministic seed data of the shop app.

Money is stored as integer cents (``*_cents``) so totals compare exactly after a JSON round
trip. Everything comes from one seeded ``random.Random`` and a fixed clock: tasks quote
SKUs, order ids and amounts from this data and their verifiers hard-code them.
"""

from __future__ import annotations

import random
import sqlite3
from datetime import timedelta

from fleetenv.local.apps.seed import frozen_clock, require_data, stamp, unique_email

#: The shop's frozen "now"; tools stamp writes with it so replays are byte-identical.
NOW = "2025-06-02T09:30:00Z"
_NOW_DT = frozen_clock(NOW)
_RANDOM_SEED = 5_2025

DATA_KEY = "shop-seed"
DATA_VERSIONS = ("v1",)

ORDER_STATUSES = ("pending", "paid", "shipped", "delivered", "cancelled", "refunded")
CATEGORIES = ("audio", "computing", "home", "kitchen", "outdoor", "fitness")
TIERS = ("bronze", "silver", "gold")
REFUND_REASONS = ("damaged", "not_received", "wrong_item", "customer_request", "other")
SHIPPING_CENTS = {"standard": 599, "express": 1499}
FREE_SHIPPING_FROM_CENTS = 5000

SCHEMA = """
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL UNIQUE,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    loyalty_tier TEXT NOT NULL CHECK (loyalty_tier IN ('bronze', 'silver', 'gold')),
    joined_at TEXT NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    sku TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price_cents INTEGER NOT NULL CHECK (price_cents > 0),
    active INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE inventory (
    product_id INTEGER PRIMARY KEY REFERENCES products (id),
    on_hand INTEGER NOT NULL CHECK (on_hand >= 0),
    reorder_level INTEGER NOT NULL,
    bin TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE coupons (
    id INTEGER PRIMARY KEY,
    code TEXT NOT NULL UNIQUE,
    percent_off INTEGER NOT NULL CHECK (percent_off BETWEEN 1 AND 90),
    active INTEGER NOT NULL DEFAULT 1,
    expires_on TEXT NOT NULL,
    max_uses INTEGER NOT NULL,
    times_used INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    status TEXT NOT NULL CHECK (status IN
        ('pending', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded')),
    placed_at TEXT NOT NULL,
    shipping_method TEXT NOT NULL CHECK (shipping_method IN ('standard', 'express')),
    subtotal_cents INTEGER NOT NULL,
    discount_cents INTEGER NOT NULL,
    shipping_cents INTEGER NOT NULL,
    total_cents INTEGER NOT NULL,
    coupon_code TEXT,
    updated_at TEXT NOT NULL
);
CREATE TABLE order_items (
    id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL REFERENCES orders (id),
    product_id INTEGER NOT NULL REFERENCES products (id),
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    unit_price_cents INTEGER NOT NULL
);
CREATE TABLE refunds (
    id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL REFERENCES orders (id),
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
    reason TEXT NOT NULL,
    restocked INTEGER NOT NULL DEFAULT 0,
    note TEXT,
    created_at TEXT NOT NULL
);
CREATE INDEX orders_by_customer ON orders (customer_id);
CREATE INDEX orders_by_status ON orders (status);
CREATE INDEX items_by_order ON order_items (order_id);
CREATE INDEX refunds_by_order ON refunds (order_id);
"""

_PRODUCTS: dict[str, tuple[tuple[str, int], ...]] = {
    "audio": (
        ("Wireless Earbuds Pro", 12999), ("Studio Headphones", 18900),
        ("Bluetooth Speaker Mini", 3999), ("Soundbar 2.1", 24900), ("USB Podcast Mic", 8900),
        ("Vinyl Turntable", 21900), ("Noise-Cancelling Headset", 15900),
        ("Portable Radio", 2999), ("Smart Speaker", 9900), ("Earbud Ear Tips (3 pairs)", 999),
    ),
    "computing": (
        ("Mechanical Keyboard", 10900), ("Wireless Mouse", 2999), ("27in 4K Monitor", 38900),
        ("USB-C Hub 7-in-1", 4999), ("Laptop Stand", 3499), ("1TB Portable SSD", 10999),
        ("Webcam 1080p", 5999), ("Ergonomic Mouse Pad", 1499), ("Docking Station", 17900),
        ("Cable Organizer Kit", 1299),
    ),
    "home": (
        ("LED Desk Lamp", 3999), ("Smart Plug (2-pack)", 2499), ("Air Purifier", 14900),
        ("Robot Vacuum", 29900), ("Weighted Blanket", 7900), ("Wall Clock", 2999),
        ("Scented Candle Set", 1999), ("Humidifier", 4999), ("Blackout Curtains", 3999),
        ("Storage Baskets (3)", 2799),
    ),
    "kitchen": (
        ("Chef's Knife 8in", 6999), ("Cast Iron Skillet", 4499), ("Espresso Machine", 34900),
        ("Electric Kettle", 3999), ("Digital Kitchen Scale", 1999), ("Blender 1200W", 8999),
        ("Coffee Grinder", 4999), ("Nonstick Pan Set", 9999), ("Glass Food Containers", 3499),
        ("Bamboo Cutting Board", 2499),
    ),
    "outdoor": (
        ("2-Person Tent", 15900), ("Sleeping Bag", 8900), ("Hiking Backpack 40L", 11900),
        ("Camping Stove", 5999), ("Headlamp", 2499), ("Water Filter Bottle", 3999),
        ("Trekking Poles", 6999), ("Camp Chair", 4999), ("Cooler 30L", 12900),
        ("Hammock", 3999),
    ),
    "fitness": (
        ("Yoga Mat", 2999), ("Adjustable Dumbbells", 29900), ("Resistance Bands Set", 1999),
        ("Jump Rope", 1299), ("Foam Roller", 2499), ("Kettlebell 12kg", 5999),
        ("Fitness Tracker", 9900), ("Pull-up Bar", 3499), ("Gym Bag", 4499),
        ("Water Bottle 1L", 1999),
    ),
}  # fmt: skip
_SKU_PREFIX = {"audio": "AUD", "computing": "CMP", "home": "HOM", "kitchen": "KIT",
               "outdoor": "OUT", "fitness": "FIT"}  # fmt: skip

_FIRST = (
    "Amelia", "Bruno", "Clara", "Dmitri", "Elif", "Farah", "Georg", "Helena", "Ivan", "Julia",
    "Kofi", "Lucia", "Mateo", "Nadia", "Oscar", "Pia", "Rafael", "Sara", "Theo", "Uma",
    "Viktor", "Wen", "Yara", "Zane", "Ines", "Jonas", "Leila", "Marco",
)  # fmt: skip
_LAST = (
    "Abbott", "Bianchi", "Costa", "Dubois", "Eriksen", "Ferreira", "Gallagher", "Horvat",
    "Ibrahim", "Jovanovic", "Kowalski", "Lindqvist", "Mendes", "Novak", "Oyelaran", "Perez",
    "Reyes", "Silva", "Tanaka", "Ueda", "Vasquez", "Weber",
)  # fmt: skip
_CITIES = (
    ("Lisbon", "PT"), ("Berlin", "DE"), ("Lyon", "FR"), ("Madrid", "ES"), ("Milan", "IT"),
    ("Dublin", "IE"), ("Utrecht", "NL"), ("Krakow", "PL"), ("Vienna", "AT"), ("Oslo", "NO"),
)  # fmt: skip
_DOMAINS = ("mailbox.example", "post.example", "inbox.example", "webmail.example")
_COUPONS = (
    ("WELCOME10", 10, 1, "2025-12-31", 1000), ("SPRING15", 15, 1, "2025-06-30", 200),
    ("VIP20", 20, 1, "2025-09-30", 50), ("FLASH30", 30, 0, "2025-04-30", 100),
    ("SUMMER5", 5, 1, "2025-08-31", 500), ("LOYAL12", 12, 1, "2025-12-31", 300),
)  # fmt: skip


def _retry_domain(suffix: int) -> str:
    """Spread repeated names over the mail domains instead of numbering one domain."""
    return _DOMAINS[suffix % len(_DOMAINS)]


def order_amounts(
    subtotal_cents: int, percent_off: int, shipping_method: str
) -> tuple[int, int, int]:
    """``(discount, shipping, total)`` in cents: the one pricing rule seed and tools share.

    The discount is rounded down to the cent; standard shipping is free from 50.00 after
    the discount.
    """
    discount = subtotal_cents * percent_off // 100
    after_discount = subtotal_cents - discount
    shipping = SHIPPING_CENTS[shipping_method]
    if shipping_method == "standard" and after_discount >= FREE_SHIPPING_FROM_CENTS:
        shipping = 0
    return discount, shipping, after_discount + shipping


def build_database(conn: sqlite3.Connection, data_key: str, data_version: str) -> None:
    """Create the schema and insert the seed rows (about 1,400 rows, tens of ms)."""
    require_data("shop", data_key, data_version, DATA_KEY, DATA_VERSIONS)
    rng = random.Random(_RANDOM_SEED)
    conn.executescript(SCHEMA)

    # (id, sku, name, category, price_cents, active)
    products: list[tuple[int, str, str, str, int, int]] = []
    inventory = []
    for category in CATEGORIES:
        for index, (name, price) in enumerate(_PRODUCTS[category], start=1):
            product_id = len(products) + 1
            sku = f"{_SKU_PREFIX[category]}-{100 + index * 7}"
            active = 0 if rng.random() < 0.06 else 1
            products.append((product_id, sku, name, category, price, active))
            reorder = rng.choice((5, 10, 15, 20))
            on_hand = rng.choice((0, 2, 4)) if rng.random() < 0.15 else rng.randint(8, 120)
            bin_code = f"{chr(65 + CATEGORIES.index(category))}{rng.randint(1, 12):02d}"
            restocked = _NOW_DT - timedelta(days=rng.randint(1, 60), minutes=rng.randint(0, 999))
            inventory.append((product_id, on_hand, reorder, bin_code, stamp(restocked)))
    conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?, ?)", products)
    conn.executemany("INSERT INTO inventory VALUES (?, ?, ?, ?, ?)", inventory)

    customers = []
    used: set[str] = set()
    for customer_id in range(1, 201):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        local = f"{first}.{last}".lower()
        email = unique_email(local, rng.choice(_DOMAINS), used, _retry_domain)
        city, country = rng.choice(_CITIES)
        tier = rng.choices(TIERS, weights=(6, 3, 1))[0]
        joined = _NOW_DT - timedelta(days=rng.randint(120, 1000), minutes=rng.randint(0, 1439))
        customers.append((customer_id, f"{first} {last}", email, city, country, tier,
                          stamp(joined)))  # fmt: skip
    conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?, ?)", customers)

    coupons = [(i, code, pct, act, exp, mx, 0) for i, (code, pct, act, exp, mx)
               in enumerate(_COUPONS, start=1)]  # fmt: skip
    percent_by_code = {c[1]: c[2] for c in coupons}
    uses = {c[1]: 0 for c in coupons}

    orders = []
    # (id, order_id, product_id, quantity, unit_price_cents)
    items: list[tuple[int, int, int, int, int]] = []
    # (id, order_id, amount_cents, reason, restocked, note, created_at)
    refunds: list[tuple[int, int, int, str, int, str | None, str]] = []
    sellable = [p for p in products if p[5] == 1]
    for order_id in range(5001, 5361):
        customer = rng.choice(customers)
        age_minutes = rng.randint(60, 90 * 24 * 60)
        placed = _NOW_DT - timedelta(minutes=age_minutes)
        days = age_minutes / (24 * 60)
        if days < 2:
            status = rng.choices(ORDER_STATUSES[:3], weights=(3, 4, 1))[0]
        elif days < 7:
            status = rng.choices(ORDER_STATUSES, weights=(1, 3, 5, 4, 1, 1))[0]
        else:
            status = rng.choices(ORDER_STATUSES, weights=(0, 0, 1, 14, 1, 1))[0]
        lines = rng.sample(sellable, k=rng.choices((1, 2, 3, 4), weights=(5, 4, 2, 1))[0])
        subtotal = 0
        for product in lines:
            quantity = rng.choices((1, 2, 3), weights=(8, 3, 1))[0]
            items.append((len(items) + 1, order_id, product[0], quantity, product[4]))
            subtotal += quantity * product[4]
        code = None
        if rng.random() < 0.18:
            code = rng.choice([c[1] for c in coupons if c[3] == 1 or c[1] == "FLASH30"])
            uses[code] += 1
        method = "express" if rng.random() < 0.2 else "standard"
        discount, shipping, total = order_amounts(
            subtotal, percent_by_code[code] if code else 0, method
        )
        touched = min(placed + timedelta(minutes=rng.randint(5, 3 * 24 * 60)), _NOW_DT)
        if status == "pending":
            touched = placed
        orders.append((order_id, customer[0], status, stamp(placed), method, subtotal,
                       discount, shipping, total, code, stamp(touched)))  # fmt: skip
        if status == "refunded":
            reason = rng.choice(REFUND_REASONS)
            refunds.append((len(refunds) + 1, order_id, total, reason, 0, None, stamp(touched)))
        elif status == "delivered" and rng.random() < 0.05:
            partial = max(items[-1][4] // 2, 100)
            refunds.append((len(refunds) + 1, order_id, partial, "damaged", 0,
                            "Partial refund for a damaged item", stamp(touched)))  # fmt: skip

    conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", orders)
    conn.executemany("INSERT INTO order_items VALUES (?, ?, ?, ?, ?)", items)
    conn.executemany("INSERT INTO refunds VALUES (?, ?, ?, ?, ?, ?, ?)", refunds)
    conn.executemany(
        "INSERT INTO coupons VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(*c[:6], uses[c[1]]) for c in coupons],
    )
    conn.commit()
