"""FleetEnv end to end against the embedded local Fleet, over real HTTP and MCP."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Task, ToolCall, bundled_tasks_path
from fleetenv.core.errors import (
    EpisodeStateError,
    InvalidActionError,
    PermanentProvisioningError,
)
from fleetenv.core.event_bus import EventBus
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASKS = fleetenv.load_tasks(bundled_tasks_path())
BY_MODALITY = {t.modality: t for t in reversed(TASKS)}


def make_env(fleet: LocalFleet, task: Task, **kwargs: Any) -> FleetEnv:
    return FleetEnv(task, api_key=fleet.token, base_url=fleet.base_url, **kwargs)


def play_reference(env: FleetEnv, task: Task) -> tuple[float | None, dict[str, Any]]:
    """Replay the task's reference solution; end with Done if it has no final answer."""
    env.reset()
    info: dict[str, Any] = {}
    assert task.reference_solution, task.key
    for call in task.reference_solution:
        _, reward, terminated, truncated, info = env.step(ToolCall(call.name, call.arguments))
        assert not truncated, info
        assert not info.get("tool_error"), (task.key, call.name, info)
        if terminated:
            return reward, info
    _, reward, terminated, _, info = env.step({"done": True})
    assert terminated
    return reward, info


def running_ids(fleet: LocalFleet) -> set[str]:
    return {i["instance_id"] for i in fleet.instances(status="running")}


def test_every_bundled_task_is_solved_by_its_reference_solution(local_fleet: LocalFleet) -> None:
    def solve(task: Task) -> tuple[str, float | None, dict[str, Any]]:
        with make_env(local_fleet, task) as env:
            reward, info = play_reference(env, task)
            return task.key, reward, info

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(solve, TASKS))
    failed = [(key, reward, info.get("verifier_stdout"), info.get("verifier_error"))
              for key, reward, info in outcomes if reward != 1.0]
    assert not failed
    assert len(outcomes) == len(TASKS) >= 20


@pytest.mark.parametrize("modality", ["tool_use", "computer_use", "browser_use"])
def test_full_episode_per_modality(local_fleet: LocalFleet, modality: str) -> None:
    source = BY_MODALITY["computer_use" if modality == "browser_use" else modality]
    task = source.replace(modality=modality)
    with make_env(local_fleet, task) as env:
        obs, info = env.reset()
        names = [t["function"]["name"] for t in obs.tools]
        if modality == "tool_use":
            assert "computer" not in names and len(names) >= 5
            assert obs.content == []
        else:
            assert names == ["computer"]
            assert obs.content and obs.content[-1]["type"] == "image_url"
            assert obs.content[-1]["image_url"]["url"].startswith("data:image/png;base64,")
        assert info["instance_id"] == env.instance_id
        reward, info = play_reference(env, task)
        assert reward == 1.0, info
        assert info["reward_status"] == "graded"
        assert info["verifier_execution_id"]
        assert env.stats.turns >= 1 and env.stats.tool_calls >= 1


def test_close_deletes_the_instance_and_is_idempotent(local_fleet: LocalFleet) -> None:
    env = make_env(local_fleet, TASKS[0])
    env.reset()
    instance_id = env.instance_id
    assert instance_id in running_ids(local_fleet)
    env.close()
    env.close()
    assert instance_id not in running_ids(local_fleet)
    statuses = {i["instance_id"]: i["status"] for i in local_fleet.instances()}
    assert statuses[instance_id] == "stopped"
    with pytest.raises(EpisodeStateError, match="closed"):
        env.step({"done": True})


def test_fifty_episodes_in_a_row_leave_no_live_instance(local_fleet: LocalFleet) -> None:
    task = next(t for t in TASKS if t.modality == "tool_use")
    before = running_ids(local_fleet)
    bus = EventBus(sinks=[])
    for _ in range(50):
        with make_env(local_fleet, task, events=bus) as env:
            env.reset()
            env.step({"done": True})
    assert running_ids(local_fleet) - before == set()
    report = bus.report()
    assert report.started == report.completed == 50
    assert report.balanced


def test_unknown_tool_and_bad_arguments_are_observations(local_fleet: LocalFleet) -> None:
    task = next(t for t in TASKS if t.modality == "tool_use")
    with make_env(local_fleet, task) as env:
        obs, _ = env.reset()
        real = obs.tools[0]["function"]["name"]
        obs, reward, terminated, truncated, info = env.step(ToolCall(real[:-1] + "x", {}))
        assert obs.is_error and "unknown tool" in obs.error and real in obs.error
        assert info["tool_error"] == obs.error
        assert (reward, terminated, truncated) == (0.0, False, False)
        obs, *_ = env.step({"type": "function",
                            "function": {"name": real, "arguments": "{oops"}})
        assert obs.is_error and "not valid JSON" in obs.error
        obs, *_ = env.step(ToolCall(real, "[1, 2]"))
        assert obs.is_error and "must be a JSON object" in obs.error
        # A schema violation reaches the server, which answers with a tool error.
        obs, *_ = env.step(ToolCall(real, {"limit": {"not": "an int"}}))
        assert obs.is_error and "limit" in obs.error
        assert env.stats.tool_errors == 4
        with pytest.raises(InvalidActionError):
            env.step(42)
        assert env.stats.turns == 4  # the invalid action took no turn
        messages = obs.to_messages()
        assert messages[0]["role"] == "tool"


