"""Every action form in circulation parses to the same typed actions."""

from __future__ import annotations

import pytest

from fleetenv.core.errors import InvalidActionError, ToolArgumentsError
from fleetenv.core.types import Done, FinalAnswer, ListTools, ToolCall
from fleetenv.env.actions import parse_action


def test_tool_call_passes_through() -> None:
    call = ToolCall("search", {"q": "x"}, id="c1")
    assert parse_action(call) == (call,)


def test_openai_tool_call_with_json_string_arguments() -> None:
    (call,) = parse_action({"id": "c9", "type": "function",
                            "function": {"name": "search", "arguments": '{"q": "x"}'}})
    assert isinstance(call, ToolCall)
    assert (call.name, call.id, call.decoded_arguments()) == ("search", "c9", {"q": "x"})


def test_openai_tool_call_with_dict_arguments() -> None:
    (call,) = parse_action({"type": "function", "function": {"name": "s", "arguments": {"a": 1}}})
    assert call.decoded_arguments() == {"a": 1}


def test_openenv_tool_params_done_yields_call_then_done() -> None:
    actions = parse_action({"tool": "close_ticket", "params": {"id": 3}, "done": True})
    assert [type(a) for a in actions] == [ToolCall, Done]
    assert actions[0].decoded_arguments() == {"id": 3}


def test_openenv_done_only() -> None:
    assert parse_action({"tool": None, "params": {}, "done": True}) == (Done(),)


def test_openenv_mcp_actions() -> None:
    assert parse_action({"type": "list_tools"}) == (ListTools(),)
    (call,) = parse_action({"type": "call_tool", "tool_name": "t", "arguments": {"x": 1}})
    assert (call.name, call.decoded_arguments()) == ("t", {"x": 1})
    (call,) = parse_action({"type": "call_tool", "tool_name": "t", "parameters": {"y": 2}})
    assert call.decoded_arguments() == {"y": 2}


def test_submit_final_answer_becomes_final_answer_in_every_form() -> None:
    forms = [
        ToolCall("submit_final_answer", {"answer": "42"}),
        {"type": "function", "function": {"name": "submit_final_answer",
                                          "arguments": '{"answer": "42"}'}},
        {"tool": "submit_final_answer", "params": {"answer": "42"}, "done": True},
        {"final_answer": "42"},
    ]
    for form in forms:
        (action,) = parse_action(form)
        assert isinstance(action, FinalAnswer) and action.answer == "42", form


def test_bad_arguments_are_kept_for_an_error_observation() -> None:
    (call,) = parse_action({"function": {"name": "s", "arguments": "{not json"}})
    with pytest.raises(ToolArgumentsError, match="not valid JSON"):
        call.decoded_arguments()
    (call,) = parse_action({"function": {"name": "s", "arguments": "[1, 2]"}})
    with pytest.raises(ToolArgumentsError, match="must be a JSON object, got list"):
        call.decoded_arguments()


@pytest.mark.parametrize("bad", [42, "search", ["a"], {"foo": 1}, {"tool": None}])
def test_non_actions_raise_a_clear_error(bad: object) -> None:
    with pytest.raises(InvalidActionError) as info:
        parse_action(bad)
    assert "hint:" in str(info.value)
