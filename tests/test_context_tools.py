"""Context tools (``FleetEnv(context_tools=True)``) against the embedded local Fleet.

They are answered by fleetenv: the local Fleet's own count of tool executions proves
nothing reaches MCP. Long outputs are truncated for the agent with the original's note,
and the whole output stays reachable through ``view_tool_output`` /
``search_tool_output``; ``manage_context`` hands the trimmed history back in
``info["history"]``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Session, ToolCall, bundled_tasks_path
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import ToolCallFinished
from fleetenv.env.context_tools import CONTEXT_TOOL_NAMES, CONTEXT_TOOLS, ContextTools
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
HELPDESK = TASKS["helpdesk-count-unassigned-open"]
SHOP = TASKS["shop-count-shipped"]
NOTE = "Use search_tool_output or view_tool_output to access full content.]"


def _session(fleet: LocalFleet, seen: list[Any]) -> Session:
    return Session(api_key=fleet.token, base_url=fleet.base_url,
                   events=EventBus([seen.append]))


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def test_context_tools_are_offered_only_when_asked(local_fleet: LocalFleet) -> None:
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with session, FleetEnv(HELPDESK, session=session) as plain, \
            FleetEnv(HELPDESK, session=session, context_tools=True) as env:
        plain_obs, _ = plain.reset()
        obs, info = env.reset()
        assert not CONTEXT_TOOL_NAMES & set(_names(plain_obs.tools))
        names = _names(obs.tools)
        assert set(names) >= CONTEXT_TOOL_NAMES
        assert set(names) - CONTEXT_TOOL_NAMES == set(_names(plain_obs.tools))
        assert set(info["tools"]) >= CONTEXT_TOOL_NAMES
        offered = {t["function"]["name"]: t for t in env.openai_tools}
        assert offered["manage_context"]["function"]["parameters"]["required"] == [
            "keep_recent_turns"]
        assert offered["view_tool_output"]["function"]["parameters"]["required"] == ["page"]


def test_context_tools_never_reach_mcp_nor_count_as_errors(local_fleet: LocalFleet) -> None:
    seen: list[Any] = []
    session = _session(local_fleet, seen)
    local = [ToolCall("check_context", {}), ToolCall("search_history", {"pattern": "x"}),
             ToolCall("search_tool_output", {"pattern": "x"}),
             ToolCall("view_tool_output", {"page": 1}),
             ToolCall("manage_context", {"keep_recent_turns": 3})]
    with session, FleetEnv(SHOP, session=session, context_tools=True) as env:
        env.reset()
        instance = env.instance_id
        before = local_fleet.tool_call_counts(instance)
        observations = [env.step(call)[0] for call in local]
        assert local_fleet.tool_call_counts(instance) == before
        env.step(ToolCall("list_orders", {"status": "shipped", "limit": 1}))
        after = local_fleet.tool_call_counts(instance)
        assert sum(after.values()) == sum(before.values()) + 1
        assert env.stats.tool_calls == 1 and env.stats.tool_errors == 0
    assert not any(o.is_error for o in observations)
    # Nothing was truncated yet: the original's answer, word for word.
    assert observations[2].text == "No truncated output available."
    finished = [(e.tool_name, e.outcome) for e in seen if isinstance(e, ToolCallFinished)]
    assert finished == [*((c.name, "local") for c in local), ("list_orders", "ok")]


def test_long_output_is_truncated_and_the_rest_is_reachable(local_fleet: LocalFleet) -> None:
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with session, FleetEnv(HELPDESK, session=session, context_tools=True,
                           max_text_chars=300) as env:
        env.reset()
        obs, *_ = env.step(ToolCall("search_tickets", {"limit": 10}))
        full = obs.result.full_text if obs.result else ""
        assert len(full) > 1000
        assert obs.text == f"{full[:300]}\n\n[TRUNCATED - {len(full)} chars total. {NOTE}"
        lines = full.split("\n")
        last_subject = [line for line in lines if '"subject"' in line][-1]
        assert last_subject not in obs.text  # beyond the cut ...

        found, *_ = env.step(ToolCall("search_tool_output", {"pattern": "SUBJECT"}))
        matches = json.loads(found.text)["matches"]
        assert matches[-1]["content"] == last_subject[:200]  # ... but found
        assert all(lines[m["line"] - 1][:200] == m["content"] for m in matches)

        page, *_ = env.step(ToolCall("view_tool_output", {"page": 2, "page_size": 7}))
        view = json.loads(page.text)
        assert view == {"page": 2, "total_pages": -(-len(lines) // 7),
                        "total_lines": len(lines), "content": "\n".join(lines[7:14])}


def test_manage_context_hands_back_the_trimmed_history(local_fleet: LocalFleet) -> None:
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with session, FleetEnv(HELPDESK, session=session, context_tools=True) as env:
        env.reset()
        for ticket in (1124, 1125, 1126):
            _, _, _, _, info = env.step(ToolCall("get_ticket", {"ticket_id": ticket}))
            assert "history" not in info
        obs, _, _, _, info = env.step(ToolCall("manage_context", {"keep_recent_turns": 2}))
        assert obs.text == "Dropped 4 messages. 4 remaining."
        history = info["history"]
        # The task stays; the last turn and the manage_context call itself stay, with
        # this call's answer: what the caller continues the conversation with.
        assert history[0] == {"role": "user",
                              "content": [{"type": "text", "text": HELPDESK.prompt}]}
        # Kept: the last 2 * 2 messages, less the orphaned tool result at their head.
        assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant",
                                                "tool"]
        assert history[1]["tool_calls"][0]["function"]["arguments"] == '{"ticket_id": 1126}'
        assert history[-1]["tool_call_id"] == obs.tool_call_id
        assert history[-1]["content"] == [{"type": "text", "text": obs.text}]

        check, _, _, _, info = env.step(ToolCall("check_context", {}))
        assert "history" not in info
        counts = json.loads(check.text)
        assert counts == {"visible_turns": 3, "total_turns": 5, "dropped_turns": 2}

        # Dropped messages are still searchable (tool results are lists of text parts).
        found, *_ = env.step(ToolCall("search_history", {"pattern": '"id": 1124'}))
        assert [m["index"] for m in json.loads(found.text)["matches"]] == [2]

        # A new episode starts a new history.
        env.reset()
        check, *_ = env.step(ToolCall("check_context", {}))
        assert json.loads(check.text) == {"visible_turns": 1, "total_turns": 1,
                                          "dropped_turns": 0}


def test_bad_arguments_are_refused_before_running(local_fleet: LocalFleet) -> None:
    seen: list[Any] = []
    session = _session(local_fleet, seen)
    with session, FleetEnv(HELPDESK, session=session, context_tools=True) as env:
        env.reset()
        obs, *_ = env.step(ToolCall("manage_context", {"keep_recent_turns": "two"}))
        assert obs.is_error and "keep_recent_turns" in (obs.error or "")
        assert "must be integer" in (obs.error or "")
        obs, *_ = env.step(ToolCall("search_history", {"query": "x"}))
        assert obs.is_error and "unknown argument 'query'" in (obs.error or "")
        assert "pattern" in (obs.error or "")
        assert env.stats.tool_errors == 0 and env.stats.tool_calls == 0
    outcomes = [e.outcome for e in seen if isinstance(e, ToolCallFinished)]
    assert outcomes == ["bad_arguments", "bad_arguments"]


def test_without_the_option_the_names_are_unknown_tools(local_fleet: LocalFleet) -> None:
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with session, FleetEnv(HELPDESK, session=session) as env:
        env.reset()
        obs, *_ = env.step(ToolCall("check_context", {}))
        assert obs.is_error and "unknown tool 'check_context'" in (obs.error or "")


def test_the_option_must_be_a_bool(local_fleet: LocalFleet) -> None:
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with session:
        options: dict[str, Any] = {"context_tools": "false"}
        with pytest.raises(ConfigurationError, match=r"context_tools=.*True or False"):
            FleetEnv(HELPDESK, session=session, **options)
        options = {"meta_tools": 1}
        with pytest.raises(ConfigurationError, match=r"meta_tools=.*True or False"):
            FleetEnv(HELPDESK, session=session, **options)


# ---------------------------------------------------------------- the engine alone


def test_engine_answers_as_the_original() -> None:
    tools = ContextTools(max_output_chars=10)
    assert [t["function"]["name"] for t in tools.tools()] == [
        "check_context", "manage_context", "search_history", "search_tool_output",
        "view_tool_output"]
    assert tools.tools() == CONTEXT_TOOLS and tools.tools() is not CONTEXT_TOOLS
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "task"}]
    for turn in range(3):
        for message in ({"role": "assistant", "content": f"thinking {turn}"},
                        {"role": "user", "content": f"result {turn}"}):
            history.append(message)
            tools.track(message)
    assert json.loads(tools.execute("check_context", {}, history).text) == {
        "visible_turns": 3, "total_turns": 3, "dropped_turns": 0}
    reply = tools.execute("manage_context", {"keep_recent_turns": 1}, history)
    assert reply.text == "Dropped 4 messages. 4 remaining."
    assert reply.history == [history[0], history[1], *history[-2:]]
    assert len(history) == 8  # the caller's list is never modified
    nothing = tools.execute("manage_context", {"keep_recent_turns": 9}, history)
    assert nothing == type(nothing)("Nothing to drop. 8 messages.")
    assert json.loads(tools.execute("search_history", {"pattern": "THINKING 0"},
                                    history).text) == {
        "matches": [{"index": 0, "role": "assistant", "snippet": "thinking 0"}]}
    assert json.loads(tools.execute("search_history", {}, history).text) == {
        "error": "pattern is required"}
    assert json.loads(tools.execute("nope", {}, history).text) == {
        "error": "Unknown context tool: nope"}
    assert tools.truncate("short") == "short" and tools.last_full_output is None
    cut = tools.truncate("line one\nline two")
    assert cut.startswith("line one\nl\n\n[TRUNCATED - 17 chars total. ")
    assert tools.last_full_output == "line one\nline two"
    assert json.loads(tools.execute("view_tool_output", {"page": 2, "page_size": 1},
                                    history).text) == {
        "page": 2, "total_pages": 2, "total_lines": 2, "content": "line two"}
    with pytest.raises(ValueError, match="max_output_chars"):
        ContextTools(max_output_chars=0)
