"""Tool arguments checked against the tool's input schema before anything is sent.

Servers commonly ignore arguments they do not declare, so a model that invents a
parameter name gets a plausible answer and learns nothing. The modes (``"strict"``,
``"lenient"``, ``"off"``) are in docs/episodes.md; strict closes what :func:`close_objects`
may close. Nothing is ever changed: the arguments sent are exactly the agent's.
``format`` is not checked (servers rarely enforce it). A schema that is invalid or cannot
be used (an unresolvable ``$ref``; nothing is fetched) is logged once and its calls go
unchecked: a server's broken schema must not break the episode.
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from fleetenv.core.errors import ConfigurationError, ToolArgumentsError

if TYPE_CHECKING:  # pragma: no cover
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

    from fleetenv.mcp.tools import Tool

__all__ = ["ARGUMENT_MODES", "ArgumentChecker", "ArgumentsMode", "check_mode",
           "require_object"]

_log = logging.getLogger("fleetenv.mcp")

ArgumentsMode = Literal["strict", "lenient", "off"]
ARGUMENT_MODES: tuple[ArgumentsMode, ...] = ("strict", "lenient", "off")

#: At most this many problems are listed in one message (the rest are counted).
_MAX_PROBLEMS = 8
#: Characters of an offending value quoted in a message.
_VALUE_CHARS = 60

# Keywords whose value is one subschema, a list of them, or a name -> subschema map.
_ONE = ("additionalProperties", "items", "additionalItems", "contains", "not", "if",
        "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# An object with any of these says something about extra properties itself.
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# An object with any of these is composed from other schemas: not closed on its own.
_COMPOSED = ("allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "if", "dependentSchemas")
# Problems listed in this order: an invented name first (the most common mistake).
_ORDER = {"additionalProperties": 0, "required": 1}


def check_mode(mode: object, *, where: str = "check_arguments") -> ArgumentsMode:
    """``mode`` as an :data:`ArgumentsMode`; a clear error for anything else."""
    for known in ARGUMENT_MODES:
        if mode == known:
            return known
    raise ConfigurationError(
        f"{where} must be one of {', '.join(map(repr, ARGUMENT_MODES))}, got {mode!r}",
        hint='"strict" also reports undeclared arguments, "lenient" only schema errors, '
             '"off" sends arguments unchecked')


def require_object(tool: str, arguments: object) -> dict[str, Any]:
    """``arguments`` as a new dict, or a :class:`ToolArgumentsError` naming ``tool``.

    ``None`` means no arguments. Anything but a mapping with string keys is refused,
    a list of ``(name, value)`` pairs included: MCP arguments are a JSON object.
    """
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        for key in arguments:
            if not isinstance(key, str):
                raise ToolArgumentsError(
                    f"arguments of {tool!r} must have string names, got the "
                    f"{type(key).__name__} key {key!r:.{_VALUE_CHARS}}",
                    hint="use the parameter names of the tool's input schema as keys",
                    tool=tool)
        return dict(arguments)
    kind = type(arguments).__name__
    hint = ("decode the JSON text first (json.loads), or use fleetenv.ToolCall, which "
            "accepts text" if isinstance(arguments, str | bytes)
            else "pass a dict of parameter name to value, e.g. {\"ticket_id\": 3}")
    raise ToolArgumentsError(
        f"arguments of {tool!r} must be a JSON object (a dict), got {kind}: "
        f"{arguments!r:.{_VALUE_CHARS * 2}}", hint=hint, tool=tool)


class ArgumentChecker:
    """Checks calls against their tools' input schemas.

    Validators are looked up once per tool (cached by tool identity; a new listing gets
    new ones) and built once per distinct schema in the process, so a call costs one
    validation.

    Not thread-safe (one per episode, as its toolbox).
    """

    def __init__(self, mode: ArgumentsMode = "strict") -> None:
        self.mode: ArgumentsMode = check_mode(mode)
        # name -> (the Tool it was built for, its validator or None when unusable)
        self._cache: dict[str, tuple[Tool, Validator | None]] = {}

    def check(self, tool: Tool, arguments: Mapping[str, Any]) -> None:
        """Raise :class:`ToolArgumentsError` naming every problem; return if none."""
        if self.mode == "off":
            return
        validator = self._validator(tool)
        if validator is None:
            return
        try:
            errors = list(validator.iter_errors(arguments))
        except RecursionError:
            raise ToolArgumentsError(
                f"{tool.name}: the arguments are nested too deeply to check",
                hint="send a flat JSON object of the tool's parameters",
                tool=tool.name) from None
        except Exception as exc:  # a schema jsonschema accepted but cannot apply
            self._give_up(tool, exc)
            return
        if errors:
            errors.sort(key=lambda e: _ORDER.get(str(e.validator), len(_ORDER)))
            problems = _dedupe(p for error in errors for p in _describe(error))
            if len(problems) > _MAX_PROBLEMS:
                problems = [*problems[:_MAX_PROBLEMS],
                            f"and {len(problems) - _MAX_PROBLEMS} more"]
            raise ToolArgumentsError(
                f"{tool.name}: {'; '.join(problems)}",
                hint="call the tool again with the parameters its schema declares",
                tool=tool.name)

    def _validator(self, tool: Tool) -> Validator | None:
        cached = self._cache.get(tool.name)
        if cached is not None and cached[0] is tool:
            return cached[1]
        validator = _SHARED.get(tool, self.mode)
        self._cache[tool.name] = (tool, validator)
        return validator

    def _give_up(self, tool: Tool, exc: Exception) -> None:
        _log.warning("tool %r at %s: its input schema cannot be applied (%s: %s); its "
                     "arguments are sent unchecked", tool.name, tool.endpoint,
                     type(exc).__name__, exc)
        self._cache[tool.name] = (tool, None)
        _SHARED.forget(tool, self.mode)


def _compile(tool: Tool, mode: ArgumentsMode) -> Validator | None:
    """A validator for ``tool``'s schema, or ``None`` (logged) when it is unusable."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    schema: Any = tool.input_schema
    if not isinstance(schema, Mapping):
        _log.warning("tool %r at %s has a non-object input schema (%s); its arguments "
                     "are sent unchecked", tool.name, tool.endpoint, type(schema).__name__)
        return None
    schema = dict(schema)
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        _log.warning("tool %r at %s has an invalid input schema (%s at %s); its "
                     "arguments are sent unchecked", tool.name, tool.endpoint,
                     exc.message, "/".join(map(str, exc.absolute_path)) or "the root")
        return None
    if mode == "strict":
        schema = close_objects(schema)
    return cls(schema)


