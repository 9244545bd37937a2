"""ToolRouter: endpoint tables, ownership, unknown tools, failing endpoints."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _support.fixtures_mcp import RunningMCPServer
from _support.mcp_servers import CallLog, ServerThread, wrap_app
from mcp.server import MCPServer

from fleetenv.core.errors import ConfigurationError, ConnectError, ToolNotFoundError
from fleetenv.mcp import Endpoint, ToolRouter, endpoints_for

pytestmark = pytest.mark.timeout(20)


def build_app_server(tag: str, names: list[str]) -> MCPServer:
    server = MCPServer(f"router-{tag}", log_level="WARNING")
    for name in names:

        def make(tool_name: str):
            def tool(text: str = "") -> str:
                return f"{tag}:{tool_name}:{text}"

            tool.__name__ = tool_name
            tool.__doc__ = f"{tool_name} served by {tag}"
            return tool

        server.tool(name=name)(make(name))
    return server


@pytest.fixture(scope="module")
def two_servers() -> Iterator[tuple[str, str]]:
    """'primary' at /mcp and 'secondary' at /mcp, on two ports; a name overlaps."""
    first = ServerThread(wrap_app(build_app_server("primary", ["search", "book_flight"]), None))
    second = ServerThread(
        wrap_app(build_app_server("secondary", ["computer", "search"]), CallLog())
    )
    with first, second:
        yield first.url, second.url


def test_endpoints_for_each_modality() -> None:
    assert endpoints_for("http://h/x/", "tool_use") == [
        Endpoint("http://h/x/mcp", required=True),
        Endpoint("http://h/x/api/v1/mcp", required=False),
    ]
    assert endpoints_for("http://h/x", "computer_use") == [
        Endpoint("http://h/x/api/v1/mcp", required=True)
    ]
    assert endpoints_for("http://h/", "browser_use", "http://b/mcp") == [
        Endpoint("http://b/mcp", required=True)
    ]
    with pytest.raises(ConfigurationError, match="browser_mcp_url"):
        endpoints_for("http://h/", "browser_use")
    with pytest.raises(ConfigurationError, match="unknown modality"):
        endpoints_for("http://h/", "telepathy")
    secret = endpoints_for("http://h/", "tool_use", headers={"Authorization": "Bearer s3cret"})
    assert "s3cret" not in repr(secret)


def test_first_endpoint_listing_a_name_owns_it(two_servers: tuple[str, str]) -> None:
    primary, secondary = two_servers
    with ToolRouter([Endpoint(primary), Endpoint(secondary)]) as router:
        assert [tool.name for tool in router.list_tools()] == ["search", "book_flight", "computer"]
        assert router.endpoint_of("search") == primary
        assert router.endpoint_of("computer") == secondary
        assert router.call("search", {"text": "q"}).texts == ["primary:search:q"]
        assert router.call("computer").texts == ["secondary:computer:"]
        assert [t["function"]["name"] for t in router.openai_tools()] == [
            "search",
            "book_flight",
            "computer",
        ]
        assert router.call_future("book_flight", {"text": "x"}).result(timeout=10).texts == [
            "primary:book_flight:x"
        ]


def test_unknown_tool_lists_close_matches(two_servers: tuple[str, str]) -> None:
    primary, secondary = two_servers
    with ToolRouter([Endpoint(primary), Endpoint(secondary)]) as router:
        with pytest.raises(ToolNotFoundError) as info:
            router.call("book_flights", {})
        assert "book_flight" in str(info.value)
        assert info.value.context == {"tool": "book_flights"}
        with pytest.raises(ToolNotFoundError, match="available tools: book_flight, computer"):
            router.call("zzz")


def test_failing_required_endpoint_is_named(mcp_server: RunningMCPServer) -> None:
    missing = mcp_server.url.replace("/mcp", "/nothing/mcp")
    router = ToolRouter([Endpoint(mcp_server.url), Endpoint(missing, required=True)])
    with pytest.raises(ConnectError) as info:
        router.open()
    assert info.value.context["endpoint"] == missing
    router.close()


def test_absent_optional_endpoint_is_skipped(mcp_server: RunningMCPServer) -> None:
    root = mcp_server.url[: -len("mcp")]
    with ToolRouter(endpoints_for(root, "tool_use")) as router:
        assert "echo" in [tool.name for tool in router.list_tools()]
        assert router.skipped_endpoints == [f"{root}api/v1/mcp"]


def test_broken_optional_endpoint_is_an_error(mcp_server: RunningMCPServer) -> None:
    dead = "http://127.0.0.1:1/mcp"  # refused: not "absent", so not silently skipped
    router = ToolRouter([Endpoint(mcp_server.url), Endpoint(dead, required=False)])
    with pytest.raises(ConnectError) as info:
        router.open()
    assert info.value.context["endpoint"] == dead
    router.close()


def test_router_needs_endpoints_and_open_before_tools(mcp_server: RunningMCPServer) -> None:
    with pytest.raises(ConfigurationError):
        ToolRouter([])
    router = ToolRouter([Endpoint(mcp_server.url)])
    with pytest.raises(Exception, match="not open"):
        _ = router.tools
    router.close()
