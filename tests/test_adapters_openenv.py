"""The OpenEnv drop-in FleetTaskEnv, driven the way SkyRL's integration drives it."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetenv
import fleetenv.errors
from fleetenv import bundled_tasks_path
from fleetenv.adapters.openenv import (
    FleetEnvClient,
    FleetTaskEnv,
    configure_fleet_telemetry,
    make_fleet_task_env,
    telemetry,
)
from fleetenv.core.events import RolloutStarted
from fleetenv.local import LocalFleet

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


# ------------------------------------------------------------------ helpers

SHOP: dict[str, Any] = next(t for t in RAW_TASKS if t["key"] == "shop-cancel-paid-order")
CU_TASK: dict[str, Any] = next(t for t in RAW_TASKS if t["task_modality"] == "computer_use")


def drop_in(fleet: LocalFleet, raw: dict[str, Any] | None = None, **kwargs: Any) -> FleetTaskEnv:
    return FleetTaskEnv(raw or SHOP, api_key=fleet.token, base_url=fleet.base_url, **kwargs)


def with_verifier(verifier: str, key: str) -> dict[str, Any]:
    return {**SHOP, "key": key, "verifier_func": verifier, "metadata": {}}


def replay(env: FleetTaskEnv, raw: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
    """Play a task's reference solution, then finish; (reward, last info)."""
    info: dict[str, Any] = {}
    reward: float | None = None
    done = False
    for call in raw["metadata"]["reference_solution"]:
        _, reward, done, info = env.step({"tool": call["name"], "params": call["arguments"],
                                          "done": False})
        assert "tool_error" not in info, info
    if not done:
        _, reward, done, info = env.step({"tool": None, "params": {}, "done": True})
    assert done
    return reward, info


# ------------------------------------------------------------------ 1. constructor, attributes

def test_the_originals_timeouts_are_session_settings(local_fleet: LocalFleet) -> None:
    env = drop_in(local_fleet, request_timeout_s=7, reset_timeout_s=3.5, max_steps=9,
                  ttl_seconds=900)
    assert (env.request_timeout_s, env.reset_timeout_s) == (7.0, 3.5)
    timeouts = env.env.config.timeouts
    assert (timeouts.call, timeouts.read, timeouts.reset) == (7.0, 7.0, 3.5)
    assert (env.max_steps, env.ttl_seconds, env.partial_reward) == (9, 900, False)
    assert env.api_key == local_fleet.token and local_fleet.token not in repr(env)
    env.close()
    defaults = drop_in(local_fleet)
    assert (defaults.request_timeout_s, defaults.reset_timeout_s) == (60.0, 10.0)
    defaults.close()
    config = fleetenv.resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with FleetTaskEnv(SHOP, request_timeout_s=4, config=config) as configured:
        assert (configured.request_timeout_s, configured.reset_timeout_s) == (4.0, 10.0)
    with pytest.raises(fleetenv.errors.ConfigurationError, match="from_json_file"):
        FleetTaskEnv("tasks.json")  # type: ignore[arg-type]
    with pytest.raises(fleetenv.errors.ConfigurationError, match="reset_timeout_s=0"):
        drop_in(local_fleet, reset_timeout_s=0)
    with pytest.raises(fleetenv.errors.ConfigurationError, match="settings of the session"):
        FleetTaskEnv(SHOP, request_timeout_s=5, session=fleetenv.Session(
            api_key=local_fleet.token, base_url=local_fleet.base_url))


PARTIAL = '''
def verify(env, final_answer=None):
    print(">>> ERROR_ACCUMULATOR >>>")
    print(["the order is still paid"])
    print("<<< ERROR_ACCUMULATOR <<<")
    print(">>> SUCCESS_ACCUMULATOR >>>")
    print(["the order exists", "nothing else changed", "the customer was told"])
    print("<<< SUCCESS_ACCUMULATOR <<<")
    return 0
'''


@pytest.mark.parametrize(("partial_reward", "reward"), [(True, 0.75), (False, 0.0)])
def test_partial_reward_is_the_originals_option(local_fleet: LocalFleet, partial_reward: bool,
                                               reward: float) -> None:
    with drop_in(local_fleet, with_verifier(PARTIAL, f"partial-{partial_reward}"),
                 partial_reward=partial_reward) as env:
        assert env.partial_reward is partial_reward
        env.reset()
        _, got, done, info = env.step({"tool": None, "params": {}, "done": True})
    assert done and got == pytest.approx(reward) == env.final_reward
    assert info["partial_reward"] == pytest.approx(0.75)


