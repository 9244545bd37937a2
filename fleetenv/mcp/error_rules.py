"""Whether a tool result is an error: one documented, configurable rule, applied once.

MCP has a flag for it (``isError``), and :class:`~fleetenv.core.tool_results.ToolResult`
keeps that flag as it came. But many of Fleet's servers answer a failed request with a
normal result whose *payload* says it failed, and trainers rely on those counting as
tool errors (in the episode's error count, the agent's ``Error:`` observation and the
tool-error events). A rule turns a result into ``None``
(not an error) or the error's message. The episode applies it in exactly one place (its
tool-call path); nothing else guesses.

The rules (``FleetEnv(tool_error_rule=...)``):

``"fleet"`` (default)
    1. The protocol's ``isError`` flag: an error, with the tool's text as the message.
    2. Otherwise the result's *payload* is looked at: its structured content when that is
       a JSON object, else its only content block when that is a text holding a JSON
       object. Results with several blocks, images, or a payload that is a list, a
       string or a number are never errors under this rule. The payload is an error
       when, at its top level:

       - ``"error"`` is non-empty: not ``null``, ``false``, ``0``, ``""`` (or blanks),
         ``{}`` or ``[]``. So a record whose ``error`` field is null or empty is data,
         not an error. The message is the value when it is a string, the ``message`` /
         ``detail`` / ``error`` of it when it is an object, else the payload's own
         ``message`` / ``detail``, else the value as JSON;
       - ``"isError"`` (or ``"is_error"``) is true;
       - ``"status"`` is ``"failed"`` or ``"error"`` (any case). The message is the
         payload's ``message``, ``error`` or ``detail``, else ``status=<value>``.

       Nested objects and list items are never looked at: a list of records where one
       has ``status: "failed"`` is data. A *single* record returned as the payload with
       ``status: "failed"`` does count (trainers rely on it); for servers whose records
       look like that, use ``"protocol"`` or a callable.
``"protocol"``
    Only the ``isError`` flag.
a callable ``(ToolResult) -> str | None``
    Your own rule: return the error message, or ``None`` for a result that is not an
    error. An exception it raises, or a return value that is neither, is a
    :class:`~fleetenv.core.errors.ConfigurationError` naming the rule and the tool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import ConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.tool_results import ToolResult

__all__ = ["RULE_NAMES", "ToolErrorRule", "decide", "fleet_rule", "payload_of",
           "protocol_rule", "resolve_rule"]

ToolErrorRule = Callable[["ToolResult"], "str | None"]
RULE_NAMES = ("fleet", "protocol")

_DEFAULT_MESSAGE = "the tool reported an error"
_FAILED_STATUSES = frozenset({"failed", "error"})
_MESSAGE_KEYS = ("message", "error", "detail")
#: Only texts mentioning one of these are parsed as JSON (most results are not errors).
_MARKERS = ('"error"', '"status"', '"isError"', '"is_error"')
#: Longest message kept (the result's content still has all of it).
_MAX_MESSAGE = 2000


def protocol_rule(result: ToolResult) -> str | None:
    """The protocol's ``isError`` flag only."""
    if not result.is_error:
        return None
    return result.error_message or _DEFAULT_MESSAGE


def fleet_rule(result: ToolResult) -> str | None:
    """``isError``, then the payload shapes Fleet's servers use (see the module doc)."""
    if result.is_error:
        return result.error_message or _DEFAULT_MESSAGE
    payload = payload_of(result)
    if payload is None:
        return None
    return _payload_error(payload)


def payload_of(result: ToolResult) -> dict[str, Any] | None:
    """The JSON object a result carries: its structured content, or its only block when
    that is a text holding a JSON object (``None`` otherwise)."""
    from fleetenv.core.tool_results import TextBlock

    if isinstance(result.structured, dict):
        return result.structured
    if len(result.content) != 1 or not isinstance(result.content[0], TextBlock):
        return None
    text = result.content[0].text
    if not text.lstrip().startswith("{") or not any(m in text for m in _MARKERS):
        return None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _payload_error(payload: Mapping[str, Any]) -> str | None:
    error = payload.get("error")
    if not _empty(error):
        if isinstance(error, str):
            return _clip(error.strip())
        if isinstance(error, Mapping):
            return _clip(_message_in(error) or _as_json(error))
        return _clip(_message_in(payload, ("message", "detail")) or _as_json(error))
    for flag in ("isError", "is_error"):
        if payload.get(flag) is True:
            return _clip(_message_in(payload) or f"{flag}=true")
    status = payload.get("status")
    if isinstance(status, str) and status.strip().lower() in _FAILED_STATUSES:
        return _clip(_message_in(payload) or f"status={status}")
    return None


def _empty(value: Any) -> bool:
    if value is None or value is False:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, Mapping | list | tuple):
        return len(value) == 0
    return False


def _message_in(data: Mapping[str, Any], keys: tuple[str, ...] = _MESSAGE_KEYS) -> str | None:
    """The first non-empty ``message``/``error``/``detail`` (one level of nesting)."""
    for key in keys:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, Mapping):
            for inner in _MESSAGE_KEYS:
                nested = value.get(inner)
                if isinstance(nested, str) and nested.strip():
                    return nested.strip()
    return None


def _as_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _clip(message: str) -> str:
    message = message or _DEFAULT_MESSAGE
    if len(message) <= _MAX_MESSAGE:
        return message
    return message[:_MAX_MESSAGE] + f" [... {len(message) - _MAX_MESSAGE} more chars]"


_NAMED: dict[str, ToolErrorRule] = {"fleet": fleet_rule, "protocol": protocol_rule}


def resolve_rule(rule: str | ToolErrorRule | None) -> ToolErrorRule:
    """The rule for ``rule`` (a name, a callable, or ``None`` for the default)."""
    if rule is None:
        return fleet_rule
    if isinstance(rule, str):
        named = _NAMED.get(rule)
        if named is not None:
            return named
    elif callable(rule):
        return rule
    raise ConfigurationError(
        f"tool_error_rule must be {' or '.join(map(repr, RULE_NAMES))} or a callable "
        f"(ToolResult) -> str | None, got {rule!r:.100}",
        hint='"fleet" (default) also reads {"error": ...} / {"status": "failed"} '
             'payloads; "protocol" only the isError flag')


def decide(rule: ToolErrorRule, result: ToolResult, *, tool: str) -> str | None:
    """Apply ``rule`` to ``result`` of ``tool``: the error message, or ``None``.

    A user rule that raises or returns something else than ``str | None`` is a
    configuration error (a bug in the rule must not pass for "no error").
    """
    try:
        decision = rule(result)
    except Exception as exc:
        raise ConfigurationError(
            f"tool_error_rule {_name(rule)} raised {type(exc).__name__} on a result of "
            f"{tool!r}: {exc}", hint="fix the rule; it must return str | None",
            tool=tool) from exc
    if decision is None or isinstance(decision, str):
        return (decision or _DEFAULT_MESSAGE) if decision is not None else None
    raise ConfigurationError(
        f"tool_error_rule {_name(rule)} returned a {type(decision).__name__} for a result "
        f"of {tool!r}", hint="return the error message (str), or None when the result "
        "is not an error", tool=tool)


def _name(rule: ToolErrorRule) -> str:
    return getattr(rule, "__qualname__", None) or repr(rule)
