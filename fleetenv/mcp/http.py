"""The one HTTP connection pool for MCP traffic (httpx2), used on the loop thread only.

Building an ``httpx2.AsyncClient`` costs tens of milliseconds (SSL context), so the process
keeps ONE shared client per runtime generation. Its pool is unbounded because every
stateful MCP session holds one long-lived GET/SSE connection: with httpx's default of 100
connections, the 100th session would die with ``PoolTimeout``.

Each MCP connection still needs its own headers (each endpoint carries its own auth),
timeouts and cookie jar. It gets a *view*: a cheap ``AsyncClient`` (about 20 us) whose
transport forwards every request to the shared client, so all views share one pool, one
SSL context and one proxy configuration. A view is never closed on its own; the shared
client is closed once, at shutdown, after the sessions.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleetenv import runtime

if TYPE_CHECKING:
    import httpx2

__all__ = ["aclose_shared_client", "connection_client", "has_shared_client"]

_shared: httpx2.AsyncClient | None = None
_shared_generation = -1
# Clients of an earlier runtime generation (fork parent): never touched again, never dropped.
_abandoned: list[object] = []

# Timeouts of the shared client for writes and pool waits; connect and read are per view.
_WRITE_TIMEOUT_S = 30.0
_POOL_TIMEOUT_S = 30.0


def _build_shared_client() -> httpx2.AsyncClient:
    import httpx2

    return httpx2.AsyncClient(
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64),
        timeout=httpx2.Timeout(30.0, read=300.0),
    )


async def _shared_client() -> httpx2.AsyncClient:
    global _shared, _shared_generation
    import anyio

    if _shared is None or _shared_generation != runtime.generation():
        # Building the client loads an SSL context (tens of ms of CPU): do it in a worker
        # thread so the loop keeps serving other sessions meanwhile.
        built = await anyio.to_thread.run_sync(_build_shared_client)
        if _shared is None or _shared_generation != runtime.generation():  # lost no race
            if _shared is not None:
                _abandoned.append(_shared)
            _shared, _shared_generation = built, runtime.generation()
    return _shared


@functools.cache
def _via_shared_transport() -> type[httpx2.AsyncBaseTransport]:
    """The view transport class (built on first use: httpx2 is imported lazily)."""
    import httpx2

    class ViaShared(httpx2.AsyncBaseTransport):
        def __init__(self, shared: httpx2.AsyncClient) -> None:
            self._shared = shared

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            return await self._shared.send(request, stream=True)

        async def aclose(self) -> None:
            """The shared client outlives its views; see `aclose_shared_client`."""

    return ViaShared


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

    shared = await _shared_client()

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
        transport=_via_shared_transport()(shared),
        trust_env=False,  # proxies and certificates come from the shared client
        event_hooks={"response": [_record]},
    )


def has_shared_client() -> bool:
    """Whether the current runtime has built its shared client (so there is one to close)."""
    return _shared is not None and _shared_generation == runtime.generation()


async def aclose_shared_client() -> None:
    """Close the shared client of the current generation (after all sessions closed)."""
    global _shared
    client = _shared
    if client is None or _shared_generation != runtime.generation():
        return
    _shared = None
    await client.aclose()
