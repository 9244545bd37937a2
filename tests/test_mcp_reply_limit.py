"""The MCP message limit holds for ``application/json`` replies too, not only for SSE.

mcp reads a JSON reply whole (``response.aread()``), so fleetenv's transport caps it at
the limit `compat.effective_message_limit` gives for the installed release, without
reading past it. The hostile server is a real MCP server behind an ASGI wrapper that
answers chosen methods itself with a JSON reply streamed from a generator (never held
whole): chunked, announced by a Content-Length, or gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from _support.mcp_servers import ServerThread, build_full_server, wrap_app

from fleetenv import runtime
from fleetenv.core.errors import ConnectError, ToolError
from fleetenv.mcp import MCPConnection, compat, http
from fleetenv.mcp.connection import MAX_MESSAGE_BYTES
from fleetenv.mcp.resources import ResourceError

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024
# What the client may hold beyond the limit: one read of the socket, the session's own
# objects and the in-process server's chunks in flight. A reply read whole needs twice
# its size (the chunks, then the joined bytes).
SLACK = 8 * MiB
# How far past the limit the hostile replies go.
OVER = 2 * SLACK
_CHUNK = 64 * 1024


def _limit() -> int:
    limit = compat.effective_message_limit(MAX_MESSAGE_BYTES)
    return limit if limit is not None else MAX_MESSAGE_BYTES


def _mib(size: int) -> str:
    return f"{size / MiB:g} MiB"


# ---------------------------------------------------------------------- the hostile server


def _envelope(method: str, request_id: Any) -> tuple[bytes, bytes]:
    """The JSON-RPC answer to ``method`` around one long string: (before it, after it)."""
    start = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":'
    if method == "tools/call":
        return (start + '{"content":[{"type":"text","text":"').encode(), b'"}]}}'
    if method == "tools/list":
        return ((start + '{"tools":[{"name":"huge","inputSchema":{"type":"object"},'
                 '"description":"').encode(), b'"}]}}')
    assert method == "resources/read", method
    return (start + '{"contents":[{"uri":"fleetenv://huge","text":"').encode(), b'"}]}}'


class _JSONReplies:
    """ASGI wrapper answering armed JSON-RPC methods with a JSON reply of a given size.

    Everything else goes to the real server. It records the TCP peer of every request
    and which requests got a hostile reply. It stops sending when the client is gone.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.armed: dict[str, tuple[int, bool, bool]] = {}  # method: size, length, gzip
        self.peers: list[tuple[str, int]] = []
        self.hostile: list[int] = []  # indexes into peers

    def arm(self, method: str, size: int, *, length: bool = False, gzipped: bool = False,
            ) -> None:
        self.armed[method] = (size, length, gzipped)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.peers.append(tuple(scope["client"]))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body) if scope["method"] == "POST" and body else None
        method = request.get("method") if isinstance(request, dict) else None
        if method in self.armed:
            self.hostile.append(len(self.peers) - 1)
            size, length, gzipped = self.armed.pop(method)
            await self._answer(method, request["id"], size, length, gzipped, receive, send)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _answer(self, method: str, request_id: Any, size: int, length: bool,
                      gzipped: bool, receive: Any, send: Any) -> None:
        head, tail = _envelope(method, request_id)
        pad = size - len(head) - len(tail)
        assert pad >= 0

        def parts() -> Iterator[bytes]:
            yield head
            for start in range(0, pad, _CHUNK):
                yield b"x" * min(_CHUNK, pad - start)
            yield tail

        chunks: Iterator[bytes] = parts()
        headers = [(b"content-type", b"application/json")]
        if gzipped:  # small on the wire, ``size`` bytes once decoded
            chunks = iter([gzip.compress(b"".join(parts()))])
            headers.append((b"content-encoding", b"gzip"))
        if length:
            headers.append((b"content-length", str(size).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        gone = anyio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            for chunk in chunks:
                if gone.is_set():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            group.cancel_scope.cancel()

    def later_peers(self) -> list[tuple[str, int]]:
        """The TCP peers of the requests after the last hostile reply."""
        return self.peers[self.hostile[-1] + 1:]


@pytest.fixture
def hostile() -> Iterator[tuple[_JSONReplies, str]]:
    replies = _JSONReplies(wrap_app(build_full_server(), None))
    with ServerThread(replies) as server:
        yield replies, server.url


class _PeakMemory:
    """The most memory Python held at once while in the block (all threads)."""

    def __enter__(self) -> _PeakMemory:
        tracemalloc.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


# ---------------------------------------------------------------------- over the limit


@pytest.mark.parametrize("length", [False, True], ids=["chunked", "content-length"])
def test_an_over_limit_json_reply_to_a_tool_call_is_a_tool_error_that_says_so(
    hostile: tuple[_JSONReplies, str], length: bool,
) -> None:
    replies, url = hostile
    limit = _limit()
    with MCPConnection(url, call_timeout_s=30) as connection:
        connection.open()
        replies.arm("tools/call", limit + OVER, length=length)
        with _PeakMemory() as memory:
            result = connection.call_tool("big_text", {"chars": 1})
        assert result.is_error, f"a {_mib(limit + OVER)} reply became a normal result"
        message = result.error_message or ""
        assert "over the" in message and f"{_mib(limit)} limit" in message, message
        assert memory.peak < limit + SLACK, f"peak {_mib(memory.peak)}, limit {_mib(limit)}"
        # the session goes on, on another TCP connection: the cut one is not reused
        assert connection.call_tool("echo", {"text": "again"}).texts == ["again"]
    hostile_peer = replies.peers[replies.hostile[-1]]
    assert replies.later_peers() and hostile_peer not in replies.later_peers()


@pytest.mark.parametrize("method", ["tools/list", "resources/read"])
def test_an_over_limit_listing_or_read_fails_with_a_clear_error(
    hostile: tuple[_JSONReplies, str], method: str,
) -> None:
    replies, url = hostile
    limit = _limit()
    with MCPConnection(url, call_timeout_s=30) as connection:
        connection.open()
        replies.arm(method, limit + OVER)
        error: type[Exception] = ToolError if method == "tools/list" else ResourceError
        with _PeakMemory() as memory, pytest.raises(error) as caught:
            if method == "tools/list":
                connection.list_tools(refresh=True)
            else:
                connection.read_resource("fleetenv://huge")
        message = caught.value.message
        assert "over the" in message and f"{_mib(limit)} limit" in message, message
        assert "Failed to parse" not in message  # mcp's words for it are not the story
        assert memory.peak < limit + SLACK, f"peak {_mib(memory.peak)}, limit {_mib(limit)}"
        assert not caught.value.retryable
        assert "echo" in [tool.name for tool in connection.list_tools(refresh=True)]
    hostile_peer = replies.peers[replies.hostile[-1]]
    assert replies.later_peers() and hostile_peer not in replies.later_peers()


def test_an_over_limit_tool_list_at_open_is_a_connect_error_that_says_so(
    hostile: tuple[_JSONReplies, str],
) -> None:
    replies, url = hostile
    limit = _limit()
    replies.arm("tools/list", limit + OVER)
    with MCPConnection(url, connect_timeout_s=30) as connection, \
            pytest.raises(ConnectError) as caught:
        connection.open()
    assert f"over the {_mib(limit)} limit" in caught.value.message, caught.value.message
    assert not caught.value.retryable
    assert len(replies.hostile) == 1  # not asked again


def test_a_json_reply_of_exactly_the_limit_is_read_whole(
    hostile: tuple[_JSONReplies, str],
) -> None:
    replies, url = hostile
    limit = _limit()
    with MCPConnection(url, call_timeout_s=30) as connection:
        connection.open()
        replies.arm("tools/call", limit)
        result = connection.call_tool("big_text", {"chars": 1})
    assert not result.is_error, result.error_message
    text = result.full_text
    assert limit - 200 < len(text) < limit and set(text) == {"x"}  # all but the envelope


# ---------------------------------------------------------------------- the transport


async def _post(url: str, method: str, limit: int) -> bytes:
    """One JSON-RPC request through fleetenv's MCP client, capped at ``limit``."""
    client = await http.connection_client(headers=None, connect_timeout_s=10,
                                          read_timeout_s=10, max_reply_bytes=limit)
    async with client:
        request = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {}}
        async with client.stream("POST", url, json=request) as response:
            return await response.aread()


def _run(url: str, method: str, limit: int) -> bytes:
    return runtime.current().call(_post, url, method, limit, timeout=30)


@pytest.mark.parametrize("length", [False, True], ids=["chunked", "content-length"])
def test_the_transport_reads_up_to_the_limit_and_not_a_byte_more(
    hostile: tuple[_JSONReplies, str], length: bool,
) -> None:
    replies, url = hostile
    limit = 256 * 1024
    replies.arm("tools/call", limit, length=length)
    assert len(_run(url, "tools/call", limit)) == limit
    replies.arm("tools/call", limit + 1, length=length)
    with pytest.raises(httpx2.StreamError, match="over the 256 KiB limit"):
        _run(url, "tools/call", limit)


def test_the_limit_counts_decoded_bytes(hostile: tuple[_JSONReplies, str]) -> None:
    """A gzip reply a few KiB on the wire that decodes to more than the limit."""
    replies, url = hostile
    limit = 256 * 1024
    replies.arm("tools/call", limit, gzipped=True)
    body = _run(url, "tools/call", limit)
    assert len(body) == limit and json.loads(body)["id"] == 7
    replies.arm("tools/call", 64 * limit, gzipped=True)
    with pytest.raises(httpx2.StreamError, match="over the 256 KiB limit"):
        _run(url, "tools/call", limit)


def test_sse_replies_are_left_to_mcp(hostile: tuple[_JSONReplies, str]) -> None:
    """An SSE reply is one stream of many messages: only each message is limited (by
    mcp), never the stream, so a small cap passes a real SSE reply through whole."""
    _, url = hostile

    async def initialize() -> bytes:
        client = await http.connection_client(headers=None, connect_timeout_s=10,
                                              read_timeout_s=10, max_reply_bytes=16)
        async with client:
            request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"}}}
            headers = {"accept": "application/json, text/event-stream"}
            async with client.stream("POST", url, json=request, headers=headers) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                return await response.aread()

    body = runtime.current().call(initialize, timeout=30)
    assert len(body) > 16 and b"serverInfo" in body
