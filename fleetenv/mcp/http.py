"""HTTP clients for MCP traffic (httpx2), used on the loop thread only.

Each MCP connection gets its own ``httpx2.AsyncClient`` with its own small connection
pool: its headers (each endpoint carries its own auth), timeouts and cookies are its own,
and its pool holds only its own two or three connections (the session's long-lived GET
stream and the POSTs). One process-wide pool was measured to cost a lot at rollout
scale: httpcore scans every pooled connection on every request, so with 64 episodes
(about 128 connections) the scan alone took a sixth of the loop thread's CPU.

What is expensive to build is the SSL context (tens of milliseconds of CPU): the process
builds ONE per runtime generation, off the loop, and every connection's pool shares it.
Pools are unbounded (``max_connections=None``): a stateful session holds a GET stream
open, and a bounded pool would make the session's next request wait for it.
Closing a connection's client closes its pool. Proxies from the environment are honoured
by each client (``trust_env``), as httpx2 does by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleetenv import runtime

if TYPE_CHECKING:
    import ssl

    import httpx2

__all__ = ["connection_client"]

_ssl_context: ssl.SSLContext | None = None
_ssl_generation = -1

_WRITE_TIMEOUT_S = 30.0
_POOL_TIMEOUT_S = 30.0
_KEEPALIVE_PER_CONNECTION = 8


def _build_ssl_context() -> ssl.SSLContext:
    import httpx2

    return httpx2.create_ssl_context()


async def _shared_ssl_context() -> ssl.SSLContext:
    global _ssl_context, _ssl_generation
    if _ssl_context is None or _ssl_generation != runtime.generation():
        # Loading the CA bundle takes tens of ms of CPU: do it in a short-lived thread so
        # the loop keeps serving other sessions meanwhile.
        built = await runtime.in_short_thread(_build_ssl_context, name="fleetenv-ssl")
        if _ssl_context is None or _ssl_generation != runtime.generation():  # lost no race
            _ssl_context, _ssl_generation = built, runtime.generation()
    return _ssl_context


async def connection_client(
    *,
    headers: Mapping[str, str] | None,
    connect_timeout_s: float,
    read_timeout_s: float,
    on_response: list[int] | None = None,
) -> httpx2.AsyncClient:
    """A client with its own pool for one MCP connection. Loop thread only.

    ``read_timeout_s`` bounds the silence on one HTTP response (an SSE tool reply or the
    session's GET stream). ``on_response``, if given, collects the status code of every
    error response, so a failed connect can tell "no MCP here" (404/405) from a broken
    server. The caller closes the client (which closes its pool).
    """
    import httpx2

    context = await _shared_ssl_context()

    async def _record(response: httpx2.Response) -> None:
        if on_response is not None and response.status_code >= 400:
            on_response.append(response.status_code)

    return httpx2.AsyncClient(
        headers=dict(headers) if headers else None,
        timeout=httpx2.Timeout(
            connect=connect_timeout_s,
            read=read_timeout_s,
            write=_WRITE_TIMEOUT_S,
            pool=_POOL_TIMEOUT_S,
        ),
        transport=httpx2.AsyncHTTPTransport(
            verify=context,
            limits=httpx2.Limits(max_connections=None,
                                 max_keepalive_connections=_KEEPALIVE_PER_CONNECTION),
        ),
        event_hooks={"response": [_record]},
    )
