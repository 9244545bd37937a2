"""One ``ToolCallFinished`` per tool call, whatever happened to it.

A mixed episode against the embedded local Fleet: a call that works, an unknown tool,
arguments that do not fit, a tool that answers with an error, a call that times out
(the local Fleet holds it), and the local ``submit_final_answer``.
"""

from __future__ import annotations

from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Session, ToolCall, bundled_tasks_path
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import ToolCallFailed, ToolCallFinished, ToolErrorReported
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASK = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
            if t.env_key == "helpdesk" and t.modality == "tool_use" and t.needs_final_answer)


def test_every_tool_call_emits_exactly_one_finished_event(local_fleet: LocalFleet,
                                                          local_faults: Any) -> None:
    seen: list[Any] = []
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url,
                      events=EventBus([seen.append]), timeouts={"call": 3.0})
    calls = [
        ToolCall("search_tickets", {"status": "open", "limit": 1}),  # ok
        ToolCall("serch_tickets", {}),                                # unknown tool
        ToolCall("get_ticket", {}),                                   # missing argument
        ToolCall("get_ticket", {"ticket_id": 999_999}),               # the tool says no
        ToolCall("list_agents", {}),                                  # held: times out
        ToolCall("submit_final_answer", {"answer": "3"}),             # local
    ]
    with session, FleetEnv(TASK, session=session) as env:
        env.reset()
        local_faults.add("tool_hang", instance=env.instance_id, tool="list_agents")
        outcomes = [env.step(call)[0] for call in calls]
        assert env.done
    finished = [e for e in seen if isinstance(e, ToolCallFinished)]
    assert [(e.tool_name, e.step, e.outcome, e.error_type) for e in finished] == [
        ("search_tickets", 1, "ok", None),
        ("serch_tickets", 2, "bad_arguments", "ToolNotFoundError"),
        ("get_ticket", 3, "bad_arguments", "ToolArgumentsError"),
        ("get_ticket", 4, "tool_error", None),
        ("list_agents", 5, "failed", "DeadlineExceeded"),
        ("submit_final_answer", 6, "local", None),
    ]
    assert {e.rollout_id for e in finished} == {env.rollout_id}
    assert {e.instance_id for e in finished} == {env.last_instance_id}
    # Errors carry what the agent saw; a clean call carries none.
    assert finished[0].error is None
    for event, observation in zip(finished[1:4], outcomes[1:4], strict=True):
        assert event.error == observation.error and event.error
    # Time is measured around the send: nothing was sent for refused calls.
    assert finished[1].duration_s == finished[2].duration_s == 0.0
    assert finished[0].duration_s > 0 and finished[3].duration_s > 0
    assert finished[4].duration_s >= 2.0  # it waited for the tool timeout (3 s)
    # The older, narrower events are still there, once each.
    assert [e.tool_name for e in seen if isinstance(e, ToolCallFailed)] == ["list_agents"]
    assert [e.tool_name for e in seen if isinstance(e, ToolErrorReported)] == ["get_ticket"]
