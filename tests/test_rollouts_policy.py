"""Policies (fleetenv.rollouts.policy): scripted, callable, spec parsing, reply conversion.

The conversion tests need no server; the episode tests run real rollouts on the local Fleet.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.errors import ConfigurationError, InvalidActionError
from fleetenv.core.tasks import Task
from fleetenv.core.types import Done, FinalAnswer, ToolCall
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import (
    CallablePolicy,
    Policy,
    PolicyContext,
    Reply,
    ScriptedPolicy,
    dump_actions,
    reply_from_assistant_message,
    to_reply,
)
from fleetenv.rollouts.policy_spec import PolicySpec, as_policy, parse_policy_spec
from fleetenv.rollouts.rollout import run_episode

TASKS: dict[str, Task] = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
PLAIN = Task(key="plain", prompt="Retag ticket 7.", env_key="helpdesk")
ANSWERING = Task(key="answering", prompt="How many? Use submit_final_answer.",
                 env_key="helpdesk")


def context(task: Task = PLAIN, turn: int = 0) -> PolicyContext:
    return PolicyContext(task=task, messages=[{"role": "user", "content": task.prompt}],
                         tools=[], turn=turn)


def openai_call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


# Targets for the "import" policy kind (this module is importable: tests/ is on sys.path).
def finish_at_once(ctx: PolicyContext) -> Any:
    return Done()


class NoArgumentPolicy:
    def act(self, ctx: PolicyContext) -> Reply:
        return Reply.from_actions([FinalAnswer("42")])


NOT_A_POLICY = 3


# ---------------------------------------------------------------- Reply and conversion

def test_reply_from_actions_builds_the_assistant_message():
    call = ToolCall("get_ticket", {"ticket_id": 7}, id="call_a")
    reply = Reply.from_actions([call, FinalAnswer("yes", id="call_b")])
    assert reply.actions == (call, FinalAnswer("yes", id="call_b"))
    assert reply.message == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_ticket", "arguments": '{"ticket_id": 7}'}},
        {"id": "call_b", "type": "function",
         "function": {"name": "submit_final_answer", "arguments": '{"answer": "yes"}'}}]}
    assert Reply.from_actions([Done()]).message == {"role": "assistant", "content": "Done."}


def test_tool_calls_in_an_assistant_message_become_actions_in_order():
    message = {"role": "assistant", "content": "Looking.", "tool_calls": [
        openai_call("a", {"x": 1}, "call_1"), openai_call("b", "{broken", "call_2"),
        openai_call("submit_final_answer", {"answer": "7"}, "call_3")]}
    reply = reply_from_assistant_message(message, ANSWERING)
    assert reply.message is message
    assert reply.actions == (ToolCall("a", '{"x": 1}', id="call_1"),
                             ToolCall("b", "{broken", id="call_2"),  # left for the env to report
                             FinalAnswer("7", id="call_3"))


@pytest.mark.parametrize("task, content, expected", [
    (ANSWERING, "  34 \n", FinalAnswer("34")),
    (ANSWERING, [{"type": "text", "text": "3"}, {"type": "text", "text": "4"}],
     FinalAnswer("34")),
    (ANSWERING, "   ", Done()),
    (ANSWERING, None, Done()),
    (PLAIN, "All done.", Done()),
])
def test_a_reply_without_tool_calls_ends_the_episode(task, content, expected):
    (action,) = reply_from_assistant_message({"role": "assistant", "content": content},
                                             task).actions
    assert type(action) is type(expected)
    if isinstance(expected, FinalAnswer):
        assert isinstance(action, FinalAnswer) and action.answer == expected.answer


def test_to_reply_accepts_every_form_a_function_may_return():
    call = ToolCall("a", {"x": 1}, id="call_1")
    reply = Reply.from_actions([call])
    assert to_reply(reply, PLAIN) is reply
    assert to_reply(call, PLAIN).actions == (call,)
    assert to_reply([call, Done()], PLAIN).actions == (call, Done())
    openenv = to_reply({"tool": "a", "params": {"x": 1}, "done": True}, PLAIN)
    assert [type(a) for a in openenv.actions] == [ToolCall, Done]
    assert openenv.actions[0].decoded_arguments() == {"x": 1}
    message = {"role": "assistant", "content": None,
               "tool_calls": [openai_call("a", {"x": 1}, "call_9")]}
    from_message = to_reply(message, PLAIN)
    assert from_message.message == message and from_message.actions[0].id == "call_9"
    (answer,) = to_reply({"final_answer": "x"}, ANSWERING).actions
    assert isinstance(answer, FinalAnswer) and answer.answer == "x"
    with pytest.raises(InvalidActionError):
        to_reply(3.5, PLAIN)


# ---------------------------------------------------------------- scripted and callable

def test_scripted_policy_plays_one_call_per_turn_then_finishes():
    policy = ScriptedPolicy([{"name": "a", "arguments": {"x": 1}}, ToolCall("b", {})])
    first, second, third = (policy.act(context(turn=t)) for t in range(3))
    assert [a.name for a in (*first.actions, *second.actions)] == ["a", "b"]
    assert first.actions[0].decoded_arguments() == {"x": 1}
    assert first.message["tool_calls"][0]["id"] == first.actions[0].id
    assert third.actions == (Done(),)


def test_scripted_reference_replays_the_tasks_solution_with_the_answer():
    task = TASKS["helpdesk-busiest-agent"]
    policy = ScriptedPolicy.reference()
    steps = [policy.act(context(task, turn)).actions for turn in range(3)]
    assert steps[0][0] == ToolCall("list_agents", {}, id=steps[0][0].id)
    assert steps[1] == (FinalAnswer("daniel.kim@helpdesk.example", id=steps[1][0].id),)
    assert steps[2] == (Done(),)


def test_scripted_reference_without_a_solution_says_so():
    with pytest.raises(ConfigurationError, match="no reference solution") as info:
        ScriptedPolicy.reference().act(context(PLAIN))
    assert "plain" in str(info.value)


def test_callable_policy_sees_the_context():
    seen: list[PolicyContext] = []

    def fn(ctx: PolicyContext) -> Any:
        seen.append(ctx)
        return {"tool": "a", "params": {"turn": ctx.turn}}

    reply = CallablePolicy(fn).act(context(turn=4))
    assert seen[0].turn == 4 and reply.actions[0].decoded_arguments() == {"turn": 4}


# ---------------------------------------------------------------- specs

def test_specs_build_each_kind_and_describe_without_secrets():
    assert isinstance(PolicySpec("reference").build(), ScriptedPolicy)
    scripted = PolicySpec("scripted", {"calls": [{"name": "a"}]}).build()
    assert isinstance(scripted, ScriptedPolicy) and scripted.calls[0].name == "a"
    openai = PolicySpec("openai", {"model": "m", "base_url": "http://127.0.0.1:9/v1",
                                   "api_key": "sk-secret-value"})
    assert openai.describe() == "openai:m" and "sk-secret" not in openai.describe()
    assert type(openai.build()).__name__ == "OpenAIChatPolicy"
    assert PolicySpec("reference").describe() == "reference"
    with pytest.raises(ConfigurationError, match="unknown policy kind 'gpt'"):
        PolicySpec("gpt").build()


def test_specs_pickle_and_parse():
    spec = parse_policy_spec("import:test_rollouts_policy:finish_at_once", extra=1)
    assert spec == PolicySpec("import", {"target": "test_rollouts_policy:finish_at_once",
                                         "extra": 1})
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert parse_policy_spec("openai", model="m") == PolicySpec("openai", {"model": "m"})
    assert parse_policy_spec("reference") == PolicySpec("reference", {})


def test_import_specs_load_functions_classes_and_objects():
    fn = as_policy("import:test_rollouts_policy:finish_at_once")
    assert isinstance(fn, CallablePolicy) and fn.act(context()).actions == (Done(),)
    obj = as_policy("import:test_rollouts_policy:NoArgumentPolicy")
    assert isinstance(obj, NoArgumentPolicy) and obj.act(context()).actions[0].answer == "42"
    for target, expected in [("no_colon", "bad policy import target"),
                             ("no_such_module_xyz:f", "cannot import policy"),
                             ("test_rollouts_policy:missing", "cannot import policy"),
                             ("test_rollouts_policy:NOT_A_POLICY", "cannot use a int")]:
        with pytest.raises(ConfigurationError, match=expected):
            as_policy(f"import:{target}")


def test_as_policy_accepts_policies_specs_and_functions():
    scripted = ScriptedPolicy()
    assert as_policy(scripted) is scripted
    assert isinstance(scripted, Policy)
    assert isinstance(as_policy(PolicySpec("reference")), ScriptedPolicy)
    assert isinstance(as_policy("reference"), ScriptedPolicy)
    assert isinstance(as_policy(finish_at_once), CallablePolicy)
    with pytest.raises(ConfigurationError, match="cannot use a list as a policy"):
        as_policy([])  # type: ignore[arg-type]


def test_dump_actions_is_compact():
    assert json.loads(dump_actions([ToolCall("a"), FinalAnswer("x"), Done()])) == [
        "ToolCall(a)", "FinalAnswer", "Done"]


# ---------------------------------------------------------------- real episodes

@pytest.fixture
def fleet_config(local_fleet: LocalFleet) -> FleetConfig:
    return resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)


@pytest.mark.timeout(30)
def test_the_reference_spec_scores_full_marks(fleet_config):
    result = run_episode(TASKS["shop-count-shipped"], PolicySpec("reference"),
                         config=fleet_config)
    assert result.error is None, result.error
    assert (result.reward, result.final_answer, result.policy) == (1.0, "30", "reference")
    assert result.tool_calls == 1 and result.stop_reason == "agent_done"


@pytest.mark.timeout(30)
def test_a_callable_policy_plays_a_whole_episode(fleet_config):
    task = TASKS["shop-cancel-paid-order"]
    solution = task.reference_solution or []

    def replay(ctx: PolicyContext) -> Any:
        if ctx.turn < len(solution):
            step = solution[ctx.turn]
            return {"tool": step.name, "params": step.arguments}
        return {"done": True}

    result = run_episode(task, replay, config=fleet_config)
    assert result.error is None, result.error
    assert result.reward == 1.0 and result.tool_calls == len(solution)
    # The transcript pairs each recorded tool call with its tool result.
    calls = [m for m in result.transcript if m.get("tool_calls")]
    answers = [m for m in result.transcript if m["role"] == "tool"]
    assert [c["tool_calls"][0]["id"] for c in calls] == [a["tool_call_id"] for a in answers]


@pytest.mark.timeout(30)
def test_a_policy_that_raises_is_an_error_result_not_a_crash(fleet_config):
    def broken(ctx: PolicyContext) -> Any:
        raise RuntimeError("policy exploded")

    result = run_episode(TASKS["shop-cancel-paid-order"], broken, config=fleet_config)
    assert result.stop_reason == "error" and result.reward is None
    assert result.error == {"type": "RuntimeError", "message": "policy exploded"}
