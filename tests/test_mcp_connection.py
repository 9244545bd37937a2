"""MCPConnection against real MCP servers over real HTTP on 127.0.0.1."""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import logging
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from _support.fixtures_mcp import RunningMCPServer
from _support.mcp_servers import CallLog, ServerThread, build_full_server, wrap_app
from _support.waiting import wait_for

from fleetenv import runtime
from fleetenv.core.errors import (
    ConnectError,
    DeadlineExceeded,
    FleetEnvError,
    ToolCallMayHaveRunError,
)
from fleetenv.mcp import CALL_ID_META_KEY, MCPConnection, ToolResult, keepalive

pytestmark = pytest.mark.timeout(20)


async def task_names() -> set[str]:
    return {task.get_name() for task in asyncio.all_tasks()}


@pytest.fixture
def conn(mcp_server: RunningMCPServer):
    with MCPConnection(mcp_server.url, call_timeout_s=10) as connection:
        yield connection


def test_open_lists_tools_with_schemas(conn: MCPConnection, mcp_server: RunningMCPServer) -> None:
    tools = {tool.name: tool for tool in conn.open().list_tools()}
    assert {"echo", "weather", "sleepy", "schema_cases"} <= set(tools)
    echo = tools["echo"]
    assert echo.endpoint == mcp_server.url
    assert echo.description == "Return the text unchanged."
    assert echo.input_schema["properties"]["text"]["type"] == "string"
    assert tools["weather"].output_schema is not None
    assert tools["no_description"].openai()["function"]["description"] == ""
    params = tools["schema_cases"].openai()["function"]["parameters"]
    assert params["type"] == "object"
    assert params["properties"]["address"]["properties"]["street"] == {
        "title": "Street",
        "type": "string",
    }
    assert params["properties"]["tree"]["properties"]["children"]["items"] == {
        "$ref": "#/$defs/TreeNode"
    }
    assert set(params["$defs"]) == {"TreeNode"}
    assert "anyOf" in params["properties"]["shape"]
    assert {"type": "null"} in params["properties"]["note"]["anyOf"]


def test_results_of_every_content_kind(conn: MCPConnection) -> None:
    echo = conn.call_tool("echo", {"text": "hi"})
    assert echo.texts == ["hi"] and echo.structured == {"result": "hi"} and not echo.is_error
    assert conn.call_tool("literal_text", {"value": "null"}).to_openai_content() == [
        {"type": "text", "text": "null"}
    ]
    assert conn.call_tool("json_text").texts == ['{"a": 1, "b": [true, null]}']
    assert conn.call_tool("several_texts").texts == ["first", "second", "third"]
    mixed = conn.call_tool("mixed").to_openai_content()
    assert [part["type"] for part in mixed] == ["text", "image_url", "text"]
    assert mixed[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    assert conn.call_tool("audio").content[0].type == "audio"
    resources = conn.call_tool("embedded_resource")
    assert [block.type for block in resources.content] == ["resource", "resource"]
    assert resources.content[0].text == "resource body"
    link = conn.call_tool("resource_link").to_openai_content()
    assert "the monthly report" in link[0]["text"]
    assert conn.call_tool("weather", {"city": "Oslo"}).structured == {
        "city": "Oslo",
        "celsius": 21.5,
    }
    shot = conn.call_tool("screenshot_json", {"mode": "no_image"}).to_openai_content()
    assert shot[0]["text"].startswith("[screenshot unavailable")


def test_tool_errors_are_results_not_exceptions(conn: MCPConnection) -> None:
    fail = conn.call_tool("fail", {"message": "no such booking"})
    assert fail.is_error and "no such booking" in (fail.error_message or "")
    boom = conn.call_tool("boom")
    # mcp<2.1 servers append the exception text (compat.features().hides_crash_text)
    assert boom.is_error and (boom.error_message or "").startswith("Error executing tool boom")
    unknown = conn.call_tool("not_a_tool")
    assert unknown.is_error
    invalid = conn.call_tool("echo", {"wrong": 1})
    assert invalid.is_error


def test_every_call_sends_a_fresh_call_id(
    conn: MCPConnection, mcp_server: RunningMCPServer
) -> None:
    before = len(mcp_server.log.call_ids("echo"))
    conn.call_tool("echo", {"text": "a"})
    conn.call_tool("echo", {"text": "b"}, meta={"trace": "t1"})
    conn.call_tool("echo", {"text": "c"}, meta={CALL_ID_META_KEY: "chosen-id"})
    ids = mcp_server.log.call_ids("echo")[before:]
    assert len(ids) == 3 and ids[0] and ids[1] and ids[0] != ids[1]
    assert ids[2] == "chosen-id"


def test_sixteen_threads_share_one_session(
    conn: MCPConnection, mcp_server: RunningMCPServer
) -> None:
    conn.open()
    before = len(mcp_server.log.call_ids("echo"))

    def work(worker: int) -> list[str]:
        return [conn.call_tool("echo", {"text": f"{worker}-{i}"}).texts[0] for i in range(8)]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(work, range(16)))
    assert results == [[f"{w}-{i}" for i in range(8)] for w in range(16)]
    ids = mcp_server.log.call_ids("echo")[before:]
    assert len(ids) == 128 and len(set(ids)) == 128, "each logical call ran exactly once"


