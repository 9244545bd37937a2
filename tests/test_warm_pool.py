"""The warm pool against the session's LocalFleet: real instances, real manager resets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _support.waiting import poll_until

from fleetenv import bundled_tasks_path
from fleetenv.core.config import resolve_config
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event, ToolCallFailed
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.fleet.session import Session
from fleetenv.fleet.warm_pool import WarmPool, pool_of
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import ScriptedPolicy
from fleetenv.rollouts.rollout import run_episode
from fleetenv.rollouts.runner import Runner

pytestmark = pytest.mark.timeout(90)

REFERENCE = ScriptedPolicy.reference()


def _helpdesk_tasks() -> list[Task]:
    """Tool-use tasks that share one environment and data set (so one warm instance)."""
    tasks = [t for t in load_tasks(bundled_tasks_path())
             if t.modality == "tool_use" and t.env_key == "helpdesk"]
    assert len({(t.env_spec, t.data_key, t.data_version) for t in tasks[:4]}) == 1
    return tasks


@pytest.fixture
def session(local_fleet: LocalFleet) -> Iterator[Session]:
    with Session(resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url),
                 events=EventBus(sinks=[])) as session:
        yield session


def _running(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances(status="running")
            if i.get("run_id") == tag]


def _resets(fleet: LocalFleet, instance_id: str) -> int:
    (record,) = [i for i in fleet.instances() if i["instance_id"] == instance_id]
    return len(record["resets"])


def _row_count(env: FleetEnv, table: str) -> int:
    rows = env.query_db(f"SELECT COUNT(*) AS n FROM {table}")["rows"]
    return int(rows[0][0] if isinstance(rows[0], list) else rows[0]["n"])


def test_episodes_reuse_one_instance_reset_to_its_seed_state(
        local_fleet: LocalFleet, session: Session) -> None:
    tasks = _helpdesk_tasks()
    with WarmPool(session, max_instances=2) as pool:
        assert pool_of(session) is pool
        # One episode wrecks the data, and closes cleanly.
        with FleetEnv(tasks[0], session=session) as env:
            env.reset()
            table = "tickets"
            seeded = _row_count(env, table)
            assert seeded > 0
            env.query_db(f"DELETE FROM {table}", read_only=False)
            assert _row_count(env, table) == 0
            first = env.instance_id
        assert pool.idle == 1 and _running(local_fleet, session.run_tag) == [first]
        # The next episodes (other tasks, same environment) get it back, reset.
        with FleetEnv(tasks[1], session=session) as env:
            env.reset()
            assert env.instance_id == first
            assert _row_count(env, table) == seeded
        results = [run_episode(task, REFERENCE, session=session) for task in tasks[2:4]]
        assert [r.reward for r in results] == [1.0, 1.0], [r.error for r in results]
        assert {r.instance_id for r in results} == {first}
        assert _resets(local_fleet, first) == 3
        assert pool.stats.created == 1 and pool.stats.reused == 3
        assert pool.stats.returned == 4
    # Closing the pool deletes what it kept.
    assert _running(local_fleet, session.run_tag) == []
    assert pool_of(session) is None


def test_a_dirty_instance_is_never_reused(local_fleet: LocalFleet, local_faults: Any) -> None:
    tasks = _helpdesk_tasks()
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url,
                            timeouts={"call": 0.5})
    with Session(config, events=EventBus(sinks=[])) as session, \
            WarmPool(session, max_instances=4) as pool:
        # A tool call that timed out may still run on the server: dirty.
        local_faults.add("tool_hang")
        with FleetEnv(tasks[0], session=session) as env:
            env.reset()
            tool = env.openai_tools[0]["function"]["name"]
            observation, *_ = env.step({"name": tool, "arguments": {}})
            assert observation.is_error
            timed_out = env.instance_id
        local_faults.clear()
        assert pool.idle == 0 and pool.stats.dirty == 1
        # An episode closed without grading (cancelled, errored, interrupted): dirty.
        env = FleetEnv(tasks[0], session=session)
        env.reset()
        interrupted = env.instance_id
        env.close(grade=False)
        assert pool.idle == 0 and pool.stats.dirty == 2
        # Neither came back: the next episode gets a fresh instance.
        result = run_episode(tasks[1], REFERENCE, session=session)
        assert result.reward == 1.0, result.error
        assert result.instance_id not in (timed_out, interrupted)
        assert pool.stats.created == 3 and pool.stats.reused == 0
        assert _running(local_fleet, session.run_tag) == [result.instance_id]


def test_close_from_another_thread_during_a_tool_call_does_not_keep_the_instance(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    """A graded close() lands while a tool call is out (it may still run on the server).
    Before, the closing thread could hand the instance back before the failing call
    marked it dirty (here the gap is widened by an event sink that is slow on the call's
    ``ToolCallFailed``, which comes before the mark); now a call counts as out until it
    settled, and the instance is not kept."""
    tasks = _helpdesk_tasks()
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url,
                            timeouts={"call": 60})
    closed = threading.Event()

    def slow_sink(event: Event) -> None:
        if isinstance(event, ToolCallFailed):
            closed.wait(10)  # the close finishes first

    with Session(config, events=EventBus(sinks=[slow_sink])) as session, \
            WarmPool(session, max_instances=4) as pool:
        hang = local_faults.add("tool_hang")
        env = FleetEnv(tasks[0], session=session)
        env.reset()
        tool = env.openai_tools[0]["function"]["name"]
        stepping = threading.Thread(target=env.step, args=({"name": tool, "arguments": {}},),
                                    daemon=True)
        stepping.start()
        assert poll_until(lambda: any(f["id"] == hang and f.get("hits")
                                      for f in local_fleet.faults.list()), 20)
        env.close()  # graded, from this thread, with the call still out
        closed.set()
        stepping.join(30)
        assert not stepping.is_alive()
        local_faults.clear()
        assert pool.idle == 0 and pool.stats.dirty == 1


def test_an_instance_whose_reset_fails_is_replaced(local_fleet: LocalFleet,
                                                   session: Session) -> None:
    tasks = _helpdesk_tasks()
    with WarmPool(session) as pool:
        first = run_episode(tasks[0], REFERENCE, session=session)
        assert pool.idle == 1
        # Gone behind the pool's back (a sweep, its TTL): the reset fails, a create follows.
        assert session.sweep() == [first.instance_id]
        second = run_episode(tasks[1], REFERENCE, session=session)
        assert second.reward == 1.0, second.error
        assert second.instance_id != first.instance_id
        assert pool.stats.reset_failed == 1 and pool.stats.created == 2


def test_the_cap_and_the_expiry_bound_what_the_pool_keeps(
        local_fleet: LocalFleet, session: Session) -> None:
    tasks = _helpdesk_tasks()
    with WarmPool(session, max_instances=1, max_idle_s=0.2) as pool:
        envs = [FleetEnv(task, session=session) for task in tasks[:2]]
        for env in envs:
            env.reset()
        for env in envs:
            env.close()
        assert pool.idle == 1 and pool.stats.full == 1  # the hard cap
        assert len(_running(local_fleet, session.run_tag)) == 1
        # Idle too long: deleted at the next trim (or take), never handed out.
        assert poll_until(pool.trim, 10) == 1
        assert pool.idle == 0 and pool.stats.expired == 1
        assert _running(local_fleet, session.run_tag) == []
    # An instance whose TTL leaves no room for another whole episode is not kept.
    with WarmPool(session, expire_before_ttl_s=10_000) as pool:
        result = run_episode(tasks[0], REFERENCE, session=session)
        assert result.reward == 1.0
        assert pool.idle == 0 and pool.stats.expired == 1
        assert _running(local_fleet, session.run_tag) == []


def test_idle_instances_give_way_when_the_live_cap_is_full(local_fleet: LocalFleet) -> None:
    tasks = load_tasks(bundled_tasks_path())
    helpdesk = _helpdesk_tasks()[0]
    other = next(t for t in tasks if t.modality == "tool_use" and t.env_key != "helpdesk")
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url,
                            max_live_instances=1, timeouts={"provision": 20})
    with Session(config, events=EventBus(sinks=[])) as session, WarmPool(session) as pool:
        assert run_episode(helpdesk, REFERENCE, session=session).reward == 1.0
        assert pool.idle == 1 and session.live.in_use == 1
        # Another environment: the idle helpdesk instance is deleted to free the slot
        # (without that, the create would wait for the slot until its budget ran out).
        result = run_episode(other, REFERENCE, session=session)
        assert result.reward == 1.0, result.error
        assert pool.stats.full == 1 and pool.idle == 1


def test_runner_episodes_share_the_pool(local_fleet: LocalFleet, session: Session) -> None:
    tasks = _helpdesk_tasks()[:6]
    with WarmPool(session, max_instances=2) as pool:
        with Runner(workers=2, session=session, events=EventBus(sinks=[]),
                    progress=False) as runner:
            results = list(runner.run(tasks, REFERENCE))
        assert [r.reward for r in results] == [1.0] * 6, [r.error for r in results]
        assert pool.stats.created <= 3 and pool.stats.reused >= 3
        assert len({r.instance_id for r in results}) == pool.stats.created


def test_bad_settings_are_clear_errors(session: Session) -> None:
    with pytest.raises(ConfigurationError, match="max_instances must be at least 1"):
        WarmPool(session, max_instances=0)
    with pytest.raises(ConfigurationError, match="max_idle_s"):
        WarmPool(session, max_idle_s=0)
    with WarmPool(session), pytest.raises(ConfigurationError, match="already has"):
        WarmPool(session)
