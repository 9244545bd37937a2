"""The transport under each MCP client: keep-alive, and the size cap of replies.

Keep-alive: the ``mcp`` client closes a POST's reply as soon as it has the answer, so
httpcore would close the TCP connection instead of pooling it (docs/performance.md). The
transport reads the rest of a POST or DELETE reply when it is closed, bounded (at most
``MAX_DRAIN_BYTES`` within ``DRAIN_S``); GET replies (the session's stream) close as they are.

Idle connections: once no POST or DELETE has been in flight for ``IDLE_S`` (the pool's
keep-alive expiry), the transport closes the pool's idle connections, so an open session at
rest holds one connection, its GET stream.

Size cap: ``mcp`` limits only SSE events, and reads a JSON reply whole. Given a ``limit``,
reading any other POST or DELETE reply raises `ReplyTooLarge` once it announces or reaches
more than ``limit`` decoded bytes, and its connection is closed, never drained. As an
``httpx2.StreamError``, ``mcp`` reports it as the request's JSON-RPC parse error, where
`fleetenv.mcp.failures.over_limit` finds fleetenv's words (docs/mcp.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fleetenv.mcp import failures

if TYPE_CHECKING:
    import httpx2

__all__ = ["DRAIN_S", "IDLE_S", "MAX_DRAIN_BYTES", "keep_alive_transport"]

#: How long closing a reply may wait for the rest of it.
DRAIN_S = 0.5
#: How much of a reply's rest closing it reads, at most.
MAX_DRAIN_BYTES = 64 * 1024
#: How long a pooled connection may stay idle: the pool's keep-alive expiry too. Below the
#: 5 s idle timeout of common servers (uvicorn, Node): a call sent just as the server closes
#: its end fails after it may have been read.
IDLE_S = 4.0

logger = logging.getLogger("fleetenv.mcp")


def keep_alive_transport(
    inner: httpx2.AsyncBaseTransport, *, limit: int | None = None
) -> httpx2.AsyncBaseTransport:
    """``inner``, draining POST and DELETE replies closed early and, with a ``limit``,
    raising `ReplyTooLarge` past it (see the module docstring)."""
    transport: httpx2.AsyncBaseTransport = _keep_alive_class()(inner, limit)
    return transport


@functools.cache
def _keep_alive_class() -> type[Any]:
    """The transport class (built on first use: ``httpx2`` is imported then)."""
    import anyio
    import httpx2

    class ReplyTooLarge(httpx2.StreamError):
        """A reply over the message limit (not read further)."""

    class DecodedStream(httpx2.AsyncByteStream):
        """A compressed reply body, decoded by ``httpx2`` here rather than by its reader."""

        def __init__(self, raw: httpx2.Response) -> None:
            self._raw = raw
            self._chunks = raw.aiter_bytes()

        def __aiter__(self) -> AsyncIterator[bytes]:
            return self._chunks

        async def aclose(self) -> None:
            try:
                await self._chunks.aclose()
            finally:
                await self._raw.aclose()

    class DrainingStream(httpx2.AsyncByteStream):
        """A reply body that, when closed before its end, reads the rest first; with a
        ``limit``, one that raises `ReplyTooLarge` instead of reading past it.
        ``on_closed`` runs once, when it is closed (its connection is back in the pool)."""

        def __init__(self, inner: httpx2.AsyncByteStream, limit: int | None = None,
                     announced: int | None = None,
                     on_closed: Callable[[], None] | None = None) -> None:
            self._inner = inner
            self._on_closed = on_closed
            self._iterator: AsyncIterator[bytes] | None = None
            self._ended = False
            self._limit = limit
            self._received = 0
            self._over = limit is not None and announced is not None and announced > limit
            self._announced = announced

        def __aiter__(self) -> AsyncIterator[bytes]:
            if self._iterator is None:
                self._iterator = self._inner.__aiter__()
            return self

        async def __anext__(self) -> bytes:
            assert self._iterator is not None  # made by __aiter__
            if self._over:  # announced too large, or already cut: read nothing (more)
                raise self._too_large()
            try:
                chunk = await self._iterator.__anext__()
            except StopAsyncIteration:
                self._ended = True
                raise
            self._received += len(chunk)
            if self._limit is not None and self._received > self._limit:
                self._over = True
                raise self._too_large()
            return chunk

        def _too_large(self) -> ReplyTooLarge:
            assert self._limit is not None  # only a limited stream is ever over
            return ReplyTooLarge(failures.too_large(self._limit, self._announced))

        async def aclose(self) -> None:
            try:
                if not self._ended and not self._over:  # an over-limit rest is not read
                    await self._drain()
            finally:
                try:
                    await self._inner.aclose()
                finally:
                    on_closed, self._on_closed = self._on_closed, None
                    if on_closed is not None:
                        on_closed()

        async def _drain(self) -> None:
            iterator = self.__aiter__()
            received = 0
            with anyio.move_on_after(DRAIN_S):
                try:
                    while received <= MAX_DRAIN_BYTES:
                        received += len(await iterator.__anext__())
                except StopAsyncIteration:
                    pass  # the whole reply was read: the connection goes back to the pool
                except Exception as exc:  # a broken rest: the connection closes
                    logger.debug("reading the rest of an MCP reply failed: %r", exc)

    class KeepAliveTransport(httpx2.AsyncBaseTransport):
        def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int | None) -> None:
            self._inner = inner
            self._limit = limit
            self._replying = 0  # POSTs and DELETEs sent whose reply is not closed yet
            self._idle_timer: asyncio.TimerHandle | None = None
            self._closing: set[asyncio.Task[None]] = set()  # held: the loop keeps weak refs

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            if request.method not in ("POST", "DELETE"):  # the GET stream: as it is
                return await self._inner.handle_async_request(request)
            self._begin()
            try:
                response = await self._inner.handle_async_request(request)
            except BaseException:
                self._end()
                raise
            if not isinstance(response.stream, httpx2.AsyncByteStream):  # closed as it is
                self._end()
                return response
            if self._limit is None or _is_event_stream(response):
                response.stream = DrainingStream(response.stream, on_closed=self._end)
                return response
            body: httpx2.AsyncByteStream = response.stream
            headers = response.headers
            length = headers.get("content-length", "")
            announced = int(length) if length.isascii() and length.isdigit() else None
            if headers.get("content-encoding", "identity").lower() != "identity":
                # decoded here, so that the limit counts what the reader would get
                body = DecodedStream(httpx2.Response(response.status_code, headers=headers,
                                                     stream=body, request=request))
                announced = None
                for name in ("content-encoding", "content-length"):  # both were the raw body's
                    headers.pop(name, None)
            response.stream = DrainingStream(body, self._limit, announced, self._end)
            return response

        def _begin(self) -> None:
            self._replying += 1
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None

        def _end(self) -> None:
            self._replying -= 1
            if self._replying == 0 and self._idle_timer is None:
                self._idle_timer = asyncio.get_running_loop().call_later(
                    IDLE_S, self._close_idle)

        def _close_idle(self) -> None:
            self._idle_timer = None
            # httpx2's transport keeps its httpcore2 pool there; the pool lists its
            # connections, and one closed while idle is dropped by the pool's next pass.
            pool = getattr(self._inner, "_pool", None)
            idle = [c for c in getattr(pool, "connections", ()) if c.is_idle()]
            if idle and self._replying == 0:
                task = asyncio.ensure_future(self._close_all(idle))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

        async def _close_all(self, connections: list[Any]) -> None:
            for connection in connections:
                # A request that started since may take an idle connection: leave them all.
                # Checked right before closing, which marks it closed without suspending.
                if self._replying or not connection.is_idle():
                    return
                try:
                    await connection.aclose()
                except Exception as exc:  # a broken socket: it is closed either way
                    logger.debug("closing an idle MCP connection failed: %r", exc)

        async def aclose(self) -> None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            await self._inner.aclose()

    return KeepAliveTransport


def _is_event_stream(response: httpx2.Response) -> bool:
    """Is ``response`` an SSE reply that ``mcp`` reads event by event (limiting each)?"""
    return 200 <= response.status_code < 300 and response.headers.get(
        "content-type", "").lower().startswith("text/event-stream")