def test_futures_fan_out(conn: MCPConnection) -> None:
    futures = [conn.call_tool_future("echo", {"text": str(i)}) for i in range(20)]
    assert [f.result(timeout=10).texts[0] for f in futures] == [str(i) for i in range(20)]


def test_timeout_raises_deadline_and_session_survives(conn: MCPConnection) -> None:
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        conn.call_tool("sleepy", {"seconds": 5}, timeout_s=0.3)
    assert time.monotonic() - started < 2  # hang bound: the 0.3 s budget, not the 5 s tool
    assert info.value.context == {"tool": "sleepy", "endpoint": conn.url}
    assert "may still have run" in str(info.value)
    assert conn.call_tool("echo", {"text": "still here"}).texts == ["still here"]


def test_call_from_asyncio_code(conn: MCPConnection) -> None:
    """Jupyter / async trainers: the blocking API inside a running loop, and call_async."""

    async def user_code() -> tuple[list[str], list[str]]:
        blocking = conn.call_tool("echo", {"text": "sync"})
        awaited = await runtime.current().call_async(conn.acall_tool, "echo", {"text": "async"})
        return blocking.texts, awaited.texts

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, user_code()).result(timeout=10) == (["sync"], ["async"])
    assert asyncio.run(user_code()) == (["sync"], ["async"])


def test_ctrl_c_during_a_call_leaves_nothing_running(conn: MCPConnection) -> None:
    conn.open()
    threading.Timer(0.3, _thread.interrupt_main).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        conn.call_tool("sleepy", {"seconds": 10})
    assert time.monotonic() - started < 3  # hang bound: interrupted at 0.3 s, not after 10 s
    names = runtime.current().call(task_names)
    assert not [name for name in names if name.startswith("call sleepy")]
    assert conn.call_tool("echo", {"text": "after ^C"}).texts == ["after ^C"]


def test_dead_port_fails_fast_with_a_clear_error() -> None:
    probe = ServerThread(wrap_app(build_full_server(), None))  # bound, never started...
    port = probe.port
    probe.sock.close()  # ...and released: nothing listens there now
    url = f"http://127.0.0.1:{port}/mcp"
    started = time.monotonic()
    with pytest.raises(ConnectError) as info:
        MCPConnection(url).open()
    # A hang bound, not a speed claim: three refused attempts (<= 0.3 s of pauses), not
    # retries until the 10 s connect timeout runs out.
    assert time.monotonic() - started < 3
    assert info.value.context["endpoint"] == url
    assert "cannot connect" in str(info.value) and info.value.hint


def test_wrong_path_says_no_mcp_server(mcp_server: RunningMCPServer) -> None:
    url = mcp_server.url.replace("/mcp", "/api/v1/mcp")
    with pytest.raises(ConnectError, match="HTTP 404") as info:
        MCPConnection(url).open()
    assert info.value.context["http_status"] == "404"


