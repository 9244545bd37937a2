"""Schema and deterministic seed data of the helpdesk app.

Everything is derived from one seeded ``random.Random`` and a fixed clock, never from the
wall clock: tasks quote ids, names and counts from this data, and their verifiers hard-code
expected values, so two builds must be row-for-row identical on every machine.
"""

from __future__ import annotations

import random
import sqlite3
from datetime import timedelta

from fleetenv.local.apps.seed import frozen_clock, require_data, stamp, unique_email

#: The app's frozen "now". Tools stamp writes with it, so replays are byte-identical.
NOW = "2025-06-02T09:30:00Z"
_NOW_DT = frozen_clock(NOW)
_RANDOM_SEED = 20250602

DATA_KEY = "helpdesk-seed"
DATA_VERSIONS = ("v1",)

STATUSES = ("open", "pending", "resolved", "closed")
PRIORITIES = ("low", "normal", "high", "urgent")
CHANNELS = ("email", "chat", "phone", "web")
TEAMS = ("billing", "technical", "accounts")
TIERS = ("free", "pro", "enterprise")
TAGS = (
    "billing", "invoice", "refund", "login", "bug", "api", "mobile", "outage",
    "onboarding", "feature-request", "security", "vip", "escalated", "data-export",
)  # fmt: skip

SCHEMA = """
CREATE TABLE agents (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL UNIQUE,
    team TEXT NOT NULL CHECK (team IN ('billing', 'technical', 'accounts')),
    role TEXT NOT NULL CHECK (role IN ('agent', 'lead')),
    active INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL UNIQUE,
    company TEXT NOT NULL,
    tier TEXT NOT NULL CHECK (tier IN ('free', 'pro', 'enterprise')),
    created_at TEXT NOT NULL
);
CREATE TABLE tickets (
    id INTEGER PRIMARY KEY,
    subject TEXT NOT NULL,
    description TEXT NOT NULL,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    assignee_id INTEGER REFERENCES agents (id),
    status TEXT NOT NULL CHECK (status IN ('open', 'pending', 'resolved', 'closed')),
    priority TEXT NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
    channel TEXT NOT NULL CHECK (channel IN ('email', 'chat', 'phone', 'web')),
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    resolved_at TEXT
);
CREATE TABLE comments (
    id INTEGER PRIMARY KEY,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    author_type TEXT NOT NULL CHECK (author_type IN ('agent', 'customer')),
    author_id INTEGER NOT NULL,
    body TEXT NOT NULL,
    internal INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
CREATE TABLE tags (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE ticket_tags (
    id INTEGER PRIMARY KEY,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    tag_id INTEGER NOT NULL REFERENCES tags (id),
    UNIQUE (ticket_id, tag_id)
);
CREATE TABLE sla_policies (
    id INTEGER PRIMARY KEY,
    priority TEXT NOT NULL UNIQUE,
    first_response_hours INTEGER NOT NULL,
    resolution_hours INTEGER NOT NULL
);
CREATE INDEX tickets_by_status ON tickets (status, priority);
CREATE INDEX tickets_by_customer ON tickets (customer_id);
CREATE INDEX comments_by_ticket ON comments (ticket_id);
CREATE INDEX ticket_tags_by_ticket ON ticket_tags (ticket_id);
"""

_AGENTS = (
    ("Alex Morgan", "billing", "lead"),
    ("Priya Raman", "billing", "agent"),
    ("Tomasz Nowak", "billing", "agent"),
    ("Grace Okafor", "billing", "agent"),
    ("Daniel Kim", "technical", "lead"),
    ("Sofia Marquez", "technical", "agent"),
    ("Liam O'Brien", "technical", "agent"),
    ("Hana Suzuki", "technical", "agent"),
    ("Marcus Webb", "technical", "agent"),
    ("Elena Petrova", "accounts", "lead"),
    ("Noah Fischer", "accounts", "agent"),
    ("Aisha Bello", "accounts", "agent"),
    ("Oliver Grant", "accounts", "agent"),
)
_INACTIVE_AGENT = "Oliver Grant"

