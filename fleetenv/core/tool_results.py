"""Typed tool results and their rendering for LLM messages (docs/mcp.md, "ToolResult").

Results are plain frozen dataclasses of JSON-able values, so they pickle across process
pools and round-trip through `to_dict` / `from_dict` for JSONL trajectories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_MAX_TEXT_CHARS",
    "AudioBlock",
    "ContentAnnotations",
    "ContentBlock",
    "ImageBlock",
    "ResourceBlock",
    "ResourceLinkBlock",
    "TextBlock",
    "ToolResult",
    "block_from_dict",
]

# Default budget of text characters per rendered result; beyond it text is cut with a marker.
DEFAULT_MAX_TEXT_CHARS = 100_000

_NULL_SCREENSHOT_NOTE = "[screenshot unavailable: the tool returned a null image]"
_NO_MESSAGE = "the tool reported an error without a message"


def _b64_size(data: str) -> int:
    """Decoded size of base64 ``data`` without decoding it."""
    stripped = data.rstrip("=")
    return len(stripped) * 3 // 4


def _data_url(mime_type: str, data: str) -> str:
    return f"data:{mime_type};base64,{data}"


@dataclass(frozen=True)
class ContentAnnotations:
    """MCP ``Annotations`` of a content block: hints for the client, not content.

    ``audience`` is who the block is meant for (``"user"``, ``"assistant"``), ``priority``
    how important it is (0 = optional, 1 = required), ``last_modified`` an ISO 8601 time.
    ``None`` where the server said nothing.
    """

    audience: tuple[str, ...] | None = None
    priority: float | None = None
    last_modified: str | None = None

    @classmethod
    def from_mcp(cls, annotations: Any) -> ContentAnnotations | None:
        """From an ``mcp.types.Annotations`` (``None`` stays ``None``)."""
        if annotations is None:
            return None
        audience = getattr(annotations, "audience", None)
        return cls(
            audience=tuple(str(role) for role in audience) if audience is not None else None,
            priority=getattr(annotations, "priority", None),
            last_modified=getattr(annotations, "last_modified", None),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContentAnnotations:
        """Inverse of `to_dict` (MCP's own key names)."""
        audience = data.get("audience")
        return cls(
            audience=tuple(audience) if audience is not None else None,
            priority=data.get("priority"),
            last_modified=data.get("lastModified"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The annotations the server gave, under MCP's names (``lastModified``)."""
        out: dict[str, Any] = {}
        if self.audience is not None:
            out["audience"] = list(self.audience)
        if self.priority is not None:
            out["priority"] = self.priority
        if self.last_modified is not None:
            out["lastModified"] = self.last_modified
        return out


def _extras(block: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Add a block's annotations and ``_meta`` to its ``to_dict`` output (when it has any)."""
    if block.annotations is not None:
        out["annotations"] = block.annotations.to_dict()
    if block.meta:
        out["meta"] = block.meta
    return out


@dataclass(frozen=True)
class TextBlock:
    """A text content block, kept byte for byte (``"null"``, ``"0"`` and ``""`` included)."""

    text: str
    type: Literal["text"] = "text"
    annotations: ContentAnnotations | None = None
    meta: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _extras(self, {"type": self.type, "text": self.text})


@dataclass(frozen=True)
class ImageBlock:
    """An image, base64 ``data`` plus its MIME type."""

    data: str
    mime_type: str
    type: Literal["image"] = "image"
    annotations: ContentAnnotations | None = None
    meta: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _extras(self, {"type": self.type, "data": self.data, "mime_type": self.mime_type})

    @property
    def data_url(self) -> str:
        # No type given: PNG, as the previous client said (a bare "data:;base64," is text).
        return _data_url(self.mime_type or "image/png", self.data)


@dataclass(frozen=True)
class AudioBlock:
    """An audio clip, base64 ``data`` plus its MIME type (chat models get a note, not sound)."""

    data: str
    mime_type: str
    type: Literal["audio"] = "audio"
    annotations: ContentAnnotations | None = None
    meta: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _extras(self, {"type": self.type, "data": self.data, "mime_type": self.mime_type})


@dataclass(frozen=True)
class ResourceBlock:
    """A resource's contents: its ``uri`` and either ``text`` or base64 ``blob``.

    Embedded in a tool result, or one item of what ``read_resource`` returned. ``meta``
    is the ``_meta`` of the embedded block (of the contents, for ``read_resource``).
    """

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: str | None = None
    type: Literal["resource"] = "resource"
    annotations: ContentAnnotations | None = None
    meta: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "uri": self.uri}
        for key in ("mime_type", "text", "blob"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return _extras(self, out)


@dataclass(frozen=True)
class ResourceLinkBlock:
    """A link to a resource the server can serve (not its contents; ``size`` in bytes)."""

    uri: str
    name: str
    description: str | None = None
    mime_type: str | None = None
    type: Literal["resource_link"] = "resource_link"
    title: str | None = None
    size: int | None = None
    annotations: ContentAnnotations | None = None
    meta: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "uri": self.uri, "name": self.name}
        for key in ("description", "mime_type", "title", "size"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return _extras(self, out)


ContentBlock = TextBlock | ImageBlock | AudioBlock | ResourceBlock | ResourceLinkBlock

_BLOCK_TYPES: dict[str, type[Any]] = {
    "text": TextBlock,
    "image": ImageBlock,
    "audio": AudioBlock,
    "resource": ResourceBlock,
    "resource_link": ResourceLinkBlock,
}


def block_from_dict(data: dict[str, Any]) -> ContentBlock:
    """Inverse of ``block.to_dict()``."""
    kind = data.get("type")
    cls = _BLOCK_TYPES.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown content block type {kind!r}")
    fields = {key: value for key, value in data.items() if key != "type"}
    if fields.get("annotations") is not None:
        fields["annotations"] = ContentAnnotations.from_dict(fields["annotations"])
    block: ContentBlock = cls(**fields)
    return block


def _meta_of(item: Any) -> dict[str, Any] | None:
    meta = getattr(item, "meta", None)
    return dict(meta) if meta else None


def resource_block(
    contents: Any,
    *,
    annotations: ContentAnnotations | None = None,
    meta: dict[str, Any] | None = None,
) -> ResourceBlock:
    """A `ResourceBlock` from ``mcp.types`` ``TextResourceContents``/``BlobResourceContents``
    (embedded in a result, or read with ``resources/read``)."""
    return ResourceBlock(
        uri=str(contents.uri),
        mime_type=contents.mime_type,
        text=getattr(contents, "text", None),
        blob=getattr(contents, "blob", None),
        annotations=annotations,
        meta=meta,
    )


def read_resource_block(contents: Any) -> ResourceBlock:
    """One item of a ``resources/read`` answer (its ``_meta`` kept as ``meta``)."""
    return resource_block(contents, meta=_meta_of(contents))


def _from_mcp_block(item: Any) -> ContentBlock:
    """Convert one ``mcp.types`` content item (duck-typed on its ``type`` tag)."""
    kind = getattr(item, "type", None)
    annotations = ContentAnnotations.from_mcp(getattr(item, "annotations", None))
    meta = _meta_of(item)
    if kind == "text":
        return TextBlock(item.text, annotations=annotations, meta=meta)
    if kind == "image":
        return ImageBlock(item.data, item.mime_type, annotations=annotations, meta=meta)
    if kind == "audio":
        return AudioBlock(item.data, item.mime_type, annotations=annotations, meta=meta)
    if kind == "resource":
        return resource_block(item.resource, annotations=annotations, meta=meta)
    if kind == "resource_link":
        size = getattr(item, "size", None)
        return ResourceLinkBlock(
            uri=str(item.uri),
            name=item.name,
            description=item.description,
            mime_type=item.mime_type,
            title=getattr(item, "title", None),
            size=int(size) if size is not None else None,
            annotations=annotations,
            meta=meta,
        )
    # A content type newer than this code: keep it visible instead of dropping it.
    return TextBlock(f"[unsupported content block of type {kind!r}]")


class _TextBudget:
    """Cuts text once a per-result character budget is spent, with a visible marker."""

    def __init__(self, max_chars: int | None) -> None:
        self.remaining = max_chars

    def take(self, text: str) -> str:
        if self.remaining is None:
            return text
        if len(text) <= self.remaining:
            self.remaining -= len(text)
            return text
        kept = text[: self.remaining]
        self.remaining = 0
        marker = f"[... truncated {len(text) - len(kept)} chars ...]"
        return f"{kept}\n{marker}" if kept else marker


def _fleet_screenshot(text: str) -> tuple[bool, Any]:
    """Recognise Fleet's screenshot convention: a JSON object text with a ``base64_image`` key.

    Returns ``(True, parsed_object)`` for such texts, ``(False, None)`` for anything else.
    """
    if "base64_image" not in text or not text.lstrip().startswith("{"):
        return False, None
    try:
        parsed = json.loads(text)
    except ValueError:
        return False, None
    if isinstance(parsed, dict) and "base64_image" in parsed:
        return True, parsed
    return False, None


def _screenshot_url(value: str) -> str:
    if value.startswith("data:"):
        return value
    return _data_url("image/png", value)


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call.

    ``content`` holds the blocks in the order the tool returned them; ``structured`` is the
    tool's structured output (or ``None``); ``is_error`` is the protocol's error flag and
    ``error_message`` its text (``None`` when not an error). Nothing else decides whether
    a call failed.
    """

    content: tuple[ContentBlock, ...] = ()
    structured: Any = None
    is_error: bool = False
    error_message: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_mcp(cls, result: Any) -> ToolResult:
        """Build from an ``mcp.types.CallToolResult``."""
        content = tuple(_from_mcp_block(item) for item in result.content or ())
        is_error = bool(result.is_error)
        error_message = None
        if is_error:
            texts = [block.text for block in content if isinstance(block, TextBlock)]
            error_message = "\n".join(text for text in texts if text) or _NO_MESSAGE
        meta = dict(result.meta) if getattr(result, "meta", None) else {}
        return cls(
            content=content,
            structured=result.structured_content,
            is_error=is_error,
            error_message=error_message,
            meta=meta,
        )

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """An error result made by fleetenv itself (e.g. a protocol error the server sent)."""
        return cls(content=(TextBlock(message),), is_error=True, error_message=message)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        """Inverse of `to_dict`."""
        return cls(
            content=tuple(block_from_dict(block) for block in data.get("content", ())),
            structured=data.get("structured"),
            is_error=bool(data.get("is_error", False)),
            error_message=data.get("error_message"),
            meta=dict(data.get("meta") or {}),
        )

    # ------------------------------------------------------------------ views

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (for JSONL trajectories)."""
        out: dict[str, Any] = {
            "content": [block.to_dict() for block in self.content],
            "is_error": self.is_error,
        }
        if self.structured is not None:
            out["structured"] = self.structured
        if self.error_message is not None:
            out["error_message"] = self.error_message
        if self.meta:
            out["meta"] = self.meta
        return out

    @property
    def texts(self) -> list[str]:
        """The text blocks' texts, in order."""
        return [block.text for block in self.content if isinstance(block, TextBlock)]

    @property
    def full_text(self) -> str:
        """The whole result as text, never truncated (for context tools and logs)."""
        return self.to_text(max_text_chars=None)

    def to_text(self, max_text_chars: int | None = None) -> str:
        """Render as plain text; non-text blocks become short bracketed notes."""
        budget = _TextBudget(max_text_chars)
        parts = [self._block_text(block, budget) for block in self.content]
        if not self.content and self.structured is not None:
            parts.append(budget.take(json.dumps(self.structured, ensure_ascii=False)))
        return "\n".join(parts)

    def to_openai_content(
        self, max_text_chars: int | None = DEFAULT_MAX_TEXT_CHARS
    ) -> list[dict[str, Any]]:
        """Render as OpenAI chat content parts (``text`` and ``image_url``), in block order.

        Images become ``data:`` URLs. Fleet's ``{"base64_image": ...}`` screenshot texts
        become images too (a null image becomes a text note, other keys stay as text).
        Audio and binary resources become text notes. Text beyond ``max_text_chars`` (a
        budget for the whole result) is cut with a ``[... truncated N chars ...]`` marker;
        `full_text` keeps everything.
        """
        budget = _TextBudget(max_text_chars)
        parts: list[dict[str, Any]] = []
        for block in self.content:
            parts.extend(self._block_parts(block, budget))
        if not self.content:
            if self.structured is not None:
                text = json.dumps(self.structured, ensure_ascii=False)
            elif self.is_error:
                text = self.error_message or _NO_MESSAGE
            else:
                text = ""
            parts.append(_text_part(budget.take(text)))
        return parts

    # ------------------------------------------------------------------ rendering helpers

    @staticmethod
    def _block_parts(block: ContentBlock, budget: _TextBudget) -> list[dict[str, Any]]:
        if isinstance(block, TextBlock):
            is_screenshot, parsed = _fleet_screenshot(block.text)
            if not is_screenshot:
                return [_text_part(budget.take(block.text))]
            parts: list[dict[str, Any]] = []
            image = parsed.pop("base64_image")
            if parsed:  # other keys (e.g. a status message) stay visible
                parts.append(_text_part(budget.take(json.dumps(parsed, ensure_ascii=False))))
            if isinstance(image, str) and image:
                parts.append(_image_part(_screenshot_url(image)))
            else:
                parts.append(_text_part(_NULL_SCREENSHOT_NOTE))
            return parts
        if isinstance(block, ImageBlock):
            return [_image_part(block.data_url)]
        if isinstance(block, ResourceBlock) and block.blob is not None and _is_image(block):
            assert block.mime_type is not None
            return [_image_part(_data_url(block.mime_type, block.blob))]
        return [_text_part(ToolResult._block_text(block, budget))]

    @staticmethod
    def _block_text(block: ContentBlock, budget: _TextBudget) -> str:
        if isinstance(block, TextBlock):
            return budget.take(block.text)
        if isinstance(block, ImageBlock):
            return f"[image: {block.mime_type}, {_b64_size(block.data)} bytes]"
        if isinstance(block, AudioBlock):
            return f"[audio: {block.mime_type}, {_b64_size(block.data)} bytes, not shown]"
        if isinstance(block, ResourceBlock):
            mime = f" ({block.mime_type})" if block.mime_type else ""
            if block.text is not None:
                return f"[resource {block.uri}{mime}]\n{budget.take(block.text)}"
            size = _b64_size(block.blob or "")
            return f"[resource {block.uri}{mime}: {size} bytes of binary data, not shown]"
        mime = f" ({block.mime_type})" if block.mime_type else ""
        description = f": {block.description}" if block.description else ""
        return f"[resource link {block.name} <{block.uri}>{mime}{description}]"


def _is_image(block: ResourceBlock) -> bool:
    return (block.mime_type or "").startswith("image/")


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}