def test_step_before_reset_and_after_the_end(local_fleet: LocalFleet) -> None:
    task = next(t for t in TASKS if t.modality == "tool_use")
    with make_env(local_fleet, task) as env:
        with pytest.raises(EpisodeStateError, match="reset"):
            env.step({"done": True})
        env.reset()
        env.step({"done": True})
        with pytest.raises(EpisodeStateError, match="over"):
            env.step({"done": True})
        # reset() starts a new episode on the same instance (seed state restored)
        first = env.instance_id
        env.reset()
        assert env.instance_id == first and env.stats.turns == 0


def test_max_steps_truncates_and_grades(local_fleet: LocalFleet) -> None:
    task = next(t for t in TASKS if t.modality == "tool_use")
    with make_env(local_fleet, task, max_steps=2) as env:
        obs, _ = env.reset()
        name = obs.tools[0]["function"]["name"]
        env.step(ToolCall("nope", {}))
        _, reward, terminated, truncated, info = env.step(ToolCall("nope", {}))
        assert (terminated, truncated, info["stop_reason"]) == (False, True, "max_steps")
        assert reward == 0.0 and info["reward_status"] == "graded"
        assert name


def test_final_answer_reaches_the_verifier(local_fleet: LocalFleet) -> None:
    task = next(t for t in TASKS if t.needs_final_answer)
    with make_env(local_fleet, task) as env:
        obs, _ = env.reset()
        assert "submit_final_answer" in [t["function"]["name"] for t in obs.tools]
        _, reward, terminated, _, info = env.step(
            ToolCall("submit_final_answer", {"answer": "certainly not the answer"}))
        assert terminated and reward == 0.0 and info["reward_status"] == "graded"
        assert info["final_answer"] == "certainly not the answer"


def test_verifier_that_raises_gives_unknown_reward(local_fleet: LocalFleet) -> None:
    broken = TASKS[0].replace(
        key="broken-verifier",
        verifier="def validate_task(env, final_answer=None):\n    raise ValueError('boom')\n")
    with make_env(local_fleet, broken) as env:
        env.reset()
        _, reward, terminated, _, info = env.step({"done": True})
    assert terminated and reward is None
    assert info["reward_status"] == "unknown" and info["reward_reason"] == "verifier_error"
    assert "boom" in info["verifier_error"]


def test_no_verifier_gives_unknown_reward_not_zero(local_fleet: LocalFleet) -> None:
    task = TASKS[0].replace(key="no-verifier", verifier=None)
    with make_env(local_fleet, task) as env:
        env.reset()
        _, reward, *_, info = env.step({"done": True})
    assert reward is None and info["reward_reason"] == "no_verifier"


def test_instance_expiring_mid_episode_truncates(local_fleet: LocalFleet,
                                                  local_faults: Any) -> None:
    task = next(t for t in TASKS if t.modality == "tool_use")
    with make_env(local_fleet, task) as env:
        env.reset()
        local_faults.expire(env.instance_id)
        call = task.reference_solution[0]
        _, reward, terminated, truncated, info = env.step(ToolCall(call.name, call.arguments))
    assert (terminated, truncated, info["stop_reason"]) == (False, True, "instance_expired")
    assert reward is None and info["reward_reason"] == "instance_gone"


def test_transient_creation_failures_are_retried(local_fleet: LocalFleet,
                                                 local_faults: Any) -> None:
    local_faults.add("create_error", status=503, times=2)
    bus = EventBus(sinks=[])
    retries: list[Any] = []
    bus.add_sink(lambda e: retries.append(e) if e.kind == "provisioning_retry" else None)
    config = fleetenv.resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url,
                                     retry_base_s=0.05, retry_cap_s=0.1)
    with FleetEnv(TASKS[0], config=config, events=bus) as env:
        env.reset()
        assert env.instance_id
    assert len(retries) == 2


def test_permanent_creation_failures_are_not_retried(local_fleet: LocalFleet,
                                                     local_faults: Any) -> None:
    local_faults.add("create_error", status=400, message="Environment 'x' not found", times=5)
    bus = EventBus(sinks=[])
    kinds: list[str] = []
    bus.add_sink(lambda e: kinds.append(e.kind))
    with make_env(local_fleet, TASKS[0], events=bus) as env, pytest.raises(
            PermanentProvisioningError, match="does not know"):
        env.reset()
    assert "provisioning_retry" not in kinds
    assert kinds.count("rollout_completed") == 1
    remaining = [f for f in local_faults.list() if f["kind"] == "create_error"]
    assert remaining and remaining[0].get("times") == 4  # exactly one attempt was made