_FIRST = (
    "Ava", "Ben", "Chloe", "David", "Emma", "Felix", "Gina", "Hugo", "Isla", "Jack",
    "Kira", "Leo", "Maya", "Nina", "Omar", "Paula", "Quinn", "Rosa", "Sam", "Tara",
    "Umar", "Vera", "Will", "Xena", "Yusuf", "Zoe", "Carlos", "Mei", "Ravi", "Lena",
)  # fmt: skip
_LAST = (
    "Anderson", "Brooks", "Chen", "Diaz", "Evans", "Foster", "Garcia", "Hughes", "Ito",
    "Jensen", "Khan", "Larsen", "Moreau", "Nguyen", "Olsen", "Patel", "Quigley", "Rossi",
    "Schmidt", "Torres", "Varga", "Walsh", "Young", "Zimmer",
)  # fmt: skip
_COMPANIES = (
    ("Acme Logistics", "acmelogistics.com"), ("Brightleaf Foods", "brightleaf.io"),
    ("Cobalt Dynamics", "cobaltdyn.com"), ("Driftwood Studio", "driftwood.design"),
    ("Evergreen Health", "evergreenhealth.org"), ("Fjord Analytics", "fjord.ai"),
    ("Granite Legal", "granitelegal.com"), ("Harbor Freight Co", "harborfreight.co"),
    ("Ionic Labs", "ioniclabs.dev"), ("Juniper Retail", "juniperretail.com"),
    ("Kestrel Aviation", "kestrelair.com"), ("Lumen Energy", "lumenenergy.net"),
    ("Meridian Bank", "meridianbank.com"), ("Northwind Traders", "northwind.com"),
    ("Orchard Schools", "orchardschools.edu"), ("Pinnacle Realty", "pinnaclerealty.com"),
    ("Quartz Media", "quartzmedia.tv"), ("Redwood Clinics", "redwoodclinics.com"),
)  # fmt: skip

_SUBJECTS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "billing": (
        ("Charged twice for the {month} invoice", ("billing", "invoice")),
        ("Refund request for unused seats", ("billing", "refund")),
        ("Invoice INV-{invoice} shows the wrong VAT number", ("invoice",)),
        ("Card declined when upgrading to the Pro plan", ("billing",)),
        ("Need a copy of invoice INV-{invoice}", ("invoice",)),
        ("Cancel subscription and refund the remaining months", ("billing", "refund")),
    ),
    "technical": (
        ("Cannot log in after password reset", ("login",)),
        ("API returns 500 on /v2/{resource}", ("api", "bug")),
        ("Mobile app crashes on startup (Android {android})", ("mobile", "bug")),
        ("Webhook deliveries delayed by hours", ("api", "outage")),
        ("Export to CSV times out for large projects", ("bug", "data-export")),
        ("Dashboard charts are not loading", ("bug",)),
        ("SSO login loop with our identity provider", ("login", "security")),
    ),
    "accounts": (
        ("Add {seats} seats to our workspace", ("onboarding",)),
        ("Transfer account ownership to a colleague", ("security",)),
        ("Change the company name on our account", ("onboarding",)),
        ("Request a full data export (GDPR)", ("data-export", "security")),
        ("Enable audit logs for our team", ("security", "feature-request")),
        ("Feature request: dark mode for the dashboard", ("feature-request",)),
    ),
}
_OPENERS = (
    "Hi team,", "Hello,", "Good morning,", "Hi there,", "Dear support,",
)  # fmt: skip
_DETAILS = (
    "This started {days} days ago and is blocking part of our team.",
    "We noticed it right after the last release.",
    "It happens for {num} of our users, not all of them.",
    "I already tried the steps in your help center without luck.",
    "Our finance department needs this sorted before the end of the month.",
    "Could you please look into it as soon as possible?",
)
_AGENT_REPLIES = (
    "Thanks for reaching out, I am looking into this now.",
    "Could you send us a screenshot and the time it happened?",
    "I have escalated this to our engineering team.",
    "This should be fixed now, please let us know if it happens again.",
    "I have applied the change to your account.",
    "We issued the correction; it will show on your next invoice.",
)
_CUSTOMER_REPLIES = (
    "Thanks, here are the details you asked for.",
    "It is still happening on our side.",
    "Confirmed, it works now. Thank you!",
    "Any update on this?",
    "Attaching the screenshot you requested.",
)
_RESOURCES = ("orders", "invoices", "users", "projects", "reports")
_MONTHS = ("January", "February", "March", "April", "May")


def _email_local(name: str) -> str:
    return name.lower().replace("'", "").replace(" ", ".")


