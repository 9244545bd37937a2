"""Actions an agent can take, and the one parser that accepts every form in circulation.

Trainers hand over actions in whatever shape their stack produces: our ``ToolCall``, an
OpenAI ``tool_call`` dict (arguments as a JSON string or a dict), OpenEnv's
``{"tool", "params", "done"}`` or its list-tools / call-tool actions. They are all
normalised here into a short tuple of typed actions, so the episode logic only ever
sees four kinds.

Malformed tool *arguments* are not rejected here: they become an error observation the
agent can recover from (a model that wrote broken JSON should see why, not crash the
rollout). Only a value that is no action at all raises :class:`InvalidActionError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleetenv.core.errors import InvalidActionError, ToolArgumentsError
from fleetenv.core.types import Action, Done, FinalAnswer, ListTools, ToolCall, new_call_id

__all__ = ["SUBMIT_FINAL_ANSWER", "SUBMIT_FINAL_ANSWER_TOOL", "parse_action"]

#: The synthetic tool that ends an episode with an answer; handled locally, never sent
#: to MCP.
SUBMIT_FINAL_ANSWER = "submit_final_answer"

#: Worded as the previous client's, which mirrors Fleet's harness answer tool
#: (``ANSWER_SUBMISSION_TOOL``): part of the prompt policies trained on Fleet saw.
SUBMIT_FINAL_ANSWER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SUBMIT_FINAL_ANSWER,
        "description": (
            "Submit your final answer to complete the task. Use this when you have "
            "finished the task and want to provide your answer for verification. If the "
            "requested answer asks for json, then write your response in the answer "
            "field using json brackets."
        ),
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "Your final answer"}},
            "required": ["answer"],
        },
    },
}


def parse_action(action: object) -> tuple[Action, ...]:
    """Normalise one action of any accepted form into typed actions, in order.

    OpenEnv's ``{"tool": t, "params": p, "done": True}`` means "call t, then finish",
    so it yields two actions.
    """
    if isinstance(action, ToolCall | FinalAnswer | Done | ListTools):
        return (_final_answer_from_call(action),) if isinstance(action, ToolCall) else (action,)
    if isinstance(action, Mapping):
        return _parse_mapping(action)
    raise InvalidActionError(f"cannot use a {type(action).__name__} as an action: "
                             f"{action!r:.200}")


def _final_answer_from_call(call: ToolCall) -> Action:
    """A call of the synthetic submit tool is a final answer (it never reaches MCP)."""
    if call.name != SUBMIT_FINAL_ANSWER:
        return call
    try:
        arguments = call.decoded_arguments()
    except ToolArgumentsError:
        return call  # the episode reports the broken arguments like any tool's
    answer = arguments.get("answer")
    if answer is None:
        return call
    return FinalAnswer(answer=answer if isinstance(answer, str) else json.dumps(answer),
                       id=call.id)


def _parse_mapping(action: Mapping[str, Any]) -> tuple[Action, ...]:
    # OpenAI tool_call: {"id", "type": "function", "function": {"name", "arguments"}}
    function = action.get("function")
    if isinstance(function, Mapping) and "name" in function:
        call = ToolCall(str(function["name"]), function.get("arguments"),
                        str(action.get("id") or new_call_id()))
        return (_final_answer_from_call(call),)
    kind = action.get("type")
    # OpenEnv MCP actions: {"type": "list_tools"} / {"type": "call_tool", "tool_name", ...}
    if kind == "list_tools":
        return (ListTools(),)
    if kind == "call_tool" and "tool_name" in action:
        arguments = action.get("arguments", action.get("parameters"))
        return (_final_answer_from_call(ToolCall(str(action["tool_name"]), arguments)),)
    # Our own dict forms: {"final_answer": "..."} and {"done": true}
    if "final_answer" in action:
        return (FinalAnswer(str(action["final_answer"])),)
    # OpenEnv fleet form: {"tool": name | None, "params": {...}, "done": bool}
    if "tool" in action or "done" in action:
        actions: list[Action] = []
        tool = action.get("tool")
        if tool:
            call = ToolCall(str(tool), action.get("params", action.get("arguments")))
            actions.append(_final_answer_from_call(call))
        if action.get("done") and not any(isinstance(a, FinalAnswer) for a in actions):
            actions.append(Done())
        if actions:
            return tuple(actions)
        raise InvalidActionError("the action names no tool and is not done: "
                                 f"{dict(action)!r:.200}")
    # A bare OpenAI function dict: {"name", "arguments"}
    if "name" in action and set(action) <= {"name", "arguments", "id"}:
        call = ToolCall(str(action["name"]), action.get("arguments"),
                        str(action.get("id") or new_call_id()))
        return (_final_answer_from_call(call),)
    raise InvalidActionError(f"unrecognised action dict with keys {sorted(action)}")
