"""The SkyRL adapter, made by ``skyrl_gym.make`` and driven the way SkyRL's generator
drives envs: one env per trajectory, sync ``init`` / ``step`` / ``close`` from a thread
pool, many trajectories at once, on the local Fleet, with scripted model texts in the
Hermes ``<tool_call>`` format. The Fleet account comes from the environment variables a
SkyRL user exports, so every env shares the default session as it would in training."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")
omegaconf = pytest.importorskip("omegaconf")

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

import fleetenv  # noqa: E402
from fleetenv import bundled_tasks_path  # noqa: E402
from fleetenv.adapters.skyrl import (  # noqa: E402
    ENV_ID,
    FleetTextEnv,
    dataset_row,
    shared_session,
)
from fleetenv.core.config import ENV_API_KEY, ENV_BASE_URL  # noqa: E402
from fleetenv.core.errors import ConfigurationError, FleetEnvError  # noqa: E402
from fleetenv.fleet.session import Session  # noqa: E402
from fleetenv.local import LocalFleet  # noqa: E402

pytestmark = pytest.mark.timeout(240)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
#: Tool-use tasks graded by their verifier alone (no LLM judge), with a reference solution.
SOLVABLE = [t for t in TASKS.values()
            if t.modality == "tool_use" and t.reference_solution
            and "judge" not in t.key][:12]


@pytest.fixture
def fleet_from_env(local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch
                   ) -> Iterator[LocalFleet]:
    """What a SkyRL user does: export the Fleet key and URL; every env then runs on the
    default session (re-created here from these variables, closed afterwards)."""
    monkeypatch.setenv(ENV_API_KEY, local_fleet.token)
    monkeypatch.setenv(ENV_BASE_URL, local_fleet.base_url)
    Session.shared().close()
    yield local_fleet
    Session.shared().close()


def hermes(*calls: tuple[str, dict[str, Any]]) -> str:
    """A model turn the way Qwen / Hermes models write it."""
    return "I will call the tools.\n" + "\n".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
        for n, a in calls)


def scripted_turns(task: fleetenv.Task, *, broken_first: bool) -> list[str]:
    """What a model that knows the reference solution writes: two calls per turn, an
    optional unreadable call first, and a closing answer if the solution does not end
    with ``submit_final_answer``."""
    calls = [(c.name, dict(c.arguments or {})) for c in task.reference_solution or []]
    turns = ['<tool_call>{"name": "list_orders", "arguments": {</tool_call>'] \
        if broken_first else []
    turns += [hermes(*calls[i:i + 2]) for i in range(0, len(calls), 2)]
    if calls[-1][0] != "submit_final_answer":
        turns.append("All done: the task is complete.")
    return turns


def generator_config(**options: Any) -> Any:
    """``env_config`` as SkyRL's generator passes it: the ``skyrl_gym.fleetenv`` section
    of its Hydra config, an OmegaConf ``DictConfig``."""
    return omegaconf.OmegaConf.create({"tool_call_format": "hermes", **options})


def trajectory(task: fleetenv.Task, broken_first: bool) -> dict[str, Any]:
    """SkyRL's ``agent_loop``: make, init, step until done, get_metrics, close."""
    row = dataset_row(task)
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    extras["max_turns"] = 10  # the generator sets this on every row
    env = skyrl_gym.make(row["env_class"], env_config=generator_config(), extras=extras)
    chat, init_metadata = env.init(row["prompt"])
    outputs = []
    for text in scripted_turns(task, broken_first=broken_first):
        out = env.step(text)
        outputs.append(out)
        if out["done"]:
            break
    metrics = env.get_metrics()
    env.close()
    env.close()  # idempotent
    return {"env": env, "chat": chat, "init": init_metadata, "outputs": outputs,
            "metrics": metrics}


