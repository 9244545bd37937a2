"""The Tinker adapter, driven by tinker-cookbook's own ``do_group_rollout`` on the local Fleet.

No model and no model hub: the tokenizer is a tiny byte-level BPE trained here and saved
as a Hugging Face tokenizer directory (the cookbook loads local directories offline),
the renderer is the cookbook's real ``qwen3_instruct``, and the "model" is a scripted
``TokenCompleter`` answering with tokens the renderer itself produced (Hermes/Qwen
``<tool_call>`` blocks), so the renderer's ``parse_response`` reads them as a model's.

These tests need tinker-cookbook (Python >= 3.11, torch): ``.ci/tinker`` builds that
virtualenv and runs them; elsewhere they skip, except the import-error test.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetenv
from fleetenv import EpisodeOptions, bundled_tasks_path
from fleetenv.local import LocalFleet

HAVE_COOKBOOK = importlib.util.find_spec("tinker_cookbook") is not None
if os.environ.get("FLEETENV_REQUIRE_TINKER") and not HAVE_COOKBOOK:  # .ci/tinker: no skips
    raise RuntimeError("FLEETENV_REQUIRE_TINKER is set but tinker_cookbook is not importable")
needs_cookbook = pytest.mark.skipif(not HAVE_COOKBOOK,
                                    reason="tinker-cookbook is not installed (.ci/tinker)")

pytestmark = pytest.mark.timeout(180)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
TASK = TASKS["helpdesk-assign-api-ticket"]  # three calls; the verifier checks all three


def test_importing_without_tinker_cookbook_says_what_to_install() -> None:
    code = ("import sys; sys.modules['tinker_cookbook'] = None\n"
            "try:\n    import fleetenv.adapters.tinker\n"
            "except ImportError as exc:\n    print('ImportError:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ImportError:" in proc.stdout
    assert "pip install 'fleetenv[tinker]'" in proc.stdout
    assert "Python >= 3.11" in proc.stdout


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fleetenv.adapters.tinker.testing import offline_tokenizer

    return offline_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def fleet(local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFleet]:
    """The local Fleet as a Tinker worker sees it: the key in the environment, never in
    the (pickled) builder; and no instance left running afterwards."""
    monkeypatch.setenv("FLEET_API_KEY", local_fleet.token)
    local_fleet.faults.clear()
    before = running(local_fleet)
    yield local_fleet
    local_fleet.faults.clear()
    assert running(local_fleet) - before == set(), "an instance leaked"


def running(fleet: LocalFleet) -> set[str]:
    return {i["instance_id"] for i in fleet.instances(status="running")}


def builder_for(fleet: LocalFleet, model_dir: str, **options: Any) -> Any:
    from fleetenv.adapters.tinker import FleetEnvGroupBuilder

    settings: dict[str, Any] = {"group_size": 1, "model_name": model_dir,
                                "renderer_name": "qwen3_instruct",
                                "base_url": fleet.base_url}
    settings.update(options)
    return FleetEnvGroupBuilder(options.pop("task", TASK), **settings)


Turn = tuple[Any, str]  # (a message to render, or raw tokens; the sampler's stop reason)
Script = Callable[[Any, int, str], Turn]

if HAVE_COOKBOOK:
    from tinker_cookbook.completers import TokensWithLogprobs

    from fleetenv.adapters.tinker.testing import ReferencePolicy, render_turn

    class ScriptedPolicy(ReferencePolicy):  # type: ignore[misc]
        """A TokenCompleter saying ``script(policy, turn, prompt)``: a message (rendered
        by the renderer) or raw tokens, with the sampler's stop reason. Records the turn
        of every call."""

        def __init__(self, renderer: Any, script: Script) -> None:
            super().__init__(renderer, list(TASKS.values()))
            self.script = script
            self.turns: list[int] = []

        async def __call__(self, model_input: Any, stop: Any, *,
                           max_tokens: int | None = None) -> Any:
            await asyncio.sleep(0)
            prompt = self.decode(model_input)
            turn = self.turn_of(prompt)
            self.turns.append(turn)
            said, stop_reason = self.script(self, turn, prompt)
            tokens = said if isinstance(said, list) else render_turn(self.renderer, said)
            return TokensWithLogprobs(tokens=tokens, maybe_logprobs=[-0.1] * len(tokens),
                                      stop_reason=stop_reason)


def reference_then(after: Callable[[Any, str], Turn]) -> Script:
    """The task's reference calls, one per turn; then whatever ``after`` says."""
    def script(policy: Any, turn: int, prompt: str) -> Turn:
        solution = policy.task_of(prompt).reference_solution or []
        if turn < len(solution):
            return policy.next_message(prompt), "stop"
        return after(policy, prompt)
    return script


