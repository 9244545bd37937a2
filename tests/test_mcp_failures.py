"""What MCP failures mean, against real servers: which session setups are retried, which
fail at once, that a tool call that may have run is never replayed, and the deprecated
keyword names of the MCP layer.

Faults come from the embedded Fleet (``fleetenv.local``): ``http_error`` answers a chosen
status, ``drop_connection`` closes the socket, ``session_loss`` forgets a session.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _support.fixtures_mcp import RunningMCPServer

from fleetenv import runtime
from fleetenv.core import deprecation
from fleetenv.core.errors import ConnectError, ToolCallMayHaveRunError
from fleetenv.core.retry import RetryPolicy
from fleetenv.local import LocalFleet
from fleetenv.mcp import Endpoint, MCPConnection, ToolRouter

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def instance(notes_client: Any, notes_faults: Any) -> Iterator[Any]:
    """A fresh notes instance; ``notes_faults`` clears faults around the test."""
    env = notes_client.make("notes")
    yield env
    env.close()


def mcp_route(env: Any) -> str:
    """The fault route of the instance's app-tools endpoint alone."""
    return f"/instances/{env.instance_id}/mcp*"


def retries_logged(caplog: pytest.LogCaptureFixture, url: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "fleetenv.mcp" and "opening an MCP session" in r.getMessage()
            and url in r.getMessage()]


# ---------------------------------------------------------------------- retried setup


