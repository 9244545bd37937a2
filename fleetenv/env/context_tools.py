"""Context tools: let an agent manage its own conversation in long episodes.

Five tools answered by fleetenv itself, never by MCP (docs/context-tools.md), with the
names, schemas and answers of OpenEnv's ``fleet_env`` ``ContextManager``, except:
``manage_context`` keeps the task's ``user`` message and never starts the kept part with
an orphaned ``tool`` message (chat APIs reject it); ``search_history`` reads the text
parts of list contents; arguments are checked against the schemas before a tool runs.
:class:`ContextTools` is the whole engine, free of I/O: ``FleetEnv`` keeps one per
episode, and a training loop with its own chat history can use one directly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetenv.mcp.tools import Tool

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.tool_results import ToolResult

__all__ = [
    "CONTEXT_TOOLS",
    "CONTEXT_TOOL_NAMES",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "ContextReply",
    "ContextTools",
    "context_tool_specs",
    "message_text",
]

#: ``fleet_env``'s cap on a tool output before it is truncated for the agent.
DEFAULT_MAX_OUTPUT_CHARS = 10_000
#: Results kept per search, as in ``fleet_env``.
_HISTORY_MATCHES = 10
_OUTPUT_MATCHES = 20
_SNIPPET_CHARS = 200
_DEFAULT_KEEP_TURNS = 5
_DEFAULT_PAGE_SIZE = 50
_MAX_PAGE_SIZE = 1000
_NO_OUTPUT = "No truncated output available."


def _function(name: str, description: str, properties: dict[str, Any],
              required: list[str]) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


_PATTERN = {"type": "string", "minLength": 1, "description": "Text pattern to search"}

#: The five tools in OpenAI function format, as ``fleet_env`` declares them (plus bounds
#: on the values, so a bad value is refused with a clear message instead of guessed at).
CONTEXT_TOOLS: list[dict[str, Any]] = [
    _function("check_context", "Check current context: visible/total turn counts", {}, []),
    _function("manage_context", "Drop old turns to free up context space",
              {"keep_recent_turns": {
                  "type": "integer", "minimum": 1,
                  "description": "Number of recent turns to keep (drops older ones)"}},
              ["keep_recent_turns"]),
    _function("search_history", "Search all history (including dropped) by pattern",
              {"pattern": _PATTERN}, ["pattern"]),
    _function("search_tool_output", "Search the last truncated tool output by pattern",
              {"pattern": _PATTERN}, ["pattern"]),
    _function("view_tool_output", "View a page of the last truncated tool output",
              {"page": {"type": "integer", "minimum": 1,
                        "description": "Page number (1-indexed)"},
               "page_size": {"type": "integer", "minimum": 1, "maximum": _MAX_PAGE_SIZE,
                             "description": "Lines per page (default 50)"}},
              ["page"]),
]

CONTEXT_TOOL_NAMES: frozenset[str] = frozenset(t["function"]["name"] for t in CONTEXT_TOOLS)


def context_tool_specs() -> list[Tool]:
    """The context tools as ``Tool`` objects (endpoint ``"local"``), so the env checks
    their arguments like any MCP tool's."""
    return [Tool(name=t["function"]["name"], description=t["function"]["description"],
                 input_schema=copy.deepcopy(t["function"]["parameters"]), endpoint="local")
            for t in CONTEXT_TOOLS]


@dataclass(frozen=True)
class ContextReply:
    """What a context tool answered: ``text`` for the agent, and for ``manage_context``
    the new visible ``history`` the caller must adopt (``None``: unchanged)."""

    text: str
    history: list[dict[str, Any]] | None = None


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message: a string content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, Mapping) and isinstance(part.get("text"), str))
    return ""


