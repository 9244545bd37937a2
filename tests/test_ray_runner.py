"""RayRunner on a real local Ray cluster (2 CPUs) against the session's LocalFleet.

One Ray cluster for the module (starting one costs seconds); every test makes its own
runner, whose worker actors are real Ray worker processes talking to the LocalFleet over
loopback, exactly as they would to Fleet.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
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
from fleetenv.rollouts.ray_runner import LiveInstanceCap
from fleetenv.rollouts.runner import Runner

ray = pytest.importorskip("ray")

from fleetenv.rollouts.ray_runner import RayRunner  # noqa: E402

pytestmark = pytest.mark.timeout(180)

REFERENCE = ScriptedPolicy.reference()


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _config(fleet: LocalFleet, **settings: Any) -> FleetConfig:
    return resolve_config(api_key=fleet.token, base_url=fleet.base_url, **settings)


def _tool_use_tasks(count: int) -> list[Task]:
    return [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"][:count]


def _running_with_tags(fleet: LocalFleet, tags: list[str]) -> list[str]:
    return [i["instance_id"] for i in fleet.instances(status="running")
            if i.get("run_id") in tags]


def _created_with_tags(fleet: LocalFleet, tags: list[str]) -> list[str]:
    return [i["instance_id"] for i in fleet.instances() if i.get("run_id") in tags]


def _held_tool_calls(faults: Any) -> int:
    return sum(int(f.get("hits") or 0) for f in faults.list() if f["kind"] == "tool_hang")


def test_ray_gives_the_same_results_as_the_thread_runner(local_fleet: LocalFleet) -> None:
    tasks = _tool_use_tasks(4)
    with Runner(workers=4, config=_config(local_fleet), events=EventBus(sinks=[]),
                progress=False) as local:
        expected = {(r.task_key, r.sample): (r.reward, r.stop_reason, r.tool_calls)
                    for r in local.run(tasks, REFERENCE, samples_per_task=2)}
    bus = EventBus(sinks=[])
    with RayRunner(workers=2, per_worker=2, config=_config(local_fleet), events=bus,
                   progress=False) as runner:
        pids = runner.worker_pids()
        results = list(runner.run(tasks, REFERENCE, samples_per_task=2))
    got = {(r.task_key, r.sample): (r.reward, r.stop_reason, r.tool_calls) for r in results}
    assert got == expected, [r.error for r in results if r.error]
    assert all(reward == 1.0 for reward, _, _ in got.values())
    # Two worker processes, neither of them this one.
    assert len(set(pids)) == 2 and os.getpid() not in pids
    # The workers' events came back and were re-emitted on the runner's bus.
    report = bus.report()
    assert report.balanced and report.started == report.completed == 8, report
    # Every instance carried a worker's tag, and none is left running.
    assert len(runner.run_tags) == 2
    assert all(tag.startswith(runner.run_tag) for tag in runner.run_tags)
    assert len(_created_with_tags(local_fleet, runner.run_tags)) == 8
    assert _running_with_tags(local_fleet, runner.run_tags) == []


def test_cancel_stops_every_worker_and_deletes_every_instance(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("tool_hang")
    tasks = _tool_use_tasks(6)
    runner = RayRunner(workers=2, per_worker=2, config=_config(local_fleet),
                       events=EventBus(sinks=[]), progress=False)
    results: list[Any] = []
    consumer = threading.Thread(target=lambda: results.extend(runner.run(tasks, REFERENCE)))
    consumer.start()
    try:
        # Four episodes (two per worker) hold a tool call each.
        wait_for(lambda: _held_tool_calls(local_faults) >= 4, 60, "4 held tool calls")
        runner.cancel()
        runner.cancel()  # idempotent
        consumer.join(timeout=60)
        assert not consumer.is_alive(), "run() did not end after cancel()"
        # Deleted by cancel() itself, before close().
        assert _running_with_tags(local_fleet, runner.run_tags) == []
    finally:
        runner.close(timeout_s=30)
    assert len(results) == 4  # nothing new started after cancel()
    assert all(r.stop_reason == "cancelled" and r.reward is None for r in results), \
        [(r.stop_reason, r.error) for r in results]
    assert len(_created_with_tags(local_fleet, runner.run_tags)) == 4
    assert _running_with_tags(local_fleet, runner.run_tags) == []
    with pytest.raises(EpisodeStateError, match="closed"):
        runner.submit(tasks[0], REFERENCE)


def test_a_killed_worker_is_an_error_result_and_leaks_no_instance(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("tool_hang")
    tasks = _tool_use_tasks(4)
    runner = RayRunner(workers=2, per_worker=1, config=_config(local_fleet),
                       events=EventBus(sinks=[]), progress=False)
    results: list[Any] = []
    consumer = threading.Thread(target=lambda: results.extend(runner.run(tasks, REFERENCE)))
    try:
        doomed_pid = runner.worker_pids()[0]
        doomed_tag = runner.run_tags[0]
        consumer.start()
        wait_for(lambda: _held_tool_calls(local_faults) >= 2, 60, "2 held tool calls")
        assert len(_running_with_tags(local_fleet, [doomed_tag])) == 1
        os.kill(doomed_pid, signal.SIGKILL)  # what the OOM killer or a lost node does
        # The dead worker's instance is deleted while the run goes on.
        wait_for(lambda: not _running_with_tags(local_fleet, [doomed_tag]), 60,
                 "the dead worker's instance deleted")
        local_faults.clear()  # the surviving episode's tool call returns
        consumer.join(timeout=90)
        assert not consumer.is_alive(), "run() did not end"
    finally:
        runner.close(timeout_s=30)
        local_faults.clear()
    assert sorted(r.task_key for r in results) == sorted(t.key for t in tasks)
    failed = [r for r in results if r.error is not None]
    assert len(failed) == 1, [r.error for r in results]
    assert failed[0].error["type"] == "RolloutWorkerError"
    assert "Ray worker 0" in failed[0].error["message"]
    assert failed[0].reward is None and failed[0].stop_reason == "error"
    # The batch went on, on the survivor and a replacement worker.
    assert all(r.reward == 1.0 for r in results if r.error is None)
    assert len(runner.run_tags) == 3
    assert _running_with_tags(local_fleet, runner.run_tags) == []


CTRL_C_SCRIPT = textwrap.dedent("""
    import os
    import ray
    from fleetenv.core.config import resolve_config
    from fleetenv.core.task_files import load_tasks
    from fleetenv import bundled_tasks_path
    from fleetenv.rollouts.ray_runner import RayRunner

    ray.init(address=os.environ["T_RAY"], log_to_driver=False)
    config = resolve_config(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                            run_tag=os.environ["T_TAG"])
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"][:6]
    with RayRunner(workers=2, per_worker=2, config=config, progress=False) as runner:
        print("RUNNING", flush=True)
        for result in runner.run(tasks, "reference"):
            print("RESULT", result.task_key, flush=True)
    print("UNREACHABLE", flush=True)
