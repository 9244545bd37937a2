"""The helpdesk app's MCP tools (served at ``{root}mcp``).

Tools are closures over the instance's ``db`` factory; each call is one unit of work, so a
refused request (``AppError``) rolls back everything it did. Writes are stamped with the
app's frozen clock, and new rows take ``MAX(id) + 1``, so replaying the same calls always
produces the same database.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from fleetenv.local.apps.base import DbFactory, add_tools
from fleetenv.local.apps.helpdesk.data import NOW, TAGS
from fleetenv.local.apps.toolkit import (
    AppError,
    Where,
    customer_by_email,
    next_id,
    one,
    one_or_refuse,
    rows,
    scalar,
    tool_errors,
)

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server import MCPServer

Status = Literal["open", "pending", "resolved", "closed"]
Priority = Literal["low", "normal", "high", "urgent"]
Channel = Literal["email", "chat", "phone", "web"]
Team = Literal["billing", "technical", "accounts"]
Tier = Literal["free", "pro", "enterprise"]

_PRIORITY_ORDER = (
    "CASE t.priority WHEN 'urgent' THEN 0 WHEN 'high' THEN 1 WHEN 'normal' THEN 2 ELSE 3 END"
)

_SUMMARY_SQL = """
SELECT t.id, t.subject, t.status, t.priority, t.channel,
       c.name AS customer_name, c.email AS customer_email,
       a.name AS assignee_name, a.email AS assignee_email,
       t.created_at, t.updated_at