@pytest.mark.parametrize("status", [503, 502])
def test_setup_is_retried_while_the_server_answers_5xx(
    status: int, instance: Any, notes_faults: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fleetenv.mcp")
    url = f"{instance.urls.root}mcp"
    notes_faults.add("http_error", route=mcp_route(instance), status=status, times=2)
    with MCPConnection(url) as connection:
        assert "list_notes" in [tool.name for tool in connection.open().list_tools()]
        assert not connection.call_tool("list_notes").is_error
    assert notes_faults.list() == [], "both injected answers were consumed"
    logged = retries_logged(caplog, url)
    assert len(logged) == 2 and f"HTTP {status}" in logged[0] and "attempt 3" in logged[1]


@pytest.mark.parametrize("kind", ["drop_connection", "session_loss"])
def test_setup_is_retried_when_the_handshake_is_cut_short(
    kind: str, instance: Any, notes_faults: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A dropped socket, or a server that forgets the session it just created (it
    restarted): a starting server explains both, and nothing was sent that could run."""
    caplog.set_level(logging.INFO, logger="fleetenv.mcp")
    url = f"{instance.urls.root}mcp"
    notes_faults.add(kind, route=mcp_route(instance), times=1)
    with MCPConnection(url) as connection:
        assert not connection.call_tool("list_notes").is_error
    assert notes_faults.list() == []
    assert len(retries_logged(caplog, url)) == 1


def test_setup_gives_up_within_its_budget(instance: Any, notes_faults: Any) -> None:
    url = f"{instance.urls.root}mcp"
    notes_faults.add("http_error", route=mcp_route(instance), status=503)
    started = time.monotonic()
    with pytest.raises(ConnectError) as info:
        MCPConnection(url).open()
    # A hang bound, not a speed claim: ~0.3 s of pauses, not the 10 s connect timeout.
    assert time.monotonic() - started < 2, "3 attempts, pauses of ~0.1 s and ~0.2 s"
    error = info.value
    assert error.retryable, "a caller with a larger budget may try again later"
    assert error.context == {"endpoint": url, "http_status": "503"}
    assert "failed after 3 attempts" in str(error)
    assert notes_faults.list()[0]["hits"] == 3


def test_the_session_layer_passes_its_own_policy(instance: Any, notes_faults: Any) -> None:
    url = f"{instance.urls.root}mcp"
    notes_faults.add("http_error", route=mcp_route(instance), status=503, times=4)
    patient = RetryPolicy(base_s=0.01, cap_s=0.05, budget_s=10, max_attempts=6,
                          rng=random.Random(1))
    with ToolRouter([Endpoint(url)], retry=patient) as router:
        assert "add_note" in [tool.name for tool in router.list_tools()]
    assert notes_faults.list() == []
    once = RetryPolicy(base_s=0.01, cap_s=0.05, budget_s=10, max_attempts=1)
    notes_faults.add("http_error", route=mcp_route(instance), status=503, times=1)
    with pytest.raises(ConnectError, match="after 1 attempt"):
        MCPConnection(url, retry=once).open()


# ---------------------------------------------------------------------- failing at once


def test_no_mcp_here_fails_at_once_and_names_the_endpoint(
    mcp_server: RunningMCPServer,
) -> None:
    url = mcp_server.url.replace("/mcp", "/api/v1/mcp")
    path = url[url.index("/api/"):]
    before = mcp_server.log.requests.count(("POST", path))
    with pytest.raises(ConnectError) as info:
        MCPConnection(url).open()
    error = info.value
    assert error.retryable is False
    assert error.context == {"endpoint": url, "http_status": "404"}
    assert url in str(error) and "no MCP server at this URL" in str(error)
    assert mcp_server.log.requests.count(("POST", path)) == before + 1, "one attempt only"


@pytest.mark.parametrize("status", [401, 403, 405])
def test_refusals_that_retrying_cannot_change_fail_at_once(
    status: int, instance: Any, notes_faults: Any
) -> None:
    url = f"{instance.urls.root}mcp"
    notes_faults.add("http_error", route=mcp_route(instance), status=status)
    with pytest.raises(ConnectError) as info:
        MCPConnection(url).open()
    assert info.value.retryable is False
    assert info.value.context == {"endpoint": url, "http_status": str(status)}
    assert notes_faults.list()[0]["hits"] == 1, "never asked twice"


def test_refused_port_is_retried_then_reported(unused_port_url: str) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectError) as info:
        MCPConnection(unused_port_url).open()
    assert time.monotonic() - started < 2  # hang bound: 3 attempts, not the 10 s timeout
    assert info.value.retryable and "cannot connect" in str(info.value)
    assert info.value.context == {"endpoint": unused_port_url}


# ---------------------------------------------------------------------- calls never replayed


def test_a_call_that_may_have_run_is_not_retried(
    notes_fleet: LocalFleet, instance: Any, notes_faults: Any
) -> None:
    url = f"{instance.urls.root}mcp"
    with MCPConnection(url).open() as connection:
        before = notes_fleet.tool_call_counts(instance.instance_id).get("add_note", 0)
        notes_faults.add("http_error", route=mcp_route(instance), method="POST", status=503,
                         times=1)
        with pytest.raises(ToolCallMayHaveRunError) as info:
            connection.call_tool("add_note", {"title": "maybe"}, meta={
                "fleetenv/call_id": "not-replayed"})
        assert info.value.retryable is False
        assert notes_fleet.tool_call_counts(instance.instance_id).get("add_note", 0) == before
        assert "not-replayed" not in notes_fleet.tool_calls_by_call_id()
        assert not connection.call_tool("list_notes").is_error, "the session still works"


# ---------------------------------------------------------------------- deprecated names


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deprecations warn once per process; forget the ones other tests triggered."""
    monkeypatch.setattr(deprecation, "_warned", set())


@pytest.mark.usefixtures("fresh_warnings")
def test_deprecated_connection_keywords_still_work_and_warn(
    mcp_server: RunningMCPServer,
) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        connection = MCPConnection(mcp_server.url, connect_timeout=4.0, call_timeout=9.0,
                                   close_timeout=3.0)
    assert [str(w.message).split(" is ")[0] for w in caught] == [
        "MCPConnection(connect_timeout=...)",
        "MCPConnection(call_timeout=...)",
        "MCPConnection(close_timeout=...)",
    ]
    assert all(w.filename == __file__ for w in caught), "the warning points at the caller"
    assert "use connect_timeout_s=" in str(caught[0].message)
    assert (connection.connect_timeout_s, connection.call_timeout_s,
            connection.close_timeout_s) == (4.0, 9.0, 3.0)
    with connection:
        with pytest.warns(DeprecationWarning, match=r"call_tool\(timeout=.*use timeout_s="):
            assert connection.call_tool("echo", {"text": "a"}, timeout=5).texts == ["a"]
        with pytest.warns(DeprecationWarning, match=r"call_tool_future\(timeout="):
            future = connection.call_tool_future("echo", {"text": "b"}, timeout=5)
        assert future.result(timeout=10).texts == ["b"]
        with pytest.warns(DeprecationWarning, match=r"acall_tool\(timeout="):
            awaited = runtime.call(lambda: connection.acall_tool("echo", {"text": "c"},
                                                                 timeout=5))
        assert awaited.texts == ["c"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'connect_timeout_ms'"):
        MCPConnection(mcp_server.url, connect_timeout_ms=4)


@pytest.mark.usefixtures("fresh_warnings")
def test_deprecated_router_keywords_still_work_and_warn(mcp_server: RunningMCPServer) -> None:
    with pytest.warns(DeprecationWarning, match="ToolRouter") as caught:
        router = ToolRouter([Endpoint(mcp_server.url)], connect_timeout=4.0, call_timeout=9.0)
    assert len(caught) == 2
    assert (router.connect_timeout_s, router.call_timeout_s) == (4.0, 9.0)
    with router:
        with pytest.warns(DeprecationWarning, match=r"ToolRouter.call\(timeout="):
            assert router.call("echo", {"text": "a"}, timeout=5).texts == ["a"]
        with pytest.warns(DeprecationWarning, match=r"ToolRouter.acall\(timeout="):
            result = runtime.call(lambda: router.acall("echo", {"text": "b"}, timeout=5))
        assert result.texts == ["b"]
        with pytest.warns(DeprecationWarning, match=r"ToolRouter.call_future\(timeout="):
            future = router.call_future("echo", {"text": "c"}, timeout=5)
        assert future.result(timeout=10).texts == ["c"]


@pytest.mark.usefixtures("fresh_warnings")
def test_each_deprecated_name_warns_once(mcp_server: RunningMCPServer) -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            MCPConnection(mcp_server.url, call_timeout=5.0).close()
    assert len(caught) == 1


@pytest.fixture
def unused_port_url() -> str:
    """An MCP URL on a loopback port nothing listens on (bound, then released)."""
    from _support.mcp_servers import bind_socket

    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/mcp"
