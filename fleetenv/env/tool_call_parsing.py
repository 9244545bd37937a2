"""Reading tool calls out of what a model wrote, and writing the tools into its prompt.

One parser and one prompt block per text format in wide use (``openai``, ``hermes``,
``llama3``, ``mistral``; ``auto`` picks from the markers); docs/episodes.md, "A step that
takes the model's turn", shows each. An unreadable call raises :class:`ToolCallParseError`
(format, offset, snippet); arguments are taken as written, for the episode to judge.

Reading is linear in the text's length: the readers scan with ``str.find`` and ``json``'s
decoder, and the one regex has no two quantifiers that can share a character (a regex
holds the GIL, so a backtracking one stalls every thread).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetenv.core.errors import ConfigurationError, ToolCallParseError
from fleetenv.core.types import ToolCall

__all__ = [
    "PARSE_FORMATS",
    "PROMPT_FORMATS",
    "ParsedText",
    "parse_tool_calls",
    "render_tools",
    "split_tool_calls",
]

#: The formats :func:`parse_tool_calls` reads (``"auto"`` detects one of the others).
PARSE_FORMATS = ("auto", "openai", "hermes", "llama3", "mistral")
#: The formats :func:`render_tools` writes.
PROMPT_FORMATS = ("openai", "hermes", "llama3", "mistral")

_SNIPPET_CHARS = 60
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL_MARK = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"
#: End-of-turn tokens a sampler may leave at the end of the text.
_END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "<|im_end|>", "</s>", "<|end|>", "<|endoftext|>")
_DECODER = json.JSONDecoder()
#: A JSON object (or list of them) that starts with a ``"name"`` key: a Llama-style call.
#: Matched after the leading whitespace, so no two ``\s*`` meet (linear on any text).
_LLAMA_START = re.compile(r'\[?\s*\{\s*"name"\s*:')


@dataclass(frozen=True)
class ParsedText:
    """What a model's text holds: its tool calls, in order, and the text around them."""

    calls: tuple[ToolCall, ...]
    text: str
    """The text outside the tool calls and reasoning blocks, stripped (the answer of a
    turn without tool calls)."""
    format: str
    """The format that was read (for ``"auto"``, the one detected; ``"text"`` when the
    text holds no tool call)."""


def parse_tool_calls(text: str | Mapping[str, Any] | Sequence[Any],
                     format: str = "auto") -> list[ToolCall]:
    """The tool calls in ``text``, in order (``[]`` when there are none).

    ``format`` is one of ``"auto"``, ``"openai"``, ``"hermes"``, ``"llama3"``,
    ``"mistral"``. An OpenAI message dict or list of ``tool_calls`` may be passed as is
    (``format`` ``"auto"`` or ``"openai"``). Raises :class:`ToolCallParseError` when a
    call is there but cannot be read.
    """
    return list(split_tool_calls(text, format).calls)


def split_tool_calls(text: str | Mapping[str, Any] | Sequence[Any],
                     format: str = "auto") -> ParsedText:
    """Like :func:`parse_tool_calls`, and keeps the text around the calls."""
    fmt = _check_format(format, PARSE_FORMATS, "parse_tool_calls")
    if not isinstance(text, str):
        if fmt not in ("auto", "openai"):
            raise ConfigurationError(
                f"parse_tool_calls(format={fmt!r}) reads text, got a {type(text).__name__}",
                hint="pass the model's completion text, or format='openai' for a message")
        try:
            return _openai_value(text, offset=0)
        except _Problem as problem:
            shown = json.dumps(text, default=str)[:2000]
            raise _parse_error(problem.format, shown, problem.offset, problem.what) from None
    cleaned, removed = _strip_reasoning(text)
    if fmt == "auto":
        fmt = _detect(cleaned)
    if fmt == "text":
        return ParsedText((), cleaned.strip(), "text")
    reader = {"openai": _openai_text, "hermes": _hermes, "llama3": _llama3,
              "mistral": _mistral}[fmt]
    try:
        return reader(cleaned)
    except _Problem as problem:  # offsets count in the text as the model wrote it
        offset = problem.offset + sum(size for at, size in removed if at <= problem.offset)
        raise _parse_error(problem.format, text, offset, problem.what) from None


