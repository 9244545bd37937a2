"""Fixtures for the runtime and MCP tests: real MCP servers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from _support.mcp_servers import (
    CallLog,
    ServerThread,
    build_full_server,
    build_paginated_server,
    wrap_app,
)

__all__ = ["RunningMCPServer", "mcp_paginated_server", "mcp_server"]


@dataclass
class RunningMCPServer:
    """A test server that is up: its URL, port and what it recorded."""

    url: str
    port: int
    log: CallLog


@pytest.fixture(scope="session")
def mcp_server() -> Iterator[RunningMCPServer]:
    """The full test server (every content / error / schema case), shared by the session."""
    log = CallLog()
    with ServerThread(wrap_app(build_full_server(log), log)) as server:
        yield RunningMCPServer(server.url, server.port, log)


@pytest.fixture(scope="session")
def mcp_paginated_server() -> Iterator[RunningMCPServer]:
    """A low-level server listing 25 tools in pages of 10."""
    log = CallLog()
    with ServerThread(wrap_app(build_paginated_server(25, 10), log)) as server:
        yield RunningMCPServer(server.url, server.port, log)
