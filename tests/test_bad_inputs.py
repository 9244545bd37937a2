"""Every row of the README's bad-input table: what each bad input gets.

Each bad input gets a clear error (naming what and where) or an error observation the
agent can recover from; nothing crashes the process and nothing leaks an instance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, ToolCall, bundled_tasks_path
from fleetenv.core.errors import (
    ConfigurationError,
    EpisodeStateError,
    InvalidActionError,
    PermanentProvisioningError,
    TransientProvisioningError,
)
from fleetenv.local import LocalFleet
from fleetenv.mcp import compat

pytestmark = pytest.mark.timeout(90)

TASKS = fleetenv.load_tasks(bundled_tasks_path())
TASK = next(t for t in TASKS if t.modality == "tool_use")
FIRST_CALL = TASK.reference_solution[0]


def env_for(fleet: LocalFleet, task: fleetenv.Task = TASK, **config: Any) -> FleetEnv:
    cfg = fleetenv.resolve_config(api_key=fleet.token, base_url=fleet.base_url, **config)
    return FleetEnv(task, config=cfg)


@pytest.fixture
def started(local_fleet: LocalFleet) -> Any:
    before = {i["instance_id"] for i in local_fleet.instances(status="running")}
    with env_for(local_fleet) as env:
        env.reset()
        yield env
    after = {i["instance_id"] for i in local_fleet.instances(status="running")}
    assert after - before == set(), "an instance leaked"


# ---------------------------------------------------------------- task files


def test_task_file_with_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.write_text('[{"key": "a", "prompt": "p", "env_id": "helpdesk",}]')
    with pytest.raises(ConfigurationError) as info:
        fleetenv.load_tasks(path)
    assert "tasks.json" in str(info.value) and "line=1" in str(info.value)


def test_task_file_missing_env_key(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"key": "ok", "prompt": "p", "env_id": "helpdesk"},
                                {"key": "no-env", "prompt": "p"}]))
    with pytest.raises(ConfigurationError) as info:
        fleetenv.load_tasks(path)
    text = str(info.value)
    assert "tasks.json" in text and "index=1" in text and "env" in text and "no-env" in text


def test_task_file_wrong_types(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"key": "a", "prompt": "p", "env_id": "helpdesk"}\n'
                    '{"key": "b", "prompt": ["not", "text"], "env_id": "helpdesk"}\n')
    with pytest.raises(ConfigurationError) as info:
        fleetenv.load_tasks(path)
    text = str(info.value)
    assert "tasks.jsonl" in text and "line=2" in text and "prompt is an array" in text


# ---------------------------------------------------------------- provisioning


def test_unknown_environment(local_fleet: LocalFleet) -> None:
    task = TASK.replace(key="x", env_key="no-such-app", env_version="v1")
    with env_for(local_fleet, task) as env, pytest.raises(PermanentProvisioningError) as info:
        env.reset()
    assert "no-such-app" in str(info.value)


def test_unknown_version(local_fleet: LocalFleet) -> None:
    task = TASK.replace(key="x", env_version="v99")
    with env_for(local_fleet, task) as env, pytest.raises(PermanentProvisioningError) as info:
        env.reset()
    assert "v99" in str(info.value)


def test_wrong_api_key(local_fleet: LocalFleet) -> None:
    config = fleetenv.resolve_config(api_key="not-the-token", base_url=local_fleet.base_url)
    with FleetEnv(TASK, config=config) as env, pytest.raises(PermanentProvisioningError) as info:
        env.reset()
    assert "401" in str(info.value) and "FLEET_API_KEY" in str(info.value)
    assert "not-the-token" not in str(info.value)


def test_unreachable_base_url() -> None:
    config = fleetenv.resolve_config(api_key="k", base_url="http://127.0.0.1:9",
                                     timeouts={"provision": 1.0}, retry_base_s=0.1,
                                     retry_cap_s=0.2)
    with FleetEnv(TASK, config=config) as env, pytest.raises(TransientProvisioningError) as info:
        env.reset()
    assert "127.0.0.1:9" in str(info.value) and "could not be reached" in str(info.value)


# ---------------------------------------------------------------- tool calls


def test_unknown_tool(started: FleetEnv) -> None:
    obs, *_ = started.step(ToolCall("get_tiket", {"ticket_id": 1}))
    assert obs.is_error and "get_ticket" in obs.error and "unknown tool" in obs.error


def test_arguments_not_an_object(started: FleetEnv) -> None:
    obs, *_ = started.step(ToolCall(FIRST_CALL.name, "[1, 2, 3]"))
    assert obs.is_error and FIRST_CALL.name in obs.error and "JSON object" in obs.error


def test_arguments_not_valid_json(started: FleetEnv) -> None:
    obs, *_ = started.step({"type": "function",
                            "function": {"name": FIRST_CALL.name, "arguments": '{"a": '}})
    assert obs.is_error and FIRST_CALL.name in obs.error and "not valid JSON" in obs.error


def test_arguments_violating_the_schema(started: FleetEnv) -> None:
    name, arguments = FIRST_CALL.name, dict(FIRST_CALL.arguments)
    bad = {key: {"not": "the right type"} for key in arguments}
    obs, *_ = started.step(ToolCall(name, bad))
    assert obs.is_error and any(key in obs.error for key in arguments)


@pytest.mark.skipif(not compat.features().message_limit_settable,
                    reason="mcp<2.3 limits one MCP message to 1 MiB (docs/platforms.md)")
def test_tool_output_of_50_mb(started: FleetEnv, local_faults: Any) -> None:
    local_faults.add("tool_output", payload="huge", size=50_000_000, times=1)
    obs, *_ = started.step(ToolCall(FIRST_CALL.name, FIRST_CALL.arguments))
    assert not obs.is_error
    assert "[... truncated" in obs.text and len(obs.text) < 100_000
    assert len(obs.result.full_text) > 50_000_000


def test_binary_non_utf8_tool_output(started: FleetEnv, local_faults: Any) -> None:
    local_faults.add("tool_output", payload="binary", size=4096, times=1)
    obs, *_ = started.step(ToolCall(FIRST_CALL.name, FIRST_CALL.arguments))
    assert not obs.is_error
    assert "\ufffd" in obs.text and "4096 bytes of binary data" in obs.text
    json.dumps(obs.to_dict())  # what lands in a results file stays valid JSON


# ---------------------------------------------------------------- episode misuse


def test_action_of_the_wrong_type(started: FleetEnv) -> None:
    turns = started.stats.turns
    # A bare string is a turn now (the model's text; see tests/test_turns.py).
    for bad in (42, ["a"], {"foo": 1}):
        with pytest.raises(InvalidActionError):
            started.step(bad)
    assert started.stats.turns == turns


def test_step_after_the_episode_ended(started: FleetEnv) -> None:
    started.step(fleetenv.Done())
    with pytest.raises(EpisodeStateError, match="over"):
        started.step(ToolCall(FIRST_CALL.name, FIRST_CALL.arguments))


def test_step_after_close(local_fleet: LocalFleet) -> None:
    env = env_for(local_fleet)
    env.reset()
    env.close()
    with pytest.raises(EpisodeStateError, match="closed"):
        env.step(ToolCall(FIRST_CALL.name, FIRST_CALL.arguments))