def test_many_threads_solve_bundled_tasks_through_skyrl_gym_make(
        fleet_from_env: LocalFleet) -> None:
    assert len(SOLVABLE) >= 8
    jobs = [(task, index % 2 == 0) for index, task in enumerate(SOLVABLE)]
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="skyrl-gym-env-") as pool:
        results = list(pool.map(lambda job: trajectory(*job), jobs))

    instance_ids = set()
    for (task, broken_first), result in zip(jobs, results, strict=True):
        env, outputs = result["env"], result["outputs"]
        assert isinstance(env, FleetTextEnv) and isinstance(env, BaseTextEnv)
        assert env.spec.id == ENV_ID
        # init: the tools in the system message, the dataset's user prompt kept.
        chat = result["chat"]
        assert [m["role"] for m in chat] == ["system", "user"]
        assert "<tools>" in chat[0]["content"] and "<tool_call>" in chat[0]["content"]
        assert chat[1]["content"] == task.prompt
        assert result["init"]["task_key"] == task.key
        instance_ids.add(result["init"]["instance_id"])
        # Every step but the last pays 0.0; the last pays the grade.
        assert [o["done"] for o in outputs] == [False] * (len(outputs) - 1) + [True]
        assert [o["reward"] for o in outputs] == [0.0] * (len(outputs) - 1) + [1.0], (
            task.key, outputs[-1]["metadata"])
        assert outputs[-1]["metadata"]["stop_reason"] == "agent_done"
        assert outputs[-1]["metadata"]["reward_unknown"] is False
        assert outputs[-1]["observations"] == []
        for out in outputs[:-1]:
            assert out["observations"], "a turn that goes on shows the model something"
            assert out["postprocessed_action"] is None
        if broken_first:  # the unreadable call was an observation, not an exception
            first = outputs[0]
            assert first["metadata"]["parse_error"]
            assert [m["role"] for m in first["observations"]] == ["user"]
            assert "could not be read" in first["observations"][0]["content"]
        for out in outputs[:-1]:
            if not out["metadata"]["parse_error"]:  # one tool message per call, as text
                tool_messages = out["observations"]
                assert {m["role"] for m in tool_messages} == {"tool"}
                assert len(tool_messages) == out["metadata"]["tool_calls"]
                assert all(isinstance(m["content"], str) for m in tool_messages)
                assert all(m["tool_call_id"] for m in tool_messages)
        metrics = result["metrics"]
        assert metrics["parse_errors"] == (1 if broken_first else 0)
        assert metrics["tool_errors"] == 0 and metrics["reward_unknown"] is False
        assert metrics["tool_calls"] == len(task.reference_solution or []) - (
            1 if (task.reference_solution or [])[-1].name == "submit_final_answer" else 0)
    assert len(instance_ids) == len(jobs)  # one instance per trajectory
    running = {i["instance_id"] for i in fleet_from_env.instances(status="running")}
    assert not instance_ids & running, "close() left instances running"
    summary = FleetTextEnv.aggregate_metrics([r["metrics"] for r in results])
    assert summary["reward_unknown"] == 0.0 and summary["turns"] >= 2


def test_unknown_grade_pays_the_configured_reward_and_is_counted(
        fleet_from_env: LocalFleet) -> None:
    task = TASKS["shop-count-shipped"].model_dump()
    task.update(key="shop-count-shipped-no-verifier", verifier=None, verifier_id=None)
    env = skyrl_gym.make(ENV_ID, env_config=generator_config(unknown_reward=-0.5),
                         extras={"task": task, "max_turns": 4})
    try:
        env.init([])
        out = env.step(hermes(("submit_final_answer", {"answer": "3"})))
        assert out["done"] and out["reward"] == -0.5
        assert out["metadata"]["reward_unknown"] is True
        assert out["metadata"]["reward_status"] == "unknown"
        assert env.get_metrics()["reward_unknown"] is True
    finally:
        env.close()


def test_max_turns_cuts_and_grades_the_episode(fleet_from_env: LocalFleet) -> None:
    task = TASKS["helpdesk-assign-api-ticket"]
    env = skyrl_gym.make(ENV_ID, env_config=generator_config(),
                         extras={"task_key": task.key, "max_turns": 2})
    try:
        chat, _ = env.init(None)
        # No prompt from the dataset: the task prompt is the user message.
        assert [m["role"] for m in chat] == ["system", "user"]
        assert chat[1]["content"] == task.prompt
        first = env.step(hermes(("list_agents", {})))
        assert not first["done"] and first["reward"] == 0.0
        second = env.step(hermes(("list_agents", {})))
        assert second["done"] and second["metadata"]["stop_reason"] == "max_steps"
        assert second["reward"] == 0.0 and second["metadata"]["reward_unknown"] is False
        assert env.max_turns == 2
    finally:
        env.close()


