"""The contract between a sample app and the local Fleet that hosts it.

An app is plain data plus three functions. The host (``fleetenv.local``) owns sockets,
instances, SQLite files, locking and fault injection; the app owns its schema, seed data,
MCP tools and screen. Keeping that line sharp lets one host serve any number of apps, and
lets an app be tested without a server.
"""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server import MCPServer

#: Opens this instance's *current* database for one unit of work. The host serialises
#: access per instance, commits when the block exits normally and rolls back on error.
DbFactory = Callable[[], AbstractContextManager[sqlite3.Connection]]


@dataclass(frozen=True)
class AppSpec:
    """One sample app, as the control plane lists it under ``GET /v1/env/``."""

    key: str
    """The env key tasks name in ``env_id`` / ``env_key`` (e.g. ``"helpdesk"``)."""
    name: str
    description: str
    versions: tuple[str, ...]
    """Env versions served, e.g. ``("v1",)``; the first is the default."""
    data: Mapping[str, tuple[str, ...]]
    """Data keys and their versions, e.g. ``{"helpdesk-seed": ("v1",)}``; first = default."""
    build_database: Callable[[sqlite3.Connection, str, str], None]
    """``(conn, data_key, data_version)``: create the schema and the deterministic seed rows."""
    register_tools: Callable[[MCPServer, DbFactory], None]
    """Add this app's MCP tools (served at ``{root}mcp``) to a per-instance server."""
    register_computer: Callable[[MCPServer, DbFactory], None]
    """Add the ``computer`` tool (served at ``{root}api/v1/mcp``) to a per-instance server.

    It keeps the instance's UI state (screen, focus, scroll) in its closure and returns
    real PNG screenshots rendered from the current database.
    """

    @property
    def default_version(self) -> str:
        return self.versions[0]

    @property
    def default_data(self) -> tuple[str, str]:
        key = next(iter(self.data))
        return key, self.data[key][0]


def add_tools(server: MCPServer, tools: Iterable[Callable[..., Any]], *,
              read_only: Iterable[str] = ()) -> None:
    """Register tool functions under their own names, each described by its docstring.

    Tools are nested functions, so their docstrings carry the enclosing indentation;
    ``inspect.cleandoc`` strips it so the model sees clean text. Each tool also gets a
    title and MCP annotations, as real servers declare them: the tools named in
    ``read_only`` only read (``readOnlyHint``); the others change state without deleting
    anything (``destructiveHint: false``). None reaches outside the app
    (``openWorldHint: false``).
    """
    from mcp.types import ToolAnnotations

    readers = set(read_only)
    for tool in tools:
        name = tool.__name__
        title = name.replace("_", " ").capitalize()
        if name in readers:
            annotations = ToolAnnotations(title=title, read_only_hint=True,
                                          open_world_hint=False)
        else:
            annotations = ToolAnnotations(title=title, read_only_hint=False,
                                          destructive_hint=False, open_world_hint=False)
        server.add_tool(tool, title=title, description=inspect.cleandoc(tool.__doc__ or ""),
                        annotations=annotations)
