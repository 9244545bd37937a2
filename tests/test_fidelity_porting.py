"""Porting names and small differences of the OpenEnv drop-in (issue 26, item 5).

The previous client's environment variables are read as fleetenv's, its ``ValueError``\\ s
stay ``ValueError``\\ s, ``SUBMIT_FINAL_ANSWER_TOOL`` is importable with the wording a
trained policy saw, and an image without a MIME type is a PNG. Checked through the public
API on the embedded local Fleet, with a ``porting`` app whose tool returns such an image.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest
from _support.fixtures_local import tiny_png, toy_app
from mcp.server.mcpserver import MCPServer
from mcp.types import ImageContent

from fleetenv import FleetEnv, Task, ToolCall
from fleetenv.adapters.openenv import (
    SUBMIT_FINAL_ANSWER_TOOL,
    FleetEnvClient,
    FleetMCPTools,
    FleetTaskEnv,
    compat,
)
from fleetenv.core.errors import ConfigurationError, ToolNotFoundError
from fleetenv.fleet.leases import LeaseClient
from fleetenv.local import LocalFleet
from fleetenv.local.apps.base import DbFactory

pytestmark = pytest.mark.timeout(120)

PNG = base64.b64encode(tiny_png(2, 2)).decode()


def _register(server: MCPServer, db: DbFactory) -> None:
    @server.tool(structured_output=False)
    def snapshot() -> list[ImageContent]:
        """An image whose server named no MIME type."""
        return [ImageContent(type="image", data=PNG, mime_type="")]


APP = toy_app("porting", "Porting", "An image without a MIME type.", _register)
TASK = Task(key="porting-task", prompt="Look, then submit_final_answer.", env_key="porting",
            env_version="v1")


@pytest.fixture(scope="module")
def fleet() -> Iterator[LocalFleet]:
    with LocalFleet(apps={"porting": APP}, verifier_workers=1, browser=False) as local:
        yield local


@pytest.fixture
def original_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No variable of either client set; the aliases read afresh, and again after."""
    names = {name for pair in compat.ENV_ALIASES for name in pair} | {compat.TOOL_DEADLINE_ENV}
    for name in names:
        # Empty reads as unset; setenv (unlike delenv of an absent name) records the
        # original, so what the aliases copy into os.environ is undone at teardown.
        monkeypatch.setenv(name, "")
    compat.env_aliases.cache_clear()
    yield monkeypatch
    compat.env_aliases.cache_clear()


# ---------------------------------------------------------------- environment variables


