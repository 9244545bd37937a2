"""The parallel rollout runner against the session's LocalFleet: real sockets, real episodes."""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from _support.waiting import poll_until, wait_for

from fleetenv import bundled_tasks_path
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.errors import ConfigurationError, EpisodeStateError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import PolicyContext, Reply, ScriptedPolicy
from fleetenv.rollouts.policy_spec import PolicySpec
from fleetenv.rollouts.progress import Progress, format_duration
from fleetenv.rollouts.runner import Runner

pytestmark = pytest.mark.timeout(60)

REFERENCE = ScriptedPolicy.reference()

#: The key behaviours hold in both in-process modes (tests/test_runner_asyncio.py has
#: what is particular to the asyncio mode).
MODES = pytest.mark.parametrize("mode", ["threads", "asyncio"])


def _config(fleet: LocalFleet, **settings: Any) -> FleetConfig:
    return resolve_config(api_key=fleet.token, base_url=fleet.base_url, **settings)


def _tasks() -> list[Task]:
    return load_tasks(bundled_tasks_path())


def _tool_use_tasks(count: int) -> list[Task]:
    return [t for t in _tasks() if t.modality == "tool_use"][:count]


def _running_with_tag(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances(status="running") if i.get("run_id") == tag]


def _created_with_tag(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances() if i.get("run_id") == tag]


def _held_tool_calls(faults: Any) -> int:
    return sum(int(f.get("hits") or 0) for f in faults.list() if f["kind"] == "tool_hang")


def exit_worker_on_first_task(context: PolicyContext) -> Reply:
    """Module-level (so it pickles): kills its worker process on one task."""
    if context.task.key == os.environ.get("FLEETENV_TEST_KILL_TASK"):
        os._exit(3)
    return REFERENCE.act(context)


@MODES
def test_threads_run_every_bundled_task_and_yield_as_they_finish(
        local_fleet: LocalFleet, mode: str) -> None:
    # How fast such a batch runs is measured in tests/benchmarks/bench_runner_batch.py.
    tasks = _tasks()
    slow = tasks[0].key
    gate = threading.Event()

    def policy(context: PolicyContext) -> Reply:
        # The first task's episode waits until run() has yielded some other result: if
        # run() yielded in submission order this would never happen (then it fails).
        if context.task.key == slow and context.turn == 0 and not gate.wait(timeout=15):
            raise RuntimeError("run() did not yield a finished result while one was slow")
        return REFERENCE.act(context)

    bus = EventBus(sinks=[])
    order: list[str] = []
    with Runner(workers=8, mode=mode, config=_config(local_fleet), events=bus,
                progress=False) as runner:
        for result in runner.run(tasks, policy):
            order.append(result.task_key)
            gate.set()
            assert result.error is None, result.error
            assert result.reward == 1.0, (result.task_key, result.grade_status)
            assert result.stop_reason == "agent_done"
            assert result.instance_id and result.timings["total_s"] > 0
    assert sorted(order) == sorted(t.key for t in tasks)
    assert order[0] != slow
    report = bus.report()
    assert report.balanced, report
    assert report.started == report.completed == len(tasks)
    assert report.by_reason == {"agent_done": len(tasks)}
    assert _running_with_tag(local_fleet, runner.run_tag) == []


def test_process_pool_workers_use_the_parents_local_fleet(local_fleet: LocalFleet) -> None:
    tasks = _tool_use_tasks(3)
    bus = EventBus(sinks=[])
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    try:
        with Runner(workers=2, executor=pool, config=_config(local_fleet), events=bus,
                    progress=False) as runner:
            results = list(runner.run(tasks, PolicySpec("reference")))
            with pytest.raises(ConfigurationError, match="cannot be sent to a worker process"):
                runner.submit(tasks[0], lambda context: REFERENCE.act(context))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    assert sorted(r.task_key for r in results) == sorted(t.key for t in tasks)
    assert [r.reward for r in results] == [1.0, 1.0, 1.0], [r.error for r in results]
    assert {r.policy for r in results} == {"reference"}
    # The workers' events were re-emitted on the runner's bus.
    report = bus.report()
    assert report.balanced and report.started == report.completed == 3, report
    assert len(_created_with_tag(local_fleet, runner.run_tag)) == 3
    assert _running_with_tag(local_fleet, runner.run_tag) == []


