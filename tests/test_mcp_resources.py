"""Resources, resource templates, and rich content blocks, against real MCP servers.

The server here is a real ``mcp`` server over streamable HTTP on 127.0.0.1 that serves
resources with annotations and ``_meta``; the same behaviour against the official
reference server is in ``test_mcp_everything.py``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from _support.fixtures_mcp import RunningMCPServer
from _support.mcp_servers import ServerThread, wrap_app
from mcp import types
from mcp.server import MCPServer

from fleetenv.core.errors import ConfigurationError, DeadlineExceeded
from fleetenv.core.tool_results import (
    ContentAnnotations,
    ResourceBlock,
    ResourceLinkBlock,
    TextBlock,
    block_from_dict,
)
from fleetenv.mcp import MCPConnection, ToolResult, ToolRouter
from fleetenv.mcp.resources import Resource, ResourceError, ResourceTemplate
from fleetenv.mcp.router import Endpoint

pytestmark = pytest.mark.timeout(30)

BLOB = bytes(range(8))


def build_resource_server(tag: str = "a") -> MCPServer:
    """Resources (text, binary, slow), a template, and a tool with annotated content."""
    server = MCPServer(f"fleetenv-resources-{tag}", version="0.0.1", log_level="WARNING")

    @server.resource(
        f"fleetenv://{tag}/readme",
        name="readme",
        title="Read me",
        description="what this server is",
        mime_type="text/markdown",
        annotations=types.Annotations(audience=["assistant"], priority=0.8),
        meta={"origin": "test"},
    )
    def readme() -> str:
        return f"# server {tag}"

    @server.resource(f"fleetenv://{tag}/blob", name="blob", mime_type="application/octet-stream")
    def blob() -> bytes:
        return BLOB

    @server.resource(f"fleetenv://{tag}/slow", name="slow", mime_type="text/plain")
    async def slow() -> str:
        await anyio.sleep(5)
        return "late"

    @server.resource(f"fleetenv://{tag}/items/{{item_id}}", name="item", mime_type="text/plain",
                     description="one item by id")
    def item(item_id: str) -> str:
        return f"item {item_id} of {tag}"

    @server.tool(structured_output=False)
    def annotated() -> list[Any]:
        """Content blocks with annotations and _meta."""
        return [
            types.TextContent(
                type="text", text="for the user",
                annotations=types.Annotations(audience=["user"], priority=0.2,
                                              last_modified="2026-01-02T03:04:05Z"),
                _meta={"k": "v"},
            ),
            types.ResourceLink(
                type="resource_link", uri=f"fleetenv://{tag}/readme", name="readme",
                title="Read me", description="what this server is", mime_type="text/markdown",
                size=42, annotations=types.Annotations(priority=1.0), _meta={"link": True},
            ),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(uri=f"fleetenv://{tag}/readme",
                                                    mime_type="text/markdown", text="# inline"),
                annotations=types.Annotations(audience=["assistant"]),
            ),
        ]

    return server


@pytest.fixture(scope="module")
def resource_server() -> Iterator[ServerThread]:
    with ServerThread(wrap_app(build_resource_server("a"), None)) as server:
        yield server


@pytest.fixture(scope="module")
def second_server() -> Iterator[ServerThread]:
    with ServerThread(wrap_app(build_resource_server("b"), None)) as server:
        yield server


@pytest.fixture
def conn(resource_server: ServerThread) -> Iterator[MCPConnection]:
    with MCPConnection(resource_server.url, call_timeout_s=10) as connection:
        yield connection


def test_lists_resources_with_what_the_server_says(
    conn: MCPConnection, resource_server: ServerThread
) -> None:
    found = {resource.name: resource for resource in conn.list_resources()}
    assert set(found) == {"readme", "blob", "slow"}
    readme = found["readme"]
    assert readme == Resource(
        uri="fleetenv://a/readme", name="readme", endpoint=resource_server.url,
        title="Read me", description="what this server is", mime_type="text/markdown",
        annotations=ContentAnnotations(audience=("assistant",), priority=0.8),
        meta={"origin": "test"},
    )
    assert readme.to_dict()["annotations"] == {"audience": ["assistant"], "priority": 0.8}


def test_lists_templates_and_reads_a_filled_one(conn: MCPConnection) -> None:
    [template] = conn.list_resource_templates()
    assert isinstance(template, ResourceTemplate)
    assert template.uri_template == "fleetenv://a/items/{item_id}"
    assert (template.name, template.mime_type) == ("item", "text/plain")
    [block] = conn.read_resource("fleetenv://a/items/7")
    assert block.text == "item 7 of a"


def test_reads_text_and_binary_contents(conn: MCPConnection) -> None:
    [text] = conn.read_resource("fleetenv://a/readme")
    assert text == ResourceBlock(uri="fleetenv://a/readme", mime_type="text/markdown",
                                 text="# server a", meta={"origin": "test"})  # contents' _meta
    [binary] = conn.read_resource("fleetenv://a/blob")
    assert binary.text is None and binary.blob is not None
    assert base64.b64decode(binary.blob) == BLOB
    assert binary.mime_type == "application/octet-stream"


def test_reading_an_unknown_uri_names_it(conn: MCPConnection) -> None:
    with pytest.raises(ResourceError) as caught:
        conn.read_resource("fleetenv://a/nothing")
    assert caught.value.context["uri"] == "fleetenv://a/nothing"
    assert caught.value.context["endpoint"] == conn.url
    conn.read_resource("fleetenv://a/readme")  # the session is fine afterwards


def test_bad_uri_argument_says_what_to_pass(conn: MCPConnection) -> None:
    with pytest.raises(TypeError, match="resource URI string"):
        conn.read_resource("")


def test_a_read_that_gets_no_answer_is_a_deadline(resource_server: ServerThread) -> None:
    with MCPConnection(resource_server.url, read_timeout_s=0.5) as connection:
        with pytest.raises(DeadlineExceeded) as caught:
            connection.read_resource("fleetenv://a/slow")
        assert caught.value.context["uri"] == "fleetenv://a/slow"
        assert [b.text for b in connection.read_resource("fleetenv://a/readme")] == ["# server a"]


def test_async_twins_on_the_loop(conn: MCPConnection) -> None:
    from fleetenv import runtime

    async def everything() -> tuple[int, int, str | None]:
        listed = await conn.alist_resources()
        templates = await conn.alist_resource_templates()
        [block] = await conn.aread_resource("fleetenv://a/items/1")
        return len(listed), len(templates), block.text

    assert runtime.current().call(everything, timeout=30) == (3, 1, "item 1 of a")


def test_a_server_without_resources_lists_none(mcp_paginated_server: RunningMCPServer) -> None:
    with MCPConnection(mcp_paginated_server.url, call_timeout_s=10) as connection:
        assert connection.list_resources() == []
        assert connection.list_resource_templates() == []


def test_reading_reconnects_after_a_server_restart() -> None:
    first = ServerThread(wrap_app(build_resource_server("a"), None))
    first.start()
    port = first.port
    with MCPConnection(first.url, call_timeout_s=10) as connection:
        assert connection.read_resource("fleetenv://a/readme")[0].text == "# server a"
        first.stop()  # every session the server knew is gone with it
        with ServerThread(wrap_app(build_resource_server("a"), None), port=port):
            assert connection.read_resource("fleetenv://a/readme")[0].text == "# server a"
            assert len(connection.list_resources()) == 3


def test_content_annotations_and_meta_survive_a_call_and_a_round_trip(
    conn: MCPConnection,
) -> None:
    result = conn.call_tool("annotated")
    text, link, embedded = result.content
    assert text == TextBlock(
        "for the user",
        annotations=ContentAnnotations(audience=("user",), priority=0.2,
                                       last_modified="2026-01-02T03:04:05Z"),
        meta={"k": "v"},
    )
    assert link == ResourceLinkBlock(
        uri="fleetenv://a/readme", name="readme", description="what this server is",
        mime_type="text/markdown", title="Read me", size=42,
        annotations=ContentAnnotations(priority=1.0), meta={"link": True},
    )
    assert isinstance(embedded, ResourceBlock)
    assert embedded.annotations == ContentAnnotations(audience=("assistant",))
    assert ToolResult.from_dict(result.to_dict()) == result
    assert result.to_dict()["content"][0]["annotations"] == {
        "audience": ["user"], "priority": 0.2, "lastModified": "2026-01-02T03:04:05Z"}
    # the model sees the content, not the annotations
    assert result.to_openai_content()[0] == {"type": "text", "text": "for the user"}
    # a linked resource can be read from the same connection
    assert conn.read_resource(link.uri)[0].text == "# server a"


def test_old_block_dicts_still_load() -> None:
    assert block_from_dict({"type": "text", "text": "x"}) == TextBlock("x")
    assert block_from_dict({"type": "resource_link", "uri": "u", "name": "n"}) == (
        ResourceLinkBlock(uri="u", name="n"))


def test_router_gathers_resources_from_every_endpoint(
    resource_server: ServerThread, second_server: ServerThread
) -> None:
    endpoints = [Endpoint(resource_server.url), Endpoint(second_server.url)]
    with ToolRouter(endpoints, call_timeout_s=10) as router:
        listed = router.list_resources()
        assert [(r.name, r.endpoint) for r in listed if r.name == "readme"] == [
            ("readme", resource_server.url), ("readme", second_server.url)]
        templates = router.list_resource_templates()
        assert [t.endpoint for t in templates] == [resource_server.url, second_server.url]
        # found on whichever endpoint serves it
        assert router.read_resource("fleetenv://b/items/3")[0].text == "item 3 of b"
        pinned = router.read_resource("fleetenv://b/readme", endpoint=second_server.url)
        assert pinned[0].text == "# server b"
        with pytest.raises(ResourceError):
            router.read_resource("fleetenv://c/readme")
        with pytest.raises(ConfigurationError, match="not an endpoint"):
            router.read_resource("fleetenv://b/readme", endpoint="http://127.0.0.1:1/mcp")


def test_async_twins_from_the_callers_own_loop(conn: MCPConnection) -> None:
    import asyncio

    async def mine() -> str | None:
        [block] = await conn.aread_resource("fleetenv://a/items/2")
        assert len(await conn.alist_resources()) == 3
        return block.text

    assert asyncio.run(mine()) == "item 2 of a"