def test_an_episode_skyrl_abandons_is_graded_and_deleted_on_close(
        fleet_from_env: LocalFleet) -> None:
    task = TASKS["shop-create-summer-coupon"]
    call = task.reference_solution[0]  # type: ignore[index]
    env = skyrl_gym.make(ENV_ID, env_config=generator_config(),
                         extras={"task_key": task.key})
    _, metadata = env.init([{"role": "user", "content": task.prompt}])
    out = env.step(hermes((call.name, dict(call.arguments or {}))))
    assert not out["done"]
    env.close()  # SkyRL stops at its context length and closes
    assert env.fleet_env.grade is not None and env.fleet_env.reward == 1.0
    running = {i["instance_id"] for i in fleet_from_env.instances(status="running")}
    assert metadata["instance_id"] not in running
    env.close()


def test_close_without_init_and_an_init_that_fails_leave_nothing(
        fleet_from_env: LocalFleet, local_faults: Any) -> None:
    unused = skyrl_gym.make(ENV_ID, env_config={}, extras={"task_key": "shop-count-shipped"})
    unused.close()
    unused.close()

    before = {i["instance_id"] for i in fleet_from_env.instances()}
    local_faults.add("http_error", route="*/mcp*", status=403, message="no MCP for you")
    env = skyrl_gym.make(ENV_ID, env_config={"episode_deadline_s": 30},
                         extras={"task_key": "shop-count-shipped"})
    with pytest.raises(FleetEnvError):
        env.init([])
    local_faults.clear()
    created = {i["instance_id"] for i in fleet_from_env.instances()} - before
    assert created, "the fault was meant to hit after the instance was created"
    running = {i["instance_id"] for i in fleet_from_env.instances(status="running")}
    assert not created & running, "an init that raised left its instance running"
    env.close()  # SkyRL would not, but it is still fine


