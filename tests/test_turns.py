"""``env.step()`` given a whole assistant turn, against the embedded local Fleet over real
HTTP and MCP: bundled tasks solved from their reference solutions written as a model
would write them, one step per turn."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Task, ToolCall, bundled_tasks_path
from fleetenv.core.errors import ConfigurationError, EpisodeStateError, InvalidActionError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event, TurnParseFailed, TurnWithoutToolCall
from fleetenv.env.tool_call_parsing import parse_tool_calls
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
#: Several calls per turn; with and without a submitted answer.
SOLVED = ["helpdesk-assign-api-ticket", "helpdesk-busiest-agent", "shop-receive-shipment"]


def make_env(fleet: LocalFleet, task: Task, events: list[Event] | None = None,
             **kwargs: Any) -> FleetEnv:
    bus = EventBus(sinks=[] if events is None else [events.append])
    return FleetEnv(task, api_key=fleet.token, base_url=fleet.base_url, events=bus, **kwargs)


def hermes(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "I will do this.\n" + "\n".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
        for n, a in calls)


def openai_message(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(calls)]}


def llama(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "<|python_tag|>" + "; ".join(
        json.dumps({"name": n, "parameters": a}) for n, a in calls) + "<|eom_id|>"


def tool_calls(calls: list[tuple[str, dict[str, Any]]]) -> list[ToolCall]:
    return [ToolCall(n, a) for n, a in calls]


RENDERINGS: dict[str, Callable[[list[tuple[str, dict[str, Any]]]], object]] = {
    "hermes": hermes, "openai": openai_message, "llama3": llama, "list": tool_calls}


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
@pytest.mark.parametrize("key", SOLVED)
def test_reference_solutions_written_as_turns_solve_their_tasks(
        local_fleet: LocalFleet, key: str, rendering: str) -> None:
    task = TASKS[key]
    solution = [(c.name, dict(c.arguments)) for c in task.reference_solution or []]
    # Turn 1: every call but the last, at once; turn 2: the last call.
    turns = [solution[:-1], solution[-1:]]
    with make_env(local_fleet, task) as env:
        env.reset()
        for number, calls in enumerate(turns, start=1):
            obs, reward, terminated, truncated, info = env.step(RENDERINGS[rendering](calls))
            assert env.stats.turns == number and info["turn_calls"] == len(calls), info
            assert not obs.is_error and not truncated, (obs.error, info)
            messages = obs.to_messages()
            assert [m["role"] for m in messages] == ["tool"] * len(calls)
            assert [m["tool_call_id"] for m in messages] == [c.tool_call_id for c in obs.calls]
            assert [c.tool_name for c in obs.calls] == [n for n, _ in calls]
        if not terminated:  # a last turn without tool calls: the episode's end
            obs, reward, terminated, truncated, info = env.step("All done.")
            assert env.final_answer == "All done." and obs.to_messages()[0]["role"] == "user"
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert env.stats.turns == len(turns) + (
            0 if solution[-1][0] == "submit_final_answer" else 1)
        assert env.stats.tool_calls == sum(n != "submit_final_answer" for n, _ in solution)


def test_turn_observation_joins_results_and_ids_match_the_message(
        local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-assign-api-ticket"]
    with make_env(local_fleet, task) as env:
        env.reset()
        message = openai_message([("get_ticket", {"ticket_id": 1124}),
                                  ("list_agents", {"team": "technical"}),
                                  ("list_agnts", {})])
        obs, reward, terminated, truncated, info = env.step(message)
        assert (reward, terminated, truncated, info["turn_calls"]) == (0.0, False, False, 3)
        assert [m["tool_call_id"] for m in obs.to_messages()] == ["call_0", "call_1", "call_2"]
        assert obs.is_error and obs.error == obs.calls[2].error and "list_agnts" in obs.error
        assert not obs.calls[0].is_error and "1124" in obs.calls[0].text
        assert obs.calls[1].text in obs.text and obs.tool_call_id == "call_2"
        view = obs.to_dict()
        assert [c["tool_call_id"] for c in view["calls"]] == ["call_0", "call_1", "call_2"]
        json.dumps(view)
        assert env.stats.turns == 1 and env.stats.tool_calls == 3 and env.stats.tool_errors == 1


def test_a_turn_counts_once_toward_max_steps(local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-assign-api-ticket"]
    with make_env(local_fleet, task, max_steps=2) as env:
        env.reset()
        three = hermes([("list_agents", {})] * 3)
        _, _, _, truncated, info = env.step(three)
        assert not truncated and env.stats.tool_calls == 3
        _, reward, terminated, truncated, info = env.step(three)
        assert truncated and not terminated and info["stop_reason"] == "max_steps"
        assert env.stats.turns == 2 and env.stats.tool_calls == 6 and reward == 0.0


@pytest.mark.parametrize("failed_parse_reward", [None, -0.5])
def test_an_unreadable_turn_is_a_parse_error_observation(
        local_fleet: LocalFleet, failed_parse_reward: float | None) -> None:
    task = TASKS["helpdesk-busiest-agent"]
    events: list[Event] = []
    with make_env(local_fleet, task, events,
                  failed_parse_reward=failed_parse_reward) as env:
        env.reset()
        broken = 'Checking.\n<tool_call>{"name": "list_agents", "arguments": {</tool_call>'
        obs, reward, terminated, truncated, info = env.step(broken)
        assert reward == (0.0 if failed_parse_reward is None else -0.5)
        assert not terminated and not truncated  # the agent may try again
        assert obs.is_error and obs.parse_error == info["parse_error"] == obs.error
        assert "not valid JSON" in obs.error and "offset" in obs.error
        (message,) = obs.to_messages()
        assert message["role"] == "user" and "could not be read" in message["content"][0]["text"]
        assert env.stats.turns == 1 and env.stats.parse_errors == 1 and env.stats.tool_calls == 0
        (failed,) = [e for e in events if isinstance(e, TurnParseFailed)]
        assert (failed.step, failed.format) == (1, "hermes")
        assert failed.offset == broken.index("</tool_call>") and failed.error == obs.error
        # The next turn reads fine, and its step reward is the usual 0.0.
        obs, reward, *_ = env.step(hermes([("list_agents", {})]))
        assert reward == 0.0 and not obs.is_error and env.stats.parse_errors == 1
        obs, reward, terminated, *_ = env.step(
            hermes([("submit_final_answer", {"answer": "daniel.kim@helpdesk.example"})]))
        assert (reward, terminated) == (1.0, True)


def test_a_turn_without_tool_calls_is_the_final_answer_by_default(
        local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-busiest-agent"]
    with make_env(local_fleet, task) as env:
        env.reset()
        env.step({"role": "assistant", "content": "<tool_call>"
                  '{"name": "list_agents", "arguments": {}}</tool_call>'})  # no tool parser
        assert env.stats.tool_calls == 1
        _, reward, terminated, truncated, info = env.step(
            "<think>Daniel has the most.</think>daniel.kim@helpdesk.example<|im_end|>")
        assert env.final_answer == "daniel.kim@helpdesk.example"
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["turn_calls"] == 0 and env.stats.noop_turns == 0


def test_a_turn_without_tool_calls_can_be_a_no_op(local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-busiest-agent"]
    events: list[Event] = []
    with make_env(local_fleet, task, events, no_tool_call="noop", max_steps=4) as env:
        env.reset()
        for turn in ("Let me think about it.", [], {"role": "assistant", "content": "Hmm."}):
            obs, reward, terminated, truncated, info = env.step(turn)
            assert (reward, terminated, truncated) == (0.0, False, False)
            assert info["no_tool_call"] and obs.calls == ()
            (message,) = obs.to_messages()
            assert message["role"] == "user" and "submit_final_answer" in obs.text
        assert env.stats.turns == 3 and env.stats.noop_turns == 3 and env.final_answer is None
        noops = [e for e in events if isinstance(e, TurnWithoutToolCall)]
        assert [(e.step, e.text) for e in noops] == [
            (1, "Let me think about it."), (2, ""), (3, "Hmm.")]
        *_, truncated, info = env.step("Still thinking.")
        assert truncated and info["stop_reason"] == "max_steps"


def test_wrong_python_values_raise_and_take_no_turn(local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-busiest-agent"]
    with make_env(local_fleet, task) as env:
        env.reset()
        for bad in ([ToolCall("list_agents", {}), 42], ["list_agents"],
                    {"role": "assistant", "tool_calls": "list_agents"}):
            with pytest.raises(InvalidActionError):
                env.step(bad)
        assert env.stats.turns == 0 and env.stats.tool_calls == 0


def test_tools_prompt_renders_the_offered_tools(local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-busiest-agent"]
    with make_env(local_fleet, task, tool_call_format="llama3") as env:
        with pytest.raises(EpisodeStateError, match="reset"):
            env.tools_prompt()
        env.reset()
        assert env.tools_prompt().startswith("Given the following functions")
        assert json.loads(env.tools_prompt(format="openai")) == env.openai_tools
        block = env.tools_prompt(format="hermes")
        listed = block.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
        names = [json.loads(line)["function"]["name"] for line in listed]
        assert "list_agents" in names and "submit_final_answer" in names
        # What the prompt teaches reads back as calls of those tools.
        (call,) = parse_tool_calls(hermes([("list_agents", {})]))
        assert call.name in names


def test_bad_turn_options_are_refused_where_given(local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-busiest-agent"]
    for options in ({"no_tool_call": "ignore"}, {"tool_call_format": "xml"},
                    {"failed_parse_reward": "low"}, {"failed_parse_reward": float("nan")},
                    {"failed_parse_reward": True}):
        with pytest.raises(ConfigurationError):
            make_env(local_fleet, task, **options)
