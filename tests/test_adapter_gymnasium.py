"""The Gymnasium adapter, checked by Gymnasium itself, on real episodes of the local Fleet."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

import fleetenv  # noqa: E402
from fleetenv import bundled_tasks_path  # noqa: E402
from fleetenv.adapters.gymnasium import ENV_ID, FleetGymEnv  # noqa: E402
from fleetenv.core.config import resolve_config  # noqa: E402
from fleetenv.core.errors import ConfigurationError, EpisodeStateError  # noqa: E402
from fleetenv.local import LocalFleet  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
TASK = TASKS["helpdesk-assign-api-ticket"]


def settings(fleet: LocalFleet) -> dict[str, Any]:
    # A FleetConfig, not api_key=: Gymnasium keeps make()'s kwargs in env.spec, and the
    # config's repr hides the key.
    return {"config": resolve_config(api_key=fleet.token, base_url=fleet.base_url)}


def openai_call(name: str, arguments: dict[str, Any], call_id: str | None = None
                ) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}
    if call_id is not None:
        call["id"] = call_id
    return call


def test_check_env_passes_without_a_single_warning(local_fleet: LocalFleet) -> None:
    import fleet  # noqa: F401  (fleet-python's own import-time warnings are not ours)

    env = gymnasium.make(ENV_ID, task=TASK, **settings(local_fleet))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
        assert [str(w.message) for w in caught] == []
        # check_env stepped with random text: every such step was a parse error.
        assert env.unwrapped.parse_errors >= 3
    finally:
        env.close()


def test_make_by_module_path_and_the_registered_spec(local_fleet: LocalFleet) -> None:
    assert ENV_ID in gymnasium.registry
    env = gymnasium.make(f"fleetenv.adapters.gymnasium:{ENV_ID}", task=TASK,
                         **settings(local_fleet))
    try:
        assert isinstance(env.unwrapped, FleetGymEnv)
        assert env.spec is not None and env.spec.id == ENV_ID
        assert local_fleet.token not in repr(env.spec) + repr(env)
    finally:
        env.close()
        env.close()  # idempotent, as Gymnasium requires


def test_reference_solution_as_json_text_earns_the_reward(local_fleet: LocalFleet) -> None:
    task = TASKS["helpdesk-assign-api-ticket"]
    assert task.reference_solution
    with FleetGymEnv(task, **settings(local_fleet)) as env:
        obs, info = env.reset(seed=7)
        assert set(obs) == {"prompt", "tools", "messages", "text"}
        assert obs["prompt"] == task.prompt
        assert [m["role"] for m in json.loads(obs["messages"])] == ["user"]
        tool_names = [t["function"]["name"] for t in json.loads(obs["tools"])]
        assert "get_ticket" in tool_names
        assert info["task_key"] == task.key
        assert "instance_id" not in info and "rollout_id" not in info
        assert env.raw_info["instance_id"] == env.fleet_env.instance_id

        history = json.loads(obs["messages"])
        for turn, call in enumerate(task.reference_solution, start=1):
            action = json.dumps(openai_call(call.name, dict(call.arguments or {})))
            obs, reward, terminated, truncated, info = env.step(action)
            messages = json.loads(obs["messages"])
            # A call without an id gets a replayable one, answered by the tool message.
            assert messages[0] == {"role": "tool", "tool_call_id": f"call_{turn}_0",
                                   "content": messages[0]["content"]}
            assert not info.get("tool_error")
            assert (reward, terminated, truncated) == (0.0, False, False)
            history += messages
        obs, reward, terminated, truncated, info = env.step('{"done": true}')
        assert type(reward) is float and reward == 1.0
        assert (terminated, truncated) == (True, False)
        assert info["stop_reason"] == "agent_done" and type(info["stop_reason"]) is str
        assert info["reward_status"] == "graded" and info["reward_unknown"] is False
        assert "verifier_execution_id" not in info and "instance_id" not in info
        assert "verifier_execution_id" in env.raw_info
        assert env.fleet_env.grade is not None and env.fleet_env.grade.reward == 1.0
        for late in ('{"done": true}', "not even JSON"):
            with pytest.raises(EpisodeStateError, match="episode is over"):
                env.step(late)


def test_one_action_may_hold_several_calls(local_fleet: LocalFleet) -> None:
    with FleetGymEnv(TASK, **settings(local_fleet)) as env:
        env.reset()
        batch = [openai_call("get_ticket", {"ticket_id": 1124}, "a"),
                 {"name": "list_agents", "arguments": {"team": "technical"}}]
        obs, reward, terminated, _, info = env.step(json.dumps(batch))
        messages = json.loads(obs["messages"])
        assert [(m["role"], m["tool_call_id"]) for m in messages] == [
            ("tool", "a"), ("tool", "call_1_1")]
        assert "1124" in obs["text"] and "daniel.kim" in obs["text"]
        assert info["tool_calls"] == 2 and reward == 0.0 and not terminated

        assistant = {"role": "assistant", "content": None, "tool_calls": [
            openai_call("submit_final_answer", {"answer": "done"}, "z")]}
        obs, reward, terminated, _, info = env.step(assistant)  # a dict, not text
        assert terminated and info["submitted_answer"] == "done"
        assert json.loads(obs["messages"])[0]["tool_call_id"] == "z"


def test_model_text_is_one_turn_with_replayable_ids(local_fleet: LocalFleet) -> None:
    # What a trainer samples from an open model: Hermes/Qwen tool calls in free text.
    text = ("<think>Look at the ticket, then the agents.</think>Checking.\n"
            '<tool_call>{"name": "get_ticket", "arguments": {"ticket_id": 1124}}</tool_call>\n'
            '<tool_call>{"name": "list_agents", "arguments": {"team": "technical"}}</tool_call>')
    with FleetGymEnv(TASK, max_steps=2, **settings(local_fleet)) as env:
        env.reset()
        obs, reward, terminated, truncated, info = env.step(text)
        messages = json.loads(obs["messages"])
        assert [(m["role"], m["tool_call_id"]) for m in messages] == [
            ("tool", "call_1_0"), ("tool", "call_1_1")]
        assert info["tool_calls"] == 2 and (reward, terminated, truncated) == (0.0, False, False)
        assert env.fleet_env.stats.turns == 1  # two calls, one step toward max_steps=2
        broken = '<tool_call>{"name": "get_ticket", "arguments": {</tool_call>'
        obs, reward, terminated, truncated, info = env.step(broken)
        assert "could not be read" in info["parse_error"] and not (terminated or truncated)
        assert env.fleet_env.stats.turns == 1 and env.fleet_env.stats.tool_calls == 2


@pytest.mark.parametrize("action", [
    "assign the ticket to Daniel",       # prose
    "42",                                # JSON, but no call
    "{}",
    "[]",
    '{"role": "assistant", "content": "I am done"}',
    '{"colour": "blue"}',
    '[{"name": "get_ticket", "arguments": {"ticket_id": 1124}}, 7]',  # one bad item
    "[" * 100_000,                       # deeper than json's recursion limit
])
def test_an_action_with_no_tool_call_is_an_observation_not_an_error(
        local_fleet: LocalFleet, action: str) -> None:
    with FleetGymEnv(TASK, **settings(local_fleet)) as env:
        env.reset()
        instance = env.fleet_env.instance_id
        obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert info["parse_error"] and info["parse_errors"] == 1
        assert obs["text"].startswith("Error: ") and '"name"' in obs["text"]
        assert json.loads(obs["messages"])[0]["role"] == "user"
        # Nothing of a bad action ran, not even the good call beside a bad one.
        assert local_fleet.tool_call_counts(instance) == {}
        assert env.fleet_env.stats.turns == 0
        # The episode goes on.
        _, _, _, _, info = env.step(json.dumps({"name": "get_ticket",
                                                "arguments": {"ticket_id": 1124}}))
        assert info["parse_error"] is None and info["parse_errors"] == 1
        assert local_fleet.tool_call_counts(instance) == {"get_ticket": 1}


def test_an_unknown_grade_pays_unknown_reward_and_is_counted(local_fleet: LocalFleet) -> None:
    task = TASK.replace(verifier=None)
    with FleetGymEnv(task, unknown_reward=-1.0, **settings(local_fleet)) as env:
        for episode in (1, 2):
            env.reset()
            _, reward, terminated, _, info = env.step({"done": True})
            assert type(reward) is float and reward == -1.0 and terminated
            assert info["reward_unknown"] is True
            assert info["reward_status"] == "unknown"
            assert info["reward_reason"] == "no_verifier"
            assert env.unknown_rewards == episode


@pytest.mark.parametrize("bad", [math.nan, math.inf, "0", True, None])
def test_unknown_reward_must_be_a_finite_float(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="unknown_reward"):
        FleetGymEnv(TASK, unknown_reward=bad)


def test_a_sync_vector_env_batches_fleet_envs(local_fleet: LocalFleet) -> None:
    envs = gymnasium.vector.SyncVectorEnv(
        [lambda: FleetGymEnv(TASK, **settings(local_fleet)) for _ in range(2)])
    try:
        obs, _ = envs.reset(seed=1)
        assert obs["prompt"] == (TASK.prompt, TASK.prompt)
        call = json.dumps({"name": "get_ticket", "arguments": {"ticket_id": 1124}})
        obs, reward, terminated, truncated, info = envs.step((call, '{"done": true}'))
        assert "1124" in obs["text"][0]
        assert reward.tolist() == [0.0, 0.0] and terminated.tolist() == [False, True]
        assert truncated.tolist() == [False, False]
        assert info["_reward_unknown"].tolist() == [False, True]
        assert info["reward_unknown"].tolist()[1] is False  # graded: a real 0.0
    finally:
        envs.close()
    ids = [e.fleet_env.last_instance_id for e in envs.envs]
    assert all(ids) and not {i["instance_id"] for i in local_fleet.instances(
        status="running")} & set(ids)
