"""What MCP failures mean, against real servers: which session setups are retried, which
fail at once, and that a tool call that may have run is never replayed.

Faults come from the embedded Fleet (``fleetenv.local``): ``http_error`` answers a chosen
status, ``drop_connection`` closes the socket, ``session_loss`` forgets a session,
``mcp_restart`` forgets them all and answers as a chosen kind of server would. The
reference server (``@modelcontextprotocol/server-everything``) is restarted for real.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from _support.fixtures_mcp import RunningMCPServer

from fleetenv import runtime
from fleetenv.core.errors import ConnectError, ToolCallMayHaveRunError, ToolError
from fleetenv.core.retry import RetryPolicy
from fleetenv.local import LocalFleet
from fleetenv.mcp import Endpoint, MCPConnection, ToolRouter, failures, http

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


@pytest.fixture
def unused_port_url() -> str:
    """An MCP URL on a loopback port nothing listens on (bound, then released)."""
    from _support.mcp_servers import bind_socket

    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/mcp"


# ---------------------------------------------------------------------- session gone


# What real servers answer to a session id they no longer know (status, body): the Python
# SDK, the TypeScript SDK, the reference server (server-everything) and a gateway.
GONE_ANSWERS = [
    (404, '{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,'
          '"message":"Session not found"}}'),
    (404, '{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}'),
    (400, '{"jsonrpc":"2.0","error":{"code":-32000,'
          '"message":"Bad Request: No valid session ID provided"}}'),
    (400, '{"jsonrpc":"2.0","error":{"code":-32000,'
          '"message":"Bad Request: Mcp-Session-Id header is required"},"id":null}'),
    (410, "Gone"),
    (404, ""),
]


@pytest.mark.parametrize(("status", "body"), GONE_ANSWERS)
def test_every_session_gone_answer_is_recognised(status: int, body: str) -> None:
    reason = failures.session_gone_answer(status, body)
    assert reason is not None and reason.startswith(f"HTTP {status}")


@pytest.mark.parametrize(("status", "body"), [
    (400, '{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params"},"id":3}'),
    (400, '{"detail":"Bad Request: malformed body"}'),
    (502, "Bad Gateway"),
    (503, '{"detail":"Session not found"}'),  # a 5xx says nothing about the session
])
def test_other_error_answers_are_not_session_loss(status: int, body: str) -> None:
    assert failures.session_gone_answer(status, body) is None


@pytest.mark.parametrize("payload", ["python", "typescript", "everything", "gateway"])
def test_listing_recovers_from_a_restarted_server(
    payload: str, instance: Any, notes_faults: Any
) -> None:
    """Whatever the restarted server answers (404 of either SDK, server-everything's 400,
    a gateway's 410), listing opens a new session and lists again; so does the next."""
    url = f"{instance.urls.root}mcp"
    with MCPConnection(url).open() as connection:
        notes_faults.add("mcp_restart", route=mcp_route(instance), payload=payload, times=1)
        assert "add_note" in [tool.name for tool in connection.list_tools(refresh=True)]
        assert notes_faults.list() == [], "the restart happened"
        assert "add_note" in [tool.name for tool in connection.list_tools(refresh=True)]
        assert not connection.call_tool("list_notes").is_error


@pytest.mark.parametrize(("payload", "status"), [
    ("python", 404), ("typescript", 404), ("everything", 400), ("gateway", 410)])
def test_a_call_turned_away_for_a_forgotten_session_runs_once_on_a_new_one(
    payload: str, status: int, notes_fleet: LocalFleet, instance: Any, notes_faults: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server refuses the call before dispatching it (it does not know the session),
    so sending it once more on a fresh session cannot run it twice."""
    caplog.set_level(logging.INFO, logger="fleetenv.mcp")
    url = f"{instance.urls.root}mcp"
    call_id = f"restart-{payload}"
    with MCPConnection(url).open() as connection:
        notes_faults.add("mcp_restart", route=mcp_route(instance), payload=payload, times=1)
        result = connection.call_tool("add_note", {"title": payload},
                                      meta={"fleetenv/call_id": call_id})
        assert not result.is_error
        assert notes_fleet.tool_calls_by_call_id()[call_id]["count"] == 1
        assert not connection.call_tool("list_notes").is_error, "the next call works too"
    lost = [r.getMessage() for r in caplog.records if "MCP session lost" in r.getMessage()]
    assert lost and f"HTTP {status}" in lost[0], "the log names the server's answer"


def test_a_400_that_is_not_about_the_session_is_never_replayed(
    notes_fleet: LocalFleet, instance: Any, notes_faults: Any
) -> None:
    """Only the body tells a forgotten session from any other 400: this one may have
    run as far as fleetenv can know, so it is not sent again."""
    url = f"{instance.urls.root}mcp"
    with MCPConnection(url).open() as connection:
        notes_faults.add("http_error", route=mcp_route(instance), method="POST", status=400,
                         message="Bad Request: malformed body", times=1)
        with pytest.raises(ToolCallMayHaveRunError):
            connection.call_tool("add_note", {"title": "x"},
                                 meta={"fleetenv/call_id": "bad-400"})
        assert "bad-400" not in notes_fleet.tool_calls_by_call_id()
        assert not connection.call_tool("list_notes").is_error


def test_a_listing_error_is_typed_never_a_bare_mcp_error(
    instance: Any, notes_faults: Any
) -> None:
    url = f"{instance.urls.root}mcp"
    with MCPConnection(url).open() as connection:
        notes_faults.add("http_error", route=mcp_route(instance), method="POST", status=500,
                         times=1)
        with pytest.raises(ToolError) as info:
            connection.list_tools(refresh=True)
        assert "listing tools failed" in str(info.value) and url in str(info.value)
        assert connection.list_tools(refresh=True), "the session still works"


# ------------------------------------------------ against the reference server (not ours)


def test_reference_server_restart_listing_recovers(everything_factory: Any) -> None:
    server = everything_factory()
    with MCPConnection(server.url).open() as connection:
        names = [tool.name for tool in connection.list_tools()]
        server.restart()  # same port, new process: every session id is unknown (HTTP 400)
        assert [tool.name for tool in connection.list_tools(refresh=True)] == names
        assert [tool.name for tool in connection.list_tools(refresh=True)] == names


def test_reference_server_restart_calls_recover(everything_factory: Any) -> None:
    server = everything_factory()
    with MCPConnection(server.url).open() as connection:
        assert connection.call_tool("echo", {"message": "before"}).texts == ["Echo: before"]
        server.restart()
        assert connection.call_tool("echo", {"message": "after"}).texts == ["Echo: after"]
        assert connection.call_tool("echo", {"message": "next"}).texts == ["Echo: next"]


# ---------------------------------------------------------------------- handshake pacing


@pytest.fixture
def handshake_limit() -> Iterator[Callable[[int], None]]:
    """Set the process-wide handshake limit for one test, then restore it."""
    before = http.handshake_limit()
    yield http.set_handshake_limit
    http.set_handshake_limit(before)


def open_all(connections: list[MCPConnection]) -> list[BaseException | None]:
    """Open every connection at once on the loop; each one's error, or None."""
    outcomes: list[BaseException | None] = [None] * len(connections)

    async def open_one(index: int) -> None:
        try:
            await connections[index].aopen()
        except Exception as exc:
            outcomes[index] = exc

    async def run() -> None:
        async with anyio.create_task_group() as group:
            for index in range(len(connections)):
                group.start_soon(open_one, index)

    runtime.current().call(run, timeout=120)
    return outcomes


def test_64_sessions_opening_at_once_against_a_slow_starting_server_all_open(
    instance: Any, notes_faults: Any
) -> None:
    """The server answers 503 for its first 0.5 s, then takes 0.1 s per handshake."""
    url = f"{instance.urls.root}mcp"
    notes_faults.add("mcp_starting", route=mcp_route(instance), seconds=0.5)
    delay = notes_faults.add("mcp_handshake_delay", route=mcp_route(instance), seconds=0.1)
    patient = RetryPolicy(base_s=0.05, cap_s=0.5, budget_s=90)
    connections = [MCPConnection(url, retry=patient) for _ in range(64)]
    try:
        assert open_all(connections) == [None] * 64
        assert all("add_note" in [t.name for t in c.list_tools()] for c in connections)
        held = next(f for f in notes_faults.list() if f["id"] == delay)
        assert held["hits"] >= 64 and held["peak"] <= http.handshake_limit()
    finally:
        for connection in connections:
            connection.close()


def test_time_queued_for_a_handshake_slot_does_not_count_against_the_connect_timeout(
    instance: Any, notes_faults: Any, handshake_limit: Callable[[int], None]
) -> None:
    """8 setups, 2 at a time, 0.4 s each: the last ones wait about 1.2 s for a slot,
    longer than their 1 s connect timeout, and still open on their single attempt."""
    handshake_limit(2)
    url = f"{instance.urls.root}mcp"
    delay = notes_faults.add("mcp_handshake_delay", route=mcp_route(instance), seconds=0.4)
    single = RetryPolicy(base_s=0.05, cap_s=0.1, budget_s=60, max_attempts=1)
    connections = [MCPConnection(url, connect_timeout_s=1.0, retry=single) for _ in range(8)]
    try:
        assert open_all(connections) == [None] * 8
        held = next(f for f in notes_faults.list() if f["id"] == delay)
        assert held["hits"] == 8 and held["peak"] == 2, "never more than 2 at once"
    finally:
        for connection in connections:
            connection.close()


def test_queueing_past_the_budget_is_a_connect_error_naming_the_endpoint(
    instance: Any, notes_faults: Any, handshake_limit: Callable[[int], None]
) -> None:
    handshake_limit(1)
    url = f"{instance.urls.root}mcp"
    notes_faults.add("mcp_handshake_delay", route=mcp_route(instance), seconds=3.0, times=1)
    slow = MCPConnection(url)
    hurried = MCPConnection(url, retry=RetryPolicy(base_s=0.05, cap_s=0.1, budget_s=0.5))
    try:
        outcomes = open_all([slow, hurried])
        assert outcomes[0] is None
        error = outcomes[1]
        assert isinstance(error, ConnectError)
        assert "no MCP session setup could start within the budget" in str(error)
        assert error.context["endpoint"] == url and "limit 1" in str(error)
    finally:
        slow.close()
        hurried.close()


def test_with_a_queue_budget_time_queued_does_not_spend_the_servers_budget(
    instance: Any, notes_faults: Any, handshake_limit: Callable[[int], None]
) -> None:
    """An episode's open (what a thousand episodes at once need): 6 setups, 1 at a time,
    0.4 s each. The last waits about 2 s for its slot, twice its 1 s budget of server
    time, and still opens, because queueing is bounded by the queue budget (the episode
    deadline) instead. Without a queue budget the same wait is a ConnectError."""
    handshake_limit(1)
    url = f"{instance.urls.root}mcp"
    notes_faults.add("mcp_handshake_delay", route=mcp_route(instance), seconds=0.4)
    queued = RetryPolicy(base_s=0.05, cap_s=0.1, budget_s=1.0, queue_budget_s=30)
    connections = [MCPConnection(url, connect_timeout_s=1.0, retry=queued) for _ in range(6)]
    try:
        assert open_all(connections) == [None] * 6
    finally:
        for connection in connections:
            connection.close()
    counted = RetryPolicy(base_s=0.05, cap_s=0.1, budget_s=1.0)
    connections = [MCPConnection(url, connect_timeout_s=1.0, retry=counted) for _ in range(6)]
    try:
        outcomes = open_all(connections)
        assert any(isinstance(o, ConnectError) for o in outcomes), outcomes
    finally:
        for connection in connections:
            connection.close()


def test_the_queue_budget_bounds_the_wait_for_a_slot(
    instance: Any, notes_faults: Any, handshake_limit: Callable[[int], None]
) -> None:
    handshake_limit(1)
    url = f"{instance.urls.root}mcp"
    notes_faults.add("mcp_handshake_delay", route=mcp_route(instance), seconds=3.0, times=1)
    slow = MCPConnection(url)
    hurried = MCPConnection(url, retry=RetryPolicy(base_s=0.05, cap_s=0.1, budget_s=10,
                                                   queue_budget_s=0.5))
    try:
        outcomes = open_all([slow, hurried])
        assert outcomes[0] is None
        assert isinstance(outcomes[1], ConnectError)
        assert "no MCP session setup could start within the budget" in str(outcomes[1])
    finally:
        slow.close()
        hurried.close()


def test_a_server_that_keeps_failing_gives_a_clear_connect_error_within_the_budget(
    instance: Any, notes_faults: Any
) -> None:
    url = f"{instance.urls.root}mcp"
    notes_faults.add("mcp_starting", route=mcp_route(instance), seconds=600)
    budget = RetryPolicy(base_s=0.05, cap_s=0.2, budget_s=1.5)
    started = time.monotonic()
    with pytest.raises(ConnectError) as info:
        MCPConnection(url, retry=budget).open()
    assert time.monotonic() - started < 10, "hang bound: the budget is 1.5 s"
    error = info.value
    assert error.context == {"endpoint": url, "http_status": "503"}
    assert "opening the MCP session failed after" in str(error) and "HTTP 503" in str(error)
    assert error.retryable
    assert notes_faults.list()[0]["hits"] >= 2, "it was retried"


def test_an_attempt_the_budget_cut_short_does_not_hide_the_servers_answer(
    instance: Any, notes_faults: Any
) -> None:
    """503s while the server starts, then a handshake that hangs until the budget runs
    out: the error reports the 503 the server gave, not the starved last attempt."""
    url = f"{instance.urls.root}mcp"
    notes_faults.add("mcp_starting", route=mcp_route(instance), seconds=0.4)
    notes_faults.add("mcp_handshake_delay", route=mcp_route(instance), seconds=30)
    budget = RetryPolicy(base_s=0.05, cap_s=0.2, budget_s=1.5)
    started = time.monotonic()
    with pytest.raises(ConnectError) as info:
        MCPConnection(url, connect_timeout_s=10, retry=budget).open()
    assert time.monotonic() - started < 10, "hang bound: the budget is 1.5 s"
    assert info.value.context == {"endpoint": url, "http_status": "503"}
    assert "HTTP 503" in str(info.value)


def test_one_endpoint_failing_transiently_is_retried_alone(
    instance: Any, notes_faults: Any
) -> None:
    """Of a tool-use instance's two endpoints, only the computer endpoint answers 503
    twice: it is retried on its own and the router opens with the tools of both."""
    computer_route = f"/instances/{instance.instance_id}/api/v1/mcp*"
    notes_faults.add("http_error", route=computer_route, status=503, times=2)
    quick = RetryPolicy(base_s=0.05, cap_s=0.2, budget_s=20)
    root = instance.urls.root  # both endpoints opened (tool_use opens the second only as
    endpoints = [Endpoint(f"{root}mcp"), Endpoint(f"{root}api/v1/mcp", required=False)]
    with ToolRouter(endpoints, retry=quick) as router:  # a fallback: test_mcp_router.py)
        names = [tool.name for tool in router.list_tools()]
        assert "add_note" in names and "computer" in names
        assert router.skipped_endpoints == []
    assert notes_faults.list() == [], "both 503s were answered, then it opened"


def test_an_episode_waits_for_a_slow_starting_mcp_server_within_its_budget(
    local_fleet: LocalFleet, local_faults: Any
) -> None:
    """The instance's MCP servers answer 503 for their first 1.5 s: reset() retries the
    setup inside its budget (a few connect timeouts, within the episode deadline) instead
    of failing after the connection's own three quick attempts."""
    import fleetenv
    from fleetenv import FleetEnv, Session, bundled_tasks_path
    from fleetenv.core.retry import Deadline
    from fleetenv.events import EventBus

    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use")
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url,
                      events=EventBus(sinks=[]), timeouts={"connect": 5.0})
    with session, FleetEnv(task, session=session) as env:
        starting = local_faults.add("mcp_starting", route="/instances/*/mcp*", seconds=1.5)
        observation, _ = env.reset()
        assert observation.tools
        assert all(f["id"] != starting for f in local_faults.list()), "its window ended"
        policy = env._lease.mcp_setup_retry(Deadline(None))
        assert policy.budget_s == 15.0, "three connect timeouts for the whole open"
        assert env._lease.mcp_setup_retry(Deadline(2.0)).budget_s <= 2.0, "within the deadline"
        # Queueing for a handshake slot is bounded by the episode deadline, not the budget.
        assert policy.queue_budget_s is None
        assert 1.0 < (env._lease.mcp_setup_retry(Deadline(120.0)).queue_budget_s or 0) <= 120
