"""The one HTTP connection pool for MCP traffic (httpx2), used on the loop thread only.

Building httpx2's transport costs tens of milliseconds (SSL context), so the process keeps
ONE shared ``httpx2.AsyncHTTPTransport`` (the connection pool) per runtime generation. Its
pool is unbounded because every stateful MCP session holds one long-lived GET/SSE
connection: with httpx's default of 100 connections, the 100th session would die with
``PoolTimeout``.

Each MCP connection still needs its own headers (each endpoint carries its own auth),
timeouts and cookie jar, so it gets its own light ``httpx2.AsyncClient`` (about 20 us to
build) on top of the shared pool. Sharing the transport rather than wrapping a shared
client keeps one client layer per request (measured: a client-over-client design added
about 0.2 ms per tool call). Closing a connection's client never closes the pool; the
pool is closed once, at shutdown, after the sessions. Proxies from the environment are
honoured by each client (``trust_env``), as httpx2 does by default.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleetenv import runtime

if TYPE_CHECKING:
    import httpx2

__all__ = ["aclose_shared_client", "connection_client", "has_shared_client"]

_shared: httpx2.AsyncHTTPTransport | None = None
_shared_generation = -1
# Pools of an earlier runtime generation (fork parent): never touched again, never dropped.
_abandoned: list[object] = []

_WRITE_TIMEOUT_S = 30.0
_POOL_TIMEOUT_S = 30.0


def _build_shared_transport() -> httpx2.AsyncHTTPTransport:
    import httpx2

    return httpx2.AsyncHTTPTransport(
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64)
    )


async def _shared_transport() -> httpx2.AsyncHTTPTransport:
    global _shared, _shared_generation
    if _shared is None or _shared_generation != runtime.generation():
        # Loading the SSL context takes tens of ms of CPU: do it in a short-lived thread so
        # the loop keeps serving other sessions meanwhile.
        built = await runtime.in_short_thread(_build_shared_transport,
                                              name="fleetenv-http-pool")
        if _shared is None or _shared_generation != runtime.generation():  # lost no race
            if _shared is not None:
                _abandoned.append(_shared)
            _shared, _shared_generation = built, runtime.generation()
    return _shared


@functools.cache
def _borrowed_transport_class() -> type[httpx2.AsyncBaseTransport]:
    """A transport that forwards to the shared pool and does not close it (built lazily)."""
    import httpx2

    class BorrowedTransport(httpx2.AsyncBaseTransport):
        def __init__(self, pool: httpx2.AsyncHTTPTransport) -> None:
            self._pool = pool

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            return await self._pool.handle_async_request(request)

        async def aclose(self) -> None:
            """The pool outlives its borrowers; see `aclose_shared_client`."""

    return BorrowedTransport


async def connection_client(
    *,
    headers: Mapping[str, str] | None,
    connect_timeout: float,
    read_timeout: float,
    on_response: list[int] | None = None,
) -> httpx2.AsyncClient:
    """A per-connection client over the shared pool. Loop thread only.

    ``read_timeout`` bounds the silence on one HTTP response (an SSE tool reply or the
    session's GET stream). ``on_response``, if given, collects the status code of every
    error response, so a failed connect can tell "no MCP here" (404/405) from a broken
    server.
    """
    import httpx2

    pool = await _shared_transport()

    async def _record(response: httpx2.Response) -> None:
        if on_response is not None and response.status_code >= 400:
            on_response.append(response.status_code)

    return httpx2.AsyncClient(
        headers=dict(headers) if headers else None,
        timeout=httpx2.Timeout(
            connect=connect_timeout,
            read=read_timeout,
            write=_WRITE_TIMEOUT_S,
            pool=_POOL_TIMEOUT_S,
        ),
        transport=_borrowed_transport_class()(pool),
        event_hooks={"response": [_record]},
    )


def has_shared_client() -> bool:
    """Whether the current runtime has built its shared pool (so there is one to close)."""
    return _shared is not None and _shared_generation == runtime.generation()


async def aclose_shared_client() -> None:
    """Close the shared pool of the current generation (after all sessions closed)."""
    global _shared
    pool = _shared
    if pool is None or _shared_generation != runtime.generation():
        return
    _shared = None
    await pool.aclose()
