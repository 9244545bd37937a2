"""The helpdesk web UI behind the ``computer`` tool: a ticket list and a ticket page.

State (screen, filters, scroll, focus, typed text) lives on the object, one per instance;
everything shown is read from the database on every render. The signed-in agent is fixed
(agent #1), so replies posted from the UI have a known author.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from fleetenv.local.apps import widgets as w
from fleetenv.local.apps.helpdesk.data import NOW
from fleetenv.local.apps.helpdesk.tools import change_ticket, post_comment, ticket_detail
from fleetenv.local.apps.list_screen import ListDetailScreen
from fleetenv.local.apps.screen import BLUE, GREEN, RED, Canvas, wrap
from fleetenv.local.apps.toolkit import AppError, one
from fleetenv.local.apps.widgets import Hotspot

SIGNED_IN_AGENT_ID = 1
PRIORITY_BUTTONS = ("low", "normal", "high", "urgent")
COMMENT_ROWS = 4
"""Comments shown at once on a ticket page; page keys and the wheel scroll through them."""


@dataclass
class HelpdeskScreen(ListDetailScreen):
    """UI state of one instance's helpdesk web app (a ticket page adds a reply box)."""

    APP_TITLE = "Helpdesk"
    LIST_TITLE = "Tickets"
    RECORD_NOUN = "Ticket"
    TODAY = NOW[:10]
    STATUS_TABS = ("All", "Open", "Pending", "Resolved", "Closed")
    LIST_COLUMNS = (
        ("#", 8, 4),
        ("Priority", 68, 8),
        ("Status", 176, 8),
        ("Subject", 284, 26),
        ("Customer", 608, 13),
    )
    LIST_FROM = "FROM tickets t JOIN customers c ON c.id = t.customer_id"
    LIST_SELECT = "t.id, t.priority, t.status, t.subject, c.name"
    ID_COLUMN = "t.id"
    STATUS_COLUMN = "t.status"
    SEARCH_COLUMNS = ("t.subject", "c.name", "c.email")
    SEARCH_PLACEHOLDER = "Search subject, customer or #id"

    reply_text: str = ""
    comment_offset: int = 0

    # -- rendering ---------------------------------------------------------------------

    def _signed_in_as(self, conn: sqlite3.Connection) -> str:
        agent = one(conn, "SELECT name FROM agents WHERE id = ?", [SIGNED_IN_AGENT_ID])
        return agent["name"] if agent else "unknown"

    def _list_cells(self, row: dict[str, Any]) -> list[str]:
        return [str(row["id"]), row["priority"], row["status"], row["subject"], row["name"]]

    def _render_record(
        self, conn: sqlite3.Connection, canvas: Canvas, record_id: int
    ) -> list[Hotspot | None]:
        ticket = ticket_detail(conn, record_id)
        status = ticket["status"]
        spots: list[Hotspot | None] = [w.button(canvas, 16, 48, 96, "< Back", "button:back")]
        w.label(canvas, 124, 54, ticket["subject"], max_chars=55)
        customer = ticket["customer"]
        assignee = ticket["assignee"]
        lines = (
            f"Status: {status}   Priority: {ticket['priority']}   Channel: {ticket['channel']}",
            f"Customer: {customer['name']} <{customer['email']}>",
            f"Company: {customer['company']} ({customer['tier']})",
            f"Assignee: {assignee['name'] if assignee else 'Unassigned'}",
            f"Tags: {', '.join(ticket['tags']) or '-'}",
        )
        for index, line in enumerate(lines):
            w.label(canvas, 16, 88 + index * 22, line, max_chars=64)
        for index, line in enumerate(wrap(ticket["description"], 64)[:2]):
            w.label(canvas, 16, 204 + index * 22, line, color=(60, 64, 72))
        comments = ticket["comments"]
        w.label(canvas, 16, 252, f"Comments ({len(comments)})", color=(37, 99, 235))
        last_page = max(len(comments) - COMMENT_ROWS, 0)
        self.comment_offset = max(0, min(self.comment_offset, last_page))
        shown = comments[self.comment_offset : self.comment_offset + COMMENT_ROWS]
        for index, comment in enumerate(shown):
            kind = "note" if comment["internal"] else comment["author_type"]
            text = f"[{kind}] {comment['author_name']}: {comment['body']}"
            w.label(canvas, 16, 276 + index * 22, text, max_chars=64)
        w.label(canvas, 16, 376, "Priority:")
        for index, name in enumerate(PRIORITY_BUTTONS):
            spots.append(w.button(canvas, 136 + index * 112, 370, 104, name.capitalize(),
                                  "button:priority", name,
                                  enabled=status != "closed" and ticket["priority"] != name))
        actions = (  # (x, label, target, enabled, colour)
            (16, "Resolve", "button:resolve", status in ("open", "pending"), GREEN),
            (168, "Pending", "button:pending", status == "open", BLUE),
            (320, "Close", "button:close", status != "closed", RED),
            (472, "Reopen", "button:reopen", status in ("resolved", "closed"), BLUE),
        )
        for x, text, target, enabled, color in actions:
            spots.append(w.button(canvas, x, 414, 140, text, target, enabled=enabled, color=color))
        w.label(canvas, 16, 462, "Reply to customer:")
        spots.append(w.text_field(canvas, 16, 486, 600, self.reply_text, "field:reply",
                                  focused=self.focus == "reply",
                                  placeholder="Click here and type a reply"))
        spots.append(w.button(canvas, 628, 486, 156, "Post reply", "button:post",
                              enabled=bool(self.reply_text.strip()) and status != "closed"))
        return spots

    # -- input ---------------------------------------------------------------------------

    def _open(self, record_id: int) -> None:
        super()._open(record_id)
        self.reply_text, self.comment_offset = "", 0

    def _record_action(
        self, conn: sqlite3.Connection, record_id: int, target: str, value: object
    ) -> None:
        if target == "button:post":
            post_comment(conn, record_id, SIGNED_IN_AGENT_ID, self.reply_text, False)
            self.reply_text = ""
            self.message = "Reply posted."
            return
        status = {
            "button:resolve": "resolved",
            "button:pending": "pending",
            "button:close": "closed",
            "button:reopen": "open",
        }.get(target)
        if status is not None:
            change_ticket(conn, record_id, status=status)
            self.message = f"Ticket #{record_id} is now {status}."
        elif target == "button:priority":
            change_ticket(conn, record_id, priority=str(value))
            self.message = f"Priority set to {value}."

    def type_text(self, conn: sqlite3.Connection, text: str) -> None:
        if self.focus == "reply":
            self.reply_text = (self.reply_text + text)[:500]
        elif self.focus == "search":
            super().type_text(conn, text)
        else:
            raise AppError("no text field is focused; click the search box or the reply box first")

    def key(self, conn: sqlite3.Connection, key: str) -> None:
        if self.focus == "reply" and key == "Enter":
            if self.reply_text.strip():
                self.click(conn, Hotspot(0, 0, 0, 0, "button:post"))
        elif self.focus == "reply" and key == "Backspace":
            self.reply_text = self.reply_text[:-1]
        else:
            super().key(conn, key)

    def scroll(self, conn: sqlite3.Connection, direction: str, amount: int) -> None:
        """The wheel scrolls the comments on a ticket page, the list elsewhere."""
        self._move(amount if direction == "down" else -amount)

    def _move(self, delta: int) -> None:
        if self.screen == "record":
            self.comment_offset = max(self.comment_offset + delta, 0)
        else:
            super()._move(delta)
