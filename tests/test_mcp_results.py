"""ToolResult: conversion from mcp types and every rendering rule."""

from __future__ import annotations

import base64
import json
import pickle

import pytest
from _support.mcp_servers import tiny_png
from mcp import types

from fleetenv.mcp import (
    AudioBlock,
    ImageBlock,
    ResourceBlock,
    ResourceLinkBlock,
    TextBlock,
    ToolResult,
)

PNG = base64.b64encode(tiny_png()).decode()


def text_result(*texts: str, is_error: bool = False) -> ToolResult:
    return ToolResult.from_mcp(
        types.CallToolResult(
            content=[types.TextContent(type="text", text=t) for t in texts], is_error=is_error
        )
    )


def every_block_result() -> ToolResult:
    return ToolResult.from_mcp(
        types.CallToolResult(
            content=[
                types.TextContent(type="text", text="one"),
                types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                types.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
                types.EmbeddedResource(
                    type="resource",
                    resource=types.TextResourceContents(
                        uri="file:///a.txt", mime_type="text/plain", text="alpha"
                    ),
                ),
                types.EmbeddedResource(
                    type="resource",
                    resource=types.BlobResourceContents(
                        uri="file:///b.png", mime_type="image/png", blob=PNG
                    ),
                ),
                types.ResourceLink(type="resource_link", uri="file:///c", name="c"),
                types.TextContent(type="text", text="two"),
            ],
            structured_content={"k": [1, None]},
        )
    )


def test_blocks_keep_their_order_and_types() -> None:
    result = every_block_result()
    assert [block.type for block in result.content] == [
        "text",
        "image",
        "audio",
        "resource",
        "resource",
        "resource_link",
        "text",
    ]
    assert isinstance(result.content[1], ImageBlock)
    assert isinstance(result.content[2], AudioBlock)
    assert result.content[3] == ResourceBlock(
        uri="file:///a.txt", mime_type="text/plain", text="alpha"
    )
    assert isinstance(result.content[5], ResourceLinkBlock)
    assert result.structured == {"k": [1, None]}
    assert result.is_error is False and result.error_message is None


def test_openai_rendering_in_order() -> None:
    parts = every_block_result().to_openai_content()
    assert parts[0] == {"type": "text", "text": "one"}
    assert parts[1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert parts[2]["type"] == "text" and parts[2]["text"].startswith("[audio: audio/wav")
    assert parts[3] == {"type": "text", "text": "[resource file:///a.txt (text/plain)]\nalpha"}
    assert parts[4]["type"] == "image_url"  # an image blob resource is shown as an image
    assert parts[5] == {"type": "text", "text": "[resource link c <file:///c>]"}
    assert parts[6] == {"type": "text", "text": "two"}


@pytest.mark.parametrize("literal", ["null", "0", "", "false", "[]", '"quoted"'])
def test_json_looking_text_stays_exactly_that_text(literal: str) -> None:
    result = text_result(literal)
    assert result.texts == [literal]
    assert result.to_openai_content() == [{"type": "text", "text": literal}]
    assert result.to_text() == literal


def test_fleet_screenshot_texts_become_images() -> None:
    raw = text_result(json.dumps({"base64_image": PNG})).to_openai_content()
    assert raw == [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    url = f"data:image/jpeg;base64,{PNG}"
    assert text_result(json.dumps({"base64_image": url})).to_openai_content()[0]["image_url"] == {
        "url": url
    }
    extra = text_result(json.dumps({"status": "ok", "base64_image": PNG})).to_openai_content()
    assert extra[0] == {"type": "text", "text": '{"status": "ok"}'}
    assert extra[1]["type"] == "image_url"


def test_null_screenshot_becomes_a_clear_note() -> None:
    parts = text_result(json.dumps({"base64_image": None})).to_openai_content()
    note = "[screenshot unavailable: the tool returned a null image]"
    assert parts == [{"type": "text", "text": note}]


def test_truncation_has_a_visible_marker_and_full_text_is_kept() -> None:
    result = text_result("a" * 100, "b" * 50)
    parts = result.to_openai_content(max_text_chars=120)
    assert parts[0] == {"type": "text", "text": "a" * 100}
    assert parts[1]["text"] == "b" * 20 + "\n[... truncated 30 chars ...]"
    assert result.full_text == "a" * 100 + "\n" + "b" * 50
    assert result.to_text(max_text_chars=20) == (
        "a" * 20 + "\n[... truncated 80 chars ...]\n[... truncated 50 chars ...]"
    )
    assert result.to_openai_content(max_text_chars=None)[1]["text"] == "b" * 50


def test_error_message_is_decided_once() -> None:
    err = text_result("first problem", "second problem", is_error=True)
    assert err.is_error and err.error_message == "first problem\nsecond problem"
    bare = ToolResult.from_mcp(types.CallToolResult(content=[], is_error=True))
    assert bare.error_message == "the tool reported an error without a message"
    assert bare.to_openai_content() == [{"type": "text", "text": bare.error_message}]
    # text that merely looks like an error is not one: the protocol flag decides
    assert text_result('{"error": "nope"}').is_error is False
    made = ToolResult.error("server said no")
    assert made.is_error and made.error_message == "server said no"
    assert made.to_openai_content() == [{"type": "text", "text": "server said no"}]


def test_structured_only_result_renders_as_json() -> None:
    result = ToolResult.from_mcp(types.CallToolResult(content=[], structured_content={"a": 1}))
    assert result.to_openai_content() == [{"type": "text", "text": '{"a": 1}'}]
    assert result.to_text() == '{"a": 1}'


def test_results_pickle_and_round_trip_through_json() -> None:
    result = every_block_result()
    assert pickle.loads(pickle.dumps(result)) == result
    encoded = json.dumps(result.to_dict())
    assert ToolResult.from_dict(json.loads(encoded)) == result
    err = ToolResult.error("x")
    assert ToolResult.from_dict(json.loads(json.dumps(err.to_dict()))) == err
    assert TextBlock("") == ToolResult.from_dict(text_result("").to_dict()).content[0]
