"""What one tool-use episode costs on the wire: no request it does not need.

Counted on the server side (the in-process local Fleet's uvicorn counts every HTTP
request it served), around a real ``FleetEnv`` episode. Before, a tool-use episode also
opened a session on the computer endpoint (``api/v1/mcp``) whose only tool it drops:
four more requests and a second streaming connection per episode.
"""

from __future__ import annotations

from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, ToolCall, bundled_tasks_path
from fleetenv.core.config import resolve_config
from fleetenv.core.event_bus import EventBus
from fleetenv.fleet.session import Session
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASK = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use")
CALLS = 5


def served(fleet: LocalFleet) -> int:
    """HTTP requests the local Fleet has served so far (uvicorn's own count)."""
    state: Any = fleet._server.server.server_state
    return int(state.total_requests)


@pytest.fixture
def quiet_fleet() -> Any:
    """A local Fleet of this test's own: the suite's shared one also serves the
    background cleanup of earlier tests (deletes, sweeps), which would be counted."""
    with LocalFleet() as fleet:
        yield fleet


def test_a_tool_use_episode_sends_only_the_requests_it_needs(quiet_fleet: LocalFleet) -> None:
    local_fleet = quiet_fleet
    # Any request to a computer endpoint would fail the episode's reset.
    local_fleet.faults.add("http_error", route="/instances/*/api/v1/mcp*", status=500)
    # A zero-second delay changes nothing but counts: every POST to the tools endpoint.
    # (Counting all requests instead flaked: on a loaded machine the session's GET
    # stream reaches the server, or reconnects, in the middle of the tool calls.)
    posts = local_fleet.faults.add("http_delay", route="/instances/*/mcp*", method="POST",
                                   seconds=0)
    read = TASK.reference_solution[0]
    # A session of our own, closed after counting: closing a session sweeps its run tag
    # (one request per session, not per episode).
    session = Session(resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url),
                      events=EventBus(sinks=[]))
    before = served(local_fleet)
    with FleetEnv(TASK, session=session) as env:
        observation, _ = env.reset()
        assert "computer" not in [tool["function"]["name"] for tool in observation.tools]
        handshake_posts = posts_seen(local_fleet, posts)
        for _ in range(CALLS):
            _, _, _, _, info = env.step(ToolCall(read.name, read.arguments))
            assert not info.get("tool_error"), info
        # One POST per tool call, no more.
        assert posts_seen(local_fleet, posts) - handshake_posts == CALLS
        env.close(grade=False)
    # Create the instance; the runner token (once per session: the instance's services
    # hold it and may echo it, so it is scrubbed from what the run writes); initialize,
    # initialized, the GET stream and tools/list on {root}mcp; end the session (DELETE);
    # delete the instance: 8. On a loaded machine the GET stream may reconnect or a slow
    # handshake be retried, so allow 3 more; a second session (the computer endpoint) is
    # caught by the fault below, whatever the count.
    assert served(local_fleet) - before - CALLS <= 8 + 3
    session.close()
    hits = {fault["kind"]: fault["hits"] for fault in local_fleet.faults.list()}
    assert hits["http_error"] == 0


def posts_seen(fleet: LocalFleet, fault_id: str) -> int:
    """POSTs to the tools endpoint so far: the hits of the counting fault."""
    return int(next(f["hits"] for f in fleet.faults.list() if f["id"] == fault_id))