JUDGE = '''
import json

def verify(env, final_answer=None, conversation=None):
    messages = json.loads(conversation) if conversation else []
    said = " ".join(str(m.get("content") or "") for m in messages if m["role"] == "assistant")
    return 1.0 if "order 5083 is cancelled" in said else 0.0
'''
CHAT = [{"role": "user", "content": "Cancel my order please."},
        {"role": "assistant", "content": "Done: order 5083 is cancelled."}]


def test_conversation_messages_reach_a_judge_verifier(local_fleet: LocalFleet) -> None:
    """SkyRL sets ``conversation_messages`` before each step; the judge reads it."""
    with drop_in(local_fleet, with_verifier(JUDGE, "judge-step")) as env:
        env.reset()
        env.conversation_messages = CHAT
        _, reward, done, _ = env.step({"tool": None, "params": {}, "done": True})
    assert done and reward == 1.0
    with drop_in(local_fleet, with_verifier(JUDGE, "judge-silent")) as env:
        env.reset()
        _, reward, _, _ = env.step({"done": True})
    assert reward == 0.0  # no conversation set: the judge saw nothing


def test_conversation_messages_reach_a_judge_at_close(local_fleet: LocalFleet) -> None:
    env = drop_in(local_fleet, with_verifier(JUDGE, "judge-close"))
    env.reset()
    env.conversation_messages = CHAT
    env.close()  # an abandoned episode is graded at close, with the conversation
    assert env.final_reward == 1.0 and env._done


def test_from_json_file_all_gives_one_env_per_task(local_fleet: LocalFleet,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"tasks": RAW_TASKS[:3]}))
    envs = FleetTaskEnv.from_json_file_all(path, api_key=local_fleet.token,
                                           base_url=local_fleet.base_url, max_steps=7)
    assert [e.task_key for e in envs] == [t["key"] for t in RAW_TASKS[:3]]
    assert {e.max_steps for e in envs} == {7} and all(e.instance_id is None for e in envs)
    for env in envs:
        env.close()


def test_private_attributes_are_views_of_the_real_state(local_fleet: LocalFleet) -> None:
    env = drop_in(local_fleet)
    assert env._orch is None and not env._done and env._last_verifier_execution_id is None
    env.reset()
    orch = env._orch
    assert orch is not None and orch._fleet_env.instance_id == env.instance_id
    assert orch._fleet_env.urls.root == env.root_url and orch._fleet_env.urls.root.endswith("/")
    assert env._step_count == 0 and env._tools == env.tools and not env._done
    reward, _ = replay(env, SHOP)
    assert reward == 1.0 and env._done and env._step_count == 3
    assert env._last_verifier_execution_id == env.last_verifier_execution_id is not None
    with pytest.raises(AttributeError):
        env._done = False  # type: ignore[misc]  # a view, not a second copy of the state
    env.close()
    assert env._orch is None and env._done and env.final_reward == 1.0


def test_a_step_without_tool_or_done_is_the_originals_no_op(local_fleet: LocalFleet) -> None:
    env = drop_in(local_fleet, max_steps=2)
    env.reset()
    obs, reward, done, info = env.step({"tool": None, "params": {}, "done": False})
    assert (obs["observation"], reward, done, obs["step"]) == ({}, 0.0, False, 1)
    assert "tool_result" not in info and "tool_name" not in info and info["done_reason"] is None
    obs, reward, done, info = env.step({})  # the original read every key with a default
    assert done and info["done_reason"] == "max_steps" and obs["observation"] == {}
    assert reward == 0.0 and env.env.stats.tool_calls == 0  # nothing ran; the task is undone
    env.close()


