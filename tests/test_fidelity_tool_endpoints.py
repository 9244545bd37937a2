"""Which MCP endpoints a tool-use episode opens (issue 26, item 6).

The previous Fleet client listed the union of ``{root}mcp`` and ``{root}api/v1/mcp`` for
tool-use tasks (less ``computer``); ``FleetEnv`` opens the aggregator only when
``{root}mcp`` serves no tool, so a tool only the aggregator serves is not offered.
``tool_endpoints="union"`` offers it; the OpenEnv drop-in does by default.

Against the embedded local Fleet with a ``split`` app whose aggregator endpoint serves a
tool (``export_audit``) that its per-environment server does not.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

from fleetenv import EpisodeOptions, FleetEnv, Task, ToolCall
from fleetenv.adapters.openenv import FleetTaskEnv
from fleetenv.core.errors import ConfigurationError
from fleetenv.local import LocalFleet
from fleetenv.local.apps.base import AppSpec, DbFactory
from fleetenv.mcp.router import ToolRouter, endpoints_for

pytestmark = pytest.mark.timeout(120)


def _register(server: MCPServer, db: DbFactory) -> None:
    @server.tool()
    def list_items() -> str:
        """The items."""
        with db() as conn:
            return ", ".join(row[0] for row in conn.execute("SELECT name FROM items"))


def _register_aggregator(server: MCPServer, db: DbFactory) -> None:
    @server.tool()
    def computer(action: str = "screenshot") -> str:
        """Not used by tool-use tasks."""
        return "no screen"

    @server.tool()
    def export_audit() -> str:
        """Only the aggregator serves this one."""
        return "audit exported"


def _build(conn: sqlite3.Connection, data_key: str, data_version: str) -> None:
    conn.execute("CREATE TABLE items (name TEXT)")
    conn.execute("INSERT INTO items VALUES ('lamp')")


APP = AppSpec(key="split", name="Split", description="Tools on both endpoints.",
              versions=("v1",), data={"split-seed": ("v1",)}, build_database=_build,
              register_tools=_register, register_computer=_register_aggregator)
TASK = Task(key="split-task", prompt="Export the audit.", env_key="split", env_version="v1")


@pytest.fixture(scope="module")
def fleet() -> Iterator[LocalFleet]:
    with LocalFleet(apps={"split": APP}, verifier_workers=1, browser=False) as local:
        yield local


def _names(tools: list[dict[str, Any]]) -> set[str]:
    return {tool["function"]["name"] for tool in tools}


def test_fleet_env_opens_only_the_first_serving_endpoint_by_default(
        fleet: LocalFleet, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fleetenv.mcp"), \
            FleetEnv(TASK, api_key=fleet.token, base_url=fleet.base_url) as env:
        env.reset()
        assert env.options.tool_endpoints == "first"
        assert _names(env.openai_tools) == {"list_items"}
        root = env.root_url
    opened = [r.getMessage() for r in caplog.records if "MCP endpoints opened" in r.message]
    assert opened == [f"MCP endpoints opened: ['{root}mcp']; absent: []; "
                      f"not opened: ['{root}api/v1/mcp']"]


def test_the_union_option_offers_the_aggregators_tools_too(
        fleet: LocalFleet, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fleetenv.mcp"), \
            FleetEnv(TASK, api_key=fleet.token, base_url=fleet.base_url,
                     tool_endpoints="union") as env:
        observation, _ = env.reset()
        assert _names(observation.tools) == {"list_items", "export_audit"}  # no computer
        result = env.step(ToolCall("export_audit", {}))
        assert result.observation.text == "audit exported"
        assert env.step(ToolCall("list_items", {})).observation.text == "lamp"
        root = env.root_url
    opened = [r.getMessage() for r in caplog.records if "MCP endpoints opened" in r.message]
    assert opened == [f"MCP endpoints opened: ['{root}mcp', '{root}api/v1/mcp']; "
                      "absent: []; not opened: []"]


def test_the_drop_in_offers_the_union_as_the_original_did(fleet: LocalFleet) -> None:
    with FleetTaskEnv(TASK, api_key=fleet.token, base_url=fleet.base_url) as env:
        obs = env.reset()
        assert _names(obs["tools"]) == {"list_items", "export_audit"}
        assert env.env.options.tool_endpoints == "union"
        obs, _, _, info = env.step({"tool": "export_audit", "params": {}, "done": False})
        assert obs["observation"] == "audit exported" and "tool_error" not in info
    chosen = EpisodeOptions(tool_endpoints="first")
    with FleetTaskEnv(TASK, api_key=fleet.token, base_url=fleet.base_url,
                      options=chosen) as env:
        assert _names(env.reset()["tools"]) == {"list_items"}


def test_union_goes_on_when_the_per_env_endpoint_is_absent(fleet: LocalFleet) -> None:
    """An image that serves its tools on the aggregator only (``{root}mcp`` answers 404):
    the union is the aggregator's tools, as with the fast default's fallback."""
    client = fleet.client()
    instance = client.make("split")
    try:
        fleet.faults.add("http_error", route=f"/instances/{instance.instance_id}/mcp*",
                         status=404)
        root = instance.urls.root
        with ToolRouter(endpoints_for(root, "tool_use", union=True)) as router:
            assert {t.name for t in router.list_tools()} == {"computer", "export_audit"}
            assert router.skipped_endpoints == [f"{root}mcp"]
    finally:
        fleet.faults.clear()
        instance.close()


def test_tool_endpoints_must_be_first_or_union() -> None:
    with pytest.raises(ConfigurationError, match="tool_endpoints='both'"):
        EpisodeOptions(tool_endpoints="both")