def test_the_originals_browser_api_variables_are_read_as_fleetenvs(
        original_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    original_env.setenv("BROWSER_API_BASE_URL", "https://browsers.example")
    original_env.setenv("BROWSER_API_TOKEN", "token-b")
    original_env.setenv("FLEET_TEAM_API_KEY", "team-key")  # the original read it first
    with caplog.at_level(logging.INFO, logger="fleetenv.openenv"):
        FleetTaskEnv(TASK, api_key="k", base_url="http://127.0.0.1:9")
        FleetTaskEnv(TASK, api_key="k", base_url="http://127.0.0.1:9")  # read once
    client = LeaseClient.configured("http://fleet.example", {"Authorization": "Bearer k"})
    assert client.base_url == "https://browsers.example"
    assert client._headers == {"Authorization": "Bearer team-key"}
    said = [r.getMessage() for r in caplog.records if "previous Fleet client" in r.message]
    assert said == [
        "reading the previous Fleet client's BROWSER_API_BASE_URL as FLEET_BROWSER_API_URL",
        "reading the previous Fleet client's FLEET_TEAM_API_KEY as FLEET_BROWSER_API_KEY"]
    assert "team-key" not in caplog.text


def test_fleetenvs_own_browser_api_variables_win(original_env: pytest.MonkeyPatch) -> None:
    original_env.setenv("FLEET_BROWSER_API_URL", "https://mine.example")
    original_env.setenv("BROWSER_API_BASE_URL", "https://theirs.example")
    original_env.setenv("BROWSER_API_TOKEN", "token-b")
    compat.env_aliases()
    client = LeaseClient.configured("http://fleet.example", {})
    assert client.base_url == "https://mine.example"
    assert client._headers == {"Authorization": "Bearer token-b"}


def test_the_originals_tool_deadline_variable_bounds_the_drop_ins_calls(
        original_env: pytest.MonkeyPatch, fleet: LocalFleet,
        caplog: pytest.LogCaptureFixture) -> None:
    assert FleetTaskEnv(TASK, api_key=fleet.token,
                        base_url=fleet.base_url).request_timeout_s == 60.0  # fleetenv's
    compat.env_aliases.cache_clear()
    original_env.setenv("FLEET_CALL_TOOL_DEADLINE_S", "7.5")
    with caplog.at_level(logging.INFO, logger="fleetenv.openenv"):
        env = FleetTaskEnv(TASK, api_key=fleet.token, base_url=fleet.base_url)
    assert env.request_timeout_s == 7.5 and env.env.config.timeouts.call == 7.5
    assert "FLEET_CALL_TOOL_DEADLINE_S=7.5" in caplog.text
    given = FleetTaskEnv(TASK, api_key=fleet.token, base_url=fleet.base_url,
                         request_timeout_s=20)
    assert given.request_timeout_s == 20.0  # the argument wins
    assert FleetMCPTools("k", ["http://127.0.0.1:9/mcp"]).call_deadline_s == 7.5
    assert FleetMCPTools("k", ["http://127.0.0.1:9/mcp"], call_deadline_s=3).call_deadline_s == 3


def test_a_malformed_tool_deadline_variable_is_a_value_error(
        original_env: pytest.MonkeyPatch) -> None:
    original_env.setenv("FLEET_CALL_TOOL_DEADLINE_S", "soon")
    with pytest.raises(ValueError, match="FLEET_CALL_TOOL_DEADLINE_S='soon'") as raised:
        FleetTaskEnv(TASK, api_key="k", base_url="http://127.0.0.1:9")
    assert isinstance(raised.value, ConfigurationError)


# ---------------------------------------------------------------- ValueError as before


def test_a_task_config_without_env_key_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="env_key") as raised:
        FleetTaskEnv({"task_key": "test", "prompt": "test"}, api_key="k",
                     base_url="http://127.0.0.1:9")
    assert isinstance(raised.value, ConfigurationError)


def test_an_unknown_tool_of_fleet_mcp_tools_is_a_value_error(fleet: LocalFleet) -> None:
    import asyncio

    client, tools = FleetEnvClient.from_fleet(fleet.token, "porting:v1",
                                              base_url=fleet.base_url)
    try:
        with pytest.raises(ValueError, match="no tool named 'snapshots'") as raised:
            asyncio.run(tools.call_tool("snapshots", {}))
        assert isinstance(raised.value, ToolNotFoundError)
    finally:
        tools.close()
        client.close()


# ---------------------------------------------------------------- the answer tool, images


def test_submit_final_answer_tool_is_exported_with_the_originals_wording(
        fleet: LocalFleet) -> None:
    description = SUBMIT_FINAL_ANSWER_TOOL["function"]["description"]
    assert description.startswith("Submit your final answer to complete the task.")
    assert "using json brackets" in description
    with FleetTaskEnv(TASK, api_key=fleet.token, base_url=fleet.base_url) as env:
        assert SUBMIT_FINAL_ANSWER_TOOL in env.reset()["tools"]


def test_an_image_without_a_mime_type_is_a_png(fleet: LocalFleet) -> None:
    expected = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    with FleetTaskEnv(TASK, api_key=fleet.token, base_url=fleet.base_url) as env:
        env.reset()
        obs, _, _, _ = env.step({"tool": "snapshot", "params": {}, "done": False})
        assert obs["observation"] == expected
    with FleetEnv(TASK, api_key=fleet.token, base_url=fleet.base_url) as plain:
        plain.reset()
        assert plain.step(ToolCall("snapshot", {})).observation.content == expected
