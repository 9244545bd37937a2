"""JSON schema -> OpenAI parameters: refs, recursion, unions, nullables, no None."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from fleetenv.mcp import Tool, to_openai_parameters


def walk(node: Any) -> list[Any]:
    """Every dict value and list item of ``node``, recursively (enum lists excluded)."""
    found: list[Any] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "enum":
                continue
            found.append(value)
            found.extend(walk(value))
    elif isinstance(node, list):
        for item in node:
            found.append(item)
            found.extend(walk(item))
    return found


def refs(node: Any) -> list[str]:
    out = []
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            out.append(node["$ref"])
        for value in node.values():
            out.extend(refs(value))
    elif isinstance(node, list):
        for item in node:
            out.extend(refs(item))
    return out


def test_refs_are_inlined_and_siblings_override() -> None:
    schema = {
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/Address", "description": "where they live"},
            "work": {"$ref": "#/definitions/Address"},
        },
        "$defs": {
            "Address": {
                "type": "object",
                "description": "an address",
                "properties": {"street": {"type": "string"}},
            }
        },
        "definitions": {
            "Address": {"type": "object", "properties": {"city": {"type": "string"}}}
        },
    }
    out = to_openai_parameters(schema)
    assert out["properties"]["home"] == {
        "type": "object",
        "description": "where they live",
        "properties": {"street": {"type": "string"}},
    }
    assert out["properties"]["work"]["properties"] == {"city": {"type": "string"}}
    assert "$defs" not in out and "definitions" not in out
    assert refs(out) == []


def test_recursive_ref_stays_a_ref_into_kept_defs() -> None:
    schema = {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}, "other": {"$ref": "#/$defs/Leaf"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    "leaf": {"$ref": "#/$defs/Leaf"},
                },
            },
            "Leaf": {"type": "string"},
        },
    }
    out = to_openai_parameters(schema)
    assert out["properties"]["root"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert out["properties"]["other"] == {"type": "string"}
    assert set(out["$defs"]) == {"Node"}  # only what recursion needs is kept
    assert out["$defs"]["Node"]["properties"]["leaf"] == {"type": "string"}
    # the result is a valid, finite schema that still accepts recursive data
    validator = jsonschema.Draft202012Validator(out)
    validator.validate({"root": {"children": [{"children": [], "leaf": "x"}]}})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"root": {"children": [{"leaf": 3}]}})


def test_mutual_recursion_and_root_self_reference() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "again": {"$ref": "#"}},
        "$defs": {
            "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
            "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}},
        },
    }
    out = to_openai_parameters(schema)
    assert out["properties"]["again"] == {"$ref": "#"}
    assert out["properties"]["a"]["properties"]["b"]["properties"]["a"] == {"$ref": "#/$defs/A"}
    assert set(out["$defs"]) == {"A"}
    assert out["$defs"]["A"]["properties"]["b"]["properties"]["a"] == {"$ref": "#/$defs/A"}
    jsonschema.Draft202012Validator.check_schema(out)


def test_unions_and_nullables_are_kept() -> None:
    schema = {
        "type": "object",
        "properties": {
            "u": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "o": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
            "all": {"allOf": [{"$ref": "#/$defs/X"}, {"required": ["x"]}]},
            "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "only_null": {"anyOf": [{"type": "null"}]},
            "listed": {"type": ["integer", "null"]},
            "openapi": {"type": "string", "nullable": True},
        },
        "$defs": {"X": {"type": "object", "properties": {"x": {"type": "number"}}}},
    }
    out = to_openai_parameters(schema)
    props = out["properties"]
    assert props["u"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["o"] == {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}
    assert props["all"]["allOf"][0]["properties"] == {"x": {"type": "number"}}
    assert props["maybe"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert props["only_null"] == {"anyOf": [{"type": "null"}]}
    assert props["listed"] == {"type": ["integer", "null"]}
    assert props["openapi"] == {"type": ["string", "null"]}


def test_no_none_values_anywhere() -> None:
    schema = {
        "type": "object",
        "description": None,
        "properties": {
            "a": {"type": "string", "description": None, "default": None, "title": None},
            "b": {"const": None},
            "c": {"enum": ["x", None]},
        },
    }
    out = to_openai_parameters(schema)
    assert None not in walk(out)
    assert out["properties"]["a"] == {"type": "string"}
    assert out["properties"]["b"] == {"type": "null"}
    assert out["properties"]["c"] == {"enum": ["x", None]}  # null as an enum *value* is data


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (None, {"type": "object", "properties": {}}),
        ({}, {"type": "object", "properties": {}}),
        ({"type": "object"}, {"type": "object", "properties": {}}),
        (
            {"properties": {"x": {"type": "integer"}}},
            {"type": "object", "properties": {"x": {"type": "integer"}}},
        ),
        ({"type": "string"}, {"type": "object", "properties": {}}),
    ],
)
def test_top_level_is_always_an_object(schema: Any, expected: dict[str, Any]) -> None:
    assert to_openai_parameters(schema) == expected


def test_remote_and_broken_refs_are_kept_untouched() -> None:
    schema = {
        "type": "object",
        "properties": {
            "r": {"$ref": "https://example.com/schema.json"},
            "b": {"$ref": "#/$defs/Missing"},
        },
    }
    out = to_openai_parameters(schema)
    assert out["properties"] == schema["properties"]


def test_input_is_not_modified() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"type": "string", "description": None}},
    }
    snapshot = repr(schema)
    to_openai_parameters(schema)
    assert repr(schema) == snapshot


def test_tool_openai_format_never_has_none_description() -> None:
    tool = Tool(name="t", description="", input_schema={"type": "object"}, endpoint="u")
    assert tool.openai() == {
        "type": "function",
        "function": {
            "name": "t",
            "description": "",
            "parameters": {"type": "object", "properties": {}},
        },
    }