def test_json_output_arrives_parsed_and_the_typed_result_stays(local_fleet: LocalFleet) -> None:
    from fleetenv.core.tool_results import ToolResult

    raw = next(t for t in RAW_TASKS if t["key"] == "shop-count-shipped")
    with drop_in(local_fleet, raw) as env:
        env.reset()
        obs, _, _, info = env.step({"tool": "get_order", "params": {"order_id": 5083},
                                    "done": False})
        assert isinstance(obs["observation"], dict) and obs["observation"]["id"] == 5083
        assert info["tool_result"] == obs["observation"]
        typed = info["typed_result"]
        assert isinstance(typed, ToolResult) and json.loads(typed.texts[0])["id"] == 5083
        assert env.last_observation is not None and env.last_observation.result is typed
        obs, reward, done, info = env.step(
            {"tool": "submit_final_answer", "params": {"answer": "30"}, "done": False})
        assert obs["observation"] == {"status": "submitted",
                                      "message": "Answer recorded. Ending session."}
        assert done and reward == 1.0 and info["submitted_answer"] == "30"


def test_describe_and_query_db_default_to_the_seed(local_fleet: LocalFleet) -> None:
    sql = "SELECT status FROM orders WHERE id = ?"
    with drop_in(local_fleet) as env:
        env.reset()
        env.step({"tool": "update_order_status",
                  "params": {"order_id": 5083, "status": "cancelled"}, "done": False})
        tables = json.dumps(env.describe_db())
        assert "orders" in tables
        assert env.query_db(sql, [5083])["rows"] == [["paid"]]
        assert env.query_db(sql, [5083], db_name="current")["rows"] == [["cancelled"]]

        async def both() -> tuple[dict[str, Any], dict[str, Any]]:
            return (await env.describe_db_async(),
                    await env.query_db_async(sql, [5083], db_name="current"))

        described, queried = asyncio.run(both())
        assert json.dumps(described) == tables and queried["rows"] == [["cancelled"]]


# ------------------------------------------------------------------ 2. importable names, telemetry

@pytest.fixture
def records() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []
    configure_fleet_telemetry(handler=lambda name, attrs: got.append((name, dict(attrs))))
    yield got
    telemetry.reset_telemetry()


def test_telemetry_speaks_the_originals_event_names(local_fleet: LocalFleet, local_faults: Any,
                                                     records: list[Any],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fleetenv.openenv.telemetry")
    with drop_in(local_fleet) as env:
        env.reset()
        local_faults.add("tool_error", instance=env.instance_id, tool="get_order",
                         message="order service down", times=1)
        _, _, _, info = env.step({"tool": "get_order", "params": {"order_id": 5083},
                                  "done": False})
        assert info["tool_error"]
        env.step({"done": True})
    names = [name for name, _ in records]
    for name in ("fleet_rollout_started", "fleet_provisioning_completed",
                 "fleet_mcp_tool_error", "fleet_rollout_completed"):
        assert name in names, names
    attrs = dict(records)
    done = attrs["fleet_rollout_completed"]
    assert (done["env_key"], done["env_version"], done["task_key"], done["modality"]) == (
        "shop", "v1", SHOP["key"], "tool_use")
    assert done["step_count"] == 2 and done["reward"] == 0.0 and done["verifier_success"]
    assert done["instance_id"] == env.env.last_instance_id
    error = attrs["fleet_mcp_tool_error"]
    assert error["tool_name"] == "get_order" and "order service down" in error["error_message"]
    assert attrs["fleet_provisioning_completed"]["provisioning_time_s"] > 0
    assert "fleet_tool_call_finished" in names  # fleetenv's own, under a fleet_ name
    logged = [r for r in caplog.records if r.name == "fleetenv.openenv.telemetry"]
    assert [r.getMessage() for r in logged] == names
    assert logged[-1].fleet_attributes["task_key"] == SHOP["key"]  # type: ignore[attr-defined]


def test_every_original_event_name_is_mapped_or_documented_absent() -> None:
    assert len(telemetry.EVENT_NAMES) + len(telemetry.NO_COUNTERPART) == 15
    assert set(telemetry.NO_COUNTERPART) == {
        "fleet_list_tools_partial", "fleet_list_tools_retry", "fleet_list_tools_exhausted",
        "fleet_call_tool_retry", "fleet_call_tool_exhausted"}


def test_a_failed_first_screenshot_is_reported(local_fleet: LocalFleet, local_faults: Any,
                                               records: list[Any]) -> None:
    local_faults.add("tool_error", tool="computer", message="display not ready", times=1)
    with drop_in(local_fleet, CU_TASK) as env:
        obs = env.reset()
    assert "initial_screenshot" not in obs
    ((attrs),) = [a for name, a in records if name == "fleet_screenshot_failed"]
    assert attrs["modality"] == "computer_use" and "display not ready" in attrs["error_message"]


def test_telemetry_is_silent_until_configured(local_fleet: LocalFleet) -> None:
    got: list[str] = []
    with drop_in(local_fleet) as env:
        env.reset()
        configure_fleet_telemetry(handler=lambda name, _: got.append(name))
        try:
            env.step({"done": True})
        finally:
            telemetry.reset_telemetry()
        env.close()
        env.env.events.emit(RolloutStarted(rollout_id="after-reset"))
    assert "fleet_rollout_completed" in got and "fleet_rollout_started" not in got


@pytest.mark.skipif(importlib.util.find_spec("logfire") is not None,
                    reason="logfire is installed: the token path would configure it")
def test_a_logfire_token_without_logfire_says_what_to_install() -> None:
    with pytest.raises(fleetenv.errors.ConfigurationError, match="pip install logfire"):
        configure_fleet_telemetry(token="lf-write-token")
    with pytest.raises(fleetenv.errors.ConfigurationError, match="without a token"):
        configure_fleet_telemetry(send_to_logfire=True)


def test_the_originals_context_manager_works() -> None:
    from fleetenv.adapters.openenv import CONTEXT_TOOL_NAMES, CONTEXT_TOOLS, ContextManager

    manager = ContextManager(max_output_chars=100)
    assert {t["function"]["name"] for t in manager.get_tools()} == set(CONTEXT_TOOL_NAMES)
    assert len(CONTEXT_TOOLS) == 5 and manager.is_context_tool("view_tool_output")
    assert manager.truncate_output({"not": "a string"}) == {"not": "a string"}
    shown = manager.truncate_output("x" * 250)
    assert shown.startswith("x" * 100) and "[TRUNCATED - 250 chars total." in shown
    assert manager.last_full_output == "x" * 250
    history = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "a"}]
    manager.track_message(history[0])
    manager.track_message(history[1])
    answer, kept = manager.execute_tool("check_context", {}, history)
    assert json.loads(answer)["total_turns"] == 1 and kept is history


