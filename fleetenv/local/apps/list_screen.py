"""The list-and-record web UI every sample app shows through its ``computer`` tool.

Each app's UI is a searchable, status-tabbed, paged table of its main records (tickets,
orders) plus a page for one record. The list page, moving between the two pages, the
search box and the paging keys work the same in every app, and computer-use tasks click at
fixed coordinates on them, so they live here once. An app subclasses
:class:`ListDetailScreen`, names its table, columns and texts, and draws and handles its
own record page.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleetenv.local.apps import widgets as w
from fleetenv.local.apps.screen import GREEN, PALE_GREEN, Canvas
from fleetenv.local.apps.toolkit import AppError, Where, rows, scalar
from fleetenv.local.apps.widgets import Hotspot

PAGE_ROWS = 14
"""Table rows on one list page: what fits between the status tabs and Prev/Next."""
_PAGE_STEPS = {"PageDown": PAGE_ROWS, "PageUp": -PAGE_ROWS, "Home": -(10**6), "End": 10**6}
_SEARCH_MAX_CHARS = 60


@dataclass
class ListDetailScreen:
    """UI state of one instance's app: which page is shown, filters, scroll and focus.

    Everything displayed is read from the database on every render; only navigation and
    half-typed text live here. Subclasses set the class constants below and implement the
    ``_signed_in_as``, ``_list_cells``, ``_render_record`` and ``_record_action`` hooks.
    """

    APP_TITLE: ClassVar[str]
    """Left part of the title bar, e.g. ``"Helpdesk"``."""
    LIST_TITLE: ClassVar[str]
    """What the list shows, plural and capitalised (``"Tickets"``)."""
    RECORD_NOUN: ClassVar[str]
    """One record, capitalised (``"Ticket"``); titles the record page."""
    TODAY: ClassVar[str]
    """The app's frozen date (``YYYY-MM-DD``), shown in the title bar."""
    STATUS_TABS: ClassVar[Sequence[str]]
    """Tab names; ``"All"`` shows every record, others filter on ``STATUS_COLUMN``."""
    LIST_COLUMNS: ClassVar[Sequence[tuple[str, int, int]]]
    """Table columns as ``(title, x offset, max chars)``, matching ``_list_cells``."""
    LIST_FROM: ClassVar[str]
    """``FROM ... JOIN ...`` of the list query."""
    LIST_SELECT: ClassVar[str]
    """Selected columns of the list query; must include the record's ``id``."""
    ID_COLUMN: ClassVar[str]
    """The record id column, which also orders the list."""
    STATUS_COLUMN: ClassVar[str]
    SEARCH_COLUMNS: ClassVar[Sequence[str]]
    """Columns the search box matches text in (a number like ``#1042`` also matches ids)."""
    SEARCH_PLACEHOLDER: ClassVar[str]

    screen: str = "list"
    """``"list"`` or ``"record"``."""
    record_id: int | None = None
    status_tab: str = "All"
    search_text: str = ""
    applied_search: str = ""
    offset: int = 0
    focus: str | None = None
    message: str = ""
    _total: int = field(default=0, repr=False)

    # -- hooks an app implements ---------------------------------------------------------

    def _signed_in_as(self, conn: sqlite3.Connection) -> str:
        """Who the title bar says is signed in."""
        raise NotImplementedError

    def _list_cells(self, row: dict[str, Any]) -> list[str]:
        """One list row's cell texts, in ``LIST_COLUMNS`` order."""
        raise NotImplementedError

    def _render_record(
        self, conn: sqlite3.Connection, canvas: Canvas, record_id: int
    ) -> list[Hotspot | None]:
        """Draw the open record's page below the title bar; return its controls."""
        raise NotImplementedError

    def _record_action(
        self, conn: sqlite3.Connection, record_id: int, target: str, value: object
    ) -> None:
        """React to a click on one of the record page's own controls."""
        raise NotImplementedError

    # -- rendering ---------------------------------------------------------------------

    def render(self, conn: sqlite3.Connection, canvas: Canvas) -> list[Hotspot]:
        """Draw the current state; return the clickable regions, topmost first."""
        who = f"{self._signed_in_as(conn)} | {self.TODAY}"
        if self.screen == "record" and self.record_id is not None:
            title = f"{self.APP_TITLE} - {self.RECORD_NOUN} #{self.record_id}"
            w.header(canvas, title, who)
            spots = self._render_record(conn, canvas, self.record_id)
        else:
            w.header(canvas, f"{self.APP_TITLE} - {self.LIST_TITLE}", who)
            spots = self._render_list(conn, canvas)
        if self.message:
            canvas.fill(16, 566, 768, 26, PALE_GREEN)
            canvas.text(24, 570, self.message[:62], GREEN, PALE_GREEN, 2)
        return [s for s in spots if s is not None]

    def _filters(self) -> Where:
        where = Where()
        if self.status_tab != "All":
            where.add(f"{self.STATUS_COLUMN} = ?", self.status_tab.lower())
        query = self.applied_search.strip()
        if query:
            like = f"%{query}%"
            cond = "(" + " OR ".join(f"{column} LIKE ?" for column in self.SEARCH_COLUMNS)
            args: list[object] = [like] * len(self.SEARCH_COLUMNS)
            if query.lstrip("#").isdigit():
                cond += f" OR {self.ID_COLUMN} = ?"
                args.append(int(query.lstrip("#")))
            where.add(cond + ")", *args)
        return where

    def _render_list(self, conn: sqlite3.Connection, canvas: Canvas) -> list[Hotspot | None]:
        spots: list[Hotspot | None] = [
            w.text_field(canvas, 16, 50, 560, self.search_text, "field:search",
                         focused=self.focus == "search", placeholder=self.SEARCH_PLACEHOLDER),
            w.button(canvas, 588, 50, 96, "Search", "button:search"),
            w.button(canvas, 692, 50, 92, "Clear", "button:clear",
                     enabled=bool(self.search_text or self.applied_search)),
        ]
        spots.extend(w.tabs(canvas, 16, 90, 144, self.STATUS_TABS, self.status_tab, "tab"))
        where = self._filters()
        self._total = int(scalar(conn, f"SELECT COUNT(*) {self.LIST_FROM} {where.sql}", where.args))
        self.offset = max(0, min(self.offset, max(self._total - PAGE_ROWS, 0)))
        found = rows(
            conn,
            f"SELECT {self.LIST_SELECT} {self.LIST_FROM} {where.sql} "
            f"ORDER BY {self.ID_COLUMN} LIMIT ? OFFSET ?",
            [*where.args, PAGE_ROWS, self.offset],
        )
        cells = [self._list_cells(r) for r in found]
        spots.extend(
            w.table(canvas, 126, self.LIST_COLUMNS, cells, [r["id"] for r in found], "row")
        )
        if self._total:
            shown = f"Rows {self.offset + 1}-{self.offset + len(found)} of {self._total}"
        else:
            shown = f"No {self.LIST_TITLE.lower()} match"
        w.label(canvas, 16, 530, shown)
        spots.append(w.button(canvas, 560, 524, 108, "< Prev", "button:prev",
                              enabled=self.offset > 0))
        spots.append(w.button(canvas, 676, 524, 108, "Next >", "button:next",
                              enabled=self.offset + PAGE_ROWS < self._total))
        return spots

    # -- input ---------------------------------------------------------------------------

    def click(self, conn: sqlite3.Connection, spot: Hotspot) -> None:
        """React to a click on ``spot`` (may write to the database)."""
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
            self._close()
        elif self.record_id is None:
            raise AppError(f"{target} needs an open {self.RECORD_NOUN.lower()}; click a row first")
        else:
            self._record_action(conn, self.record_id, target, spot.value)

    def _open(self, record_id: int) -> None:
        self.screen, self.record_id = "record", record_id

    def _close(self) -> None:
        self.screen, self.record_id = "list", None

    def type_text(self, conn: sqlite3.Connection, text: str) -> None:
        if self.focus != "search":
            raise AppError("no text field is focused; click the search box first")
        self.search_text = (self.search_text + text)[:_SEARCH_MAX_CHARS]

    def key(self, conn: sqlite3.Connection, key: str) -> None:
        if key == "Escape":
            if self.focus:
                self.focus = None
            elif self.screen == "record":
                self._close()
        elif key in _PAGE_STEPS:
            self._move(_PAGE_STEPS[key])
        elif self.focus == "search":
            if key == "Enter":
                self.applied_search, self.offset = self.search_text, 0
            elif key == "Backspace":
                self.search_text = self.search_text[:-1]

    def scroll(self, conn: sqlite3.Connection, direction: str, amount: int) -> None:
        """Scroll the list; a record page has nothing to scroll unless an app says so."""
        if self.screen == "list":
            self._move(amount if direction == "down" else -amount)

    def _move(self, delta: int) -> None:
        """Page keys move the list even behind an open record, which keeps its place."""
        self.offset = max(self.offset + delta, 0)