def render_tools(tools: Sequence[Mapping[str, Any]], format: str = "hermes") -> str:
    """The tools (OpenAI function format) as the text a chat template puts in the prompt.

    ``hermes``: the ``# Tools`` system-prompt block with ``<tools>...</tools>`` and the
    ``<tool_call>`` instructions of Qwen 2.5 / Hermes templates. ``openai``: the JSON list
    (what the ``tools`` request field holds). ``llama3``: Llama 3.1's JSON tool-calling
    instructions and the functions. ``mistral``: ``[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]``.
    """
    fmt = _check_format(format, PROMPT_FORMATS, "tools_prompt")
    items = [dict(tool) for tool in tools]
    if fmt == "openai":
        return json.dumps(items, indent=2, ensure_ascii=False)
    if fmt == "mistral":
        return f"[AVAILABLE_TOOLS]{json.dumps(items, ensure_ascii=False)}[/AVAILABLE_TOOLS]"
    if fmt == "llama3":
        listed = "\n\n".join(json.dumps(tool, indent=4, ensure_ascii=False) for tool in items)
        return ("Given the following functions, please respond with a JSON for a function "
                "call with its proper arguments that best answers the given prompt.\n\n"
                'Respond in the format {"name": function name, "parameters": dictionary of '
                "argument name and its value}. Do not use variables.\n\n" + listed)
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in items)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>")


# ---------------------------------------------------------------------------- helpers


def _check_format(value: object, allowed: tuple[str, ...], where: str) -> str:
    if isinstance(value, str) and value.lower() in allowed:
        return value.lower()
    raise ConfigurationError(f"{where}(format={value!r:.40}) is not a known tool-call format",
                             hint=f"use one of {', '.join(allowed)}")


def _strip_reasoning(text: str) -> tuple[str, list[tuple[int, int]]]:
    """Drop ``<think>`` blocks, everything before a lone ``</think>`` (templates that
    open the block in the prompt leave only its end in the completion) and end-of-turn
    tokens at the end. Returns the text and what was removed: ``(position in the new
    text, characters removed)``, to map offsets back."""
    removed: list[tuple[int, int]] = []
    kept: list[str] = []
    kept_chars = position = 0
    # A scan, not a regex: one pass even over many unclosed <think> tags.
    while (start := text.find(_THINK_OPEN, position)) != -1:
        end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end == -1:
            break  # no later <think> has an end either
        end += len(_THINK_CLOSE)
        kept.append(text[position:start])
        kept_chars += start - position
        removed.append((kept_chars, end - start))
        position = end
    kept.append(text[position:])
    cleaned = "".join(kept)
    if _THINK_CLOSE in cleaned and _THINK_OPEN not in cleaned:
        cut = cleaned.index(_THINK_CLOSE) + len(_THINK_CLOSE)
        removed = [(0, cut + sum(size for _, size in removed))]
        cleaned = cleaned[cut:]
    end = len(cleaned.rstrip())
    while token := next((t for t in _END_TOKENS if cleaned.endswith(t, 0, end)), None):
        end -= len(token)
        while end and cleaned[end - 1].isspace():
            end -= 1
    if end < len(cleaned):
        removed.append((end, len(cleaned) - end))
    return cleaned[:end], removed


def _detect(text: str) -> str:
    if _HERMES_OPEN in text or _HERMES_CLOSE in text:
        return "hermes"
    if _MISTRAL_MARK in text:
        return "mistral"
    stripped = text.lstrip()
    if _PYTHON_TAG in text or _LLAMA_START.match(stripped):
        return "llama3"
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(stripped)
        except (ValueError, RecursionError):
            return "text"  # an answer that happens to start with a brace
        if _looks_openai(value):
            return "openai"
    return "text"


def _looks_openai(value: object) -> bool:
    if isinstance(value, Mapping):
        return ("tool_calls" in value or "choices" in value
                or isinstance(value.get("function"), Mapping))
    if isinstance(value, list) and value:
        return all(isinstance(item, Mapping) and isinstance(item.get("function"), Mapping)
                   for item in value)
    return False


def _snippet(text: str, offset: int) -> str:
    return repr(text[max(0, offset - 10): offset + _SNIPPET_CHARS])


#: What a well-formed call looks like, per format (the hint of a parse error).
_HINTS = {
    "hermes": 'write each call as <tool_call>{"name": "...", "arguments": {...}}</tool_call>',
    "llama3": 'reply with only {"name": "...", "parameters": {...}} (several: separate them '
              "with ;)",
    "mistral": 'write [TOOL_CALLS][{"name": "...", "arguments": {...}}]',
    "openai": 'send {"role": "assistant", "tool_calls": [{"type": "function", "function": '
              '{"name": "...", "arguments": "{...}"}}]}',
}


