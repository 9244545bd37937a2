"""Reading tool calls out of model text in each format, and rendering tools for a prompt."""

from __future__ import annotations

import contextlib
import json
import pickle
import time

import pytest

from fleetenv.core.errors import ConfigurationError, FleetEnvError, ToolCallParseError
from fleetenv.env.tool_call_parsing import (
    PARSE_FORMATS,
    parse_tool_calls,
    render_tools,
    split_tool_calls,
)

TOOLS = [{"type": "function", "function": {
    "name": "get_ticket", "description": "Read one ticket.",
    "parameters": {"type": "object", "properties": {"ticket_id": {"type": "integer"}},
                   "required": ["ticket_id"]}}}]


def named(text: str, fmt: str = "auto") -> list[tuple[str, object]]:
    return [(c.name, c.decoded_arguments()) for c in parse_tool_calls(text, fmt)]


HERMES = ('Let me look.\n<tool_call>\n{"name": "get_ticket", "arguments": {"ticket_id": 7}}\n'
          '</tool_call>\n<tool_call>{"name": "list_agents", "arguments": {}}</tool_call>')
LLAMA = ('<|python_tag|>{"name": "get_ticket", "parameters": {"ticket_id": 7}}; '
         '{"name": "list_agents", "parameters": {}}<|eom_id|>')
MISTRAL = ('[TOOL_CALLS][{"name": "get_ticket", "arguments": {"ticket_id": 7}}, '
           '{"name": "list_agents", "arguments": {}}]</s>')
MISTRAL_V11 = '[TOOL_CALLS]get_ticket[ARGS]{"ticket_id": 7}[TOOL_CALLS]list_agents[ARGS]{}'
OPENAI = json.dumps({"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_a", "type": "function",
     "function": {"name": "get_ticket", "arguments": '{"ticket_id": 7}'}},
    {"id": "call_b", "type": "function", "function": {"name": "list_agents", "arguments": {}}},
]})
BOTH = [("get_ticket", {"ticket_id": 7}), ("list_agents", {})]


@pytest.mark.parametrize(("text", "fmt"), [
    (HERMES, "hermes"), (LLAMA, "llama3"), (MISTRAL, "mistral"), (MISTRAL_V11, "mistral"),
    (OPENAI, "openai"),
])
def test_each_format_reads_two_calls_in_order_explicitly_and_by_detection(
        text: str, fmt: str) -> None:
    assert named(text, fmt) == BOTH
    assert named(text) == BOTH
    assert split_tool_calls(text).format == fmt


def test_ids_written_by_the_model_are_kept() -> None:
    assert [c.id for c in parse_tool_calls(OPENAI)] == ["call_a", "call_b"]
    (call,) = parse_tool_calls('[TOOL_CALLS][{"name": "a", "arguments": {}, "id": "x9"}]')
    assert call.id == "x9"
    (call,) = parse_tool_calls("[TOOL_CALLS]a[CALL_ID]k2[ARGS]{}")
    assert (call.name, call.id) == ("a", "k2")


def test_an_openai_message_or_list_can_be_passed_as_a_value() -> None:
    message = json.loads(OPENAI)
    assert [c.name for c in parse_tool_calls(message)] == ["get_ticket", "list_agents"]
    assert [c.name for c in parse_tool_calls(message["tool_calls"], "openai")] == [
        "get_ticket", "list_agents"]
    with pytest.raises(ConfigurationError, match="reads text"):
        parse_tool_calls(message, "hermes")


def test_text_without_calls_is_no_call_and_keeps_its_text() -> None:
    for text in ("The busiest agent is daniel.", '{"answer": 3}', "[1, 2]", "", "{oops"):
        parsed = split_tool_calls(text)
        assert parsed.calls == () and parsed.text == text.strip(), text
    assert split_tool_calls("<think>hmm</think> 34 <|im_end|>").text == "34"


def test_reasoning_blocks_do_not_make_calls() -> None:
    text = ('<think>I could write <tool_call>{"name": "drop_db"}</tool_call></think>'
            '<tool_call>{"name": "get_ticket", "arguments": {"ticket_id": 7}}</tool_call>')
    assert named(text) == [("get_ticket", {"ticket_id": 7})]
    # A template that opened <think> in the prompt leaves only its end in the completion.
    assert named('drop <tool_call>{"name": "x"}</tool_call></think>The answer') == []


