"""A tool call has ONE timer: its deadline (``timeouts.call``), enforced on fleetenv's loop.

Before, one call passed three timers: the MCP read timeout T, an in-loop limit (T + 15 s,
the toolbox's backstop) and a caller-side watchdog (T + 20 s). Here a call that a local
Fleet tool holds forever gets exactly one error, once, at its deadline; and a caller
never gives up on its own: with the loop held up (a bug, not a timeout) it waits for the
loop, whose deadline then reports the call's own error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
from _support.waiting import wait_for

import fleetenv
from fleetenv import FleetEnv, Observation, Session, ToolCall, bundled_tasks_path, runtime
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import ToolCallFailed, ToolCallFinished
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASK = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
            if t.env_key == "helpdesk" and t.modality == "tool_use")
HUNG = ToolCall("list_agents", {})


def _session(fleet: LocalFleet, seen: list[Any], call_s: float) -> Session:
    return Session(api_key=fleet.token, base_url=fleet.base_url,
                   events=EventBus([seen.append]), timeouts={"call": call_s})


def _held(faults: Any, fault_id: str) -> bool:
    return any(f.get("hits") for f in faults.list() if f["id"] == fault_id)


async def _task_names() -> set[str]:
    return {task.get_name() for task in asyncio.all_tasks()}


def _events_of(seen: list[Any], kind: type) -> list[Any]:
    return [e for e in seen if isinstance(e, kind) and e.tool_name == HUNG.name]


def test_a_hung_tool_gets_one_error_at_its_one_deadline(
        local_fleet: LocalFleet, local_faults: Any, caplog: pytest.LogCaptureFixture) -> None:
    call_s = 2.0
    seen: list[Any] = []
    with _session(local_fleet, seen, call_s) as session, FleetEnv(TASK, session=session) as env:
        env.reset()
        local_faults.add("tool_hang", instance=env.instance_id, tool=HUNG.name)
        with caplog.at_level(logging.INFO, logger="fleetenv"):
            started = time.monotonic()
            observation, _, terminated, truncated, info = env.step(HUNG)
            elapsed = time.monotonic() - started
            # Nothing of the call is left on the loop to fire later, and nothing did.
            assert not {name for name in runtime.current().call(_task_names)
                        if HUNG.name in name}
            time.sleep(1.0)  # a late timer would log or emit in this second
        assert env.step(ToolCall("search_tickets", {"limit": 1}))[0].error is None
    assert observation.error == (f"{HUNG.name} did not answer within {call_s:.0f} s; it may "
                                 "still have run. Check the state before calling it again.")
    assert info["tool_error"] == observation.error and not (terminated or truncated)
    finished, failed = _events_of(seen, ToolCallFinished), _events_of(seen, ToolCallFailed)
    assert len(finished) == 1 and len(failed) == 1, seen
    assert (finished[0].outcome, finished[0].error_type) == ("failed", "DeadlineExceeded")
    assert finished[0].error.startswith(f"tool call got no answer within {call_s:g} s")
    assert call_s <= elapsed <= call_s + 10.0  # its deadline; a hang bound, not a speed claim
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.slow
def test_the_caller_adds_no_timer_of_its_own(local_fleet: LocalFleet,
                                             local_faults: Any) -> None:
    """A held-up loop is a bug, not a timeout: the blocking caller waits for it, and the
    call's own deadline, enforced on the loop, reports the error. Before, a caller-side
    watchdog (T + 20 s) gave up first with an error of its own ("... the fleetenv loop
    did not stop it"), while the in-loop limit (T + 15 s) stood behind the MCP one."""
    call_s, held_up_s = 1.0, 25.0
    seen: list[Any] = []
    outcome: list[Observation] = []
    with _session(local_fleet, seen, call_s) as session, FleetEnv(TASK, session=session) as env:
        env.reset()
        hang = local_faults.add("tool_hang", instance=env.instance_id, tool=HUNG.name)
        caller = threading.Thread(target=lambda: outcome.append(env.step(HUNG)[0]))
        started = time.monotonic()
        caller.start()
        wait_for(lambda: _held(local_faults, hang), timeout=20, what="the call to be held")
        runtime.current().call_soon(lambda: time.sleep(held_up_s))  # holds the loop up
        caller.join(timeout=90)
        elapsed = time.monotonic() - started
        assert not caller.is_alive()
    assert outcome and outcome[0].error is not None
    assert outcome[0].error.startswith(f"{HUNG.name} did not answer within {call_s:.0f} s")
    [failed] = _events_of(seen, ToolCallFailed)
    assert failed.error.startswith(f"tool call got no answer within {call_s:g} s"), failed.error
    assert elapsed >= held_up_s  # it waited for the loop, with no timer of its own


def test_a_calls_task_is_named_for_its_tool_not_its_arguments(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    """While a call runs, its task on the loop says which tool it is and nothing of what
    was sent: arguments may hold what an agent typed, and task names reach asyncio's
    warnings and anyone listing tasks. Before, a step's call was named by the repr of the
    bound call, its arguments included."""
    typed = "pw-7f3a91@typed.example"
    call = ToolCall("search_tickets", {"customer_email": typed, "limit": 1})
    outcome: list[Observation] = []
    with _session(local_fleet, [], 60.0) as session, FleetEnv(TASK, session=session) as env:
        env.reset()
        hang = local_faults.add("tool_hang", instance=env.instance_id, tool=call.name)
        caller = threading.Thread(target=lambda: outcome.append(env.step(call)[0]))
        caller.start()
        try:
            wait_for(lambda: _held(local_faults, hang), timeout=20, what="the call to be held")
            names = runtime.current().call(_task_names)
        finally:
            local_faults.clear(hang)  # the held call proceeds
            caller.join(timeout=60)
        assert not caller.is_alive()
    assert f"call {call.name}" in names, names
    assert not [name for name in names if typed in name], names
    assert outcome  # released, the call ran and the step returned
