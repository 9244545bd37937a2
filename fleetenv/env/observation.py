"""What the agent sees: chat-ready observations.

An observation carries the typed tool result *and* its rendering as OpenAI chat content,
so a trainer can append it to the conversation without knowing MCP. Rendering is
explicit: a ``tool`` message holds the text parts (OpenAI's tool messages accept text
only), and any images follow in a ``user`` message, in their original order.

The observation of a whole assistant turn (``step()`` given the model's text, message or
list of calls) holds one observation per tool call in ``calls`` and renders one ``tool``
message per call, all of them before any image message: OpenAI's API wants every tool
message of a turn right after the assistant message that made the calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.mcp.results import ToolResult


@dataclass(frozen=True)
class Observation:
    """One observation of an episode.

    After ``reset()``: ``step == 0``, ``content`` is the initial screenshot for
    computer/browser use (else empty). After ``step()``: ``content`` renders the result
    of the action (a tool result, or an error the agent can recover from).
    """

    task_key: str
    prompt: str
    modality: str
    step: int
    tools: list[dict[str, Any]] = field(repr=False)
    """The tools in OpenAI function format (modality-filtered, plus the submit tool)."""
    content: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI chat content parts (``text`` and ``image_url``), in order."""
    result: ToolResult | None = field(default=None, repr=False)
    tool_name: str | None = None
    tool_call_id: str | None = None
    is_error: bool = False
    error: str | None = None
    turn: bool = False
    """Whether this observes a whole assistant turn (see ``calls``), not one action."""
    calls: tuple[Observation, ...] = field(default=(), repr=False)
    """For a turn: one observation per tool call it ran, in order (empty for a turn
    without tool calls). ``content`` joins theirs; ``tool_name``, ``tool_call_id`` and
    ``result`` are the last call's."""
    parse_error: str | None = None
    """For a turn whose tool calls could not be read: what is wrong and where."""

    @property
    def text(self) -> str:
        """All text parts joined (images as a short note)."""
        parts = []
        for part in self.content:
            if part.get("type") == "text":
                parts.append(part["text"])
            elif part.get("type") == "image_url":
                parts.append("[image]")
        return "\n".join(parts)

    def to_messages(self) -> list[dict[str, Any]]:
        """The chat messages to append for this observation.

        For the reset observation: one ``user`` message with the prompt (and the initial
        screenshot). For a tool observation: a ``tool`` message answering
        ``tool_call_id`` with the text parts, then a ``user`` message with the images if
        there are any.
        """
        if self.turn:
            return self._turn_messages()
        if self.tool_call_id is None:
            return [{"role": "user", "content": [{"type": "text", "text": self.prompt},
                                                 *self.content]}]
        texts = [p for p in self.content if p.get("type") == "text"]
        images = [p for p in self.content if p.get("type") == "image_url"]
        if not texts:
            texts = [{"type": "text", "text": "(see the image below)" if images else "(empty)"}]
        messages: list[dict[str, Any]] = [
            {"role": "tool", "tool_call_id": self.tool_call_id, "content": texts}
        ]
        if images:
            messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Image output of {self.tool_name}:"}, *images]})
        return messages

    def _turn_messages(self) -> list[dict[str, Any]]:
        """A turn's messages: a ``tool`` message per call, then one ``user`` message with
        every image; a turn without calls (a parse error, a no-op) says why as ``user``."""
        if not self.calls:
            return [{"role": "user", "content": list(self.content)}] if self.content else []
        messages: list[dict[str, Any]] = []
        images: list[dict[str, Any]] = []
        for call in self.calls:
            call_messages = call.to_messages()
            messages.append(call_messages[0])
            for extra in call_messages[1:]:
                images.extend(extra["content"])
        if images:
            messages.append({"role": "user", "content": images})
        return messages

    def _repr_html_(self) -> str:
        """Jupyter's rich display: step, tool, text, and screenshots as images."""
        from fleetenv.core.rendering import observation_html

        return observation_html(self)

    def _repr_png_(self) -> bytes | None:
        """The screenshot (the last PNG image) for frontends without HTML; else None."""
        from fleetenv.core.rendering import image_bytes

        return image_bytes(self.content, "image/png")

    def _repr_jpeg_(self) -> bytes | None:
        """The last JPEG image, like ``_repr_png_``."""
        from fleetenv.core.rendering import image_bytes

        return image_bytes(self.content, "image/jpeg")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (for trajectories), without the tool list."""
        view = {
            "task_key": self.task_key, "step": self.step, "modality": self.modality,
            "tool_name": self.tool_name, "tool_call_id": self.tool_call_id,
            "is_error": self.is_error, "error": self.error, "content": self.content,
        }
        if self.turn:
            view["calls"] = [call.to_dict() for call in self.calls]
            view["parse_error"] = self.parse_error
        return view