def build_database(conn: sqlite3.Connection, data_key: str, data_version: str) -> None:
    """Create the schema and insert the seed rows (about 2,300 rows, tens of ms)."""
    require_data("helpdesk", data_key, data_version, DATA_KEY, DATA_VERSIONS)
    rng = random.Random(_RANDOM_SEED)
    conn.executescript(SCHEMA)

    agents = []
    for agent_id, (name, team, role) in enumerate(_AGENTS, start=1):
        active = 0 if name == _INACTIVE_AGENT else 1
        email = f"{_email_local(name)}@helpdesk.example"
        agents.append((agent_id, name, email, team, role, active))
    conn.executemany("INSERT INTO agents VALUES (?, ?, ?, ?, ?, ?)", agents)
    active_by_team = {team: [a[0] for a in agents if a[3] == team and a[5] == 1] for team in TEAMS}

    customers = []
    used_emails: set[str] = set()
    for customer_id in range(1, 161):
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        company, domain = rng.choice(_COMPANIES)
        email = unique_email(_email_local(name), domain, used_emails)
        tier = rng.choices(TIERS, weights=(5, 4, 2))[0]
        joined = _NOW_DT - timedelta(days=rng.randint(150, 900), minutes=rng.randint(0, 1439))
        customers.append((customer_id, name, email, company, tier, stamp(joined)))
    conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?)", customers)

    conn.executemany("INSERT INTO tags VALUES (?, ?)", list(enumerate(TAGS, start=1)))
    tag_ids = {name: tag_id for tag_id, name in enumerate(TAGS, start=1)}
    conn.executemany(
        "INSERT INTO sla_policies VALUES (?, ?, ?, ?)",
        [(1, "urgent", 1, 8), (2, "high", 4, 24), (3, "normal", 8, 72), (4, "low", 24, 168)],
    )

    tickets, comments = [], []
    ticket_tags: list[tuple[int, int, int]] = []  # (id, ticket_id, tag_id)
    comment_id = 1
    for ticket_id in range(1001, 1421):
        team = rng.choices(TEAMS, weights=(4, 5, 3))[0]
        template, template_tags = rng.choice(_SUBJECTS[team])
        subject = template.format(
            month=rng.choice(_MONTHS),
            invoice=rng.randint(1000, 9999),
            android=rng.randint(10, 15),
            seats=rng.randint(2, 60),
            resource=rng.choice(_RESOURCES),
        )
        detail = rng.choice(_DETAILS).format(days=rng.randint(2, 9), num=rng.randint(2, 40))
        customer = rng.choice(customers)
        description = f"{rng.choice(_OPENERS)} {subject}. {detail} - {customer[1]}"
        # Older tickets are more likely to be finished; recent ones more likely open.
        age_minutes = rng.randint(30, 120 * 24 * 60)
        created = _NOW_DT - timedelta(minutes=age_minutes)
        finished_weight = 1 + age_minutes // (10 * 24 * 60)
        status = rng.choices(STATUSES, weights=(6, 3, 2 * finished_weight, finished_weight))[0]
        priority = rng.choices(PRIORITIES, weights=(3, 6, 3, 1))[0]
        channel = rng.choices(CHANNELS, weights=(5, 3, 2, 3))[0]
        if status == "open" and rng.random() < 0.3:
            assignee = None
        else:
            assignee = rng.choice(active_by_team[team])
        touched = created + timedelta(minutes=rng.randint(5, max(age_minutes - 1, 6)))
        touched = min(touched, _NOW_DT)
        resolved_at = stamp(touched) if status in ("resolved", "closed") else None
        tickets.append(
            (ticket_id, subject, description, customer[0], assignee, status, priority, channel,
             stamp(created), stamp(touched), resolved_at)
        )  # fmt: skip

        extra_tags = ["vip"] if customer[4] == "enterprise" and rng.random() < 0.5 else []
        if priority == "urgent" and rng.random() < 0.4:
            extra_tags.append("escalated")
        for tag in (*template_tags, *extra_tags):
            ticket_tags.append((len(ticket_tags) + 1, ticket_id, tag_ids[tag]))

        n_comments = {"open": rng.randint(0, 2), "pending": rng.randint(1, 3)}.get(
            status, rng.randint(2, 4)
        )
        moment = created
        for index in range(n_comments):
            moment = moment + timedelta(minutes=rng.randint(10, 600))
            moment = min(moment, touched)
            agent_turn = index % 2 == 0 and assignee is not None
            if agent_turn:
                row = (comment_id, ticket_id, "agent", assignee, rng.choice(_AGENT_REPLIES),
                       int(rng.random() < 0.2), stamp(moment))  # fmt: skip
            else:
                row = (comment_id, ticket_id, "customer", customer[0],
                       rng.choice(_CUSTOMER_REPLIES), 0, stamp(moment))  # fmt: skip
            comments.append(row)
            comment_id += 1

    conn.executemany("INSERT INTO tickets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", tickets)
    conn.executemany("INSERT INTO comments VALUES (?, ?, ?, ?, ?, ?, ?)", comments)
    conn.executemany("INSERT INTO ticket_tags VALUES (?, ?, ?)", ticket_tags)
    conn.commit()
