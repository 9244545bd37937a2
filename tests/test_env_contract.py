"""The episode contract (``fleetenv.core.types``) holds for real episodes.

``StepResult`` is Gymnasium's 5-tuple with names, and ``StepInfo`` / ``ResetInfo``
declare every key ``step()`` and ``reset()`` put in ``info``: episodes against the local
Fleet walk the paths that add keys (tool calls, tool errors, a final answer, the step
limit, whole turns, a parse error, context tools, a replaced instance, an expired one, a
failed screenshot), and every key they produce must be declared. A new key that is not
documented in ``StepInfo`` fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Session, StepResult, ToolCall, bundled_tasks_path
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(180)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
ANSWERED = TASKS["helpdesk-busiest-agent"]        # list_agents, then a final answer
ACTING = TASKS["shop-refund-returned-order"]      # no final answer: ends by the step limit
COMPUTER = TASKS["helpdesk-ui-reply-and-resolve"]
#: Declared keys no episode here produces, and the test that produces them.
ELSEWHERE = {"tools_changed"}  # tests/test_env_notifications.py (a server that says so)


class Recorder:
    """Every ``info`` key an env's ``reset()`` and ``step()`` returned."""

    def __init__(self) -> None:
        self.reset_keys: set[str] = set()
        self.step_keys: set[str] = set()

    def reset(self, env: FleetEnv, **kwargs: Any) -> Any:
        observation, info = env.reset(**kwargs)
        self.reset_keys |= set(info)
        return observation, info

    def step(self, env: FleetEnv, action: object) -> StepResult:
        result = env.step(action)
        self.step_keys |= set(result.info)
        return result


def test_a_step_result_is_the_gymnasium_tuple_with_names(local_fleet: LocalFleet) -> None:
    with FleetEnv(ANSWERED, api_key=local_fleet.token, base_url=local_fleet.base_url) as env:
        env.reset()
        result = env.step(ToolCall("list_agents", {}))
        assert isinstance(result, StepResult) and isinstance(result, tuple)
        observation, reward, terminated, truncated, info = result
        assert len(result) == 5
        assert (result.observation, result.reward, result.terminated, result.truncated,
                result.info) == (observation, reward, terminated, truncated, info)
        assert result == (observation, reward, terminated, truncated, info)
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert result.observation.tool_name == "list_agents" and result.info["step"] == 1
        first, *rest = result
        assert first is observation and rest[-1] is info


def test_every_info_key_is_declared(local_fleet: LocalFleet, local_faults: Any) -> None:
    seen = Recorder()
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with session:
        # Tool calls, a tool error, a final answer (graded).
        with FleetEnv(ANSWERED, session=session) as env:
            seen.reset(env)
            seen.step(env, ToolCall("list_agents", {}))
            seen.step(env, ToolCall("list_agnts", {}))
            _, reward, terminated, *_ = seen.step(env, fleetenv.FinalAnswer("nobody"))
            assert terminated and reward is not None
            # The restore of the seed state fails: the instance is replaced.
            local_faults.add("http_error", route="*/api/v1/env/reset", status=500, times=1)
            _, info = seen.reset(env)
            assert info["reset"] == "instance_replaced"
            # The instance expires under a call.
            local_faults.expire(env.instance_id)
            *_, truncated, info = seen.step(env, ToolCall("list_agents", {}))
            assert truncated and "instance_error" in info
        # Whole turns: text with calls, an unreadable one, one without calls; the limit.
        with FleetEnv(ACTING, session=session, max_steps=3, no_tool_call="noop") as env:
            seen.reset(env)
            seen.step(env, '<tool_call>{"name": "get_order", "arguments": {"order_id": 1}}'
                           "</tool_call>")
            *_, info = seen.step(env, '<tool_call>{"name": "get_order", "arguments": {'
                                      "</tool_call>")
            assert info["parse_error"]
            *_, truncated, info = seen.step(env, "Thinking it over.")
            assert info["no_tool_call"] and truncated and info["stop_reason"] == "max_steps"
        # Context tools: answered locally; manage_context hands back the history.
        with FleetEnv(ANSWERED, session=session, context_tools=True) as env:
            seen.reset(env)
            seen.step(env, ToolCall("list_agents", {}))
            *_, info = seen.step(env, ToolCall("manage_context", {"keep_recent_turns": 1}))
            assert info["local_tool"] == "manage_context" and "history" in info
        # A computer-use reset whose first screenshot fails.
        local_faults.add("tool_error", tool="computer", message="no display", times=1)
        with FleetEnv(COMPUTER, session=session) as env:
            _, info = seen.reset(env)
            assert info.get("screenshot_error")
            env.close(grade=False)

    reset_declared = set(fleetenv.ResetInfo.__annotations__)
    step_declared = set(fleetenv.StepInfo.__annotations__)
    assert seen.reset_keys <= reset_declared, (
        f"reset() info keys missing from ResetInfo: {seen.reset_keys - reset_declared}")
    assert seen.step_keys <= step_declared, (
        f"step() info keys missing from StepInfo: {seen.step_keys - step_declared}")
    # ...and the episodes above walked every path that adds a key, so nothing declared
    # is stale.
    assert reset_declared == seen.reset_keys
    assert step_declared - seen.step_keys == ELSEWHERE