def final_answer(policy: Any, prompt: str) -> Turn:
    return {"role": "assistant", "content": "Done."}, "stop"


def rollout(builder: Any, policy: Any) -> Any:
    from tinker_cookbook.rl.rollouts import do_group_rollout

    return asyncio.run(do_group_rollout(builder, policy))


def text_tokens(policy: Any, text: str, *, stop_token: bool) -> list[int]:
    tokenizer = policy.renderer.tokenizer
    tokens: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return tokens + ([policy.renderer._end_message_token] if stop_token else [])


# ---------------------------------------------------------------- a group, for real

@needs_cookbook
def test_a_group_of_four_solves_the_task_through_do_group_rollout(
        fleet: LocalFleet, model_dir: str) -> None:
    from fleetenv.adapters.tinker import session_for

    builder = pickle.loads(pickle.dumps(builder_for(fleet, model_dir, group_size=4)))
    policy = ScriptedPolicy(builder.renderer(), reference_then(final_answer))
    events: list[Any] = []
    bus = session_for(fleet.base_url).events
    bus.add_sink(events.append)
    try:
        group = rollout(builder, policy)
    finally:
        bus.remove_sink(events.append)

    assert group.get_total_rewards() == [1.0, 1.0, 1.0, 1.0]
    assert group.rollout_errors == []
    # Provisioned at once: all four episodes started before any tool call was made.
    kinds = [type(event).__name__ for event in events]
    assert kinds.count("RolloutStarted") == 4
    assert max(i for i, k in enumerate(kinds) if k == "RolloutStarted") < kinds.index(
        "ToolCallFinished")
    solution = TASK.reference_solution or []
    instances = set()
    for trajectory in group.trajectories_G:
        assert trajectory.stop_reason == "completed"
        assert len(trajectory.transitions) == len(solution) + 1
        first, last = trajectory.transitions[0], trajectory.transitions[-1]
        assert first.reward == 0.0 and not first.episode_done
        assert first.metrics["fleet/turn_tool_calls"] == 1
        assert first.metrics["fleet/turn_tool_errors"] == 0
        assert first.metrics["fleet/tool_latency_s"] > 0
        assert last.episode_done and last.reward == 1.0
        assert last.metrics["stop/completed"] == 1.0
        assert last.metrics["fleet/provision_s"] > 0
        assert last.metrics["fleet/tool_calls"] == len(solution)
        assert last.metrics["fleet/tool_errors"] == 0
        assert last.metrics["fleet/reward_unknown"] == 0
        assert last.metrics["fleet/graded"] == 1
        assert "SUCCESS_ACCUMULATOR" in str(last.logs["fleet/verifier_stdout"])
        assert last.logs["fleet/grade_status"] == "graded"
        assert last.logs["fleet/task_key"] == TASK.key
        instances.add(last.logs["fleet/instance_id"])
        # The tool results reached the model: the next prompt holds them.
        assert trajectory.transitions[1].ob.length > first.ob.length
    assert len(instances) == 4
    assert builder.logging_tags()[:2] == ["fleet", TASK.env_key]
    # Each episode released its instance when it ended; cleanup has nothing left, twice.
    asyncio.run(builder.cleanup())
    asyncio.run(builder.cleanup())


@needs_cookbook
def test_groups_share_one_session_whose_caps_hold(fleet: LocalFleet, model_dir: str) -> None:
    from fleetenv.adapters.tinker import session_for

    settings = {"max_creating_instances": 1, "max_live_instances": 2}
    builders = [builder_for(fleet, model_dir, group_size=2, fleet_settings=settings)
                for _ in range(2)]
    before = running(fleet)
    live: list[int] = []
    script = reference_then(final_answer)

    def counting(policy: Any, turn: int, prompt: str) -> Turn:
        live.append(len(running(fleet) - before))  # instances up while this one plays
        return script(policy, turn, prompt)

    policy = ScriptedPolicy(builders[0].renderer(), counting)
    session = session_for(fleet.base_url, settings)
    assert session.config.max_live_instances == 2 and session is not session_for(
        fleet.base_url)

    async def two_groups() -> list[Any]:
        from tinker_cookbook.rl.rollouts import do_group_rollout

        return list(await asyncio.gather(*(do_group_rollout(b, policy) for b in builders)))

    groups = asyncio.run(two_groups())
    assert [g.get_total_rewards() for g in groups] == [[1.0, 1.0], [1.0, 1.0]]
    assert 1 <= max(live) <= 2  # four episodes, never more than two instances at once


