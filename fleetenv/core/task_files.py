"""Reading task files: a JSON array, ``{"tasks": [...]}``, or JSONL (one task per line).

The shape is told by the content, not the extension, because exporters disagree on
extensions (``tasks.json`` files that are JSONL exist). Every problem fails the whole load,
before any instance is created, with the file, the item index (0-based, as in the list),
the line for JSONL and syntax errors, the task key when known, and the field.

Duplicate task keys are an error, not a warning: results, pass@k grouping, events and
``select_tasks`` are all keyed by task key, so two different tasks under one key would
silently merge their statistics. To run a task several times, ask the runner for more
samples per task instead of repeating it in the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.tasks import Task

__all__ = ["bundled_tasks_path", "load_tasks", "parse_tasks"]

_SHAPES_HINT = 'write a JSON array of tasks, {"tasks": [...]}, or one JSON object per line'


def bundled_tasks_path() -> Path:
    """The sample tasks shipped with fleetenv (a JSON array in Fleet's export format),
    written against the apps of the embedded local Fleet, each with a reference solution."""
    return Path(__file__).with_name("bundled_tasks.json")


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """All tasks of a task file, validated; raises ``ConfigurationError`` on any problem."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigurationError("task file not found", file=source,
                                 hint="check the path (relative paths start at the "
                                      "current directory)") from None
    except IsADirectoryError:
        raise ConfigurationError("the task file path is a directory", file=source,
                                 hint="pass the JSON / JSONL file inside it") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"task file is not UTF-8 text (byte {exc.start})",
                                 file=source, hint="save the file as UTF-8 JSON") from None
    except OSError as exc:
        raise ConfigurationError(f"cannot read task file: {exc.strerror}", file=source,
                                 hint="check the file's permissions") from None
    return parse_tasks(text, source=source)


def parse_tasks(text: str, *, source: str = "<string>") -> list[Task]:
    """Tasks from the text of a task file; ``source`` names the file in errors."""
    if not text.strip():
        raise ConfigurationError("task file is empty", file=source, hint=_SHAPES_HINT)
    items = list(_items(text, source))
    if not items:
        raise ConfigurationError("task file contains no tasks", file=source,
                                 hint=_SHAPES_HINT)
    tasks: list[Task] = []
    first_index: dict[str, int] = {}
    for index, line, raw in items:
        task = _build(raw, source=source, index=index, line=line)
        if task.key in first_index:
            raise ConfigurationError(
                f"duplicate task key {task.key!r} (first at item {first_index[task.key]})",
                file=source, index=index, line=line, task=task.key, field="key",
                hint="give every task a unique key; to run a task several times, ask "
                     "the runner for more samples per task")
        first_index[task.key] = index
        tasks.append(task)
    return tasks


def _items(text: str, source: str) -> Iterator[tuple[int, int | None, Any]]:
    """(index, line or None, raw item) for every task in the text, whatever its shape."""
    try:
        document = json.loads(text)
    except RecursionError:  # json's parser recurses once per nesting level
        raise ConfigurationError(
            "the file is JSON nested too deeply to read", file=source,
            hint="a task file is a list of flat task objects") from None
    except json.JSONDecodeError as exc:
        # Not one JSON value. JSONL if its first line is a JSON value by itself;
        # otherwise a broken JSON document, reported where the parser stopped.
        first_line = next(line for line in text.splitlines() if line.strip())
        try:
            json.loads(first_line)
        except json.JSONDecodeError:
            raise ConfigurationError(
                f"invalid JSON: {exc.msg}", file=source, line=exc.lineno, column=exc.colno,
                hint="fix the syntax at that position (a trailing comma or an unquoted "
                     "key is typical)") from None
        yield from _jsonl_items(text, source)
        return
    yield from _document_items(document, source)


def _document_items(document: Any, source: str) -> Iterator[tuple[int, int | None, Any]]:
    if isinstance(document, dict) and "tasks" in document:
        document = document["tasks"]
        if not isinstance(document, list):
            raise ConfigurationError('"tasks" must be an array', file=source,
                                     field="tasks", hint=_SHAPES_HINT)
    elif isinstance(document, dict):
        if not {"prompt", "env_key", "env_id", "environment_id"} & set(document):
            raise ConfigurationError(
                "the file is a JSON object without \"tasks\" and does not look like a task "
                f"(keys: {', '.join(sorted(map(str, document))[:8])})",
                file=source, hint=_SHAPES_HINT)
        document = [document]
    elif not isinstance(document, list):
        raise ConfigurationError(f"the file holds a JSON {type(document).__name__}, "
                                 "not tasks", file=source, hint=_SHAPES_HINT)
    for index, raw in enumerate(document):
        yield index, None, raw


def _jsonl_items(text: str, source: str) -> Iterator[tuple[int, int | None, Any]]:
    index = 0
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except RecursionError:
            raise ConfigurationError(
                f"line {line_number} is JSON nested too deeply to read", file=source,
                index=index, line=line_number,
                hint="JSONL needs one flat task object per line") from None
        except json.JSONDecodeError as exc:
            raise ConfigurationError(
                f"invalid JSON on line {line_number}: {exc.msg}", file=source,
                index=index, line=line_number, column=exc.colno,
                hint="JSONL needs one complete JSON object per line") from None
        yield index, line_number, raw
        index += 1


def _build(raw: Any, *, source: str, index: int, line: int | None) -> Task:
    try:
        return Task.model_validate(raw)
    except ConfigurationError as exc:
        # Re-raise with the location first, keeping the task and field the Task named.
        context = {"file": source, "index": index, "line": line, **exc.context}
        raise ConfigurationError(f"invalid task: {exc.message}", hint=exc.hint,
                                 retryable=exc.retryable, **context) from None
