"""ToolRouter: endpoint tables, ownership, unknown tools, failing endpoints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
        Endpoint("http://h/x/api/v1/mcp", required=False, fallback=True),
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
    absent = mcp_server.url.replace("/mcp", "/api/v1/mcp")
    with ToolRouter([Endpoint(mcp_server.url), Endpoint(absent, required=False)]) as router:
        assert "echo" in [tool.name for tool in router.list_tools()]
        assert router.skipped_endpoints == [absent]


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


# ---------------------------------------------------------------------- fallback endpoints


@pytest.fixture
def notes_instance(notes_client: Any, notes_faults: Any) -> Iterator[Any]:
    """A fresh instance of the local Fleet's notes app (faults cleared around the test)."""
    env = notes_client.make("notes")
    yield env
    env.close()


def test_tool_use_opens_one_session_when_the_app_endpoint_serves_tools(
    notes_instance: Any, notes_faults: Any
) -> None:
    """The computer endpoint is never contacted: a fault there would fail any request
    to it, and it is still armed (never hit) after the router opened and called."""
    root = notes_instance.urls.root
    notes_faults.add("http_error", route=f"/instances/{notes_instance.instance_id}/api/v1/mcp*",
                     status=500)
    with ToolRouter(endpoints_for(root, "tool_use")) as router:
        names = [tool.name for tool in router.list_tools()]
        assert "add_note" in names and "computer" not in names
        assert router.unused_endpoints == [f"{root}api/v1/mcp"]
        assert router.skipped_endpoints == []
        assert not router.call("list_notes", {}).is_error
    assert [fault["hits"] for fault in notes_faults.list()] == [0]


def test_tool_use_falls_back_to_the_computer_endpoint_when_the_app_endpoint_is_absent(
    notes_instance: Any, notes_faults: Any
) -> None:
    """An image that serves its tools on ``api/v1/mcp`` only: ``{root}mcp`` answers 404,
    and the router opens the fallback and routes its tools."""
    root = notes_instance.urls.root
    notes_faults.add("http_error", route=f"/instances/{notes_instance.instance_id}/mcp*",
                     status=404)
    with ToolRouter(endpoints_for(root, "tool_use")) as router:
        assert [tool.name for tool in router.list_tools()] == ["computer"]
        assert router.skipped_endpoints == [f"{root}mcp"]
        assert router.unused_endpoints == []
        assert router.endpoint_of("computer") == f"{root}api/v1/mcp"


def test_absent_app_endpoint_without_a_serving_fallback_is_named(
    notes_instance: Any, notes_faults: Any
) -> None:
    root = notes_instance.urls.root
    for path in ("mcp*", "api/v1/mcp*"):
        notes_faults.add("http_error", route=f"/instances/{notes_instance.instance_id}/{path}",
                         status=404)
    router = ToolRouter(endpoints_for(root, "tool_use"))
    with pytest.raises(ConnectError) as info:
        router.open()
    assert info.value.context["endpoint"] == f"{root}mcp"
    router.close()


def test_broken_app_endpoint_is_the_error_and_the_fallback_is_not_tried(
    notes_instance: Any, notes_faults: Any
) -> None:
    """A failure that is not "absent" ends the open with its own error: the fallback is
    not opened (it would spend the setup budget a second time for nothing)."""
    root = notes_instance.urls.root
    notes_faults.add("http_error", route=f"/instances/{notes_instance.instance_id}/mcp*",
                     status=401)
    notes_faults.add("http_error",
                     route=f"/instances/{notes_instance.instance_id}/api/v1/mcp*", status=500)
    router = ToolRouter(endpoints_for(root, "tool_use"))
    with pytest.raises(ConnectError) as info:
        router.open()
    assert info.value.context["endpoint"] == f"{root}mcp"
    assert info.value.context.get("http_status") == "401"
    assert router.unused_endpoints == [f"{root}api/v1/mcp"]
    router.close()
    hits = {fault["route"]: fault["hits"] for fault in notes_faults.list()}
    assert hits[f"/instances/{notes_instance.instance_id}/api/v1/mcp*"] == 0
