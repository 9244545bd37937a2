"""MCP tool input schemas -> OpenAI function ``parameters``, without losing meaning.

Nested models keep their fields, no value is ``None`` and nullable fields keep their
type. The rules:

* Local ``$ref`` pointers are inlined (sibling keywords such as ``description`` override
  the target's). A recursive reference stays a ``$ref`` and its target is kept under the
  top-level ``$defs`` (or ``definitions``), so recursive models remain valid and finite.
  Remote refs (``https://...``) and unresolvable pointers are kept untouched.
* ``anyOf`` / ``oneOf`` / ``allOf`` are kept as they are. Nullable types are kept in both
  spellings (``anyOf [X, {"type": "null"}]`` and ``type: [X, "null"]``); OpenAPI's
  ``nullable: true`` becomes ``type: [X, "null"]``.
* No ``None`` values: keys whose value is ``None`` are dropped (``default: None`` too,
  since a nullable type already says it); ``const: None`` becomes ``type: "null"``. Data
  keywords (``enum``, ``const``, ``default``, ``examples``) are copied verbatim otherwise,
  so an ``enum`` may still list ``null`` as a value.
* The top level is always an object schema with ``properties``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

__all__ = ["to_openai_parameters"]

logger = logging.getLogger("fleetenv.mcp")

_DEF_CONTAINERS = ("$defs", "definitions")
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})


def to_openai_parameters(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """Convert a tool's JSON ``inputSchema`` to an OpenAI function ``parameters`` object."""
    root: dict[str, Any] = dict(schema) if schema else {}
    resolver = _Resolver(root)
    resolved = resolver.walk(root, ())
    out = resolved if isinstance(resolved, dict) else {}
    defs = resolver.kept_definitions()
    for container, entries in defs.items():
        out[container] = entries
    return _as_object(out)


def _as_object(out: dict[str, Any]) -> dict[str, Any]:
    kind = out.get("type")
    if kind is None or (isinstance(kind, list) and "object" in kind):
        out["type"] = "object"
    elif kind != "object":
        logger.warning("tool input schema has top-level type %r; using an empty object", kind)
        out = {"type": "object"}
    out.setdefault("properties", {})
    return out


def _pointer_segments(ref: str) -> list[str] | None:
    """Segments of a local JSON pointer (``#/a/b``), or None for anything else."""
    if ref == "#":
        return []
    if not ref.startswith("#/"):
        return None
    return [unquote(part).replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/")]


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


class _Resolver:
    """Inlines local refs of one schema document and remembers the ones kept for recursion."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        # original ref -> (container, name) in the output, for refs kept because of recursion
        self._kept: dict[str, tuple[str, str]] = {}

    def _target(self, ref: str) -> Any:
        segments = _pointer_segments(ref)
        if segments is None:
            return _MISSING
        node: Any = self.root
        for segment in segments:
            if isinstance(node, dict) and segment in node:
                node = node[segment]
            elif isinstance(node, list) and segment.isdigit() and int(segment) < len(node):
                node = node[int(segment)]
            else:
                return _MISSING
        return node

    def _keep(self, ref: str) -> str:
        """Record ``ref`` as kept and return the ref to write in the output."""
        segments = _pointer_segments(ref) or []
        if len(segments) >= 2 and segments[-2] in _DEF_CONTAINERS:
            container = segments[-2] if len(segments) == 2 else "$defs"
            location = (container, segments[-1])
            self._kept.setdefault(ref, location)
            return f"#/{location[0]}/{_escape(location[1])}"
        return ref  # "#" or a pointer into the (preserved) structure of the document

    def walk(self, node: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [self.walk(item, stack) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self._walk_ref(node, ref, stack)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DEF_CONTAINERS:
                continue  # inlined where used; recursive targets are re-added at the top
            if key == "const" and value is None:
                out.setdefault("type", "null")
            elif value is None:
                continue
            elif key in _DATA_KEYWORDS:
                out[key] = copy.deepcopy(value)
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: self.walk(sub, stack) for name, sub in value.items()}
            else:
                out[key] = self.walk(value, stack)
        if out.pop("nullable", None) is True:
            kind = out.get("type")
            if isinstance(kind, str) and kind != "null":
                out["type"] = [kind, "null"]
            elif isinstance(kind, list) and "null" not in kind:
                out["type"] = [*kind, "null"]
            elif kind is None:
                out["nullable"] = True  # nothing to attach it to; keep the hint
        return out

    def _walk_ref(self, node: dict[str, Any], ref: str, stack: tuple[str, ...]) -> Any:
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        target = self._target(ref)
        if target is _MISSING:
            return {"$ref": ref, **self.walk(siblings, stack)}  # remote or broken: keep it
        if ref == "#" or ref in stack:
            return {"$ref": self._keep(ref), **self.walk(siblings, stack)}
        resolved = self.walk(target, (*stack, ref))
        if not isinstance(resolved, dict):
            return resolved  # a boolean schema
        return {**resolved, **self.walk(siblings, stack)}

    def kept_definitions(self) -> dict[str, dict[str, Any]]:
        """Resolve every kept target (which may keep further refs) into def containers."""
        out: dict[str, dict[str, Any]] = {}
        done: set[str] = set()
        while len(done) < len(self._kept):
            for ref, (container, name) in list(self._kept.items()):
                if ref in done:
                    continue
                done.add(ref)
                out.setdefault(container, {})[name] = self.walk(self._target(ref), (ref,))
        return out


_MISSING = object()
