"""Turning a model's whole assistant turn into the actions of one step.

A turn (text with tool calls, an OpenAI assistant message, a list of calls) is the action
list of *one* step. Two failures, kept apart on purpose: an unreadable tool call in the
model's text is the model's mistake (a :class:`Turn` with ``parse_error``, shown to the
agent, never an exception); a Python value of the wrong shape is the caller's
(:class:`InvalidActionError`, no turn used). A turn without tool calls is a final answer
or a no-op, per ``no_tool_call``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetenv.core.errors import InvalidActionError, ToolCallParseError
from fleetenv.core.types import Action, Done, FinalAnswer, ToolCall
from fleetenv.env.actions import parse_action
from fleetenv.env.tool_call_parsing import split_tool_calls

__all__ = ["Turn", "is_turn", "read_turn", "text_of"]


@dataclass(frozen=True)
class Turn:
    """The actions of one assistant turn, or why it could not be read."""

    actions: tuple[Action, ...]
    text: str = ""
    """The turn's text outside tool calls and reasoning blocks."""
    parse_error: ToolCallParseError | None = None
    no_tool_call: bool = False
    """The turn made no tool call (``actions`` is then a final answer, ``Done`` or
    nothing, per ``no_tool_call``)."""


def is_turn(action: object) -> bool:
    """Whether ``step()`` got a whole turn (text, an assistant message, a list of calls)
    rather than one action in the forms :func:`parse_action` reads."""
    if isinstance(action, str | list | tuple):
        return True
    return isinstance(action, Mapping) and action.get("role") == "assistant"


def read_turn(action: object, *, format: str = "auto",
              no_tool_call: str = "final_answer") -> Turn:
    """The actions of one turn (see the module docstring for what raises and what not)."""
    if isinstance(action, str):
        return _from_text(action, format, no_tool_call)
    if isinstance(action, Mapping):
        return _from_message(action, format, no_tool_call)
    if isinstance(action, list | tuple):
        return _from_actions(list(action), "", no_tool_call, where="the list")
    raise InvalidActionError(f"cannot use a {type(action).__name__} as a turn")


def _from_text(text: str, fmt: str, no_tool_call: str) -> Turn:
    try:
        parsed = split_tool_calls(text, fmt)
    except ToolCallParseError as exc:
        return Turn((), text=text, parse_error=exc)
    return _from_actions(list(parsed.calls), parsed.text, no_tool_call, where="the text")


def _from_message(message: Mapping[str, Any], fmt: str, no_tool_call: str) -> Turn:
    calls = message.get("tool_calls")
    text = text_of(message.get("content"))
    if calls:
        if not isinstance(calls, list | tuple):
            raise InvalidActionError(
                f"the assistant message's tool_calls is a {type(calls).__name__}, not a list",
                hint='pass {"role": "assistant", "tool_calls": [{"id": ..., "type": '
                     '"function", "function": {...}}]}')
        return _from_actions(list(calls), text, no_tool_call, where="tool_calls")
    # No structured calls: a server without a tool parser leaves them in the text.
    return _from_text(text, fmt, no_tool_call)


def _from_actions(items: list[Any], text: str, no_tool_call: str, *, where: str) -> Turn:
    actions: list[Action] = []
    for index, item in enumerate(items):
        try:
            actions.extend(parse_action(item))  # all checked before any call runs
        except InvalidActionError as exc:
            raise InvalidActionError(f"item {index} of {where} is no action: {exc.message}",
                                     hint=exc.hint) from None
    if any(isinstance(a, ToolCall | FinalAnswer | Done) for a in actions):
        return Turn(tuple(actions), text=text)
    if no_tool_call == "noop":
        return Turn(tuple(actions), text=text, no_tool_call=True)
    ending: Action = FinalAnswer(text) if text else Done()
    return Turn((*actions, ending), text=text, no_tool_call=True)


def text_of(content: object) -> str:
    """The text of a message's ``content`` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, Mapping) and part.get("type") == "text")
    return ""