def test_the_last_hermes_block_may_be_left_open_by_a_stop_sequence() -> None:
    assert named('<tool_call>{"name": "list_agents", "arguments": {}}') == [("list_agents", {})]


def test_llama_json_without_tag_and_as_a_list() -> None:
    assert named('{"name": "get_ticket", "parameters": {"ticket_id": 7}}') == BOTH[:1]
    assert named('[{"name": "get_ticket", "parameters": {"ticket_id": 7}}, '
                 '{"name": "list_agents", "parameters": {}}]', "llama3") == BOTH
    assert named("The answer is 4.", "llama3") == []


def test_non_object_arguments_are_kept_for_the_episode_to_report() -> None:
    (call,) = parse_tool_calls('<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>')
    with pytest.raises(FleetEnvError, match="must be a JSON object"):
        call.decoded_arguments()


@pytest.mark.parametrize(("text", "fmt", "what", "offset"), [
    ('<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>', "hermes",
     "not valid JSON", 46),
    ('<tool_call>{"arguments": {}}</tool_call>', "hermes", "no tool name", 11),
    ("ok </tool_call>", "hermes", "closes no <tool_call>", 3),
    ("<tool_call>  </tool_call>", "hermes", "is empty", 0),
    ('<tool_call>{"name": "a"} and more', "hermes", "cut off", 25),
    ('<tool_call>{"name": "a"}</tool_call><tool_call>[1]</tool_call>', "hermes",
     "tool call 2 is a JSON list", 47),
    ('{"name": "a", "parameters": {"x": ', "llama3", "not valid JSON", 34),
    ("<|python_tag|>", "llama3", "no tool call", 14),
    ('[TOOL_CALLS]a{"x": 1}', "mistral", "no [ARGS]", 12),
    ('[TOOL_CALLS][{"name": "a", "arguments": {}}] trailing', "mistral",
     "text after the tool calls", 45),
    ('{"tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}', "openai",
     "tool_calls[0] has no tool name", 0),
    ('{"tool_calls": "get_ticket"}', "openai", "not a list", 0),
])
def test_malformed_calls_raise_naming_what_and_where(text: str, fmt: str, what: str,
                                                     offset: int) -> None:
    for chosen in (fmt, "auto"):
        with pytest.raises(ToolCallParseError) as info:
            parse_tool_calls(text, chosen)
        error = info.value
        assert what in error.message, (chosen, error.message)
        assert (error.format, error.offset) == (fmt, offset)
        assert f"offset {offset}" in str(error) and error.hint
    copy = pickle.loads(pickle.dumps(error))  # crosses process pools intact
    assert (copy.format, copy.offset, str(copy)) == (fmt, offset, str(error))


def test_an_unknown_format_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="hermes"):
        parse_tool_calls("x", "qwen-xml")
    with pytest.raises(ConfigurationError, match="not a known"):
        render_tools(TOOLS, "auto")


def test_hermes_prompt_is_the_qwen_tools_block_and_reads_back() -> None:
    prompt = render_tools(TOOLS, "hermes")
    listed = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in listed.splitlines()] == TOOLS
    assert "<tool_call>" in prompt and prompt.startswith("# Tools")


def test_other_prompts_carry_the_tool_schemas() -> None:
    assert json.loads(render_tools(TOOLS, "openai")) == TOOLS
    mistral = render_tools(TOOLS, "mistral")
    assert mistral.startswith("[AVAILABLE_TOOLS]") and mistral.endswith("[/AVAILABLE_TOOLS]")
    assert json.loads(mistral[len("[AVAILABLE_TOOLS]"):-len("[/AVAILABLE_TOOLS]")]) == TOOLS
    llama = render_tools(TOOLS, "llama3")
    assert '"parameters": dictionary' in llama
    assert json.loads(llama.split("Do not use variables.\n\n", 1)[1]) == TOOLS[0]


def test_offsets_count_in_the_text_as_written_around_reasoning() -> None:
    text = '<think>plan</think>ok <tool_call>{"name": 5}</tool_call>'
    with pytest.raises(ToolCallParseError) as info:
        parse_tool_calls(text)
    assert info.value.offset == text.index('{"name"')
    assert '{"name": 5}' in info.value.message


# ------------------------------------------------------------------- hostile text

