"""fleetenv against the official MCP reference server, ``@modelcontextprotocol/server-everything``.

A server fleetenv did not write (TypeScript SDK, express, its own session handling)
catches what our own test servers share with our client by construction. The server
runs as a child process (see ``_support/everything.py``); without Node.js these skip.

What it exercises here: tool listing with titles, annotations (hints), output schemas
and ``execution.taskSupport``; plain calls (``echo``, ``get-sum``); annotated content
(``get-annotated-message``); resource links and embedded resources
(``get-resource-links``, ``get-resource-reference``); resources, resource templates and
reads (``demo://resource/...``); progress notifications
(``trigger-long-running-operation``); log notifications (``toggle-simulated-logging``);
and a restart of the server process on the same port.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _support.everything import ENV_VAR, EverythingServer, everything_command
from _support.waiting import wait_for

from fleetenv.core.tool_results import (
    ContentAnnotations,
    ImageBlock,
    ResourceBlock,
    ResourceLinkBlock,
    TextBlock,
)
from fleetenv.mcp import MCPConnection, ToolResult, ToolRouter
from fleetenv.mcp.notifications import Notification, ServerLogMessage, ToolProgressUpdate
from fleetenv.mcp.resources import ResourceError
from fleetenv.mcp.router import Endpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def conn(everything_server: EverythingServer) -> Iterator[MCPConnection]:
    with MCPConnection(everything_server.url, call_timeout_s=30) as connection:
        yield connection


class Recorder:
    def __init__(self) -> None:
        self.got: list[Notification] = []
        self.lock = threading.Lock()

    def __call__(self, notification: Notification) -> None:
        with self.lock:
            self.got.append(notification)

    def of(self, kind: type) -> list[Any]:
        with self.lock:
            return [n for n in self.got if isinstance(n, kind)]


def test_lists_tools_and_calls_echo(everything_server: EverythingServer) -> None:
    with MCPConnection(everything_server.url, call_timeout_s=20) as conn:
        names = {tool.name for tool in conn.list_tools()}
        assert {"echo", "get-sum", "trigger-long-running-operation"} <= names
        result = conn.call_tool("echo", {"message": "hello everything"})
    assert not result.is_error
    assert result.texts == ["Echo: hello everything"]


def test_tool_metadata_is_kept(conn: MCPConnection) -> None:
    tools = {tool.name: tool for tool in conn.list_tools()}
    echo = tools["echo"]
    assert echo.title == "Echo Tool"
    assert (echo.hints.read_only, echo.hints.destructive) == (True, False)
    assert echo.task_support == "forbidden"
    assert tools["toggle-simulated-logging"].hints.idempotent is False
    structured = tools["get-structured-content"]
    assert structured.output_schema is not None
    assert "temperature" in structured.output_schema["properties"]
    assert structured.to_dict()["execution"] == {"taskSupport": "forbidden"}
    weather = conn.call_tool("get-structured-content", {"location": "New York"})
    assert set(weather.structured) >= {"temperature", "conditions", "humidity"}


def test_calls_with_numbers(conn: MCPConnection) -> None:
    assert conn.call_tool("get-sum", {"a": 2, "b": 3.5}).texts == ["The sum of 2 and 3.5 is 5.5."]


def test_content_annotations(conn: MCPConnection) -> None:
    result = conn.call_tool("get-annotated-message",
                            {"messageType": "error", "includeImage": True})
    text, image = result.content
    assert isinstance(text, TextBlock) and text.text == "Error: Operation failed"
    assert text.annotations == ContentAnnotations(audience=("user", "assistant"), priority=1.0)
    assert isinstance(image, ImageBlock) and image.mime_type == "image/png"
    assert image.annotations == ContentAnnotations(audience=("user",), priority=0.5)
    assert ToolResult.from_dict(result.to_dict()) == result


def test_resource_links_can_be_read(conn: MCPConnection) -> None:
    result = conn.call_tool("get-resource-links", {"count": 2})
    links = [block for block in result.content if isinstance(block, ResourceLinkBlock)]
    assert len(links) == 2
    assert all(link.uri.startswith("demo://resource/dynamic/") for link in links)
    assert all(link.name and link.mime_type for link in links)
    for link in links:
        [contents] = conn.read_resource(link.uri)
        assert contents.uri == link.uri
        assert (contents.text or contents.blob)


@pytest.mark.parametrize("kind", ["Text", "Blob"])
def test_embedded_resources(conn: MCPConnection, kind: str) -> None:
    result = conn.call_tool("get-resource-reference", {"resourceType": kind, "resourceId": 3})
    [embedded] = [block for block in result.content if isinstance(block, ResourceBlock)]
    assert embedded.uri == f"demo://resource/dynamic/{kind.lower()}/3"
    if kind == "Text":
        assert embedded.text and "Resource 3" in embedded.text
    else:
        assert embedded.blob and b"Resource 3" in base64.b64decode(embedded.blob)


def test_resources_templates_and_reads(conn: MCPConnection) -> None:
    resources = {resource.uri: resource for resource in conn.list_resources()}
    features = resources["demo://resource/static/document/features.md"]
    assert features.mime_type == "text/markdown" and features.endpoint == conn.url
    [document] = conn.read_resource(features.uri)
    assert document.text and "Everything Server" in document.text
    templates = {template.name: template for template in conn.list_resource_templates()}
    text_template = templates["Dynamic Text Resource"]
    assert text_template.uri_template == "demo://resource/dynamic/text/{resourceId}"
    [filled] = conn.read_resource(text_template.uri_template.format(resourceId=5))
    assert filled.text and filled.text.startswith("Resource 5:")
    with pytest.raises(ResourceError) as caught:
        conn.read_resource("demo://resource/static/document/missing.md")
    assert caught.value.context["uri"] == "demo://resource/static/document/missing.md"


def test_router_reads_resources(everything_server: EverythingServer) -> None:
    with ToolRouter([Endpoint(everything_server.url)], call_timeout_s=30) as router:
        assert any(r.uri.endswith("features.md") for r in router.list_resources())
        [blob] = router.read_resource("demo://resource/dynamic/blob/2")
        assert blob.uri == "demo://resource/dynamic/blob/2" and blob.text is None
        assert blob.blob and base64.b64decode(blob.blob).startswith(b"Resource 2")


def test_progress_of_a_long_running_tool(everything_server: EverythingServer) -> None:
    recorder = Recorder()
    with MCPConnection(everything_server.url, call_timeout_s=30,
                       on_notification=recorder) as conn:
        result = conn.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 3})
        assert not result.is_error
        wait_for(lambda: len(recorder.of(ToolProgressUpdate)) == 3, what="3 progress updates")
    updates = recorder.of(ToolProgressUpdate)
    assert [(u.tool, u.progress, u.total) for u in updates] == [
        ("trigger-long-running-operation", float(i), 3.0) for i in (1, 2, 3)]
    assert all(u.endpoint == everything_server.url for u in updates)


def test_server_logs(everything_server: EverythingServer) -> None:
    recorder = Recorder()
    with MCPConnection(everything_server.url, call_timeout_s=30,
                       on_notification=recorder) as conn:
        assert conn.call_tool("toggle-simulated-logging").texts[0].startswith("Started")
        try:
            # one message at once, then one every 5 s, each at a random level
            wait_for(lambda: recorder.of(ServerLogMessage), timeout=15, what="a log message")
        finally:
            conn.call_tool("toggle-simulated-logging")  # stop it
    message = recorder.of(ServerLogMessage)[0]
    assert message.endpoint == everything_server.url
    assert message.level in {"debug", "info", "notice", "warning", "error", "critical",
                             "alert", "emergency"}
    assert isinstance(message.data, str) and "message" in message.data


def test_restart_keeps_the_port_and_drops_sessions(
    everything_factory: Callable[[], EverythingServer],
) -> None:
    server = everything_factory()
    port = server.port
    with MCPConnection(server.url, call_timeout_s=20) as conn:
        assert conn.call_tool("get-sum", {"a": 2, "b": 3}).texts == ["The sum of 2 and 3 is 5."]
    server.restart()
    assert server.port == port and server.running and server.starts == 2
    with MCPConnection(server.url, call_timeout_s=20) as conn:  # a fresh session works
        assert conn.call_tool("echo", {"message": "again"}).texts == ["Echo: again"]
    server.stop()
    assert not server.running
    server.stop()  # idempotent


def test_without_node_the_harness_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no node, no npx
    with pytest.raises(pytest.skip.Exception, match=r"npm not found: install Node\.js/npm"):
        everything_command()


def test_a_wrong_server_path_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "mcp-server-everything"
    monkeypatch.setenv(ENV_VAR, str(missing))
    with pytest.raises(RuntimeError, match=ENV_VAR):
        everything_command()


def test_reading_resources_survives_a_server_restart(
    everything_factory: Callable[[], EverythingServer],
) -> None:
    server = everything_factory()
    uri = "demo://resource/dynamic/text/1"
    with MCPConnection(server.url, call_timeout_s=20) as conn:
        assert conn.read_resource(uri)[0].text
        server.restart()  # the session id conn holds is unknown now: it answers 400
        [again] = conn.read_resource(uri)
        assert again.text and again.text.startswith("Resource 1:")
        assert len(conn.list_resource_templates()) == 2


def test_arguments_are_checked_against_its_schemas(conn: MCPConnection) -> None:
    """The reference server's own input schemas: an invented or mistyped argument is
    refused before sending, and a non-object never leaves the client."""
    from fleetenv.core.errors import ToolArgumentsError
    from fleetenv.mcp.arguments import ArgumentChecker

    tools = {tool.name: tool for tool in conn.list_tools()}
    strict = ArgumentChecker("strict")
    strict.check(tools["get-sum"], {"a": 2, "b": 3})
    with pytest.raises(ToolArgumentsError, match="unknown argument 'c'"):
        strict.check(tools["get-sum"], {"a": 2, "b": 3, "c": 4})
    with pytest.raises(ToolArgumentsError, match="'a'"):
        strict.check(tools["get-sum"], {"a": "two", "b": 3})
    with pytest.raises(ToolArgumentsError, match="'message'"):
        strict.check(tools["echo"], {})
    ArgumentChecker("lenient").check(tools["get-sum"], {"a": 2, "b": 3, "c": 4})
    with pytest.raises(ToolArgumentsError, match="echo"):
        conn.call_tool("echo", [("message", "pairs")])  # type: ignore[arg-type]


def test_the_async_api_from_a_trio_loop(conn: MCPConnection) -> None:
    pytest.importorskip("trio", reason="trio is in the test extra: pip install -e '.[test]'")
    import anyio

    async def main() -> list[str]:
        results: list[ToolResult] = []

        async def one(text: str) -> None:
            results.append(await conn.acall_tool("echo", {"message": text}))

        async with anyio.create_task_group() as group:
            for text in ("a", "b", "c"):
                group.start_soon(one, text)
        return sorted(t for r in results for t in r.texts)

    assert anyio.run(main, backend="trio") == ["Echo: a", "Echo: b", "Echo: c"]


def test_opening_waits_for_a_server_that_is_still_starting(
        everything_factory: Callable[[], EverythingServer]) -> None:
    """Session setup is retried while the port refuses (the server is starting), within
    the retry budget; tool calls themselves are never retried."""
    from fleetenv.core.retry import RetryPolicy

    server = everything_factory()
    server.stop()
    starter = threading.Thread(target=server.restart, daemon=True)
    starter.start()
    try:
        retry = RetryPolicy(base_s=0.05, cap_s=0.5, budget_s=60)
        with MCPConnection(server.url, connect_timeout_s=10, retry=retry) as connection:
            assert "echo" in {tool.name for tool in connection.list_tools()}
    finally:
        starter.join(timeout=60)
