"""Policies: what turns the conversation so far into the agent's next move (docs/rollouts.md,
"Policies"). A :class:`Reply` keeps both the assistant message and the actions it implies,
so the transcript shows exactly what the model said while the episode executes what it
meant.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.tasks import Task
from fleetenv.core.types import Action, Done, FinalAnswer, ToolCall
from fleetenv.env.actions import parse_action


@dataclass
class PolicyContext:
    """What a policy sees when it is asked for the next move."""

    task: Task
    messages: list[dict[str, Any]]
    """The conversation so far, OpenAI chat format (images as ``image_url`` parts)."""
    tools: list[dict[str, Any]]
    """The tools the agent may call, OpenAI function format."""
    turn: int
    """How many replies the policy gave before this one."""
    instance_id: str | None = None
    """The instance the episode runs on (for logs, traces, or tests that inject faults)."""
    root_url: str | None = None
    """The instance's root URL (some browser/computer-use prompts show the portal URL)."""


@dataclass(frozen=True)
class Reply:
    """One policy reply: the assistant message and the actions it stands for."""

    message: dict[str, Any]
    actions: tuple[Action, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
    """What the policy knows about this reply that trainers log (e.g. a model's
    ``finish_reason`` and token ``usage``); kept per turn in ``RolloutResult.turn_meta``."""

    @classmethod
    def from_actions(cls, actions: Sequence[Action]) -> Reply:
        """Build the assistant message for actions that did not come from a model."""
        calls = [a for a in actions if isinstance(a, ToolCall)]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        answers = [a for a in actions if isinstance(a, FinalAnswer)]
        if answers:
            call = ToolCall("submit_final_answer", {"answer": answers[0].answer},
                            id=answers[0].id)
            message.setdefault("tool_calls", []).append(call.to_openai())
        if not calls and not answers:
            message["content"] = "Done."
        return cls(message=message, actions=tuple(actions))


@runtime_checkable
class Policy(Protocol):
    """Anything with ``act(context) -> Reply``."""

    def act(self, context: PolicyContext) -> Reply: ...


class ScriptedPolicy:
    """Replays a fixed list of tool calls, one per turn, then finishes.

    ``ScriptedPolicy.reference()`` replays each task's bundled reference solution, which is
    what ``fleetenv demo`` runs: an end-to-end check that needs no model.
    """

    def __init__(self, calls: Sequence[Mapping[str, Any] | ToolCall] | None = None,
                 *, use_reference: bool = False) -> None:
        self.calls = [c if isinstance(c, ToolCall) else ToolCall(str(c["name"]),
                                                                 dict(c.get("arguments") or {}))
                      for c in (calls or [])]
        self.use_reference = use_reference

    @classmethod
    def reference(cls) -> ScriptedPolicy:
        return cls(use_reference=True)

    def act(self, context: PolicyContext) -> Reply:
        calls = self.calls
        if self.use_reference:
            solution = context.task.reference_solution
            if not solution:
                raise ConfigurationError(
                    "the task has no reference solution to replay",
                    hint="use another policy, or add metadata.reference_solution",
                    task=context.task.key)
            calls = [ToolCall(c.name, dict(c.arguments)) for c in solution]
        if context.turn >= len(calls):
            return Reply.from_actions([Done()])
        return Reply.from_actions(parse_action(calls[context.turn]))


class CallablePolicy:
    """Adapts a plain function ``fn(context)`` into a policy.

    The function may return a :class:`Reply`, one action in any accepted form (a
    ``ToolCall``, an OpenAI tool-call dict, ``{"tool", "params", "done"}``,
    ``FinalAnswer``, ``Done``), a list of those, or an OpenAI assistant message dict
    (``{"role": "assistant", "tool_calls": [...]}``).
    """

    def __init__(self, fn: Callable[[PolicyContext], Any]) -> None:
        self.fn = fn

    def act(self, context: PolicyContext) -> Reply:
        return to_reply(self.fn(context), context.task)


def to_reply(value: Any, task: Task) -> Reply:
    """Normalise what a policy function returned into a :class:`Reply`."""
    if isinstance(value, Reply):
        return value
    if isinstance(value, Mapping) and value.get("role") == "assistant":
        return reply_from_assistant_message(dict(value), task)
    items = value if isinstance(value, list | tuple) else [value]
    actions: list[Action] = []
    for item in items:
        actions.extend(parse_action(item))
    return Reply.from_actions(actions)


def reply_from_assistant_message(message: dict[str, Any], task: Task,
                                 meta: Mapping[str, Any] | None = None) -> Reply:
    """The actions an OpenAI assistant message stands for.

    Tool calls run in order. A reply without tool calls ends the episode: its text is the
    final answer when the task asks for one, otherwise it is a plain "done".
    """
    calls = message.get("tool_calls") or []
    actions: list[Action] = []
    for call in calls:
        actions.extend(parse_action(call))
    if not calls:
        text = _text_of(message.get("content"))
        if task.needs_final_answer and text.strip():
            actions.append(FinalAnswer(text.strip()))
        else:
            actions.append(Done())
    return Reply(message=message, actions=tuple(actions), meta=dict(meta or {}))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def dump_actions(actions: Sequence[Action]) -> str:
    """A compact description of actions for logs."""
    return json.dumps([type(a).__name__ + (f"({a.name})" if isinstance(a, ToolCall) else "")
                       for a in actions])