#: Far above what a linear parse of 100k characters takes; a super-linear one takes minutes.
PARSE_BOUND_S = 2.0
SIZES = [10_000, 100_000]


def repeat(unit: str, size: int) -> str:
    return unit * (size // len(unit))


def hostile(size: int) -> dict[str, dict[str, str]]:
    """Adversarial replies of about ``size`` characters, by the format each one aims at
    (``any``: what is read before a format is: whitespace, reasoning, end tokens)."""
    half = size // 2
    hermes_call = '{"name": "a", "arguments": {}}'
    llama_call = '{"name": "a", "parameters": {}}'
    entry = '{"type": "function", "function": {"name": "a", "arguments": "{}"}}'
    huge = '{"name": "a", "arguments": {"x": "' + "y" * size + '"}}'
    return {
        "any": {
            "whitespace then a word": " " * size + "x",
            "newlines then a word": "\n" * size + "x",
            "whitespace around a bracket": " " * half + "[" + " " * half + "x",
            "unclosed think tags": repeat("<think>", size),
            "many think blocks": repeat("<think>a</think>", size) + "x",
            "lone think ends": repeat("</think>", size),
            "end tokens": "x" + repeat("<|eot_id|> ", size),
            "nested braces": "{" * size,
            "nested brackets": "[" * size,
        },
        "hermes": {
            "unclosed tags": repeat("<tool_call>", size),
            "a tag then whitespace": "<tool_call>" + " " * size,
            "stray ends": repeat("</tool_call>", size),
            "many calls": repeat(f"<tool_call>{hermes_call}</tool_call>", size),
            "nested braces": "<tool_call>" + "{" * size + "</tool_call>",
            "huge JSON": f"<tool_call>{huge}</tool_call>",
        },
        "llama3": {
            "a start cut by whitespace": " " * half + "[ {" + " " * half + '"name"',
            "python tags": repeat("<|python_tag|>", size),
            "a tag then separators": "<|python_tag|>" + repeat(" ;", size),
            "many calls": repeat(llama_call + "; ", size),
            "an unclosed list": "[" + repeat(llama_call + ", ", size),
            "huge JSON": huge.replace("arguments", "parameters"),
        },
        "mistral": {
            "marks": repeat("[TOOL_CALLS]", size),
            "many calls": repeat("[TOOL_CALLS]a[ARGS]{}", size),
            "an unclosed list": "[TOOL_CALLS][" + repeat(hermes_call + ", ", size),
            "nested brackets": "[TOOL_CALLS]" + "[" * size,
            "a name without [ARGS]": "[TOOL_CALLS]" + "a" * size,
            "call ids without [ARGS]": "[TOOL_CALLS]a" + repeat("[CALL_ID]", size),
            "[ARGS] then whitespace": "[TOOL_CALLS]a[ARGS]" + " " * size,
            "huge JSON": f"[TOOL_CALLS][{huge}]",
        },
        "openai": {
            "many calls": '{"tool_calls": [' + ", ".join([entry] * (size // len(entry))) + "]}",
            "nested tool_calls": '{"tool_calls": ' + "[" * size,
            "huge content": json.dumps({"role": "assistant", "content": "y" * size,
                                        "tool_calls": []}),
        },
    }


def test_the_hostile_texts_aim_at_every_format() -> None:
    assert set(hostile(10)) - {"any"} == set(PARSE_FORMATS) - {"auto"}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("aim", "case"), [
    (aim, case) for aim, cases in hostile(10).items() for case in cases])
def test_hostile_text_is_read_in_linear_time_by_every_format(
        aim: str, case: str, size: int) -> None:
    text = hostile(size)[aim][case]
    for fmt in PARSE_FORMATS:
        started = time.perf_counter()
        with contextlib.suppress(ToolCallParseError):  # a clear error is a fine answer
            parse_tool_calls(text, fmt)
        took = time.perf_counter() - started
        assert took < PARSE_BOUND_S, f"format {fmt!r} took {took:.1f} s on {len(text)} chars"


@pytest.mark.parametrize("aim", ["hermes", "llama3", "mistral", "openai"])
def test_every_call_of_a_long_reply_is_read(aim: str) -> None:
    text = hostile(100_000)[aim]["many calls"]
    calls = named(text)
    assert len(calls) > 1000 and all(call == ("a", {}) for call in calls)
    assert named(text, aim) == calls
