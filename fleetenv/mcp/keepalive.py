"""Keep-alive for MCP requests: read the rest of a reply the ``mcp`` client closes early.

The ``mcp`` client closes a POST's reply as soon as it has the JSON-RPC answer: an SSE
reply before the server's last chunk, a ``202`` before its (empty) body was read. httpcore
then closes the TCP connection instead of returning it to the pool, so every request of a
session paid a new connection (23 per 12-call episode, against 3 now). The transport
made here reads what is left of a POST or DELETE reply when it is closed, so the
connection goes back to the pool. It does so after the caller already has its answer
(the ``mcp`` client delivers the answer, then closes), and bounded: at most
``MAX_DRAIN_BYTES`` within ``DRAIN_S``; a server that keeps the stream open longer loses
the connection, as before. GET replies (the session's long-lived stream) are closed as
they are. ``httpx2`` and ``anyio`` are imported on first use.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx2

__all__ = ["DRAIN_S", "MAX_DRAIN_BYTES", "keep_alive_transport"]

#: How long closing a reply may wait for the rest of it.
DRAIN_S = 0.5
#: How much of a reply's rest closing it reads, at most.
MAX_DRAIN_BYTES = 64 * 1024

logger = logging.getLogger("fleetenv.mcp")


def keep_alive_transport(inner: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """``inner``, made to let a POST or DELETE reply closed before its end keep its
    connection: closing it first reads the rest (at most ``MAX_DRAIN_BYTES`` within
    ``DRAIN_S``; a server that keeps the stream open longer loses the connection, as
    before). GET replies (the session's long-lived stream) are closed as they are."""
    transport_class, _ = _keep_alive_classes()
    transport: httpx2.AsyncBaseTransport = transport_class(inner)
    return transport


@functools.cache
def _keep_alive_classes() -> tuple[type[Any], type[Any]]:
    """The transport and stream classes (built on first use: ``httpx2`` is imported then)."""
    import anyio
    import httpx2

    class DrainingStream(httpx2.AsyncByteStream):
        """A reply body that, when closed before its end, reads the rest first."""

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
                    await self._drain()
            finally:
                await self._inner.aclose()

        async def _drain(self) -> None:
            iterator = self.__aiter__()
            received = 0
            with anyio.move_on_after(DRAIN_S):
                try:
                    while received <= MAX_DRAIN_BYTES:
                        received += len(await iterator.__anext__())
                except StopAsyncIteration:
                    pass  # the whole reply was read: the connection goes back to the pool
                except Exception as exc:  # a broken rest: the connection closes, as before
                    logger.debug("reading the rest of an MCP reply failed: %r", exc)

    class KeepAliveTransport(httpx2.AsyncBaseTransport):
        def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
            self._inner = inner

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            response = await self._inner.handle_async_request(request)
            if request.method in ("POST", "DELETE") and isinstance(
                    response.stream, httpx2.AsyncByteStream):  # else: closed as it is
                response.stream = DrainingStream(response.stream)
            return response

        async def aclose(self) -> None:
            await self._inner.aclose()

    return KeepAliveTransport, DrainingStream