class ContextTools:
    """The context tools of one episode: the full history and the last long output.

    ``track(message)`` every message the conversation gets (the full history is never
    trimmed, so ``search_history`` finds dropped messages); ``truncate(text)`` every
    tool output before the agent sees it; ``execute(name, arguments, history)`` when
    the agent calls one of the tools, with the visible history. Not thread-safe (one
    per episode).
    """

    def __init__(self, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> None:
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) \
                or max_output_chars < 1:
            raise ValueError(f"max_output_chars must be a positive int, got "
                             f"{max_output_chars!r}")
        self.max_output_chars = max_output_chars
        self.full_history: list[dict[str, Any]] = []
        #: The whole text of the last tool output that was truncated (``None``: the last
        #: output was shown whole).
        self.last_full_output: str | None = None

    def reset(self) -> None:
        """Forget everything (a new episode)."""
        self.full_history = []
        self.last_full_output = None

    @staticmethod
    def tools() -> list[dict[str, Any]]:
        """The tool definitions to offer the model (a copy: callers may edit it)."""
        return copy.deepcopy(CONTEXT_TOOLS)

    @staticmethod
    def is_context_tool(name: str) -> bool:
        return name in CONTEXT_TOOL_NAMES

    def track(self, message: Mapping[str, Any]) -> None:
        """Add one message to the full history (a copy)."""
        self.full_history.append(dict(message))

    def truncate(self, output: str, max_chars: int | None = None) -> str:
        """``output`` as the agent should see it: whole when short, else its head and a
        note naming the tools that reach the rest (which is kept for them)."""
        cap = self.max_output_chars if max_chars is None else max_chars
        if len(output) <= cap:
            self.last_full_output = None
            return output
        self.last_full_output = output
        return (output[:cap] + f"\n\n[TRUNCATED - {len(output)} chars total. "
                "Use search_tool_output or view_tool_output to access full content.]")

    def render(self, result: ToolResult, max_chars: int | None = None) -> list[dict[str, Any]]:
        """A tool result as chat content with its text truncated by :meth:`truncate`
        (one text part, then the images in their order)."""
        parts = result.to_openai_content(None)
        texts = [part["text"] for part in parts if part.get("type") == "text"]
        others = [part for part in parts if part.get("type") != "text"]
        if not texts:
            self.last_full_output = None
            return others
        return [{"type": "text", "text": self.truncate("\n".join(texts), max_chars)},
                *others]

    def execute(self, name: str, arguments: Mapping[str, Any],
                history: Sequence[Mapping[str, Any]]) -> ContextReply:
        """Run context tool ``name`` over the visible ``history`` (never modified)."""
        if name == "check_context":
            return ContextReply(self._check(history))
        if name == "manage_context":
            return self._manage(arguments, history)
        if name == "search_history":
            return ContextReply(self._search_history(arguments))
        if name == "search_tool_output":
            return ContextReply(self._search_output(arguments))
        if name == "view_tool_output":
            return ContextReply(self._view_output(arguments))
        return ContextReply(json.dumps({"error": f"Unknown context tool: {name}"}))

    # ------------------------------------------------------------------ the tools

    def _check(self, history: Sequence[Mapping[str, Any]]) -> str:
        visible = sum(1 for m in history if m.get("role") == "assistant")
        total = sum(1 for m in self.full_history if m.get("role") == "assistant")
        return json.dumps({"visible_turns": visible, "total_turns": total,
                           "dropped_turns": max(total - visible, 0)})

    def _manage(self, arguments: Mapping[str, Any],
                history: Sequence[Mapping[str, Any]]) -> ContextReply:
        keep = _int(arguments.get("keep_recent_turns"), _DEFAULT_KEEP_TURNS)
        messages = [dict(m) for m in history]
        # Kept whatever happens: system messages, and the task (the first user message).
        first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
        pinned = {i for i, m in enumerate(messages) if m.get("role") == "system"}
        if first_user is not None:
            pinned.add(first_user)
        rest = [i for i in range(len(messages)) if i not in pinned]
        keep_count = 2 * max(keep, 0)  # a turn: the assistant message and its answer
        if len(rest) <= keep_count:
            return ContextReply(f"Nothing to drop. {len(messages)} messages.")
        kept = rest[len(rest) - keep_count:] if keep_count else []
        while kept and messages[kept[0]].get("role") == "tool":
            kept.pop(0)  # its assistant tool call is dropped: chat APIs reject it alone
        chosen = sorted(pinned | set(kept))
        new_history = [messages[i] for i in chosen]
        dropped = len(messages) - len(new_history)
        return ContextReply(f"Dropped {dropped} messages. {len(new_history)} remaining.",
                            new_history)

    def _search_history(self, arguments: Mapping[str, Any]) -> str:
        pattern = str(arguments.get("pattern") or "").lower()
        if not pattern:
            return json.dumps({"error": "pattern is required"})
        matches = []
        for index, message in enumerate(self.full_history):
            text = message_text(message)
            if pattern in text.lower():
                matches.append({"index": index, "role": message.get("role"),
                                "snippet": text[:_SNIPPET_CHARS]})
                if len(matches) == _HISTORY_MATCHES:
                    break
        return json.dumps({"matches": matches}, ensure_ascii=False)

    def _search_output(self, arguments: Mapping[str, Any]) -> str:
        if not self.last_full_output:
            return _NO_OUTPUT
        pattern = str(arguments.get("pattern") or "").lower()
        if not pattern:
            return json.dumps({"error": "pattern is required"})
        matches = []
        for number, line in enumerate(self.last_full_output.split("\n"), start=1):
            if pattern in line.lower():
                matches.append({"line": number, "content": line[:_SNIPPET_CHARS]})
                if len(matches) == _OUTPUT_MATCHES:
                    break
        return json.dumps({"matches": matches}, ensure_ascii=False)

    def _view_output(self, arguments: Mapping[str, Any]) -> str:
        if not self.last_full_output:
            return _NO_OUTPUT
        page = max(_int(arguments.get("page"), 1), 1)
        size = min(max(_int(arguments.get("page_size"), _DEFAULT_PAGE_SIZE), 1),
                   _MAX_PAGE_SIZE)
        lines = self.last_full_output.split("\n")
        start = (page - 1) * size
        return json.dumps({"page": page, "total_pages": (len(lines) + size - 1) // size,
                           "total_lines": len(lines),
                           "content": "\n".join(lines[start:start + size])},
                          ensure_ascii=False)


def _int(value: object, default: int) -> int:
    """An integer argument (already schema-checked in the env; defensive for direct use)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value