def test_a_dead_worker_process_is_an_error_result_and_its_instance_is_swept(
        local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = _tool_use_tasks(3)
    monkeypatch.setenv("FLEETENV_TEST_KILL_TASK", tasks[0].key)  # inherited by spawn workers
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        with Runner(workers=1, executor=pool, config=_config(local_fleet),
                    events=EventBus(sinks=[]), progress=False) as runner:
            results = {r.task_key: r for r in runner.run(tasks, exit_worker_on_first_task)}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    assert sorted(results) == sorted(t.key for t in tasks)  # the batch went on
    killed = results[tasks[0].key]
    assert killed.error is not None and killed.error["type"] == "RolloutWorkerError"
    assert "BrokenProcessPool" in killed.error["message"]
    assert killed.reward is None and killed.stop_reason == "error"
    # The dead worker had provisioned an instance; close() swept it by the run's tag.
    assert len(_created_with_tag(local_fleet, runner.run_tag)) >= 1
    assert _running_with_tag(local_fleet, runner.run_tag) == []


UNCLOSED_PROCESS_DRIVER_SCRIPT = textwrap.dedent("""
    import os, sys
    from fleetenv.core.config import resolve_config
    from fleetenv.core.task_files import load_tasks
    from fleetenv import bundled_tasks_path
    from fleetenv.rollouts.runner import Runner

    config = resolve_config(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                            run_tag=os.environ["T_TAG"])
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"][:2]
    runner = Runner(workers=2, mode="processes", config=config, progress=False)
    futures = [runner.submit(task, "reference") for task in tasks]
    print("RUNNING", flush=True)
    sys.stdin.readline()
""")


def test_sigterm_to_an_unclosed_process_runner_deletes_its_workers_instances(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    # Before, the driver's exit cleanup only knew its own instances: its worker
    # processes' instances ran on while their calls hung, until their TTL at worst.
    local_faults.add("tool_hang")
    tag = f"test-unclosed-processes-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url, T_TAG=tag)
    child = subprocess.Popen([sys.executable, "-c", UNCLOSED_PROCESS_DRIVER_SCRIPT], env=env,
                             text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("RUNNING")
        wait_for(lambda: _held_tool_calls(local_faults) >= 2, 60, "2 held tool calls")
        assert len(_running_with_tag(local_fleet, tag)) == 2
        child.send_signal(signal.SIGTERM)  # to the driver only, as a job scheduler might
        assert poll_until(lambda: not _running_with_tag(local_fleet, tag), 20), \
            _running_with_tag(local_fleet, tag)
    finally:
        local_faults.clear()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)


@MODES
def test_a_policy_that_raises_fails_only_its_own_rollouts(local_fleet: LocalFleet,
                                                          mode: str) -> None:
    tasks = _tool_use_tasks(4)
    broken = tasks[1].key

    def policy(context: PolicyContext) -> Reply:
        if context.task.key == broken:
            raise ValueError("the model server answered nonsense")
        return REFERENCE.act(context)

    bus = EventBus(sinks=[])
    with Runner(workers=4, mode=mode, config=_config(local_fleet), events=bus,
                progress=False) as runner:
        results = list(runner.run(tasks, policy, samples_per_task=2))
    assert len(results) == 8
    failed = [r for r in results if r.task_key == broken]
    assert sorted(r.sample for r in failed) == [0, 1]
    for result in failed:
        assert result.error == {"type": "ValueError",
                                "message": "the model server answered nonsense"}
        assert result.reward is None and result.stop_reason == "error"
    assert all(r.reward == 1.0 for r in results if r.task_key != broken)
    assert bus.report().balanced
    assert _running_with_tag(local_fleet, runner.run_tag) == []


@MODES
def test_provisioning_failures_are_error_results_and_the_batch_goes_on(
        local_fleet: LocalFleet, local_faults: Any, mode: str) -> None:
    tasks = _tool_use_tasks(5)
    unknown = tasks[0].model_copy(update={"key": "no-such-env-task", "env_key": "no-such-env"})
    local_faults.add("create_error", status=400, message="Environment 'x' not found", times=2)
    with Runner(workers=3, mode=mode, config=_config(local_fleet),
                events=EventBus(sinks=[]), progress=False) as runner:
        results = list(runner.run([unknown, *tasks], REFERENCE))
    assert len(results) == 6
    errors = [r for r in results if r.error is not None]
    assert {r.error["type"] for r in errors} == {"PermanentProvisioningError"}
    # Exactly the two injected failures say 'x'; the unknown env fails whichever way.
    assert sum("Environment 'x' not found" in r.error["message"] for r in errors) == 2
    assert any(r.task_key == unknown.key for r in errors)
    assert all(r.reward == 1.0 for r in results if r.error is None)
    assert len(results) - len(errors) >= 3


@MODES
def test_cancel_closes_live_episodes_and_leaves_no_instance(
        local_fleet: LocalFleet, local_faults: Any, mode: str) -> None:
    local_faults.add("tool_hang")
    tasks = _tool_use_tasks(6)
    bus = EventBus(sinks=[])
    runner = Runner(workers=3, max_in_flight=5, mode=mode, config=_config(local_fleet),
                    events=bus, progress=False)
    results: list[Any] = []
    consumer = threading.Thread(target=lambda: results.extend(runner.run(tasks, REFERENCE)))
    consumer.start()
    try:
        wait_for(lambda: _held_tool_calls(local_faults) >= 3, 15, "3 held tool calls")
        cancelled_at = time.monotonic()
        runner.cancel()
        runner.cancel()  # idempotent
        consumer.join(timeout=20)
        assert not consumer.is_alive(), "run() did not end after cancel()"
        took = time.monotonic() - cancelled_at
    finally:
        runner.close(timeout_s=20)
    # A hang bound, not a speed claim: run() ends well under a second after cancel();
    # 10 s only catches a cancel that waits for the held calls or some timeout to run out.
    assert took < 10
    # Five were submitted (three running, two queued); nothing new starts after cancel().
    assert len(results) == 5
    assert all(r.stop_reason == "cancelled" and r.reward is None for r in results)
    queued = [r for r in results if "before this rollout started" in r.error["message"]]
    assert len(queued) == 2 and {r.error["type"] for r in queued} == {"RolloutCancelled"}
    assert bus.report().balanced and bus.report().started == 3
    assert len(_created_with_tag(local_fleet, runner.run_tag)) == 3
    assert _running_with_tag(local_fleet, runner.run_tag) == []
    with pytest.raises(EpisodeStateError, match="closed"):
        runner.submit(tasks[0], REFERENCE)


CTRL_C_SCRIPT = textwrap.dedent("""
    import os
    from fleetenv.core.config import resolve_config
    from fleetenv.core.task_files import load_tasks
    from fleetenv import bundled_tasks_path
    from fleetenv.rollouts.runner import Runner

    config = resolve_config(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                            run_tag=os.environ["T_TAG"])
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"][:8]
    with Runner(workers=4, mode=os.environ["T_MODE"], config=config, progress=False) as runner:
        print("RUNNING", flush=True)
        for result in runner.run(tasks, "reference"):
            print("RESULT", result.task_key, flush=True)
    print("UNREACHABLE", flush=True)
""")


@MODES
def test_ctrl_c_during_a_run_leaves_no_live_instance(local_fleet: LocalFleet,
                                                      local_faults: Any, mode: str) -> None:
    local_faults.add("tool_hang")
    tag = f"test-ctrl-c-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url, T_TAG=tag,
               T_MODE=mode)
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("RUNNING"), (line, child.stderr.read() if child.stderr else "")
        wait_for(lambda: _held_tool_calls(local_faults) >= 2, 20, "2 held tool calls")
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
    assert "UNREACHABLE" not in out
    assert "KeyboardInterrupt" in err, err[-2000:]
    assert len(_created_with_tag(local_fleet, tag)) >= 2
    assert _running_with_tag(local_fleet, tag) == []


@MODES
def test_runner_checks_its_arguments_and_policies(local_fleet: LocalFleet, mode: str) -> None:
    with pytest.raises(ConfigurationError, match="workers"):
        Runner(workers=0, config=_config(local_fleet))
    with Runner(workers=1, mode=mode, config=_config(local_fleet), progress=False) as runner:
        assert runner.run_tag.startswith("fleetenv-")
        with pytest.raises(ConfigurationError, match="unknown policy kind"):
            runner.run(_tasks()[:1], "no-such-kind")
        with pytest.raises(ConfigurationError, match="as a policy"):
            runner.submit(_tasks()[0], 42)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="samples_per_task"):
            runner.run(_tasks()[:1], REFERENCE, samples_per_task=0)
        future = runner.submit(_tasks()[0], "reference", sample=3)
        result = future.result(timeout=20)
    assert (result.sample, result.reward, result.policy) == (3, 1.0, "reference")


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class _BrokenTTY(_TTY):
    def write(self, text: str) -> int:
        raise OSError("stderr is gone")