class _SharedValidators:
    """Validators by schema text, for the whole process.

    Checking a schema against its metaschema costs milliseconds, and every episode of a
    run lists the same tools from a new instance (new ``Tool`` objects, new endpoint
    URLs): keyed by the schema itself, each distinct schema is compiled once. jsonschema
    validators are immutable, so sharing them across threads is safe. Bounded: cleared
    when full (a run sees a few dozen distinct schemas).
    """

    _MAX = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], Validator | None] = {}

    def get(self, tool: Tool, mode: ArgumentsMode) -> Validator | None:
        key = self._key(tool, mode)
        if key is None:
            return _compile(tool, mode)
        with self._lock:
            if key in self._entries:
                return self._entries[key]
        validator = _compile(tool, mode)  # outside the lock: it may take milliseconds
        with self._lock:
            if len(self._entries) >= self._MAX:
                self._entries.clear()
            return self._entries.setdefault(key, validator)

    def forget(self, tool: Tool, mode: ArgumentsMode) -> None:
        key = self._key(tool, mode)
        if key is not None:
            with self._lock:
                self._entries[key] = None

    @staticmethod
    def _key(tool: Tool, mode: ArgumentsMode) -> tuple[str, str] | None:
        try:
            return json.dumps(tool.input_schema, sort_keys=True), mode
        except (TypeError, ValueError):
            return None


_SHARED = _SharedValidators()


# ---------------------------------------------------------------------- closing schemas