@needs_cookbook
def test_a_truncated_generation_is_still_graded(fleet: LocalFleet, model_dir: str) -> None:
    """The agent made every call, then its final answer ran out of tokens: nothing from
    the cut turn runs, and the episode is graded on the state it left (solved: 1.0)."""
    builder = builder_for(fleet, model_dir)
    policy = ScriptedPolicy(builder.renderer(), reference_then(
        lambda policy, prompt: (text_tokens(policy, "The ticket is assigned and I",
                                            stop_token=False), "length")))

    group = rollout(builder, policy)

    [trajectory] = group.trajectories_G
    last = trajectory.transitions[-1]
    assert trajectory.stop_reason == "max_tokens"
    assert last.metrics["stop/max_tokens"] == 1.0 and last.metrics["max_tokens_reached"] == 1.0
    assert last.reward == 1.0 and last.metrics["fleet/graded"] == 1
    assert "SUCCESS_ACCUMULATOR" in str(last.logs["fleet/verifier_stdout"])
    assert last.logs["fleet/stop_reason"] == "abandoned"


@needs_cookbook
def test_a_truncated_generation_early_is_graded_as_unsolved(
        fleet: LocalFleet, model_dir: str) -> None:
    builder = builder_for(fleet, model_dir, failed_parse_reward=-1.0)
    policy = ScriptedPolicy(builder.renderer(), lambda policy, turn, prompt: (
        text_tokens(policy, '<tool_call>\n{"name": "get_ti', stop_token=False), "length"))

    [trajectory] = rollout(builder, policy).trajectories_G

    last = trajectory.transitions[-1]
    assert trajectory.stop_reason == "max_tokens"
    assert last.reward == 0.0  # the grade, not failed_parse_reward
    assert last.metrics["fleet/graded"] == 1 and last.metrics["fleet/tool_calls"] == 0
    assert "ERROR_ACCUMULATOR" in str(last.logs["fleet/verifier_stdout"])


@needs_cookbook
def test_an_unreadable_tool_call_pays_failed_parse_reward(
        fleet: LocalFleet, model_dir: str) -> None:
    builder = builder_for(fleet, model_dir, failed_parse_reward=-0.5)
    policy = ScriptedPolicy(builder.renderer(), lambda policy, turn, prompt: (
        text_tokens(policy, '<tool_call>\n{"name": "get_ticket", "arguments": {ticket}\n'
                            '</tool_call>', stop_token=True), "stop"))

    [trajectory] = rollout(builder, policy).trajectories_G

    [only] = trajectory.transitions
    assert trajectory.stop_reason == "parse_error"
    assert only.reward == -0.5 and only.episode_done
    assert only.metrics["parse_error"] == 1.0 and only.metrics["stop/parse_error"] == 1.0
    assert only.metrics["fleet/parse_errors"] == 1  # fleetenv counted the turn
    assert only.metrics["fleet/tool_calls"] == 0
    assert only.metrics["fleet/graded"] == 0 and only.metrics["fleet/reward_unknown"] == 0


@needs_cookbook
def test_after_an_unreadable_call_the_agent_can_go_on(
        fleet: LocalFleet, model_dir: str) -> None:
    """terminate_on_parse_error=False: the agent reads the error and retries; the turn
    pays failed_parse_reward and the episode its grade."""
    builder = builder_for(fleet, model_dir, failed_parse_reward=-0.25,
                          terminate_on_parse_error=False)
    broken = '<tool_call>\n{"name": "get_ticket", "arguments": [1124\n</tool_call>'

    def script(policy: Any, turn: int, prompt: str) -> Turn:
        if turn == 0:
            return text_tokens(policy, broken, stop_token=True), "stop"
        assert "could not be read" in prompt  # the error went back to the model
        solution = policy.task_of(prompt).reference_solution
        if turn - 1 < len(solution):
            return reference_message(policy, solution[turn - 1]), "stop"
        return final_answer(policy, prompt)

    group = rollout(builder, ScriptedPolicy(builder.renderer(), script))

    [trajectory] = group.trajectories_G
    rewards = [t.reward for t in trajectory.transitions]
    assert rewards[0] == -0.25 and rewards[-1] == 1.0
    assert group.get_total_rewards() == [0.75]
    assert trajectory.transitions[0].metrics["parse_error"] == 1.0
    assert trajectory.transitions[-1].metrics["fleet/parse_errors"] == 1
    assert trajectory.stop_reason == "completed"


