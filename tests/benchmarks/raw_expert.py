"""The raw ``mcp`` program as a careful expert would write it: the HTTP client it hands
``streamable_http_client(url, http_client=...)``.

The plain raw program lets ``mcp`` make its default client per session, which costs two
things fleetenv does not pay, so part of fleetenv's lead over it is the baseline's
handicap:

* A new TCP connection per request: ``mcp`` closes each POST's reply as soon as it has
  the JSON-RPC answer, before the server's end of the stream (an SSE reply's last chunk,
  the empty body of a ``202``), so httpcore closes the connection instead of pooling it.
  The fix (fleetenv's, see ``fleetenv/mcp/keepalive.py``): when a POST or DELETE reply is
  closed early, read the rest first (at most 64 KiB within 0.5 s) so the connection goes
  back to the pool. GET replies (the session's long-lived stream) are closed as they are.
* An SSL context per session (``httpx2.AsyncClient()`` loads the CA bundle, tens of ms of
  CPU, even for plain http): the fix is one context for the process, handed to every
  client's transport.

And the keep-alive expiry below the server's idle timeout (4 s against uvicorn's 5 s, as
fleetenv's): with httpx2's default of 5 s a call sent on a connection the server is
closing for idleness fails, and ``mcp`` ends the whole session (256 episodes: 2 to 13
sessions lost per round).

Written here from ``mcp`` and ``httpx2``'s public API only, as a user would, not imported
from fleetenv, so the baseline stays independent of the code it is compared with.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator

import anyio
import httpx2

#: How long, and how much, closing a reply early may read of its rest (fleetenv's bounds).
DRAIN_S = 0.5
MAX_DRAIN_BYTES = 64 * 1024
#: ``mcp``'s default timeouts (``create_mcp_http_client``).
TIMEOUT = httpx2.Timeout(30.0, read=300.0)
#: Idle connections expire before the server's 5 s idle timeout closes them.
KEEPALIVE_EXPIRY_S = 4.0


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One SSL context for the process (loading the CA bundle is the expensive part)."""
    return httpx2.create_ssl_context()


def expert_http_client() -> httpx2.AsyncClient:
    """A client for one MCP session: its own pool, the shared SSL context, keep-alive.
    The caller closes it (``streamable_http_client`` does not close a client it was
    given)."""
    return httpx2.AsyncClient(
        timeout=TIMEOUT,
        transport=_KeepAlive(httpx2.AsyncHTTPTransport(
            verify=shared_ssl_context(),
            limits=httpx2.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))))


class _DrainOnClose(httpx2.AsyncByteStream):
    """A reply body that, closed before its end, reads the rest (bounded) first."""

    def __init__(self, inner: httpx2.AsyncByteStream) -> None:
        self._inner = inner
        self._iterator: AsyncIterator[bytes] | None = None
        self._ended = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._iterator is None:
            self._iterator = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._iterator is not None  # made by __aiter__
        try:
            return await self._iterator.__anext__()
        except StopAsyncIteration:
            self._ended = True
            raise

    async def aclose(self) -> None:
        try:
            if not self._ended:
                iterator = self.__aiter__()
                read = 0
                with anyio.move_on_after(DRAIN_S):
                    try:
                        while read <= MAX_DRAIN_BYTES:
                            read += len(await iterator.__anext__())
                    except StopAsyncIteration:
                        pass  # read to its end: the connection returns to the pool
                    except httpx2.HTTPError:
                        pass  # a broken rest: the connection closes, as without this
        finally:
            await self._inner.aclose()


class _KeepAlive(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if request.method in ("POST", "DELETE") and isinstance(response.stream,
                                                               httpx2.AsyncByteStream):
            response.stream = _DrainOnClose(response.stream)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
