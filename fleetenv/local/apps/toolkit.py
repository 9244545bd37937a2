"""Small helpers every sample app's tools share.

MCPServer only shows the model the message of a ``ToolError``; any other exception becomes
a bare "Error executing tool X". Apps raise :class:`AppError` with a message that says what
was wrong and what to try, and wrap tool bodies in :func:`tool_errors` to turn it into a
``ToolError`` at the MCP boundary. mcp is imported lazily so ``import fleetenv.local.apps``
stays light.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class AppError(ValueError):
    """A request the app refuses: bad input, unknown id, or an invalid state change."""


@contextmanager
def tool_errors() -> Iterator[None]:
    """Re-raise ``AppError`` as mcp's ``ToolError`` so its message reaches the caller."""
    try:
        yield
    except AppError as exc:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError(str(exc)) from exc


def rows(conn: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Run a query and return its rows as plain dicts (JSON-ready)."""
    cursor = conn.execute(sql, tuple(args))
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def one(conn: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> dict[str, Any] | None:
    """The first row of a query as a dict, or ``None``."""
    found = rows(conn, sql, args)
    return found[0] if found else None


def one_or_refuse(conn: sqlite3.Connection, sql: str, args: Sequence[Any], missing: str
                  ) -> dict[str, Any]:
    """The first row of a query as a dict; ``AppError(missing)`` when there is none."""
    found = one(conn, sql, args)
    if found is None:
        raise AppError(missing)
    return found


def customer_by_email(conn: sqlite3.Connection, email: str) -> dict[str, Any]:
    """The customer with ``email`` (any case), in either app."""
    return one_or_refuse(conn, "SELECT * FROM customers WHERE lower(email) = lower(?)",
                         [email.strip()],
                         f"no customer with email {email!r}; search with find_customers")


def scalar(conn: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> Any:
    """The first column of the first row (``None`` when there is no row)."""
    row = conn.execute(sql, tuple(args)).fetchone()
    return None if row is None else row[0]


def next_id(conn: sqlite3.Connection, table: str) -> int:
    """The next integer primary key of ``table``: explicit, so replays are deterministic."""
    return int(scalar(conn, f'SELECT COALESCE(MAX(id), 0) + 1 FROM "{table}"'))


def money(cents: int) -> str:
    """``123456 -> "$1,234.56"`` for display next to the exact ``*_cents`` value."""
    sign = "-" if cents < 0 else ""
    return f"{sign}${abs(cents) // 100:,}.{abs(cents) % 100:02d}"


@dataclass
class Where:
    """A ``WHERE`` clause built from whichever optional filters a caller gave.

    Tools and screens filter on a varying subset of their arguments; collecting each
    condition together with its parameters keeps placeholders and values in step.
    """

    conditions: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)

    def add(self, condition: str, *args: Any) -> None:
        """AND ``condition`` (with one ``?`` per value in ``args``) onto the clause."""
        self.conditions.append(condition)
        self.args.extend(args)

    def like(self, columns: Sequence[str], text: str) -> None:
        """Match ``text`` (trimmed; SQLite's LIKE ignores ASCII case) in any of ``columns``."""
        pattern = f"%{text.strip()}%"
        matches = " OR ".join(f"{column} LIKE ?" for column in columns)
        self.add(f"({matches})", *[pattern] * len(columns))

    @property
    def sql(self) -> str:
        """``"WHERE a AND b"``, or ``""`` when no filter was given."""
        return f"WHERE {' AND '.join(self.conditions)}" if self.conditions else ""