def test_progress_draws_one_throttled_line_on_a_tty() -> None:
    stream = _TTY()
    bar = Progress(total=4, stream=stream)
    assert bar.enabled
    bar.started()
    bar.started()
    bar.finished(failed=False, reward=1.0)
    for _ in range(500):  # a burst of updates draws at most a frame or two, not 500
        bar.tick()
    bar.finished(failed=True, reward=None)
    line = bar.line()
    assert line.startswith("rollouts 2/4 | failed 1 | running 0 | pass 100% | elapsed 0s")
    assert "eta" in line
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") <= 4 and text.endswith("\n") and "\n" not in text[:-1]
    assert format_duration(42) == "42s" and format_duration(185) == "3m05s"
    assert format_duration(7380) == "2h03m"


def test_progress_is_silent_off_a_tty_and_never_raises() -> None:
    quiet = io.StringIO()
    bar = Progress(total=1, stream=quiet)
    bar.started()
    bar.finished(failed=False, reward=1.0)
    bar.close()
    assert not bar.enabled and quiet.getvalue() == ""
    broken = Progress(stream=_BrokenTTY())
    broken.started()  # the write fails: the bar turns itself off
    broken.tick(force=True)
    broken.close()
    assert not broken.enabled and broken.done == 0 and broken.running == 1


def test_local_mode_points_every_worker_at_the_parents_embedded_fleet() -> None:
    from fleetenv.fleet.backend import local_fleet

    # A spawned worker process would start an embedded Fleet of its own unless the runner
    # points it at this process's one: the instance must show up here.
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    with pool, Runner(workers=1, executor=pool, config=resolve_config(environ={}),
                      events=EventBus(sinks=[]), progress=False) as runner:
        embedded = local_fleet()
        assert embedded.token not in repr(runner) and embedded.token not in repr(runner.config)
        (result,) = list(runner.run(_tool_use_tasks(1), "reference"))
    assert result.reward == 1.0, result.error
    assert _created_with_tag(embedded, runner.run_tag) == [result.instance_id]
