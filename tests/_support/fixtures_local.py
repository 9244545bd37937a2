"""Fixtures for tests that need an embedded Fleet (``fleetenv.local``).

* ``local_fleet`` (session): a ``LocalFleet`` serving the bundled sample apps
  (``fleetenv.local.apps.APPS``), or the tiny ``notes`` app below until those exist, with
  fleetenv's harness for its harness jobs.
* ``notes_fleet`` (session): a ``LocalFleet`` serving only the ``notes`` app, for tests
  of the host itself that must not depend on the sample apps.
* ``local_faults`` / ``notes_faults`` (function): the fleet's ``Faults``, cleared before
  and after the test so one test's faults never leak into the next.
* ``fleet_client`` / ``notes_client``: fleet-python ``Fleet`` clients (``max_retries=0``).
* ``toy_app``: a one-version app of the given tools, for a test's own ``LocalFleet``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import struct
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Image

from fleetenv.local import LocalFleet
from fleetenv.local.apps.base import AppSpec, DbFactory
from fleetenv.rollouts.harness import ScriptedHarness

__all__ = [
    "NOTES_APP",
    "TEST_APPS",
    "fleet_client",
    "local_faults",
    "local_fleet",
    "notes_client",
    "notes_faults",
    "notes_fleet",
    "open_mcp",
    "tiny_png",
    "toy_app",
]


@contextlib.asynccontextmanager
async def open_mcp(url: str, *, timeout: float = 10.0) -> AsyncIterator[ClientSession]:
    """A raw ``mcp`` client session on ``url`` (initialized, tools listed)."""
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(timeout)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, read_timeout_seconds=timeout) as session,
    ):
        await session.initialize()
        await session.list_tools()
        yield session


def tiny_png(width: int, height: int = 1, rgb: tuple[int, int, int] = (40, 120, 200)) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def _build_notes(conn: sqlite3.Connection, data_key: str, data_version: str) -> None:
    conn.executescript(
        """
        CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
                            body TEXT NOT NULL DEFAULT '', updated_at TEXT);
        INSERT INTO notes (title, body, updated_at) VALUES ('groceries', 'milk, eggs', 't0');
        INSERT INTO notes (title, body, updated_at) VALUES ('todo', 'write tests', 't0');
        """
    )
    if data_version == "v2":
        conn.execute("INSERT INTO notes (title, body) VALUES ('extra', 'only in v2')")


def _register_notes_tools(server: Any, db: DbFactory) -> None:
    @server.tool()
    def list_notes() -> list[dict[str, Any]]:
        """List every note."""
        with db() as conn:
            rows = conn.execute("SELECT id, title, body FROM notes ORDER BY id").fetchall()
        return [{"id": r[0], "title": r[1], "body": r[2]} for r in rows]

    @server.tool()
    def add_note(title: str, body: str = "") -> int:
        """Add a note and return its id."""
        with db() as conn:
            cursor = conn.execute(
                "INSERT INTO notes (title, body, updated_at) VALUES (?, ?, 'now')", (title, body)
            )
            return int(cursor.lastrowid)


def _register_notes_computer(server: Any, db: DbFactory) -> None:
    @server.tool()
    def computer(action: str = "screenshot") -> Image:
        """Return a screenshot: one pixel column per note."""
        with db() as conn:
            count = conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0]
        return Image(data=tiny_png(max(1, count)), format="png")


NOTES_APP = AppSpec(
    key="notes",
    name="Notes",
    description="A two-tool notes app used by fleetenv.local's own tests.",
    versions=("v1", "v2"),
    data={"notes-seed": ("v1", "v2")},
    build_database=_build_notes,
    register_tools=_register_notes_tools,
    register_computer=_register_notes_computer,
)
TEST_APPS = {"notes": NOTES_APP}


def _toy_computer(server: Any, db: DbFactory) -> None:
    @server.tool()
    def computer(action: str = "screenshot") -> str:
        """Not used."""
        return "no screen"


def _toy_database(conn: sqlite3.Connection, data_key: str, data_version: str) -> None:
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")


def toy_app(key: str, name: str, description: str,
            register_tools: Callable[[Any, DbFactory], None]) -> AppSpec:
    """An app of ``register_tools`` (version ``v1``, data ``<key>-seed``), with a one-table
    database and a computer tool that is not used."""
    return AppSpec(key=key, name=name, description=description, versions=("v1",),
                   data={f"{key}-seed": ("v1",)}, build_database=_toy_database,
                   register_tools=register_tools, register_computer=_toy_computer)


def _bundled_apps_or_notes() -> dict[str, AppSpec] | None:
    try:
        from fleetenv.local.apps import APPS
    except ImportError:
        return TEST_APPS
    return None if APPS else TEST_APPS


@pytest.fixture(scope="session")
def local_fleet() -> Iterator[LocalFleet]:
    with LocalFleet(apps=_bundled_apps_or_notes(), verifier_timeout=10.0,
                    harness=ScriptedHarness) as fleet:
        yield fleet


@pytest.fixture(scope="session")
def notes_fleet() -> Iterator[LocalFleet]:
    with LocalFleet(apps=TEST_APPS, verifier_timeout=10.0, ttl_seconds=600) as fleet:
        yield fleet


@pytest.fixture
def local_faults(local_fleet: LocalFleet) -> Iterator[Any]:
    local_fleet.faults.clear()
    yield local_fleet.faults
    local_fleet.faults.clear()


@pytest.fixture
def notes_faults(notes_fleet: LocalFleet) -> Iterator[Any]:
    notes_fleet.faults.clear()
    yield notes_fleet.faults
    notes_fleet.faults.clear()


@pytest.fixture
def fleet_client(local_fleet: LocalFleet) -> Iterator[Any]:
    client = local_fleet.client()
    yield client
    client._httpx_client.close()


@pytest.fixture
def notes_client(notes_fleet: LocalFleet) -> Iterator[Any]:
    client = notes_fleet.client()
    yield client
    client._httpx_client.close()