""")


def test_ctrl_c_in_the_driver_deletes_the_instances_of_every_worker(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("tool_hang")
    tag = f"test-ray-ctrl-c-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url, T_TAG=tag,
               T_RAY=ray.get_runtime_context().gcs_address)
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    mine = [f"{tag}-w0", f"{tag}-w1"]
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("RUNNING"), (line, child.stderr.read() if child.stderr else "")
        wait_for(lambda: _held_tool_calls(local_faults) >= 4, 60, "4 held tool calls")
        assert len(_running_with_tags(local_fleet, mine)) == 4  # two on each worker
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
    assert "UNREACHABLE" not in out
    assert "KeyboardInterrupt" in err, err[-2000:]
    assert len(_created_with_tags(local_fleet, mine)) == 4
    assert _running_with_tags(local_fleet, mine) == []


# A driver without `with`: its training loop (the readline) gets SIGTERM, or fails.
UNCLOSED_DRIVER_SCRIPT = textwrap.dedent("""
    import os, sys
    import ray
    from fleetenv.core.config import resolve_config
    from fleetenv.core.task_files import load_tasks
    from fleetenv import bundled_tasks_path
    from fleetenv.rollouts.ray_runner import RayRunner

    ray.init(address=os.environ["T_RAY"], log_to_driver=False)
    config = resolve_config(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                            run_tag=os.environ["T_TAG"])
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"][:4]
    runner = RayRunner(workers=2, per_worker=2, config=config, progress=False)
    futures = [runner.submit(task, "reference") for task in tasks]
    print("RUNNING", flush=True)
    sys.stdin.readline()
    raise RuntimeError("the training step failed")