class _Problem(Exception):
    """What a reader found wrong, at an offset in the text it read."""

    def __init__(self, fmt: str, offset: int, what: str) -> None:
        super().__init__(what)
        self.format, self.offset, self.what = fmt, offset, what


def _error(fmt: str, text: str, offset: int, what: str) -> _Problem:
    return _Problem(fmt, offset, what)


def _parse_error(fmt: str, text: str, offset: int, what: str) -> ToolCallParseError:
    return ToolCallParseError(f"{what} (at offset {offset}: {_snippet(text, offset)})",
                              hint=_HINTS[fmt], format=fmt, offset=offset)


def _skip_space(text: str, position: int) -> int:
    """The first position at or after ``position`` that is not whitespace."""
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _decode_at(fmt: str, text: str, start: int, what: str) -> tuple[Any, int]:
    """The JSON value starting at ``start`` (after whitespace), and where it ends."""
    start = _skip_space(text, start)
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise _error(fmt, text, exc.pos, f"{what} is not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise _error(fmt, text, start, f"{what} is JSON nested too deeply to read") from None


def _call(fmt: str, value: object, *, text: str, offset: int, what: str,
          arguments_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall:
    """One ``{"name": ..., "arguments": ...}`` object as a ``ToolCall``."""
    if not isinstance(value, Mapping):
        raise _error(fmt, text, offset, f"{what} is a JSON {type(value).__name__}, "
                     'not an object like {"name": ..., "arguments": {...}}')
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _error(fmt, text, offset, f"{what} has no tool name (a \"name\" string)")
    raw: Any = None
    for key in arguments_keys:
        if key in value:
            raw = value[key]
            break
    # Anything but an object is kept as written: the episode tells the agent why it fails.
    arguments: Mapping[str, Any] | str | None = (
        raw if raw is None or isinstance(raw, Mapping | str) else json.dumps(raw))
    call_id = value.get("id")
    if isinstance(call_id, str) and call_id:
        return ToolCall(name.strip(), arguments, call_id)
    return ToolCall(name.strip(), arguments)


# ---------------------------------------------------------------------------- readers


def _hermes(text: str) -> ParsedText:
    fmt = "hermes"
    calls: list[ToolCall] = []
    outside: list[str] = []
    position = 0
    while True:
        start = text.find(_HERMES_OPEN, position)
        stray = text.find(_HERMES_CLOSE, position)
        if stray != -1 and (start == -1 or stray < start):
            raise _error(fmt, text, stray, f"{_HERMES_CLOSE} closes no {_HERMES_OPEN}")
        if start == -1:
            outside.append(text[position:])
            break
        outside.append(text[position:start])
        body_start = start + len(_HERMES_OPEN)
        what = f"tool call {len(calls) + 1}"
        body_at = _skip_space(text, body_start)  # an index, not a copy of the rest
        if body_at == len(text) or text.startswith(_HERMES_CLOSE, body_at):
            raise _error(fmt, text, start, f"{what} is empty")
        value, stop = _decode_at(fmt, text, body_at, what)
        end = text.find(_HERMES_CLOSE, stop)
        between = text[stop:end if end != -1 else len(text)]
        if between.strip():
            where = stop + len(between) - len(between.lstrip())
            ending = (f"before {_HERMES_CLOSE}" if end != -1
                      else f"and no {_HERMES_CLOSE} (was the generation cut off?)")
            raise _error(fmt, text, where, f"{what} has text after its JSON {ending}")
        calls.append(_call(fmt, value, text=text, offset=body_start, what=what))
        if end == -1:  # the sampler stopped at </tool_call>: an unclosed last block is fine
            break
        position = end + len(_HERMES_CLOSE)
    return ParsedText(tuple(calls), "".join(outside).strip(), fmt)


def _llama3(text: str) -> ParsedText:
    fmt = "llama3"
    body = text.lstrip()
    base = len(text) - len(body)
    if body.startswith(_PYTHON_TAG):
        base += len(_PYTHON_TAG)
        body = body[len(_PYTHON_TAG):]
    elif body[:1] not in ("{", "["):
        return ParsedText((), text.strip(), "text")  # an answer in words, not a call
    calls: list[ToolCall] = []
    position = base
    while True:
        while position < len(text) and (text[position].isspace() or text[position] == ";"):
            position += 1
        if position >= len(text):
            break
        what = f"tool call {len(calls) + 1}"
        value, stop = _decode_at(fmt, text, position, what)
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            label = what if len(items) == 1 else f"item {index + 1} of {what}"
            calls.append(_call(fmt, item, text=text, offset=position, what=label,
                               arguments_keys=("parameters", "arguments")))
        position = stop
    if not calls:
        raise _error(fmt, text, base, f"{_PYTHON_TAG} is followed by no tool call")
    return ParsedText(tuple(calls), "", fmt)


def _mistral(text: str) -> ParsedText:
    fmt = "mistral"
    first = text.find(_MISTRAL_MARK)
    if first == -1:
        return ParsedText((), text.strip(), "text")
    calls: list[ToolCall] = []
    position = first
    while position < len(text):
        if not text.startswith(_MISTRAL_MARK, position):
            raise _error(fmt, text, position, "text after the tool calls")
        position = _skip_space(text, position + len(_MISTRAL_MARK))
        what = f"tool call {len(calls) + 1}"
        if text.startswith("[", position):  # [TOOL_CALLS][{...}, {...}]
            value, position = _decode_at(fmt, text, position, what)
            if not isinstance(value, list):
                raise _error(fmt, text, position, f"{what} is not a JSON list")
            for index, item in enumerate(value):
                calls.append(_call(fmt, item, text=text, offset=position,
                                   what=f"item {index + 1} of {what}"))
        else:  # [TOOL_CALLS]name[ARGS]{...}   (optionally name[CALL_ID]id[ARGS]{...})
            args_at = text.find("[ARGS]", position)
            if args_at == -1:
                raise _error(fmt, text, position, f"{what} has no [ARGS]")
            head = text[position:args_at]
            name, _, call_id = head.partition("[CALL_ID]")
            value, stop = _decode_at(fmt, text, args_at + len("[ARGS]"), f"{what}'s arguments")
            entry: dict[str, Any] = {"name": name.strip(), "arguments": value}
            if call_id.strip():
                entry["id"] = call_id.strip()
            calls.append(_call(fmt, entry, text=text, offset=position, what=what))
            position = stop
        position = _skip_space(text, position)
    return ParsedText(tuple(calls), text[:first].strip(), fmt)


def _openai_text(text: str) -> ParsedText:
    fmt = "openai"
    stripped = text.lstrip()
    if not stripped:
        return ParsedText((), "", "text")
    value, stop = _decode_at(fmt, text, len(text) - len(stripped), "the tool calls")
    if text[stop:].strip():
        raise _error(fmt, text, stop, "text after the tool calls' JSON")
    return _openai_value(value, offset=len(text) - len(stripped), text=text)


def _openai_value(value: object, *, offset: int, text: str | None = None) -> ParsedText:
    """Tool calls from a decoded OpenAI value: a chat response, a message, a list of
    ``tool_calls`` entries or one entry."""
    fmt = "openai"
    source = text or ""
    if isinstance(value, Mapping) and isinstance(value.get("choices"), list):
        choices = value["choices"]
        message = choices[0].get("message") if choices and isinstance(choices[0], Mapping) \
            else None
        if not isinstance(message, Mapping):
            raise _error(fmt, source, offset, "the response has no choices[0].message")
        value = message
    content = ""
    entries: object
    if isinstance(value, Mapping) and isinstance(value.get("function"), Mapping):
        entries = [value]
    elif isinstance(value, Mapping):
        entries = value.get("tool_calls") or []
        raw_content = value.get("content")
        content = raw_content if isinstance(raw_content, str) else ""
    else:
        entries = value
    if not isinstance(entries, list | tuple):
        raise _error(fmt, source, offset, f"tool_calls is a {type(entries).__name__}, "
                     "not a list")
    calls: list[ToolCall] = []
    for index, entry in enumerate(entries):
        what = f"tool_calls[{index}]"
        if not isinstance(entry, Mapping):
            raise _error(fmt, source, offset, f"{what} is a {type(entry).__name__}, not an "
                         'object like {"type": "function", "function": {...}}')
        function = entry.get("function", entry)
        call = _call(fmt, function, text=source, offset=offset, what=what)
        call_id = entry.get("id")
        if isinstance(call_id, str) and call_id:
            call = ToolCall(call.name, call.arguments, call_id)
        calls.append(call)
    return ParsedText(tuple(calls), content.strip(), fmt)
