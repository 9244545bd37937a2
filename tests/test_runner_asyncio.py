"""The Runner's asyncio mode, awaitable futures and ``run_episode_async``, against the
session's LocalFleet (real sockets, real MCP sessions, real episodes).

The behaviours both in-process modes share are parametrized over the mode in
test_rollouts_runner.py; here is what is particular to running episodes on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from typing import Any

import anyio
import pytest
from _support.waiting import wait_for

from fleetenv import bundled_tasks_path
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event, RolloutCompleted, VerificationFinished
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.core.types import Done, RolloutResult, ToolCall
from fleetenv.local import LocalFleet
from fleetenv.rollouts.futures import AwaitableFuture
from fleetenv.rollouts.policy import PolicyContext, Reply, ScriptedPolicy
from fleetenv.rollouts.rollout import run_episode, run_episode_async
from fleetenv.rollouts.runner import Runner
from fleetenv.runtime import LOOP_THREAD_NAME

pytestmark = pytest.mark.timeout(90)

REFERENCE = ScriptedPolicy.reference()


def _config(fleet: LocalFleet, **settings: Any) -> FleetConfig:
    return resolve_config(api_key=fleet.token, base_url=fleet.base_url, **settings)


def _tool_use_tasks(count: int) -> list[Task]:
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"]
    return tasks[:count]


def _running_with_tag(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances(status="running")
            if i.get("run_id") == tag]


def _created_with_tag(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances() if i.get("run_id") == tag]


def _held_tool_calls(faults: Any) -> int:
    return sum(int(f.get("hits") or 0) for f in faults.list() if f["kind"] == "tool_hang")


def _client_threads(before: set[int | None]) -> list[str]:
    """The threads started since ``before`` on fleetenv's client side (the LocalFleet's
    servers and verifier workers, in this process too, are not counted)."""
    return [t.name for t in threading.enumerate() if t.ident not in before
            and t.name.startswith("fleetenv-") and not t.name.startswith("fleetenv-local")
            and not t.name.startswith("fleetenv-verifier")]


def _comparable(result: RolloutResult) -> dict[str, Any]:
    """A result without what differs between any two runs (ids, times, the instance)."""
    data = result.to_dict()
    for name in ("rollout_id", "instance_id", "timings", "verifier_execution_id",
                 "verifier_stdout"):
        data.pop(name)
    for timing in data["tool_timings"]:  # the same calls and outcomes, not the seconds
        timing.pop("seconds")
    for message in data["transcript"]:
        message.pop("tool_call_id", None)
        for call in message.get("tool_calls") or []:
            call.pop("id", None)
    return data


def test_64_concurrent_episodes_run_on_a_few_threads_and_cancel_deletes_them_all(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    tasks = _tool_use_tasks(4) * 16
    runner = Runner(workers=64, mode="asyncio", config=_config(local_fleet),
                    events=EventBus(sinks=[]), progress=False)
    # Warm up: one-off threads of a process's first connections (SSL context, imports)
    # are not the episodes' threads.
    assert runner.submit(tasks[0], REFERENCE).result(timeout=30).reward == 1.0
    local_faults.add("tool_hang")  # from now on every episode holds in its first tool call
    before = {t.ident for t in threading.enumerate()}
    futures = [runner.submit(task, REFERENCE, sample=i) for i, task in enumerate(tasks)]
    peak: list[str] = []

    def all_held() -> bool:
        threads = _client_threads(before)
        if len(threads) > len(peak):
            peak[:] = threads
        return _held_tool_calls(local_faults) >= 64

    try:
        wait_for(all_held, 60, "64 episodes holding a tool call at once")
        # 64 episodes in flight; a thread per episode would be 64 "fleetenv-rollout"s.
        assert not [name for name in peak if name.startswith("fleetenv-rollout")], peak
        assert len(peak) <= 32, " ".join(sorted(peak))
        runner.cancel()
        _, not_done = concurrent.futures.wait(futures, timeout=30)
        assert not not_done
    finally:
        runner.close(timeout_s=30)
    results = [f.result() for f in futures]
    assert all(r.stop_reason == "cancelled" and r.reward is None for r in results), {
        (r.stop_reason, str(r.error)) for r in results}
    assert len(_created_with_tag(local_fleet, runner.run_tag)) == 65
    assert _running_with_tag(local_fleet, runner.run_tag) == []


def test_results_are_the_same_in_both_modes(local_fleet: LocalFleet) -> None:
    tasks = _tool_use_tasks(3)
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for mode in ("threads", "asyncio"):
        bus = EventBus(sinks=[])
        with Runner(workers=3, mode=mode, config=_config(local_fleet), events=bus,
                    progress=False) as runner:
            results = list(runner.run(tasks, "reference", samples_per_task=2))
        assert bus.report().balanced and bus.report().started == 6
        by_mode[mode] = sorted((_comparable(r) for r in results),
                               key=lambda d: (d["task_key"], d["sample"]))
    assert by_mode["threads"] == by_mode["asyncio"]
    assert all(r["reward"] == 1.0 and r["transcript"] for r in by_mode["asyncio"])


class AsyncReference:
    """An async policy object: replays the reference solution, noting where it ran."""

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def describe(self) -> str:
        return "async-reference"

    async def act(self, context: PolicyContext) -> Reply:
        await anyio.sleep(0)
        self.threads.add(threading.current_thread().name)
        return REFERENCE.act(context)


def test_async_policies_run_on_the_loop_in_auto_mode(local_fleet: LocalFleet) -> None:
    tasks = _tool_use_tasks(2)
    policy = AsyncReference()
    seen: set[str] = set()

    async def async_function(context: PolicyContext) -> Reply:
        seen.add(threading.current_thread().name)
        return REFERENCE.act(context)

    with Runner(workers=2, config=_config(local_fleet), events=EventBus(sinks=[]),
                progress=False) as runner:
        assert runner.mode == "auto"
        results = list(runner.run(tasks, policy)) + list(runner.run(tasks, async_function))
        with Runner(mode="threads", config=_config(local_fleet)) as threads, \
                pytest.raises(ConfigurationError, match="async policy"):
            threads.submit(tasks[0], policy)
    assert [r.reward for r in results] == [1.0] * 4, [r.error for r in results]
    assert policy.threads == seen == {LOOP_THREAD_NAME}
    assert {r.policy for r in results} == {"async-reference", "CallablePolicy"}


def test_submit_futures_are_awaitable_from_asyncio_and_trio(local_fleet: LocalFleet) -> None:
    tasks = _tool_use_tasks(2)
    with Runner(workers=2, config=_config(local_fleet), events=EventBus(sinks=[]),
                progress=False) as runner:

        async def main() -> list[RolloutResult]:
            futures = [runner.submit(task, "reference") for task in tasks]
            assert all(isinstance(f, AwaitableFuture) for f in futures)
            # Both slots (max_in_flight=2) are taken: this waits, without blocking the
            # loop, until one of the two rollouts finishes.
            later = await runner.submit_async(tasks[0], "reference", sample=1)
            # (the slot frees just before the future resolves: allow that instant)
            done, _ = concurrent.futures.wait(
                futures, timeout=5, return_when=concurrent.futures.FIRST_COMPLETED)
            assert done
            first = await futures[0]
            second = await futures[1].result_async(timeout=30)
            return [first, second, await later]

        from_asyncio = asyncio.run(main())
        from_trio = anyio.run(main, backend="trio")
        # ... and they are still concurrent.futures futures.
        plain = [runner.submit(task, "reference") for task in tasks]
        finished = list(concurrent.futures.as_completed(plain, timeout=30))
        assert set(finished) == set(plain)
    for result in [*from_asyncio, *from_trio, *(f.result() for f in plain)]:
        assert result.reward == 1.0, result.error


def test_run_async_yields_every_result_without_blocking_the_loop(
        local_fleet: LocalFleet) -> None:
    tasks = _tool_use_tasks(3)

    async def main() -> tuple[list[RolloutResult], int]:
        ticks = 0
        stop = anyio.Event()

        async def ticker() -> None:  # runs only if the loop stays free
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as group:
            group.start_soon(ticker)
            async with Runner(workers=2, max_in_flight=2, config=_config(local_fleet),
                              events=EventBus(sinks=[]), progress=False) as runner:
                results = [r async for r in runner.run_async(tasks, "reference",
                                                             samples_per_task=2)]
            stop.set()
        return results, ticks

    results, ticks = asyncio.run(main())
    assert sorted((r.task_key, r.sample) for r in results) == sorted(
        (t.key, s) for t in tasks for s in range(2))
    assert all(r.reward == 1.0 for r in results), [r.error for r in results]
    assert ticks > 5


def two_calls_first(context: PolicyContext) -> Reply:
    """The reference solution, with its first two calls in ONE reply."""
    solution = [ToolCall(c.name, dict(c.arguments)) for c in context.task.reference_solution]
    calls = [solution[:2], *([c] for c in solution[2:]), [Done()]]
    return Reply.from_actions(calls[context.turn])


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_reply_with_several_tool_calls_is_one_step(local_fleet: LocalFleet,
                                                     flavour: str) -> None:
    task = next(t for t in _tool_use_tasks(20) if len(t.reference_solution) >= 2)
    calls = len(task.reference_solution)
    options: dict[str, Any] = {"config": _config(local_fleet), "events": EventBus(sinks=[])}
    if flavour == "sync":
        capped = run_episode(task, two_calls_first, max_steps=1, **options)
        free = run_episode(task, two_calls_first, **options)
    else:
        capped = anyio.run(lambda: run_episode_async(task, two_calls_first, max_steps=1,
                                                     **options))
        free = asyncio.run(run_episode_async(task, two_calls_first, **options))
    # One reply of two calls is one step: both run, and max_steps=1 ends the episode.
    assert (capped.turns, capped.tool_calls, capped.stop_reason) == (1, 2, "max_steps")
    assert (free.turns, free.tool_calls, free.stop_reason) == (calls, calls, "agent_done")
    assert free.reward == 1.0, free.error
    for result, answered in ((capped, 2), (free, calls)):
        assert result.error is None, result.error
        roles = [m["role"] for m in result.transcript]
        assert roles.count("tool") == answered  # one tool message per call
        first = roles.index("assistant")
        assert roles[first:first + 3] == ["assistant", "tool", "tool"]


def test_run_episode_async_gives_run_episodes_result(local_fleet: LocalFleet) -> None:
    task = _tool_use_tasks(1)[0]
    options: dict[str, Any] = {"config": _config(local_fleet), "events": EventBus(sinks=[])}
    blocking = run_episode(task, REFERENCE, **options)
    awaited = anyio.run(lambda: run_episode_async(task, REFERENCE, **options),
                        backend="trio")
    assert blocking.reward == 1.0, blocking.error
    assert _comparable(awaited) == _comparable(blocking)


def test_modes_are_checked_where_they_are_given(local_fleet: LocalFleet) -> None:
    with pytest.raises(ConfigurationError, match="not a known mode"):
        Runner(mode="fibers", config=_config(local_fleet))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        with pytest.raises(ConfigurationError, match="takes no executor"):
            Runner(mode="asyncio", executor=pool, config=_config(local_fleet))
        with Runner(executor=pool, config=_config(local_fleet), progress=False) as runner:
            assert runner.mode == "threads"  # auto, for a thread pool
    finally:
        pool.shutdown()
    with Runner(mode="processes", workers=1, config=_config(local_fleet),
                progress=False) as runner:
        assert "processes" in repr(runner)
        with pytest.raises(ConfigurationError, match="cannot be sent to a worker process"):
            runner.submit(_tool_use_tasks(1)[0], lambda context: REFERENCE.act(context))


# ---------------------------------------------------------------- the episode loop, once


def test_run_episode_refuses_an_async_policy_with_a_clear_error(
        local_fleet: LocalFleet) -> None:
    # Before, the blocking episode called the coroutine function and failed on the
    # coroutine it got back (an AttributeError), with no word of the async twin.
    task = _tool_use_tasks(1)[0]
    tag = f"test-async-refused-{uuid.uuid4().hex[:8]}"
    result = run_episode(task, AsyncReference(), config=_config(local_fleet),
                         events=EventBus(sinks=[]), run_tag=tag)
    assert result.stop_reason == "error" and result.reward is None
    assert result.error is not None and result.error["type"] == "ConfigurationError"
    assert "coroutine function" in result.error["message"]
    assert "run_episode_async" in result.error["message"]
    assert _running_with_tag(local_fleet, tag) == []


def test_ctrl_c_in_run_episode_deletes_the_instance_ungraded_then_propagates(
        local_fleet: LocalFleet) -> None:
    # Before, the blocking episode graded the env on its way out of a Ctrl-C (a verifier
    # run the user had just interrupted); now it is closed ungraded, as `with FleetEnv`
    # does, and the instance is gone before the KeyboardInterrupt reaches the caller.
    task = _tool_use_tasks(1)[0]
    tag = f"test-ctrl-c-episode-{uuid.uuid4().hex[:8]}"
    events: list[Event] = []

    def interrupted(context: PolicyContext) -> Reply:
        if context.turn == 1:
            raise KeyboardInterrupt
        return REFERENCE.act(context)

    with pytest.raises(KeyboardInterrupt):
        run_episode(task, interrupted, config=_config(local_fleet),
                    events=EventBus(sinks=[events.append]), run_tag=tag)
    assert len(_created_with_tag(local_fleet, tag)) == 1
    assert _running_with_tag(local_fleet, tag) == []
    (completed,) = [e for e in events if isinstance(e, RolloutCompleted)]
    assert (completed.reason, completed.grade_status) == ("interrupted", "not_graded")
    assert not [e for e in events if isinstance(e, VerificationFinished)]


def test_a_cancelled_run_episode_async_deletes_the_instance_before_it_returns(
        local_fleet: LocalFleet) -> None:
    task = _tool_use_tasks(1)[0]
    tag = f"test-cancel-episode-{uuid.uuid4().hex[:8]}"
    asked = threading.Event()

    async def stuck(context: PolicyContext) -> Reply:
        asked.set()
        await anyio.sleep(3600)
        raise AssertionError("not cancelled")

    async def main() -> None:
        with anyio.move_on_after(60):
            episode = asyncio.ensure_future(run_episode_async(
                task, stuck, config=_config(local_fleet), events=EventBus(sinks=[]),
                run_tag=tag))
            while not asked.is_set():
                await asyncio.sleep(0.05)
            episode.cancel()
            with pytest.raises(asyncio.CancelledError):
                await episode

    asyncio.run(main())
    assert asked.is_set()
    assert len(_created_with_tag(local_fleet, tag)) == 1
    assert _running_with_tag(local_fleet, tag) == []
