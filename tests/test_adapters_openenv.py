"""The OpenEnv drop-in FleetTaskEnv, driven the way SkyRL's integration drives it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import fleetenv
import fleetenv.errors
from fleetenv.adapters.openenv import FleetTaskEnv, make_fleet_task_env
from fleetenv.local import LocalFleet
from fleetenv.local.apps import bundled_tasks_path

pytestmark = pytest.mark.timeout(120)

RAW_TASKS: list[dict[str, Any]] = json.loads(bundled_tasks_path().read_text())


def skyrl_normalized(raw: dict[str, Any]) -> dict[str, Any]:
    """SkyRL's _normalize_task_config: key->task_key, env_id->env_key, version->env_version
    (and, as in the field, it drops data_id)."""
    return {"task_key": raw["key"], "prompt": raw["prompt"], "env_key": raw["env_id"],
            "env_version": raw["version"], "verifier_code": raw["verifier_func"],
            "task_modality": raw["task_modality"], "metadata": raw["metadata"]}


def test_skyrl_seed_pattern_end_to_end(local_fleet: LocalFleet) -> None:
    raw = next(t for t in RAW_TASKS if "submit_final_answer" in t["prompt"])
    env = FleetTaskEnv(task_config=skyrl_normalized(raw), api_key=local_fleet.token,
                       base_url=local_fleet.base_url, ttl_seconds=600, max_steps=20)

    async def rollout() -> tuple[float | None, dict[str, Any]]:
        obs = await env.reset_async()
        assert obs["tools"] and obs["step"] == 0 and obs["task_key"] == raw["key"]
        reward, info = None, {}
        for call in raw["metadata"]["reference_solution"]:
            obs, reward, done, info = await env.step_async(
                {"tool": call["name"], "params": call["arguments"], "done": False})
            assert "tool_error" not in info, info
            if done:
                break
        assert done and info["done_reason"] == "agent_done"
        await env.close_async()
        return reward, info

    reward, _ = asyncio.run(rollout())
    assert reward == 1.0 == env.final_reward
    assert env._done and env.verifier_stdout and env.last_verifier_execution_id
    assert env.tool_errors_list == []


def test_sync_pattern_with_done_action_and_errors(local_fleet: LocalFleet) -> None:
    raw = next(t for t in RAW_TASKS if t["task_modality"] == "tool_use")
    env = make_fleet_task_env(raw, api_key=local_fleet.token, base_url=local_fleet.base_url)
    obs = env.reset()
    assert obs["observation"] == {}
    obs, reward, done, info = env.step({"tool": "no_such_tool", "params": {}, "done": False})
    assert not done and reward == 0.0
    assert "unknown tool" in obs["observation"]["error"] and info["tool_error"]
    obs, reward, done, info = env.step({"tool": None, "params": {}, "done": True})
    assert done and reward == 0.0 and info["reward_computed"]
    env.close()
    assert env.final_reward == 0.0
    assert env.tool_errors_list and "no_such_tool" in env.tool_errors_list[0]


def test_computer_use_reset_has_initial_screenshot(local_fleet: LocalFleet) -> None:
    raw = next(t for t in RAW_TASKS if t["task_modality"] == "computer_use")
    env = FleetTaskEnv(raw, api_key=local_fleet.token, base_url=local_fleet.base_url)
    try:
        obs = env.reset()
        (shot,) = obs["initial_screenshot"]
        assert shot["image_url"]["url"].startswith("data:image/png;base64,")
        assert [t["function"]["name"] for t in obs["tools"]] == ["computer"]
    finally:
        env.close()


def test_from_json_file_picks_a_task(local_fleet: LocalFleet, tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"tasks": RAW_TASKS[:3]}))
    env = FleetTaskEnv.from_json_file(path, task_key=RAW_TASKS[1]["key"],
                                      api_key=local_fleet.token, base_url=local_fleet.base_url)
    assert env.task_config["key"] == RAW_TASKS[1]["key"]
    with pytest.raises(fleetenv.errors.ConfigurationError, match="3 tasks"):
        FleetTaskEnv.from_json_file(path, api_key=local_fleet.token,
                                    base_url=local_fleet.base_url)
    env.close()  # never reset: nothing to delete, nothing to grade
    assert env.final_reward is None


def test_drop_in_resets_per_episode_state_and_exposes_the_task(local_fleet: LocalFleet) -> None:
    raw = next(t for t in RAW_TASKS if t["task_modality"] == "tool_use")
    with FleetTaskEnv(raw, api_key=local_fleet.token, base_url=local_fleet.base_url) as env:
        assert (env.task_key, env.prompt, env.modality) == (
            raw["key"], raw["prompt"], "tool_use")
        assert env.env_key == raw["env_id"] and env.env_version == raw["version"]
        env.reset(seed=None)
        _, reward, done, _ = env.step({"tool": None, "params": {}, "done": True})
        assert done and env.final_reward == reward
        env.reset()  # a new episode: the last one's reward must not linger (0.1 kept it)
        assert env.final_reward is None and not env._done
    assert env.instance_id is None  # leaving the block closed it