def test_pagination_is_followed(mcp_paginated_server: RunningMCPServer) -> None:
    with MCPConnection(mcp_paginated_server.url) as connection:
        names = [tool.name for tool in connection.list_tools()]
        assert names == [f"tool_{i:03d}" for i in range(25)]
        assert [t.name for t in connection.list_tools(refresh=True)] == names
        assert connection.call_tool("tool_024").texts == ["tool_024"]


def test_close_is_idempotent_and_terminates_the_session(mcp_server: RunningMCPServer) -> None:
    connection = MCPConnection(mcp_server.url).open()
    deletes = mcp_server.log.count("DELETE")
    connection.close()
    connection.close()
    assert mcp_server.log.count("DELETE") == deletes + 1
    with pytest.raises(FleetEnvError, match="closed"):
        connection.call_tool("echo", {"text": "x"})
    assert "closed" in repr(connection)


def test_headers_are_sent_but_never_shown(mcp_server: RunningMCPServer) -> None:
    secret = "sk-live-0123456789"
    with MCPConnection(mcp_server.url, headers={"Authorization": f"Bearer {secret}"}) as c:
        assert c.call_tool("echo", {"text": "x"}).texts == ["x"]
        assert secret not in repr(c)


def test_server_restart_mid_session(caplog: pytest.LogCaptureFixture) -> None:
    """Listing recovers; a call in flight fails as may-have-run; a stale call is resent once."""
    caplog.set_level(logging.INFO, logger="fleetenv.mcp")
    log = CallLog()
    first = ServerThread(wrap_app(build_full_server(log), log))
    first.start()
    port = first.port
    in_flight = MCPConnection(first.url, call_timeout_s=10).open()
    idle = MCPConnection(first.url, call_timeout_s=10).open()
    second: ServerThread | None = None
    try:
        future = in_flight.call_tool_future("sleepy", {"seconds": 5})
        wait_for(lambda: "sleepy" in [name for name, _ in log.calls], what="the sleepy call")
        first.stop()
        with pytest.raises(ToolCallMayHaveRunError) as info:
            future.result(timeout=10)
        assert info.value.context == {"tool": "sleepy", "endpoint": in_flight.url}

        second = ServerThread(wrap_app(build_full_server(log), log), port=port)
        second.start()
        # listing reconnects (bounded attempts) and recovers
        assert "echo" in [tool.name for tool in in_flight.list_tools(refresh=True)]
        assert in_flight.call_tool("echo", {"text": "back"}).texts == ["back"]
        # the idle session is unknown to the new server: HTTP 404 before dispatch, so the
        # call is sent once more on a fresh session and runs exactly once
        before = len(log.call_ids("echo"))
        result = idle.call_tool("echo", {"text": "resent"})
        assert isinstance(result, ToolResult) and result.texts == ["resent"]
        ids = log.call_ids("echo")[before:]
        assert len(ids) == 1
        # Which path noticed the stale session is a race: the call (404, sent once more:
        # "Session not found" is logged) or, first, the GET stream reconnecting (the
        # session is replaced before the call is sent; seen with mcp 2.0). Both run it once.
    finally:
        in_flight.close()
        idle.close()
        if second is not None:
            second.stop()
        else:
            first.stop()


# ---------------------------------------------------------------------- keep-alive


class _PeerRecorder:
    """ASGI wrapper recording the client address of every HTTP request: one distinct
    (host, port) per TCP connection the client opened."""

    def __init__(self, app: object) -> None:
        self.app = app
        self.peers: list[tuple[str, int]] = []

    async def __call__(self, scope: dict, receive: object, send: object) -> None:
        if scope["type"] == "http":
            self.peers.append(tuple(scope["client"]))
        await self.app(scope, receive, send)  # type: ignore[operator]


def test_tool_calls_reuse_their_tcp_connection() -> None:
    """Each reply is read to its end, so the POSTs of one session share a pooled
    connection: a dozen calls cost no new TCP connection (before, every request opened
    one, because the reply was closed before the server's end of the stream)."""
    recorder = _PeerRecorder(wrap_app(build_full_server(), None))
    with ServerThread(recorder) as server:
        with MCPConnection(server.url, call_timeout_s=10) as connection:
            connection.open()
            opened = len(set(recorder.peers))
            for index in range(12):
                assert connection.call_tool("echo", {"text": str(index)}).texts == [str(index)]
        requests = len(recorder.peers)
        connections = len(set(recorder.peers))
    assert requests >= 12 + 4  # initialize, initialized, GET stream, tools/list, calls, DELETE
    assert connections <= 3, f"{connections} TCP connections for {requests} requests"
    assert connections - opened <= 1  # the calls reused the setup's connections


