"""What the agent sees: chat-ready observations.

An observation carries the typed tool result *and* its rendering as OpenAI chat content,
so a trainer can append it to the conversation without knowing MCP. Rendering is
explicit: a ``tool`` message holds the text parts (OpenAI's tool messages accept text
only), and any images follow in a ``user`` message, in their original order.
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (for trajectories), without the tool list."""
        return {
            "task_key": self.task_key, "step": self.step, "modality": self.modality,
            "tool_name": self.tool_name, "tool_call_id": self.tool_call_id,
            "is_error": self.is_error, "error": self.error, "content": self.content,
        }