def test_the_originals_trace_and_evaluation_functions_work(
        local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetenv.adapters.openenv import (
        TaskEvaluator,
        create_trace_job,
        evaluate_task,
        upload_trace,
    )

    # The original's functions take only the key; the Fleet is FLEET_BASE_URL's.
    monkeypatch.setenv("FLEET_BASE_URL", local_fleet.base_url)
    key = local_fleet.token
    job_id = asyncio.run(create_trace_job(key, "eval_pre"))
    chat = [{"role": "user", "content": "Count the open tickets."},
            {"role": "assistant", "content": "There are 3."}]
    session_id = asyncio.run(upload_trace(key, job_id, "task", "model", chat, 1.0))
    assert isinstance(session_id, str) and session_id
    assert asyncio.run(upload_trace(key, "no-such-job", "task", "model", chat, 1.0)) is None

    verifier = "def verify(env, final_answer=None):\n    return 1.0\n"
    evaluator = TaskEvaluator(api_key=key, k_rollouts=2, models=["noop"],
                              poll_interval_s=0.2, max_poll_time_s=120)
    result = asyncio.run(evaluator.evaluate("Do nothing.", verifier, "shop", "v1"))
    assert result["num_sessions"] == 2 and result["job_id"]
    assert result["results_per_model"] == {"noop": [1.0, 1.0]}
    again = asyncio.run(evaluate_task("Do nothing.", verifier, "shop", "v1", api_key=key,
                                      k_rollouts=1, models=["noop"]))
    assert again["results_per_model"] == {"noop": [1.0]}


def test_fleet_env_client_and_mcp_tools_work_on_an_instance(local_fleet: LocalFleet,
                                                             local_faults: Any) -> None:
    client, tools = FleetEnvClient.from_fleet(
        local_fleet.token, "shop:v1", "shop-seed", "v1", base_url=local_fleet.base_url)
    try:
        handle = client._fleet_env
        assert handle.instance_id == client.instance_id
        assert client.mcp_urls == (f"{handle.urls.root}mcp", f"{handle.urls.root}api/v1/mcp")

        async def use() -> tuple[Any, Any, Any]:
            listed = await tools.list_tools()
            order = await tools.call_tool("get_order", {"order_id": 5083})
            local_faults.add("tool_error", instance=client.instance_id, tool="get_order",
                             message="order service down", times=1)
            failed = await tools.call_tool("get_order", {"order_id": 5083})
            await tools.close_async()
            return listed, order, failed

        listed, order, failed = asyncio.run(use())
        names = {t["function"]["name"] for t in listed.tools}
        # the union of both endpoints, as the original (FleetTaskEnv filters by modality)
        assert {"get_order", "update_order_status", "computer"} <= names
        assert order["id"] == 5083 and "order service down" in failed["error"]
        assert "orders" in json.dumps(client.describe_db())
        assert client.query_db("SELECT count(*) FROM orders WHERE id = 5083")["rows"] == [[1]]
        assert client.reset().observation.metadata  # the manager's answer
        assert client.state().instance_id == client.instance_id
        with pytest.raises(fleetenv.errors.InvalidActionError, match="MCP-only"):
            client.step({"tool_name": "get_order"})
    finally:
        client.close()
    assert client.state().done  # deleted

    async def async_path() -> tuple[FleetEnvClient, Any]:
        return await FleetEnvClient.from_fleet_async(
            local_fleet.token, "shop", data_key="shop-seed", data_version="v1",
            env_version="v1", base_url=local_fleet.base_url, skip_mcp=True)

    other, no_tools = asyncio.run(async_path())
    assert no_tools is None
    asyncio.run(other.close_async())
    assert other.state().done


# ------------------------------------------------------------------ 4. OpenEnv's own types

def _openenv_types() -> Any:
    return pytest.importorskip(
        "openenv.core.env_server.types",
        reason="openenv-core is not installed (pip install 'fleetenv[openenv]'); the "
               "drop-in's types then stand in for OpenEnv's")


def test_the_drop_ins_types_are_openenvs_own(local_fleet: LocalFleet) -> None:
    oe = _openenv_types()
    from openenv.core.client_types import StepResult as OpenEnvStepResult
    from pydantic import ValidationError

    from fleetenv.adapters.openenv import (
        CallToolAction,
        FleetAction,
        FleetObservation,
        FleetState,
        ListToolsAction,
        StepResult,
    )

    assert StepResult is OpenEnvStepResult
    assert issubclass(FleetObservation, oe.Observation) and issubclass(FleetState, oe.State)
    for action in (FleetAction, CallToolAction, ListToolsAction):
        assert issubclass(action, oe.Action)
    with pytest.raises(ValidationError):
        FleetAction(tol="get_order")  # type: ignore[call-arg]  # OpenEnv forbids extras
    with drop_in(local_fleet) as env:
        first = env.reset_result()
        assert isinstance(first, OpenEnvStepResult) and not first.done
        assert isinstance(first.observation, oe.Observation) and first.observation.tools
        got = env.step_result(FleetAction(tool="get_order", params={"order_id": 5083}))
        assert got.observation.observation["id"] == 5083 and got.reward == 0.0
        assert got.observation.metadata["tool_name"] == "get_order"
        env.step_result(CallToolAction(tool_name="update_order_status",
                                       parameters={"order_id": 5083, "status": "cancelled"}))
        last = asyncio.run(env.step_result_async(FleetAction(done=True)))
        assert last.done and last.reward == 1.0 and last.observation.done
        state = env.state()
        assert isinstance(state, oe.State) and state.step_count == 3 and state.done
        assert state.episode_id == env.env.rollout_id and state.final_reward == 1.0


def test_without_openenv_core_look_alike_types_stand_in() -> None:
    """Run in a fresh interpreter where importing ``openenv`` fails."""
    code = (
        "import sys\n"
        "sys.modules['openenv'] = None\n"
        "from fleetenv.adapters.openenv import types, FleetObservation, StepResult\n"
        "assert types.OPENENV_AVAILABLE is False\n"
        "obs = FleetObservation(prompt='p', observation={'a': 1}, done=True, reward=1.0)\n"
        "result = StepResult(observation=obs, reward=1.0, done=True)\n"
        "assert result.observation.metadata == {} and types.FleetState().step_count == 0\n"
        "print('stand-ins ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "stand-ins ok" in done.stdout
