"""`Tool`: one tool as listed by one MCP endpoint, ready to hand to a chat model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetenv.mcp.schema import to_openai_parameters

__all__ = ["Tool"]


@dataclass(frozen=True)
class Tool:
    """A tool and the endpoint that serves it.

    ``input_schema`` and ``output_schema`` are the raw JSON schemas from the server (kept
    for validation and for callers that need them verbatim); `openai` converts.
    """

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    endpoint: str = ""

    @classmethod
    def from_mcp(cls, tool: Any, endpoint: str) -> Tool:
        """Build from an ``mcp.types.Tool`` listed by ``endpoint``."""
        return cls(
            name=tool.name,
            description=tool.description or "",
            input_schema=dict(tool.input_schema or {}),
            output_schema=dict(tool.output_schema) if tool.output_schema else None,
            endpoint=endpoint,
        )

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry: ``{"type": "function", "function": {...}}``.

        ``description`` is always a string ("" when the server gave none), never None.
        """
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": to_openai_parameters(self.input_schema),
            },
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "endpoint": self.endpoint,
        }
        if self.output_schema is not None:
            out["output_schema"] = self.output_schema
        return out
