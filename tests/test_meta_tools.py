"""Meta-tools (``FleetEnv(meta_tools=True)``) against the embedded local Fleet.

The agent is offered ``search_tools`` / ``get_tool_schema`` / ``list_service_tools``
instead of the tool list, finds a tool through them, and calls it by name; the meta-tools
themselves never reach MCP (the local Fleet counts every tool execution).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Session, ToolCall, bundled_tasks_path
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import ToolCallFinished
from fleetenv.env.meta_tools import META_TOOL_NAMES, MetaTools, signature
from fleetenv.local import LocalFleet
from fleetenv.mcp.tools import Tool

pytestmark = pytest.mark.timeout(120)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
HELPDESK = TASKS["helpdesk-count-unassigned-open"]


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def test_an_agent_finds_a_tool_and_calls_it_by_name(local_fleet: LocalFleet) -> None:
    seen: list[Any] = []
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url,
                      events=EventBus([seen.append]))
    with session, FleetEnv(HELPDESK, session=session, meta_tools=True) as env:
        obs, _ = env.reset()
        assert _names(obs.tools) == ["search_tools", "get_tool_schema",
                                     "list_service_tools", "submit_final_answer"]
        assert "search_tickets" in [t.name for t in env.tools]  # still the env's tools
        instance = env.instance_id
        before = local_fleet.tool_call_counts(instance)

        found, *_ = env.step(ToolCall("search_tools", {"query": "search tickets"}))
        tools = json.loads(found.text)["tools"]
        assert tools[0]["name"] == "search_tickets"
        assert "status?: " in tools[0]["signature"]  # small enums inline
        assert '"open"' in tools[0]["signature"]

        schema, *_ = env.step(ToolCall("get_tool_schema", {"name": "search_tickets"}))
        real = next(t for t in env.tools if t.name == "search_tickets")
        assert json.loads(schema.text) == real.openai()

        service, *_ = env.step(ToolCall("list_service_tools", {"service": "ticket"}))
        listed = {t["name"] for t in json.loads(service.text)["tools"]}
        assert {"search_tickets", "get_ticket", "update_ticket", "create_ticket"} <= listed
        assert "list_agents" not in listed
        assert local_fleet.tool_call_counts(instance) == before  # nothing was sent

        # The real tool, called by name although it is not in the offered list.
        obs, *_ = env.step(ToolCall("search_tickets", {"status": "open", "limit": 1}))
        assert not obs.is_error and '"tickets"' in obs.text
        after = local_fleet.tool_call_counts(instance)
        assert after.get("search_tickets", 0) == before.get("search_tickets", 0) + 1
        # ... with its arguments checked like any tool's.
        bad, *_ = env.step(ToolCall("search_tickets", {"query": "x"}))
        assert bad.is_error and "unknown argument 'query'" in (bad.error or "")
        stats = env.stats
        assert stats.tool_calls == 2 and stats.tool_errors == 1  # the refused one counts too
    outcomes = [(e.tool_name, e.outcome) for e in seen if isinstance(e, ToolCallFinished)]
    assert outcomes == [("search_tools", "local"), ("get_tool_schema", "local"),
                        ("list_service_tools", "local"), ("search_tickets", "ok"),
                        ("search_tickets", "bad_arguments")]


def test_misses_say_what_to_try(local_fleet: LocalFleet) -> None:
    session = Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with session, FleetEnv(HELPDESK, session=session, meta_tools=True,
                           context_tools=True) as env:
        obs, _ = env.reset()
        assert META_TOOL_NAMES | {"check_context"} <= set(_names(obs.tools))
        assert "search_tickets" not in _names(obs.tools)
        schema, *_ = env.step(ToolCall("get_tool_schema", {"name": "search_ticket"}))
        assert json.loads(schema.text)["error"].startswith(
            "no tool named 'search_ticket'. Did you mean search_tickets, ")
        none, *_ = env.step(ToolCall("search_tools", {"query": "zebra"}))
        assert "services:" in json.loads(none.text)["note"]
        unknown, *_ = env.step(ToolCall("serch_tickets", {}))
        assert unknown.is_error and "Did you mean 'search_tickets'" in (unknown.error or "")
        assert "Use search_tools" in (unknown.error or "")
        empty, *_ = env.step(ToolCall("search_tools", {"query": ""}))
        assert empty.is_error and "query" in (empty.error or "")


def test_index_over_many_tools() -> None:
    tools = [Tool(name=f"svc{n % 10}__action_{n}", description=f"Does thing {n}.",
                  input_schema={"type": "object",
                                "properties": {"id": {"type": "integer"},
                                               "mode": {"enum": ["a", "b"]}},
                                "required": ["id"]})
             for n in range(180)]
    meta = MetaTools(tools)
    assert signature(tools[0]) == 'svc0__action_0(id: integer, mode?: "a"|"b")'
    found = json.loads(meta.execute("search_tools", {"query": "action"}))["tools"]
    assert len(found) == 25  # capped, as the original
    listed = json.loads(meta.execute("list_service_tools", {"service": "svc3"}))["tools"]
    assert [t["name"] for t in listed] == [f"svc3__action_{n}" for n in range(3, 180, 10)]
    assert json.loads(meta.execute("nope", {})) == {"error": "Unknown meta tool: nope"}