""")


@pytest.mark.parametrize("how", ["sigterm", "exception"])
def test_a_driver_that_dies_without_close_deletes_the_instances_of_every_worker(
        local_fleet: LocalFleet, local_faults: Any, how: str) -> None:
    # Before, Ray ended the workers with the driver and nothing swept their tags: their
    # instances ran on until their TTL (a `with RayRunner(...)` block was clean).
    local_faults.add("tool_hang")
    tag = f"test-ray-unclosed-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url, T_TAG=tag,
               T_RAY=ray.get_runtime_context().gcs_address)
    child = subprocess.Popen([sys.executable, "-c", UNCLOSED_DRIVER_SCRIPT], env=env,
                             text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    mine = [f"{tag}-w0", f"{tag}-w1"]
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line.startswith("RUNNING"), (line, child.stderr.read() if child.stderr else "")
        wait_for(lambda: _held_tool_calls(local_faults) >= 4, 60, "4 held tool calls")
        assert len(_running_with_tags(local_fleet, mine)) == 4  # two on each worker
        if how == "sigterm":
            child.send_signal(signal.SIGTERM)
        else:
            child.stdin.write("\n")
            child.stdin.flush()
        _, err = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
    if how == "sigterm":  # ray.init's own handler, which fleetenv's calls: sys.exit(15)
        assert child.returncode == signal.SIGTERM, err[-2000:]
    else:
        assert child.returncode == 1 and "the training step failed" in err, err[-2000:]
    assert len(_created_with_tags(local_fleet, mine)) == 4
    assert poll_until(lambda: not _running_with_tags(local_fleet, mine), 30), err[-2000:]


class _HoldsALock:
    """A policy that cannot cross a process boundary (locks do not pickle)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def act(self, context: PolicyContext) -> Reply:
        return REFERENCE.act(context)


def test_bad_arguments_and_unsendable_policies_are_clear_errors(
        local_fleet: LocalFleet) -> None:
    with pytest.raises(ConfigurationError, match="per_worker must be at least 1"):
        RayRunner(per_worker=0, config=_config(local_fleet))
    with RayRunner(workers=1, per_worker=1, config=_config(local_fleet),
                   progress=False) as runner:
        with pytest.raises(ConfigurationError, match="cannot be sent to a Ray worker"):
            runner.run(_tool_use_tasks(1), _HoldsALock())
        with pytest.raises(ConfigurationError, match="as a policy"):
            runner.submit(_tool_use_tasks(1)[0], 42)  # type: ignore[arg-type]
        # A closure is fine: Ray ships it by value.
        marker = "closure"
        future = runner.submit(_tool_use_tasks(1)[0],
                               lambda context: REFERENCE.act(context) if marker else None)
        assert future.result(timeout=60).reward == 1.0


