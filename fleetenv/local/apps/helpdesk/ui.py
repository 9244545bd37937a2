"""The helpdesk web UI behind the ``computer`` tool: a ticket list and a ticket page.

State (screen, filters, scroll, focus, typed text) lives on the object, one per instance;
everything shown is read from the database on every render. The signed-in agent is fixed
(agent #1), so replies posted from the UI have a known author.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from fleetenv.local.apps import widgets as w
from fleetenv.local.apps.computer import Hotspot
from fleetenv.local.apps.helpdesk.data import NOW
from fleetenv.local.apps.helpdesk.tools import change_ticket, post_comment, ticket_detail
from fleetenv.local.apps.screen import GREEN, PALE_GREEN, RED, Canvas, wrap
from fleetenv.local.apps.toolkit import AppError, one, rows, scalar

SIGNED_IN_AGENT_ID = 1
PAGE_ROWS = 14
STATUS_TABS = ("All", "Open", "Pending", "Resolved", "Closed")
PRIORITY_BUTTONS = ("low", "normal", "high", "urgent")
_LIST_COLUMNS = (
    ("#", 8, 4),
    ("Priority", 68, 8),
    ("Status", 176, 8),
    ("Subject", 284, 26),
    ("Customer", 608, 13),
)


@dataclass
class HelpdeskScreen:
    """UI state of one instance's helpdesk web app."""

    screen: str = "list"
    ticket_id: int | None = None
    status_tab: str = "All"
    search_text: str = ""
    applied_search: str = ""
    offset: int = 0
    focus: str | None = None
    reply_text: str = ""
    comment_offset: int = 0
    message: str = ""
    _total: int = field(default=0, repr=False)

    # -- rendering ---------------------------------------------------------------------

    def render(self, conn: sqlite3.Connection, canvas: Canvas) -> list[Hotspot]:
        agent = one(conn, "SELECT name FROM agents WHERE id = ?", [SIGNED_IN_AGENT_ID])
        who = agent["name"] if agent else "unknown"
        if self.screen == "ticket" and self.ticket_id is not None:
            w.header(canvas, f"Helpdesk - Ticket #{self.ticket_id}", f"{who} | {NOW[:10]}")
            spots = self._render_ticket(conn, canvas)
        else:
            w.header(canvas, "Helpdesk - Tickets", f"{who} | {NOW[:10]}")
            spots = self._render_list(conn, canvas)
        if self.message:
            canvas.fill(16, 566, 768, 26, PALE_GREEN)
            canvas.text(24, 570, self.message[:62], GREEN, PALE_GREEN, 2)
        return [s for s in spots if s is not None]

    def _filters(self) -> tuple[str, list[object]]:
        where: list[str] = []
        args: list[object] = []
        if self.status_tab != "All":
            where.append("t.status = ?")
            args.append(self.status_tab.lower())
        query = self.applied_search.strip()
        if query:
            like = f"%{query}%"
            cond = "(t.subject LIKE ? OR c.name LIKE ? OR c.email LIKE ?"
            args.extend([like, like, like])
            if query.lstrip("#").isdigit():
                cond += " OR t.id = ?"
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
                placeholder="Search subject, customer or #id",
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
        base = "FROM tickets t JOIN customers c ON c.id = t.customer_id"
        self._total = int(scalar(conn, f"SELECT COUNT(*) {base} {clause}", args))
        self.offset = max(0, min(self.offset, max(self._total - PAGE_ROWS, 0)))
        found = rows(
            conn,
            f"SELECT t.id, t.priority, t.status, t.subject, c.name {base} {clause} "
            "ORDER BY t.id LIMIT ? OFFSET ?",
            [*args, PAGE_ROWS, self.offset],
        )
        cells = [[str(r["id"]), r["priority"], r["status"], r["subject"], r["name"]] for r in found]
        spots.extend(w.table(canvas, 126, _LIST_COLUMNS, cells, [r["id"] for r in found], "row"))
        if self._total:
            shown = f"Rows {self.offset + 1}-{self.offset + len(found)} of {self._total}"
        else:
            shown = "No tickets match"
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

    def _render_ticket(self, conn: sqlite3.Connection, canvas: Canvas) -> list[Hotspot | None]:
        assert self.ticket_id is not None
        ticket = ticket_detail(conn, self.ticket_id)
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
        self.comment_offset = max(0, min(self.comment_offset, max(len(comments) - 4, 0)))
        for index, comment in enumerate(comments[self.comment_offset : self.comment_offset + 4]):
            kind = "note" if comment["internal"] else comment["author_type"]
            text = f"[{kind}] {comment['author_name']}: {comment['body']}"
            w.label(canvas, 16, 276 + index * 22, text, max_chars=64)
        w.label(canvas, 16, 376, "Priority:")
        for index, name in enumerate(PRIORITY_BUTTONS):
            spots.append(
                w.button(
                    canvas,
                    136 + index * 112,
                    370,
                    104,
                    name.capitalize(),
                    "button:priority",
                    name,
                    enabled=status != "closed" and ticket["priority"] != name,
                )
            )
        spots.append(
            w.button(
                canvas,
                16,
                414,
                140,
                "Resolve",
                "button:resolve",
                enabled=status in ("open", "pending"),
                color=GREEN,
            )
        )
        spots.append(
            w.button(canvas, 168, 414, 140, "Pending", "button:pending", enabled=status == "open")
        )
        spots.append(
            w.button(
                canvas,
                320,
                414,
                140,
                "Close",
                "button:close",
                enabled=status != "closed",
                color=RED,
            )
        )
        spots.append(
            w.button(
                canvas,
                472,
                414,
                140,
                "Reopen",
                "button:reopen",
                enabled=status in ("resolved", "closed"),
            )
        )
        w.label(canvas, 16, 462, "Reply to customer:")
        spots.append(
            w.text_field(
                canvas,
                16,
                486,
                600,
                self.reply_text,
                "field:reply",
                focused=self.focus == "reply",
                placeholder="Click here and type a reply",
            )
        )
        spots.append(
            w.button(
                canvas,
                628,
                486,
                156,
                "Post reply",
                "button:post",
                enabled=bool(self.reply_text.strip()) and status != "closed",
            )
        )
        return spots

    # -- input ---------------------------------------------------------------------------

    def click(self, conn: sqlite3.Connection, spot: Hotspot) -> None:
        self.message = ""
        target = spot.target
        if target.startswith("field:"):
            self.focus = target.removeprefix("field:")
            return
        self.focus = None
        if target == "row":
            self._open(int(spot.value or 0))
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
            self.screen, self.ticket_id = "list", None
        else:
            self._ticket_action(conn, target, spot.value)

    def _open(self, ticket_id: int) -> None:
        self.screen, self.ticket_id = "ticket", ticket_id
        self.reply_text, self.comment_offset = "", 0

    def _ticket_action(self, conn: sqlite3.Connection, target: str, value: object) -> None:
        if self.ticket_id is None:
            raise AppError(f"{target} needs an open ticket; click a row first")
        if target == "button:post":
            post_comment(conn, self.ticket_id, SIGNED_IN_AGENT_ID, self.reply_text, False)
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
            change_ticket(conn, self.ticket_id, status=status)
            self.message = f"Ticket #{self.ticket_id} is now {status}."
        elif target == "button:priority":
            change_ticket(conn, self.ticket_id, priority=str(value))
            self.message = f"Priority set to {value}."

    def type_text(self, conn: sqlite3.Connection, text: str) -> None:
        if self.focus == "search":
            self.search_text = (self.search_text + text)[:60]
        elif self.focus == "reply":
            self.reply_text = (self.reply_text + text)[:500]
        else:
            raise AppError("no text field is focused; click the search box or the reply box first")

    def key(self, conn: sqlite3.Connection, key: str) -> None:
        if key == "Escape":
            if self.focus:
                self.focus = None
            elif self.screen == "ticket":
                self.screen, self.ticket_id = "list", None
        elif key == "Enter":
            if self.focus == "search":
                self.applied_search, self.offset = self.search_text, 0
            elif self.focus == "reply" and self.reply_text.strip():
                self.click(conn, Hotspot(0, 0, 0, 0, "button:post"))
        elif key == "Backspace":
            if self.focus == "search":
                self.search_text = w.edit_text(self.search_text, key)
            elif self.focus == "reply":
                self.reply_text = w.edit_text(self.reply_text, key)
        elif key in ("PageDown", "PageUp", "Home", "End"):
            step = {"PageDown": PAGE_ROWS, "PageUp": -PAGE_ROWS, "Home": -(10**6), "End": 10**6}
            self._move(step[key])

    def scroll(self, conn: sqlite3.Connection, direction: str, amount: int) -> None:
        self._move(amount if direction == "down" else -amount)

    def _move(self, delta: int) -> None:
        if self.screen == "ticket":
            self.comment_offset = max(self.comment_offset + delta, 0)
        else:
            self.offset = max(self.offset + delta, 0)