def _established_to(port: int) -> int:
    """Client sockets of this host ESTABLISHED to ``127.0.0.1:port`` (Linux's table)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].rsplit(":", 1)[1], 16)
        count += remote_port == port and fields[3] == "01"  # 01: ESTABLISHED
    return count


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket table")
def test_a_session_at_rest_keeps_only_its_stream_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once no request of a session has been in flight for the keep-alive expiry, its
    pooled connection is closed (before, it stayed open until the next request found it
    expired): a session at rest holds one connection, its GET stream. The next call
    opens a new one."""
    monkeypatch.setattr(keepalive, "IDLE_S", 1.0)
    with (ServerThread(wrap_app(build_full_server(), None)) as server,
          MCPConnection(server.url, call_timeout_s=10) as connection):
        port = int(urlsplit(server.url).port or 0)
        connection.open()
        assert connection.call_tool("echo", {"text": "a"}).texts == ["a"]
        # the GET stream and the pooled ones (two when a setup POST overlapped another's drain)
        assert _established_to(port) >= 2
        # within the test server's own keep-alive timeout (5 s), which would close it too
        wait_for(lambda: _established_to(port) == 1, timeout=3,
                 what="the idle pooled connection to be closed")
        assert connection.call_tool("echo", {"text": "b"}).texts == ["b"]


class _StreamHeldOpen:
    """ASGI wrapper that holds every SSE reply open for ``hold_s`` after its last event
    (a server slow to end the stream), recording which replies ended."""

    def __init__(self, app: object, hold_s: float) -> None:
        self.app = app
        self.hold_s = hold_s
        self.ended = 0
        self.sse_replies = 0

    async def __call__(self, scope: dict, receive: object, send: object) -> None:
        sse = False

        async def held(message: dict) -> None:
            nonlocal sse
            if message["type"] == "http.response.start":
                sse = any(name == b"content-type" and value.startswith(b"text/event-stream")
                          for name, value in message.get("headers", []))
                self.sse_replies += sse and scope["method"] == "POST"
            if (sse and scope["method"] == "POST" and message["type"] == "http.response.body"
                    and not message.get("more_body")):
                await asyncio.sleep(self.hold_s)
                self.ended += 1
            await send(message)  # type: ignore[operator]

        await self.app(scope, receive, held)  # type: ignore[operator]


def test_a_reply_stream_held_open_does_not_hold_the_call() -> None:
    """Reading a reply's rest is bounded and happens after the caller has its answer: a
    server that keeps the stream open long after the answer delays no call."""
    server_app = _StreamHeldOpen(wrap_app(build_full_server(), None), hold_s=5.0)
    with (ServerThread(server_app) as server,
          MCPConnection(server.url, call_timeout_s=10) as connection):
        connection.open()
        for index in range(3):
            assert connection.call_tool("echo", {"text": str(index)}).texts == [str(index)]
        # every answer arrived while its stream was still held open by the server
        assert server_app.sse_replies >= 5 and server_app.ended == 0


def test_a_burst_of_first_connections_builds_the_ssl_context_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions that start before the process's SSL context exists all wait for one
    build. Before, each started its own build in a thread (12 seen at start-up)."""
    from fleetenv.mcp import http

    builds: list[str] = []
    build = http._build_ssl_context

    def counted() -> Any:
        builds.append(threading.current_thread().name)
        return build()

    monkeypatch.setattr(http, "_build_ssl_context", counted)

    async def burst() -> int:
        http._ssl_context = http._ssl_building = None  # as in a fresh process
        tasks = [asyncio.ensure_future(http._shared_ssl_context()) for _ in range(20)]
        contexts = await asyncio.gather(*tasks)
        return len({id(c) for c in contexts})

    assert runtime.current().call(burst, timeout=60) == 1
    assert len(builds) == 1 and builds[0].startswith(runtime.POOL_THREAD_PREFIX), builds