def test_prompt_shapes_roles_and_images(fleet_from_env: LocalFleet) -> None:
    task = TASKS["shop-count-shipped"]
    env = skyrl_gym.make(
        ENV_ID, env_config=generator_config(observation_role="user",
                                            system_prompt="You run a shop."),
        extras={"task_key": task.key})
    try:
        chat, _ = env.init([{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Count the shipped orders."}])
        assert [m["role"] for m in chat] == ["system", "user"]
        assert chat[0]["content"].startswith("Be brief.\n\nYou run a shop.\n\n# Tools")
        out = env.step(hermes(("list_orders", {"status": "shipped"}),
                              ("list_orders", {"status": "paid"})))
        assert [m["role"] for m in out["observations"]] == ["user", "user"]
        assert all("tool_call_id" not in m for m in out["observations"])
        assert env.chat_history[-3]["role"] == "assistant"
    finally:
        env.close()


def test_bad_settings_are_refused_with_a_way_out(local_fleet: LocalFleet) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown fleetenv SkyRL option.*max_turn"):
        skyrl_gym.make(ENV_ID, env_config={"max_turn": 3}, extras={"task_key": "x"})
    with pytest.raises(ConfigurationError, match="FLEET_API_KEY") as caught:
        skyrl_gym.make(ENV_ID, env_config={"api_key": "sk-very-secret"},
                       extras={"task_key": "shop-count-shipped"})
    assert "sk-very-secret" not in str(caught.value)
    with pytest.raises(ConfigurationError, match="did you mean 'shop-count-shipped'"):
        skyrl_gym.make(ENV_ID, env_config={}, extras={"task_key": "shop-count-shiped"})
    with pytest.raises(ConfigurationError, match="needs a task"):
        skyrl_gym.make(ENV_ID, env_config={}, extras={"reward_spec": {}})
    with pytest.raises(ConfigurationError, match="tool_call_format"):
        skyrl_gym.make(ENV_ID, env_config={"tool_call_format": "xml"},
                       extras={"task_key": "shop-count-shipped"})
    with pytest.raises(ConfigurationError, match="unknown_reward"):
        skyrl_gym.make(ENV_ID, env_config={"unknown_reward": float("nan")},
                       extras={"task_key": "shop-count-shipped"})
    with pytest.raises(ConfigurationError, match="max_turns"):
        skyrl_gym.make(ENV_ID, env_config={}, extras={"task_key": "shop-count-shipped",
                                                       "max_turns": 0})


def test_task_keys_are_looked_up_in_the_configured_file(tmp_path: Any,
                                                        fleet_from_env: LocalFleet) -> None:
    task = TASKS["shop-count-shipped"].model_dump(mode="json")
    task["key"] = "my-own-task"
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task) + "\n", encoding="utf-8")
    env = skyrl_gym.make(ENV_ID, env_config=generator_config(tasks_file=str(path)),
                         extras={"task_key": "my-own-task", "reward_spec": {"x": 1}})
    assert env.task.key == "my-own-task"
    env.close()
    with pytest.raises(ConfigurationError, match="no task 'shop-count-shipped' in"):
        skyrl_gym.make(ENV_ID, env_config={"tasks_file": str(path)},
                       extras={"task_key": "shop-count-shipped"})


def _shared_session_in_child(settings: dict[str, Any], out: Any) -> None:
    try:
        shared_session(settings).provisioner  # noqa: B018 - the access is the test
    except FleetEnvError as exc:
        out.put(str(exc))
    else:
        out.put("usable")


def test_a_forked_env_process_gets_its_own_shared_session(
        fleet_from_env: LocalFleet) -> None:
    settings = {"max_live_instances": 3}
    parent = shared_session(settings)
    with parent:
        parent.provisioner  # noqa: B018 - build the backend in the parent first
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        child = context.Process(target=_shared_session_in_child, args=(settings, out))
        child.start()
        message = out.get(timeout=30)
        child.join(timeout=30)
    assert message == "usable"


def test_settings_give_every_env_one_shared_session_with_its_caps(
        fleet_from_env: LocalFleet) -> None:
    config = generator_config(settings={"max_live_instances": 2})  # nested, as in Hydra
    envs = [skyrl_gym.make(ENV_ID, env_config=config, extras={"task_key": key})
            for key in ("shop-count-shipped", "helpdesk-busiest-agent")]
    session = envs[0].fleet_env.session
    try:
        assert envs[1].fleet_env.session is session
        assert session.config.max_live_instances == 2
        assert session.config.base_url == fleet_from_env.base_url  # from FLEET_BASE_URL
        with ThreadPoolExecutor(max_workers=2) as pool:
            chats = list(pool.map(lambda env: env.init([])[0], envs))
        assert all(chat[-1]["role"] == "user" for chat in chats)
        assert session.live.in_use == 2
    finally:
        for env in envs:
            env.close()
        session.close()
    with pytest.raises(ConfigurationError, match="settings does not take 'api_key'"):
        skyrl_gym.make(ENV_ID, env_config={"settings": {"api_key": "sk-x"}},
                       extras={"task_key": "shop-count-shipped"})
    with pytest.raises(ConfigurationError, match="max_live_instance"):
        skyrl_gym.make(ENV_ID, env_config={"settings": {"max_live_instance": 2}},
                       extras={"task_key": "shop-count-shipped"})


def test_verifiers_that_read_the_conversation_grade_the_chat(
        fleet_from_env: LocalFleet) -> None:
    """Only the model's turns say the ticket is resolved (the final answer does not):
    the grade is 1.0 only if the verifier got the chat."""
    task = TASKS["helpdesk-judge-tell-customer"]
    calls = [(c.name, dict(c.arguments or {})) for c in task.reference_solution or []
             if c.name != "submit_final_answer"]
    env = skyrl_gym.make(ENV_ID, env_config=generator_config(),
                         extras={"task_key": task.key, "max_turns": 4})
    try:
        env.init([{"role": "user", "content": task.prompt}])
        out = env.step("Good news: ticket 1080 is resolved now.\n" + hermes(*calls))
        assert not out["done"] and out["metadata"]["tool_error"] is None
        out = env.step("Done.")
        assert out["done"] and out["reward"] == 1.0, env.fleet_env.grade
    finally:
        env.close()