def reference_message(policy: Any, call: Any) -> dict[str, Any]:
    from tinker_cookbook.renderers import ToolCall

    return {"role": "assistant", "content": "", "tool_calls": [ToolCall(
        function=ToolCall.FunctionBody(name=call.name, arguments=json.dumps(call.arguments)))]}


@needs_cookbook
def test_a_turn_without_its_stop_token_is_a_parse_error(
        fleet: LocalFleet, model_dir: str) -> None:
    builder = builder_for(fleet, model_dir, failed_parse_reward=-1.0)
    policy = ScriptedPolicy(builder.renderer(), lambda policy, turn, prompt: (
        text_tokens(policy, "I am done", stop_token=False), "stop"))

    [trajectory] = rollout(builder, policy).trajectories_G

    assert trajectory.stop_reason == "parse_error"
    assert trajectory.transitions[-1].reward == -1.0


@needs_cookbook
def test_an_unknown_grade_pays_the_configured_reward(
        fleet: LocalFleet, model_dir: str) -> None:
    fleet.faults.add("verifier_crash", times=1)
    builder = builder_for(fleet, model_dir, unknown_reward=0.25)
    policy = ScriptedPolicy(builder.renderer(), reference_then(final_answer))

    [trajectory] = rollout(builder, policy).trajectories_G

    last = trajectory.transitions[-1]
    assert last.reward == 0.25
    assert last.metrics["fleet/reward_unknown"] == 1 and last.metrics["fleet/graded"] == 0
    assert last.logs["fleet/grade_status"] == "unknown"
    assert last.logs["fleet/grade_reason"] == "verifier_error"
    assert trajectory.stop_reason == "completed"


@needs_cookbook
def test_tool_errors_are_counted_per_turn_and_per_episode(
        fleet: LocalFleet, model_dir: str) -> None:
    fleet.faults.add("tool_error", tool="get_ticket", message="ticket service down", times=1)
    builder = builder_for(fleet, model_dir)
    policy = ScriptedPolicy(builder.renderer(), reference_then(final_answer))

    [trajectory] = rollout(builder, policy).trajectories_G

    first, last = trajectory.transitions[0], trajectory.transitions[-1]
    assert first.metrics["fleet/turn_tool_errors"] == 1
    assert trajectory.transitions[1].metrics["fleet/turn_tool_errors"] == 0
    assert last.metrics["fleet/tool_errors"] == 1
    assert last.reward == 1.0  # a failed read does not stop the task being solved
    assert "ticket service down" in policy.decode(trajectory.transitions[1].ob)


@needs_cookbook
def test_a_conversation_over_its_token_budget_ends_graded(
        fleet: LocalFleet, model_dir: str) -> None:
    builder = builder_for(fleet, model_dir, max_trajectory_tokens=1)
    policy = ScriptedPolicy(builder.renderer(), reference_then(final_answer))

    [trajectory] = rollout(builder, policy).trajectories_G

    [only] = trajectory.transitions  # the first reply already outgrew the budget
    assert trajectory.stop_reason == "context_overflow"
    assert only.metrics["context_overflow"] == 1.0 and only.metrics["fleet/tool_calls"] == 1
    assert only.metrics["fleet/graded"] == 1 and only.reward == 0.0  # one call of three


# ---------------------------------------------------------------- cleanup, pickling

@needs_cookbook
def test_cleanup_closes_unfinished_episodes_once_and_within_its_bound(
        fleet: LocalFleet, model_dir: str) -> None:
    builder = builder_for(fleet, model_dir, group_size=3, cleanup_timeout_s=30.0)
    before = running(fleet)

    async def start_two_and_abandon() -> list[Any]:
        envs = list(await builder.make_envs())
        await asyncio.gather(*(env.initial_observation() for env in envs[:2]))
        assert len(running(fleet) - before) == 2  # the third was never started
        await builder.cleanup()
        await builder.cleanup()  # idempotent
        return envs

    envs = asyncio.run(start_two_and_abandon())
    assert running(fleet) - before == set()
    assert all(env.fleet_env.instance_id is None for env in envs)
    assert all(env.fleet_env.grade is None for env in envs)  # not graded: the group failed