def test_the_cluster_wide_cap_bounds_live_instances_across_workers(
        local_fleet: LocalFleet) -> None:
    tasks = _tool_use_tasks(4)
    with RayRunner(workers=2, per_worker=2, max_live_instances=1,
                   config=_config(local_fleet), events=EventBus(sinks=[]),
                   progress=False) as runner:
        results = list(runner.run(tasks, REFERENCE))
    assert [r.reward for r in results] == [1.0] * 4, [r.error for r in results]
    # Four episodes on two workers with room for four, yet never two instances at once.
    spans = sorted((i["created_at"], i["terminated_at"]) for i in local_fleet.instances()
                   if i.get("run_id") in runner.run_tags)
    assert len(spans) == 4 and all(end is not None for _, end in spans)
    assert all(spans[k][1] <= spans[k + 1][0] for k in range(3)), spans


def test_the_cluster_wide_cap_is_a_shared_semaphore() -> None:
    cap = ray.remote(LiveInstanceCap).options(name="test-cap", namespace="fleetenv",
                                              get_if_exists=True).remote(2)
    same = ray.remote(LiveInstanceCap).options(name="test-cap", namespace="fleetenv",
                                               get_if_exists=True).remote(99)
    try:
        assert ray.get(same.limit.remote(), timeout=30) == 2  # the first one's
        assert ray.get(cap.acquire.remote("a:1", 0.0), timeout=30)
        assert ray.get(same.acquire.remote("b:1", 0.0), timeout=30)
        assert not ray.get(cap.acquire.remote("a:2", 0.2), timeout=30)  # full
        waiting = cap.acquire.remote("a:2", 30.0)
        ray.get(same.release.remote("b:1"), timeout=30)
        assert ray.get(waiting, timeout=30)  # woken by the release
        ray.get(cap.release.remote("b:1"), timeout=30)  # idempotent
        assert ray.get(cap.release_prefix.remote("a:"), timeout=30) == 2
        assert ray.get(cap.held.remote(), timeout=30) == 0
    finally:
        ray.kill(cap)
    with pytest.raises(ValueError, match="at least 1"):
        LiveInstanceCap(0)


def test_local_mode_workers_use_the_drivers_embedded_fleet() -> None:
    from fleetenv.fleet.backend import local_fleet

    # Without a key each worker process would start an embedded Fleet of its own unless
    # the runner points it at this process's one: the instance must show up here.
    # warm_pool=1: the worker keeps its instance and resets it for the next episode.
    with RayRunner(workers=1, per_worker=1, config=resolve_config(environ={}),
                   events=EventBus(sinks=[]), progress=False, warm_pool=1) as runner:
        embedded = local_fleet()
        assert embedded.token not in repr(runner)
        results = list(runner.run(_tool_use_tasks(1), "reference", samples_per_task=2))
        (instance_id,) = {r.instance_id for r in results}
        assert _running_with_tags(embedded, runner.run_tags) == [instance_id]
    assert [r.reward for r in results] == [1.0, 1.0], [r.error for r in results]
    assert _created_with_tags(embedded, runner.run_tags) == [instance_id]
    assert _running_with_tags(embedded, runner.run_tags) == []


def test_ray_has_the_runners_async_twins_and_trace_upload(local_fleet: LocalFleet) -> None:
    # Before, RayRunner had its own copy of the Runner's loop: no submit_async, no
    # run_async, futures that asyncio could not await, and no traces=.
    task = _tool_use_tasks(1)[0]
    name = f"test-ray-traces-{uuid.uuid4().hex[:8]}"

    async def main(runner: RayRunner) -> list[Any]:
        future = await runner.submit_async(task, REFERENCE)
        streamed = [r async for r in runner.run_async([task], REFERENCE)]
        return [await future, *streamed]

    with RayRunner(workers=1, per_worker=2, config=_config(local_fleet),
                   events=EventBus(sinks=[]), progress=False, traces=name) as runner:
        results = asyncio.run(main(runner))
    assert [r.reward for r in results] == [1.0, 1.0], [r.error for r in results]
    report = runner.trace_report()
    assert report is not None and report.ok and report.uploaded == 2, report
    assert set(report.session_ids) == {r.rollout_id for r in results}