FROM tickets t
JOIN customers c ON c.id = t.customer_id
LEFT JOIN agents a ON a.id = t.assignee_id
"""


def agent_by_email(conn: sqlite3.Connection, email: str) -> dict[str, Any]:
    """The agent with ``email`` or an error that says where to look."""
    return one_or_refuse(conn, "SELECT * FROM agents WHERE lower(email) = lower(?)",
                         [email.strip()],
                         f"no agent with email {email!r}; call list_agents to see every agent")


def tag_id(conn: sqlite3.Connection, name: str) -> int:
    found = scalar(conn, "SELECT id FROM tags WHERE name = ?", [name.strip().lower()])
    if found is None:
        raise AppError(f"unknown tag {name!r}; known tags: {', '.join(TAGS)}")
    return int(found)


def ticket_row(conn: sqlite3.Connection, ticket_id: int) -> dict[str, Any]:
    return one_or_refuse(conn, "SELECT * FROM tickets WHERE id = ?", [ticket_id],
                         f"no ticket #{ticket_id}; find ticket ids with search_tickets")


def status_and_priority(status: str | None, priority: str | None) -> Where:
    """The filters ``search_tickets`` and ``ticket_stats`` share (``t`` is tickets)."""
    where = Where()
    if status:
        where.add("t.status = ?", status)
    if priority:
        where.add("t.priority = ?", priority)
    return where


def active_agent_id(conn: sqlite3.Connection, email: str) -> int:
    """The id of the agent with ``email``, who must still be active to take tickets."""
    agent = agent_by_email(conn, email)
    if not agent["active"]:
        raise AppError(f"agent {agent['email']} is inactive; pick an active agent")
    return int(agent["id"])


def ticket_detail(conn: sqlite3.Connection, ticket_id: int) -> dict[str, Any]:
    """A ticket with its customer, assignee, tags, SLA and comments, for display."""
    ticket = ticket_row(conn, ticket_id)
    customer = one(conn, "SELECT id, name, email, company, tier FROM customers WHERE id = ?",
                   [ticket["customer_id"]])
    assignee = None
    if ticket["assignee_id"] is not None:
        assignee = one(conn, "SELECT id, name, email, team FROM agents WHERE id = ?",
                       [ticket["assignee_id"]])
    tags = [r["name"] for r in rows(conn, "SELECT g.name FROM ticket_tags tt JOIN tags g "
                                    "ON g.id = tt.tag_id WHERE tt.ticket_id = ? ORDER BY g.name",
                                    [ticket_id])]
    sla = one(conn, "SELECT first_response_hours, resolution_hours FROM sla_policies "
              "WHERE priority = ?", [ticket["priority"]])
    comments = rows(
        conn,
        """
        SELECT m.id, m.author_type, m.internal, m.body, m.created_at,
               CASE m.author_type WHEN 'agent' THEN a.name ELSE c.name END AS author_name
        FROM comments m
        LEFT JOIN agents a ON m.author_type = 'agent' AND a.id = m.author_id
        LEFT JOIN customers c ON m.author_type = 'customer' AND c.id = m.author_id
        WHERE m.ticket_id = ? ORDER BY m.id
        """,
        [ticket_id],
    )
    for comment in comments:
        comment["internal"] = bool(comment["internal"])
    fields = ("id", "subject", "description", "status", "priority", "channel", "created_at",
              "updated_at", "resolved_at")
    return {**{k: ticket[k] for k in fields}, "customer": customer, "assignee": assignee,
            "tags": tags, "sla": sla, "comments": comments}


def change_ticket(
    conn: sqlite3.Connection, ticket_id: int, *, status: str | None = None,
    priority: str | None = None, assignee_id: int | None = None, unassign: bool = False,
) -> dict[str, Any]:
    """Apply a status / priority / assignee change; shared by the tool and the UI."""
    ticket = ticket_row(conn, ticket_id)
    if ticket["status"] == "closed" and status not in (None, "open"):
        raise AppError(f"ticket #{ticket_id} is closed; reopen it (status='open') to change it")
    changes: dict[str, Any] = {}
    if status is not None and status != ticket["status"]:
        changes["status"] = status
        if status in ("resolved", "closed"):
            changes["resolved_at"] = ticket["resolved_at"] or NOW
        else:
            changes["resolved_at"] = None
    if priority is not None and priority != ticket["priority"]:
        changes["priority"] = priority
    if unassign and ticket["assignee_id"] is not None:
        changes["assignee_id"] = None
    elif assignee_id is not None and assignee_id != ticket["assignee_id"]:
        changes["assignee_id"] = assignee_id
    if not changes:
        raise AppError(f"ticket #{ticket_id} already has those values; nothing was changed")
    changes["updated_at"] = NOW
    assignments = ", ".join(f"{column} = ?" for column in changes)
    conn.execute(f"UPDATE tickets SET {assignments} WHERE id = ?", [*changes.values(), ticket_id])
    return ticket_detail(conn, ticket_id)


def post_comment(
    conn: sqlite3.Connection, ticket_id: int, agent_id: int, body: str, internal: bool
) -> dict[str, Any]:
    """Insert an agent comment; the ticket row itself is left untouched."""
    ticket = ticket_row(conn, ticket_id)
    if ticket["status"] == "closed":
        raise AppError(f"ticket #{ticket_id} is closed; reopen it before commenting")
    text = body.strip()
    if not text:
        raise AppError("comment body is empty; write the reply text in 'body'")
    comment_id = next_id(conn, "comments")
    conn.execute("INSERT INTO comments VALUES (?, ?, 'agent', ?, ?, ?, ?)",
                 [comment_id, ticket_id, agent_id, text, int(internal), NOW])
    return {"id": comment_id, "ticket_id": ticket_id, "author_id": agent_id, "body": text,
            "internal": internal, "created_at": NOW}


def register_tools(server: MCPServer, db: DbFactory) -> None:
    """Add the helpdesk tools to one instance's MCP server."""

    def search_tickets(
        status: Annotated[Status | None, Field(description="Only tickets in this status.")] = None,
        priority: Annotated[Priority | None, Field(description="Only this priority.")] = None,
        assignee_email: Annotated[
            str | None, Field(description="Only tickets assigned to the agent with this email.")
        ] = None,
        unassigned: Annotated[bool, Field(description="Only tickets with no assignee.")] = False,
        customer_email: Annotated[
            str | None, Field(description="Only tickets filed by this customer.")
        ] = None,
        tag: Annotated[str | None, Field(description="Only tickets carrying this tag.")] = None,
        text: Annotated[
            str | None,
            Field(description="Case-insensitive text to find in the subject or description."),
        ] = None,
        sort: Annotated[
            Literal["newest", "oldest", "priority"],
            Field(description="Order of results: by creation time, or most urgent first."),
        ] = "newest",
        limit: Annotated[int, Field(description="Page size.", ge=1, le=50)] = 20,
        offset: Annotated[int, Field(description="Rows to skip (paging).", ge=0)] = 0,
    ) -> dict[str, Any]:
        """Search tickets by status, priority, assignee, customer, tag or text.

        Returns one page of ticket summaries and the total number of matches. Use
        get_ticket for the full ticket with its comments.
        """
        with tool_errors(), db() as conn:
            where = status_and_priority(status, priority)
            if assignee_email and unassigned:
                raise AppError("use either assignee_email or unassigned=true, not both")
            if assignee_email:
                where.add("t.assignee_id = ?", agent_by_email(conn, assignee_email)["id"])
            if unassigned:
                where.add("t.assignee_id IS NULL")
            if customer_email:
                where.add("t.customer_id = ?", customer_by_email(conn, customer_email)["id"])
            if tag:
                where.add(
                    "t.id IN (SELECT ticket_id FROM ticket_tags WHERE tag_id = ?)",
                    tag_id(conn, tag),
                )
            if text:
                where.like(("t.subject", "t.description"), text)
            order = {
                "newest": "t.created_at DESC, t.id DESC",
                "oldest": "t.created_at ASC, t.id ASC",
                "priority": f"{_PRIORITY_ORDER}, t.created_at ASC, t.id ASC",
            }[sort]
            total = scalar(conn, f"SELECT COUNT(*) FROM tickets t {where.sql}", where.args)
            found = rows(
                conn,
                f"{_SUMMARY_SQL} {where.sql} ORDER BY {order} LIMIT ? OFFSET ?",
                [*where.args, limit, offset],
            )
            return {"total": total, "offset": offset, "tickets": found}

    def get_ticket(
        ticket_id: Annotated[int, Field(description="The ticket number, e.g. 1042.")],
    ) -> dict[str, Any]:
        """Get one ticket with its customer, assignee, tags, SLA targets and all comments."""
        with tool_errors(), db() as conn:
            return ticket_detail(conn, ticket_id)

    def find_customers(
        query: Annotated[
            str | None,
            Field(description="Case-insensitive text found in the name, email or company."),
        ] = None,
        tier: Annotated[Tier | None, Field(description="Only customers on this plan.")] = None,
        limit: Annotated[int, Field(description="Maximum results.", ge=1, le=50)] = 20,
    ) -> dict[str, Any]:
        """Find customers and their ticket counts (open means open or pending)."""
        with tool_errors(), db() as conn:
            where = Where()
            if query:
                where.like(("c.name", "c.email", "c.company"), query)
            if tier:
                where.add("c.tier = ?", tier)
            found = rows(
                conn,
                f"""
                SELECT c.id, c.name, c.email, c.company, c.tier, c.created_at,
                       COUNT(t.id) AS total_tickets,
                       COALESCE(SUM(t.status IN ('open', 'pending')), 0) AS open_tickets
                FROM customers c LEFT JOIN tickets t ON t.customer_id = c.id
                {where.sql} GROUP BY c.id ORDER BY c.name, c.id LIMIT ?
                """,
                [*where.args, limit],
            )
            return {"customers": found}

    def list_agents(
        team: Annotated[Team | None, Field(description="Only agents of this team.")] = None,
        include_inactive: Annotated[
            bool, Field(description="Also list agents who left (they cannot take tickets).")
        ] = False,
    ) -> dict[str, Any]:
        """List support agents with their team, role and number of open/pending tickets."""
        with tool_errors(), db() as conn:
            where = Where()
            if team:
                where.add("a.team = ?", team)
            if not include_inactive:
                where.add("a.active = 1")
            found = rows(
                conn,
                f"""
                SELECT a.id, a.name, a.email, a.team, a.role, a.active,
                       COALESCE(SUM(t.status IN ('open', 'pending')), 0) AS open_tickets
                FROM agents a LEFT JOIN tickets t ON t.assignee_id = a.id
                {where.sql} GROUP BY a.id ORDER BY a.team, a.name
                """,
                where.args,
            )
            for agent in found:
                agent["active"] = bool(agent["active"])
            return {"agents": found}

    def create_ticket(
        customer_email: Annotated[str, Field(description="Email of an existing customer.")],
        subject: Annotated[
            str, Field(description="One-line summary.", min_length=3, max_length=200)
        ],
        description: Annotated[
            str, Field(description="The customer's problem in their words.", min_length=1)
        ],
        priority: Annotated[Priority, Field(description="Urgency.")] = "normal",
        channel: Annotated[Channel, Field(description="How the customer reached us.")] = "web",
        tags: Annotated[
            list[str], Field(description="Tag names to attach, e.g. ['billing', 'vip'].")
        ] = [],  # noqa: B006 - pydantic copies defaults
        assignee_email: Annotated[
            str | None, Field(description="Agent to assign; leave out to keep it unassigned.")
        ] = None,
    ) -> dict[str, Any]:
        """Open a new ticket for an existing customer, optionally tagged and assigned."""
        with tool_errors(), db() as conn:
            customer = customer_by_email(conn, customer_email)
            assignee_id = active_agent_id(conn, assignee_email) if assignee_email else None
            wanted: list[int] = []
            for name in tags:
                found = tag_id(conn, name)
                if found not in wanted:
                    wanted.append(found)
            ticket_id = next_id(conn, "tickets")
            conn.execute("INSERT INTO tickets VALUES (?, ?, ?, ?, ?, 'open', ?, ?, ?, ?, NULL)",
                         [ticket_id, subject.strip(), description.strip(), customer["id"],
                          assignee_id, priority, channel, NOW, NOW])
            for found in wanted:
                conn.execute("INSERT INTO ticket_tags VALUES (?, ?, ?)",
                             [next_id(conn, "ticket_tags"), ticket_id, found])
            return ticket_detail(conn, ticket_id)

    def update_ticket(
        ticket_id: Annotated[int, Field(description="The ticket number.")],
        status: Annotated[
            Status | None,
            Field(description="New status; resolving stamps resolved_at, reopening clears it."),
        ] = None,
        priority: Annotated[Priority | None, Field(description="New priority.")] = None,
        assignee_email: Annotated[
            str | None, Field(description="Email of the active agent to assign.")
        ] = None,
        unassign: Annotated[bool, Field(description="Remove the current assignee.")] = False,
    ) -> dict[str, Any]:
        """Change a ticket's status, priority and/or assignee.

        Closed tickets must be reopened (status 'open') before anything else changes.
        """
        with tool_errors(), db() as conn:
            if status is None and priority is None and assignee_email is None and not unassign:
                raise AppError(
                    "nothing to update; give status, priority, assignee_email or unassign"
                )
            if assignee_email and unassign:
                raise AppError("use either assignee_email or unassign=true, not both")
            assignee_id = active_agent_id(conn, assignee_email) if assignee_email else None
            return change_ticket(conn, ticket_id, status=status, priority=priority,
                                 assignee_id=assignee_id, unassign=unassign)

    def add_comment(
        ticket_id: Annotated[int, Field(description="The ticket number.")],
        body: Annotated[str, Field(description="The comment text.", min_length=1, max_length=4000)],
        author_email: Annotated[str, Field(description="Email of the agent writing it.")],
        internal: Annotated[
            bool, Field(description="True for an internal note the customer does not see.")
        ] = False,
    ) -> dict[str, Any]:
        """Add an agent reply (or internal note) to a ticket.

        It does not change the ticket's status; use update_ticket for that.
        """
        with tool_errors(), db() as conn:
            agent = agent_by_email(conn, author_email)
            return post_comment(conn, ticket_id, agent["id"], body, internal)

    def set_tags(
        ticket_id: Annotated[int, Field(description="The ticket number.")],
        add: Annotated[
            list[str], Field(description="Tag names to attach.")
        ] = [],  # noqa: B006 - pydantic copies defaults
        remove: Annotated[
            list[str], Field(description="Tag names to detach.")
        ] = [],  # noqa: B006 - pydantic copies defaults
    ) -> dict[str, Any]:
        """Attach and/or detach tags on a ticket; returns the tags it now carries."""
        with tool_errors(), db() as conn:
            if not add and not remove:
                raise AppError("give at least one tag name in 'add' or 'remove'")
            ticket_row(conn, ticket_id)
            overlap = {t.strip().lower() for t in add} & {t.strip().lower() for t in remove}
            if overlap:
                raise AppError(f"tags both added and removed: {', '.join(sorted(overlap))}")
            current = {
                r["tag_id"]: r["id"]
                for r in rows(
                    conn, "SELECT id, tag_id FROM ticket_tags WHERE ticket_id = ?", [ticket_id]
                )
            }
            added, removed = [], []
            for name in remove:
                found = tag_id(conn, name)
                if found in current:
                    conn.execute("DELETE FROM ticket_tags WHERE id = ?", [current.pop(found)])
                    removed.append(name.strip().lower())
            for name in add:
                found = tag_id(conn, name)
                if found not in current:
                    link_id = next_id(conn, "ticket_tags")
                    conn.execute(
                        "INSERT INTO ticket_tags VALUES (?, ?, ?)", [link_id, ticket_id, found]
                    )
                    current[found] = link_id
                    added.append(name.strip().lower())
            return {"ticket_id": ticket_id, "added": added, "removed": removed,
                    "tags": ticket_detail(conn, ticket_id)["tags"]}

    def ticket_stats(
        group_by: Annotated[
            Literal["status", "priority", "channel", "assignee", "team", "tag"],
            Field(description="What to count tickets by."),
        ],
        status: Annotated[Status | None, Field(description="Only count this status.")] = None,
        priority: Annotated[Priority | None, Field(description="Only count this priority.")] = None,
    ) -> dict[str, Any]:
        """Count tickets grouped by a field, most frequent first (unassigned shows as null)."""
        with tool_errors(), db() as conn:
            key = {"status": "t.status", "priority": "t.priority", "channel": "t.channel",
                   "assignee": "a.email", "team": "a.team", "tag": "g.name"}[group_by]
            joins = "LEFT JOIN agents a ON a.id = t.assignee_id"
            if group_by == "tag":
                joins += (
                    " JOIN ticket_tags tt ON tt.ticket_id = t.id JOIN tags g ON g.id = tt.tag_id"
                )
            where = status_and_priority(status, priority)
            counts = rows(
                conn,
                f"SELECT {key} AS key, COUNT(*) AS count FROM tickets t {joins} {where.sql} "
                "GROUP BY 1 ORDER BY 2 DESC, 1",
                where.args,
            )
            return {"group_by": group_by, "counts": counts}

    add_tools(server, (search_tickets, get_ticket, find_customers, list_agents, create_ticket,
                       update_ticket, add_comment, set_tags, ticket_stats),
              read_only=("search_tickets", "get_ticket", "find_customers", "list_agents",
                         "ticket_stats"))