def close_objects(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` where every plain object schema that lists ``properties``
    and says nothing about extra ones gets ``additionalProperties: false``.

    Left open: composed schemas (``allOf``/``anyOf``/``oneOf``/``$ref``/``if`` beside
    ``properties``), members of an ``allOf``, alternatives under a parent that has
    ``properties`` of its own, and ``$defs`` referenced from such places: in each, other
    subschemas may declare the properties the closed one would reject.
    """
    closed = copy.deepcopy(dict(schema))
    keep_open: set[str] = set()
    _walk(closed, open_here=False, keep_open=keep_open, close=False)
    _walk(closed, open_here=False, keep_open=keep_open, close=True)
    return closed


def _walk(node: Any, *, open_here: bool, keep_open: set[str], close: bool) -> None:
    """First pass (``close=False``): collect the ``$ref`` targets used in open places.
    Second pass: close what may be closed."""
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if open_here and isinstance(ref, str):
        keep_open.add(ref)
    if close and not open_here and _closable(node):
        node["additionalProperties"] = False
    has_properties = isinstance(node.get("properties"), dict)
    for key in _ONE:
        if key in node and not (key == "items" and isinstance(node[key], list)):
            _walk(node[key], open_here=False, keep_open=keep_open, close=close)
    for key in _LIST:
        members = node.get(key)
        if isinstance(members, list):
            member_open = key == "allOf" or (key in ("anyOf", "oneOf") and has_properties)
            for member in members:
                _walk(member, open_here=member_open, keep_open=keep_open, close=close)
    for key in _MAP:
        mapping = node.get(key)
        if isinstance(mapping, dict):
            for name, sub in mapping.items():
                target_open = (key in ("$defs", "definitions")
                               and f"#/{key}/{name}" in keep_open)
                _walk(sub, open_here=target_open, keep_open=keep_open, close=close)


def _closable(node: dict[str, Any]) -> bool:
    return (isinstance(node.get("properties"), dict)
            and not any(key in node for key in _OPEN_KEYS)
            and not any(key in node for key in _COMPOSED))


# ---------------------------------------------------------------------- messages


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _where(path: Iterable[Any]) -> str:
    """``['items', 0, 'qty']`` -> ``items[0].qty``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _value(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS] + "..."


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string",
               list: "array", dict: "object", type(None): "null"}


def _json_type(value: Any) -> str:
    for py_type, name in _JSON_TYPES.items():
        if type(value) is py_type:
            return name
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _describe(error: ValidationError) -> list[str]:
    """The problems one jsonschema error stands for, as short phrases for an agent."""
    path = list(error.absolute_path)
    where = _where(path)
    kind = error.validator
    if kind == "additionalProperties" and isinstance(error.instance, Mapping):
        return _unknown(error, path)
    if kind == "required" and isinstance(error.instance, Mapping):
        properties = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) else {}
        return [f"missing required argument {_where([*path, name])!r}"
                + _expected_suffix(properties.get(name))
                for name in cast("list[str]", error.validator_value)
                if name not in error.instance]
    subject = f"argument {where!r}" if where else "the arguments"
    if kind == "type":
        return [f"{subject} must be {_types(error.validator_value)}, got "
                f"{_json_type(error.instance)} {_value(error.instance)}"]
    if kind == "enum":
        choices = ", ".join(_value(v) for v in cast("list[Any]", error.validator_value))
        return [f"{subject} must be one of {choices}; got {_value(error.instance)}"]
    if kind == "const":
        return [f"{subject} must be {_value(error.validator_value)}; got "
                f"{_value(error.instance)}"]
    if kind in ("anyOf", "oneOf") and error.context:
        return _alternatives(error, subject)
    message = error.message
    if len(message) > 200:
        message = message[:200] + "..."
    return [f"{subject}: {message}"]


def _unknown(error: ValidationError, path: list[Any]) -> list[str]:
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    properties = schema.get("properties")
    declared = list(properties) if isinstance(properties, Mapping) else []
    patterns = schema.get("patternProperties")
    instance = cast("Mapping[str, Any]", error.instance)
    extras = [key for key in instance if key not in declared
              and not _matches_any(key, patterns)]
    takes = (f"this tool takes: {', '.join(declared) or 'no arguments'}" if not path
             else f"allowed in {_where(path)}: {', '.join(declared) or 'nothing'}")
    phrases = []
    for name in extras:
        close = difflib.get_close_matches(str(name), declared, n=1, cutoff=0.6)
        guess = f"did you mean {close[0]!r}? " if close else ""
        phrases.append(f"unknown argument {_where([*path, name])!r} ({guess}{takes})")
    return phrases


def _matches_any(key: str, patterns: Any) -> bool:
    import re

    if not isinstance(patterns, Mapping):
        return False
    return any(re.search(pattern, key) for pattern in patterns)


def _types(value: Any) -> str:
    names = [value] if isinstance(value, str) else list(value)
    return " or ".join(str(n) for n in names)


def _expected_suffix(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return ""
    expected = _expect(schema)
    return f" ({expected})" if expected else ""


def _expect(schema: Mapping[str, Any]) -> str:
    """What a schema asks for, in a few words (``one of "a", "b"``, ``integer``)."""
    if "enum" in schema and isinstance(schema["enum"], list):
        return "one of " + ", ".join(_value(v) for v in schema["enum"])
    if "const" in schema:
        return _value(schema["const"])
    if "type" in schema:
        return _types(schema["type"])
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alternatives, list):
        parts = [_expect(a) for a in alternatives if isinstance(a, Mapping)]
        return " or ".join(p for p in parts if p)
    if "$ref" in schema:
        return "object"
    return ""


def _alternatives(error: ValidationError, subject: str) -> list[str]:
    """An ``anyOf``/``oneOf`` failure: the errors of the one branch whose type fits the
    value when there is exactly one; else what the alternatives accept."""
    got = _json_type(error.instance)
    branches: dict[str | int, list[ValidationError]] = {}
    for sub in error.context or ():
        branches.setdefault(sub.schema_path[0] if sub.schema_path else 0, []).append(sub)
    fitting = [errors for errors in branches.values()
               if not any(e.validator == "type" and not e.relative_path for e in errors)]
    if len(fitting) == 1:
        return [p for sub in fitting[0] for p in _describe(sub)]
    schemas = error.validator_value if isinstance(error.validator_value, list) else []
    accepted = " or ".join(e for e in (_expect(s) for s in schemas if isinstance(s, Mapping))
                           if e)
    if accepted:
        return [f"{subject} must be {accepted}; got {got} {_value(error.instance)}"]
    return [f"{subject}: {error.message[:200]}"]
