"""What MCP servers say unasked reaches the episode: a tool-list change is offered on the
next observation, server logs and tool progress become events.

Against the embedded local Fleet with a ``notifying`` app whose tools unlock another
tool (``notifications/tools/list_changed``), log, and report progress.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _support.fixtures_local import toy_app
from _support.notifying import add_notifying_tools
from _support.waiting import wait_for
from mcp.server.mcpserver import MCPServer

from fleetenv import FleetEnv, Task, ToolCall
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import ServerLog, ToolProgress, ToolsChanged
from fleetenv.local import LocalFleet
from fleetenv.local.apps.base import DbFactory

pytestmark = [
    pytest.mark.timeout(120),
    # The servers here log the classic way, which mcp 2.3 marks deprecated (SEP-2577);
    # Fleet's servers still do.
    pytest.mark.filterwarnings("ignore:The logging capability is deprecated"),
]


def _register(server: MCPServer, db: DbFactory) -> None:
    add_notifying_tools(server)


APP = toy_app("notifying", "Notifying", "Servers that talk unasked.", _register)
TASK = Task(key="notifying-task", prompt="Unlock the bonus.", env_key="notifying",
            env_version="v1")


@pytest.fixture(scope="module")
def fleet() -> Iterator[LocalFleet]:
    with LocalFleet(apps={"notifying": APP}, verifier_workers=1, browser=False) as local:
        yield local


def _names(observation: Any) -> set[str]:
    return {tool["function"]["name"] for tool in observation.tools}


def test_a_changed_tool_list_is_offered_on_the_next_observation(fleet: LocalFleet) -> None:
    seen: list[Any] = []
    with FleetEnv(TASK, api_key=fleet.token, base_url=fleet.base_url,
                  events=EventBus([seen.append])) as env:
        observation, _ = env.reset()
        assert "bonus" not in _names(observation)
        observation, _, _, _, info = env.step(ToolCall("unlock", {}))
        # The server sends tools/list_changed on its own stream, not in the call's answer,
        # so it may land just after this step: the first observation built once it has
        # arrived offers the new list (and says so).
        steps = [(observation, info)]

        def offered() -> bool:
            if "bonus" not in _names(steps[-1][0]):
                quiet = ToolCall("say", {"level": "debug", "text": "waiting"})
                observation, _, _, _, info = env.step(quiet)
                steps.append((observation, info))
            return "bonus" in _names(steps[-1][0])

        wait_for(offered, timeout=10, what="the unlocked tool to be offered")
        assert steps[-1][1]["tools_changed"] is True
        assert [i.get("tools_changed") for _, i in steps[:-1]] == [None] * (len(steps) - 1)
        assert "bonus" in {tool.name for tool in env.tools}
        observation, *_ = env.step(ToolCall("bonus", {}))  # offered, so checked and sent
        assert not observation.is_error and "bonus!" in str(observation.content)
        quiet = ToolCall("say", {"level": "info", "text": "quiet step"})
        observation, _, _, _, info = env.step(quiet)
        assert "tools_changed" not in info
    changed = [e for e in seen if isinstance(e, ToolsChanged)]
    assert len(changed) == 1 and changed[0].endpoint.endswith("/mcp")
    assert changed[0].rollout_id == env.rollout_id


def test_server_logs_and_tool_progress_become_events(fleet: LocalFleet) -> None:
    seen: list[Any] = []
    with FleetEnv(TASK, api_key=fleet.token, base_url=fleet.base_url,
                  events=EventBus([seen.append])) as env:
        env.reset()
        env.step(ToolCall("say", {"level": "warning", "text": "disk almost full"}))
        env.step(ToolCall("steps", {"n": 3}))
    logs = [e for e in seen if isinstance(e, ServerLog)]
    assert [(e.severity, e.message, e.logger_name) for e in logs] == [
        ("warning", "disk almost full", "test-logger")]
    progress = [e for e in seen if isinstance(e, ToolProgress)]
    assert [(e.tool_name, e.progress, e.total, e.message) for e in progress] == [
        ("steps", float(i), 3.0, f"step {i}") for i in (1, 2, 3)]
    assert all(e.rollout_id == env.rollout_id for e in logs + progress)
