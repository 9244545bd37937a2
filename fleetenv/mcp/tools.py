"""`Tool`: one tool as listed by one MCP endpoint, ready to hand to a chat model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetenv.mcp.schema import to_openai_parameters

__all__ = ["Tool", "ToolHints"]


@dataclass(frozen=True)
class ToolHints:
    """What the server says a tool does (MCP ``ToolAnnotations``), ``None`` when unsaid.

    Hints, not guarantees: a trainer may leave destructive tools out of an exploration
    run, or a caller may decide a call is safe to repeat, but fleetenv itself never
    replays a call on a hint's word.
    """

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None

    @classmethod
    def from_mcp(cls, annotations: Any) -> ToolHints:
        if annotations is None:
            return cls()
        return cls(read_only=annotations.read_only_hint,
                   destructive=annotations.destructive_hint,
                   idempotent=annotations.idempotent_hint,
                   open_world=annotations.open_world_hint)

    def to_dict(self) -> dict[str, bool]:
        """The hints the server gave, under MCP's own names (``readOnlyHint``, ...)."""
        names = {"read_only": "readOnlyHint", "destructive": "destructiveHint",
                 "idempotent": "idempotentHint", "open_world": "openWorldHint"}
        return {names[k]: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class Tool:
    """A tool and the endpoint that serves it, with what its server says about it.

    ``input_schema`` and ``output_schema`` are the raw JSON schemas from the server (kept
    for validation and for callers that need them verbatim); `openai` converts.
    ``title``, ``hints`` (the MCP annotations), ``meta`` (the tool's ``_meta``) and
    ``execution`` (MCP ``execution``, e.g. ``{"taskSupport": "optional"}``: whether the
    tool can run as an MCP task) are kept as listed; the model sees none of them unless
    a caller puts them in.
    """

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    endpoint: str = ""
    title: str | None = None
    hints: ToolHints = field(default_factory=ToolHints)
    meta: dict[str, Any] | None = None
    execution: dict[str, Any] | None = None

    @property
    def task_support(self) -> str | None:
        """``"forbidden"``, ``"optional"`` or ``"required"`` (``None``: the server did not say)."""
        value = (self.execution or {}).get("taskSupport")
        return value if isinstance(value, str) else None

    @classmethod
    def from_mcp(cls, tool: Any, endpoint: str) -> Tool:
        """Build from an ``mcp.types.Tool`` listed by ``endpoint``."""
        annotations = tool.annotations
        return cls(
            name=tool.name,
            description=tool.description or "",
            input_schema=dict(tool.input_schema or {}),
            output_schema=dict(tool.output_schema) if tool.output_schema else None,
            endpoint=endpoint,
            title=tool.title or (annotations.title if annotations is not None else None),
            hints=ToolHints.from_mcp(annotations),
            meta=dict(tool.meta) if tool.meta else None,
            execution=_wire_dict(tool.execution),
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
        if self.title is not None:
            out["title"] = self.title
        hints = self.hints.to_dict()
        if hints:
            out["annotations"] = hints
        if self.meta:
            out["_meta"] = self.meta
        if self.execution:
            out["execution"] = self.execution
        return out


def _wire_dict(model: Any) -> dict[str, Any] | None:
    """A pydantic model of ``mcp.types`` as its JSON object (MCP names), ``None`` if empty."""
    if model is None:
        return None
    data = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dict(data) if data else None