@needs_cookbook
def test_cleanup_returns_within_its_bound_when_deleting_hangs(
        fleet: LocalFleet, model_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    builder = builder_for(fleet, model_dir, cleanup_timeout_s=1.0)
    before = running(fleet)

    async def start_then_clean_up_while_deletes_hang() -> str:
        [env] = await builder.make_envs()
        await env.initial_observation()
        fleet.faults.add("http_hang", method="DELETE")
        await builder.cleanup()  # returns: the bound, not the hang, decides
        return str(env.fleet_env.last_instance_id)

    instance = asyncio.run(start_then_clean_up_while_deletes_hang())
    assert f"instances {instance} are deleted by the session at exit" in caplog.text
    fleet.faults.clear()  # the hung requests go on, and the deletion completes
    wait_for(lambda: running(fleet) - before == set(), what="the instance to be deleted")


def wait_for(condition: Callable[[], bool], *, what: str, timeout: float = 90.0) -> None:
    """Poll ``condition`` with backoff until it holds (a deadline, not a sleep)."""
    import time

    deadline = time.monotonic() + timeout
    delay = 0.05
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


@needs_cookbook
def test_builders_pickle_without_their_live_parts(fleet: LocalFleet, model_dir: str) -> None:
    builder = builder_for(fleet, model_dir, group_size=2, unknown_reward=0.5,
                          env_options={"max_steps": 7})
    envs = asyncio.run(builder.make_envs())
    try:
        copy = pickle.loads(pickle.dumps(builder))
        assert copy.task == builder.task and copy.group_size == 2
        assert copy.unknown_reward == 0.5 and copy.env_options == EpisodeOptions(max_steps=7)
        assert copy._envs == [] and copy._renderer is None
        assert fleet.token not in pickle.dumps(builder).decode("latin-1")
        assert envs[0].fleet_env.options.max_steps == 7
    finally:
        asyncio.run(builder.cleanup())


@needs_cookbook
def test_bad_builder_settings_say_what_to_fix(model_dir: str) -> None:
    from fleetenv.adapters.tinker import FleetEnvGroupBuilder
    from fleetenv.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="group_size"):
        FleetEnvGroupBuilder(TASK, group_size=0, model_name=model_dir)
    with pytest.raises(ConfigurationError, match="max_stpes"):
        FleetEnvGroupBuilder(TASK, group_size=1, model_name=model_dir,
                             env_options={"max_stpes": 3})
    with pytest.raises(ConfigurationError, match="failed_parse_reward"):
        FleetEnvGroupBuilder(TASK, group_size=1, model_name=model_dir,
                             failed_parse_reward=float("nan"))


@needs_cookbook
def test_the_dataset_builder_makes_batches_of_group_builders(
        fleet: LocalFleet, model_dir: str) -> None:
    import chz
    from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder

    from fleetenv.adapters.tinker import FleetEnvGroupBuilder, FleetRLDatasetBuilder

    keys = [t.key for t in TASKS.values() if t.modality == "tool_use"][:5]
    config = FleetRLDatasetBuilder(batch_size=2, group_size=3, model_name=model_dir,
                                   renderer_name="qwen3_instruct", task_keys=keys,
                                   test_task_keys=keys[:1], n_epochs=2,
                                   base_url=fleet.base_url, max_live_instances=4)
    assert isinstance(config, RLDatasetBuilder) and chz.is_chz(config)
    train, test = asyncio.run(config())
    assert isinstance(train, RLDataset) and test is not None
    assert len(train) == 4  # 4 train tasks, 2 per batch, 2 epochs
    first_epoch = [b.task.key for i in range(2) for b in train.get_batch(i)]
    second_epoch = [b.task.key for i in range(2, 4) for b in train.get_batch(i)]
    assert sorted(first_epoch) == sorted(second_epoch) == sorted(keys[1:])
    batch = train.get_batch(0)
    assert all(isinstance(b, FleetEnvGroupBuilder) and isinstance(b, EnvGroupBuilder)
               for b in batch)
    assert batch[0].group_size == 3 and test.get_batch(0)[0].group_size == 1
    assert batch[0].fleet_settings == {"max_live_instances": 4}
    assert [b.task.key for b in test.get_batch(0)] == keys[:1]
    assert pickle.loads(pickle.dumps(train)).get_batch(0)[0].task == batch[0].task
    with pytest.raises(IndexError):
        train.get_batch(4)


@needs_cookbook
def test_the_dataset_builder_names_a_missing_task_key(model_dir: str) -> None:
    from fleetenv.adapters.tinker import FleetRLDatasetBuilder
    from fleetenv.core.errors import ConfigurationError

    config = FleetRLDatasetBuilder(batch_size=1, group_size=1, model_name=model_dir,
                                   task_keys=["no-such-task"])
    with pytest.raises(ConfigurationError, match="no-such-task"):
        asyncio.run(config())


@needs_cookbook
def test_the_example_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "tinker_env.py"
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLEET_API_KEY", "FLEET_BASE_URL")}
    proc = subprocess.run([sys.executable, str(example)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "tinker_env: group rewards [1.0, 1.0, 1.0, 1.0]" in proc.stdout
