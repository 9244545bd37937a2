"""load_tasks / parse_tasks: the three file shapes and every load-time error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.task_files import load_tasks, parse_tasks

TASKS = [
    {"key": "add-bob", "prompt": "Add bob", "env_id": "helpdesk", "version": "1"},
    {"task_key": "close-42", "prompt": "Close ticket 42", "env_key": "helpdesk:v1",
     "data_id": "seed:2", "task_modality": "tool_use"},
    {"id": "shot", "prompt": "Click OK", "env_key": "desktop", "modality": "computer_use"},
]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(items: list[Any]) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def load_error(path: Path) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as err:
        load_tasks(path)
    assert err.value.context["file"] == str(path)
    assert err.value.hint
    return err.value


# --- shapes -----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "text"), [
    ("array.json", json.dumps(TASKS, indent=2)),
    ("wrapped.json", json.dumps({"tasks": TASKS})),
    ("lines.jsonl", jsonl(TASKS)),
    ("lines-named.json", jsonl(TASKS)),           # JSONL told by content, not extension
    ("array-named.jsonl", json.dumps(TASKS)),     # and a JSON array in a .jsonl file
    ("blank-lines.jsonl", "\n" + jsonl(TASKS).replace("\n", "\n\n")),
    ("bom.json", "\ufeff" + json.dumps(TASKS)),
])
def test_every_shape_loads_the_same_tasks(tmp_path: Path, name: str, text: str) -> None:
    tasks = load_tasks(write(tmp_path, name, text))
    assert [t.key for t in tasks] == ["add-bob", "close-42", "shot"]
    assert [t.env_spec for t in tasks] == ["helpdesk:v1", "helpdesk:v1", "desktop"]
    assert tasks[1].data_spec == "seed:v2"
    assert tasks[2].modality == "computer_use"


def test_a_single_task_object_loads(tmp_path: Path) -> None:
    tasks = load_tasks(write(tmp_path, "one.json", json.dumps(TASKS[0], indent=2)))
    assert [t.key for t in tasks] == ["add-bob"]


def test_path_may_be_a_string(tmp_path: Path) -> None:
    path = write(tmp_path, "t.json", json.dumps(TASKS))
    assert len(load_tasks(str(path))) == 3


# --- file-level errors ------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "  \n\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    assert "empty" in str(load_error(write(tmp_path, "e.json", text)))


@pytest.mark.parametrize("text", ["[]", '{"tasks": []}'])
def test_no_tasks(tmp_path: Path, text: str) -> None:
    assert "no tasks" in str(load_error(write(tmp_path, "n.json", text)))


def test_missing_file(tmp_path: Path) -> None:
    assert "not found" in str(load_error(tmp_path / "nope.json"))


def test_directory(tmp_path: Path) -> None:
    assert "directory" in str(load_error(tmp_path))


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes('[{"prompt": "caf\xe9"}]'.encode("latin-1"))
    assert "UTF-8" in str(load_error(path))


def test_json_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    text = '{\n  "tasks": [\n    {"key": "a", "prompt": "p", "env_key": "e"},\n  ]\n}\n'
    err = load_error(write(tmp_path, "bad.json", text))
    assert err.context["line"] == "4"
    assert "column" in err.context
    assert "invalid JSON" in str(err)


def test_jsonl_syntax_error_names_the_line(tmp_path: Path) -> None:
    text = jsonl(TASKS[:2]) + "\n" + '{"key": "x", "prompt": \n'
    err = load_error(write(tmp_path, "bad.jsonl", text))
    assert err.context["line"] == "4"
    assert err.context["index"] == "2"
    assert "line 4" in str(err)


@pytest.mark.parametrize(("text", "words"), [
    ('{"tasks": {"key": "a"}}', '"tasks" must be an array'),
    ('{"data": [1, 2]}', "does not look like a task"),
    ('"just a string"', "not tasks"),
    ("42", "not tasks"),
])
def test_wrong_top_level_shape(tmp_path: Path, text: str, words: str) -> None:
    assert words in str(load_error(write(tmp_path, "shape.json", text)))


# --- item-level errors ------------------------------------------------------------------

def item_error(tmp_path: Path, items: list[Any], *, as_jsonl: bool = False
               ) -> ConfigurationError:
    text = jsonl(items) if as_jsonl else json.dumps(items)
    return load_error(write(tmp_path, "items.jsonl" if as_jsonl else "items.json", text))


@pytest.mark.parametrize(("bad", "field", "words"), [
    ({"key": "x", "prompt": "p"}, "env_key", "env_key is missing"),
    ({"key": "x", "prompt": "p", "env_key": ""}, "env_key", "env_key is missing"),
    ({"key": "x", "prompt": ["p"], "env_key": "e"}, "prompt", "array"),
    ({"key": "x", "prompt": "p", "env_key": "e", "modality": "vr"}, "modality",
     "unknown modality"),
    ({"key": "x", "prompt": "p", "env_key": "e", "metadata": []}, "metadata",
     "must be an object"),
    ({"key": "x", "prompt": "p", "env_key": "e", "env_variables": "A=1"}, "env_variables",
     "must be an object"),
])
def test_item_errors_name_file_index_task_and_field(tmp_path: Path, bad: dict[str, Any],
                                                    field: str, words: str) -> None:
    err = item_error(tmp_path, [TASKS[0], TASKS[1], bad])
    assert err.context["index"] == "2"
    assert err.context["task"] == "x"
    assert err.context["field"] == field
    assert words in str(err)
    assert "line" not in err.context  # JSON arrays report the index only


def test_jsonl_item_errors_also_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl",
                 jsonl(TASKS[:1]) + "\n\n" + jsonl([{"key": "x", "prompt": "p"}]))
    err = load_error(path)
    assert (err.context["index"], err.context["line"]) == ("1", "4")
    assert err.context["field"] == "env_key"
    assert str(err).startswith("invalid task: env_key is missing")


def test_item_without_key_names_index_and_field(tmp_path: Path) -> None:
    err = item_error(tmp_path, [{"prompt": "p", "env_key": "e"}])
    assert (err.context["index"], err.context["field"]) == ("0", "key")
    assert "task" not in err.context


def test_item_that_is_not_an_object(tmp_path: Path) -> None:
    err = item_error(tmp_path, [TASKS[0], "helpdesk"])
    assert err.context["index"] == "1"
    assert "must be a JSON object, got string" in str(err)


def test_jsonl_line_that_is_an_array(tmp_path: Path) -> None:
    err = item_error(tmp_path, [TASKS[0], [TASKS[1]]], as_jsonl=True)
    assert (err.context["index"], err.context["line"]) == ("1", "2")


def test_duplicate_keys_are_an_error(tmp_path: Path) -> None:
    dup = {"task_key": "add-bob", "prompt": "Another", "env_key": "crm"}
    err = item_error(tmp_path, [TASKS[0], TASKS[1], dup])
    assert (err.context["index"], err.context["task"], err.context["field"]) == (
        "2", "add-bob", "key")
    assert "first at item 0" in str(err)
    assert "samples per task" in (err.hint or "")


def test_parse_tasks_names_its_source() -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_tasks("[{]", source="inline")
    assert err.value.context["file"] == "inline"
    assert [t.key for t in parse_tasks(json.dumps(TASKS))] == ["add-bob", "close-42", "shot"]