@pytest.mark.parametrize(("status", "retryable", "retried"), [
    (400, True, True),    # a 4xx whose body says "retryable": a blip (0.1: permanent)
    (503, False, False),  # a 5xx whose body says "not retryable": do not burn the budget
])
def test_fleets_retryable_flag_beats_the_status_code(local_fleet: LocalFleet,
                                                     local_faults: Any, status: int,
                                                     retryable: bool, retried: bool) -> None:
    local_faults.add("create_error", status=status, retryable=retryable,
                     message="Health check failed", times=1)
    kinds: list[str] = []
    bus = EventBus(sinks=[lambda e: kinds.append(e.kind)])
    config = fleetenv.resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url,
                                     retry_base_s=0.05, retry_cap_s=0.1)
    with FleetEnv(TASKS[0], config=config, events=bus) as env:
        if retried:
            env.reset()
            assert kinds.count("provisioning_retry") == 1 and env.instance_id
        else:
            with pytest.raises(PermanentProvisioningError, match="says not to retry"):
                env.reset()
            assert "provisioning_retry" not in kinds


def test_unknown_environment_is_permanent(local_fleet: LocalFleet) -> None:
    task = TASKS[0].replace(key="nowhere", env_key="no-such-env", env_version=None)
    with make_env(local_fleet, task) as env, pytest.raises(PermanentProvisioningError):
        env.reset()


def test_env_from_a_thread_running_its_own_event_loop(local_fleet: LocalFleet) -> None:
    task = next(t for t in TASKS if t.modality == "tool_use")
    outcome: dict[str, Any] = {}

    async def notebook_cell() -> None:  # blocking API called inside a running loop
        with make_env(local_fleet, task) as env:
            outcome["reward"], _ = play_reference(env, task)

    thread = threading.Thread(target=lambda: asyncio.run(notebook_cell()))
    thread.start()
    thread.join(60)
    assert outcome.get("reward") == 1.0


def test_async_twins(local_fleet: LocalFleet) -> None:
    task = next(t for t in TASKS if t.modality == "tool_use")

    async def episode() -> float | None:
        async with make_env(local_fleet, task) as env:
            await env.reset_async()
            reward = None
            for call in task.reference_solution:
                _, reward, terminated, _, _ = await env.step_async(
                    ToolCall(call.name, call.arguments))
                if terminated:
                    return reward
            _, reward, *_ = await env.step_async({"done": True})
            return reward

    async def two_at_once() -> list[float | None]:
        return list(await asyncio.gather(episode(), episode()))

    assert asyncio.run(two_at_once()) == [1.0, 1.0]


def test_abandoned_episode_is_graded_at_close(local_fleet: LocalFleet) -> None:
    bus = EventBus(sinks=[])
    completed: list[Any] = []
    bus.add_sink(lambda e: completed.append(e) if e.kind == "rollout_completed" else None)
    env = make_env(local_fleet, TASKS[0], events=bus)
    env.reset()
    env.close()
    assert [c.reason for c in completed] == ["abandoned"]
    assert completed[0].grade_status == "graded" and completed[0].reward == 0.0
    assert env.reward == 0.0


def test_a_failed_first_reset_reports_the_rollout_id_its_events_carry(
        local_fleet: LocalFleet) -> None:
    from fleetenv.rollouts.rollout import run_episode

    events: list[Any] = []
    bus = EventBus(sinks=[events.append])
    task = TASKS[0].replace(key="nowhere", env_key="no-such-env", env_version=None)
    config = fleetenv.resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    result = run_episode(task, "reference", config=config, events=bus)
    assert result.error is not None
    (completed,) = [e for e in events if e.kind == "rollout_completed"]
    assert completed.rollout_id == result.rollout_id


@pytest.mark.parametrize("how", ["failed_manager_reset", "fresh_instance"])
def test_tools_talk_to_the_new_instance_after_a_replacement(local_fleet: LocalFleet,
                                                            local_faults: Any,
                                                            how: str) -> None:
    """A reset that replaces the instance also replaces the MCP sessions: the old ones
    point at a deleted instance."""
    task = BY_MODALITY["tool_use"]
    with make_env(local_fleet, task) as env:
        env.reset()
        old = env.instance_id
        if how == "failed_manager_reset":
            local_faults.add("http_error", route="*/api/v1/env/reset", status=500, times=1)
            _, info = env.reset()
            assert info["reset"] == "instance_replaced"
        else:
            env.reset(options={"fresh_instance": True})
        assert env.instance_id != old and old not in running_ids(local_fleet)
        for call in task.reference_solution:
            observation, *_, info = env.step(ToolCall(call.name, call.arguments))
            assert not observation.is_error, observation.error
            if env.done:
                break
        counts = local_fleet.tool_call_counts(env.instance_id)
        assert sum(counts.values()) >= 1  # the calls reached the new instance
