"""Session: per-session settings, caps and cleanup; the per-key limiter; fork safety.

All against the embedded local Fleet over real HTTP and MCP.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Session, bundled_tasks_path
from fleetenv.core.retry import Deadline
from fleetenv.errors import (
    ConfigurationError,
    DeadlineExceeded,
    FleetEnvError,
    TransientProvisioningError,
)
from fleetenv.events import EventBus, ProvisioningRetry
from fleetenv.fleet.limits import KeyLimiter
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASK = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use")


def session_on(fleet: LocalFleet, **settings: Any) -> Session:
    return Session(api_key=fleet.token, base_url=fleet.base_url, events=EventBus(sinks=[]),
                   **settings)


def running(fleet: LocalFleet) -> set[str]:
    return {i["instance_id"] for i in fleet.instances(status="running")}


def test_two_sessions_keep_their_own_budgets(local_fleet: LocalFleet,
                                             local_faults: Any) -> None:
    # 0.1 cached one backend per (URL, key): the first config's budget won for everyone.
    short = session_on(local_fleet, timeouts={"provision": 0.5}, retry_base_s=0.4,
                       retry_cap_s=0.4)
    long = session_on(local_fleet, timeouts={"provision": 30}, retry_base_s=0.4,
                      retry_cap_s=0.4)
    with short, long:
        fault = local_faults.add("create_error", status=503)
        with FleetEnv(TASK, session=short) as env, pytest.raises(TransientProvisioningError,
                                                                 match="provisioning budget"):
            env.reset()
        local_faults.clear(fault)
        # Four failures pause 4 x [0.2, 0.4] s: more than the short budget, well inside
        # the long one. Only the long session's own budget lets this succeed.
        local_faults.add("create_error", status=503, times=4)
        with FleetEnv(TASK, session=long) as env:
            env.reset()
            assert env.instance_id in running(local_fleet)
        assert short.config.timeouts.provision == 0.5
        assert long.config.timeouts.provision == 30


def test_two_sessions_keep_their_own_caps(local_fleet: LocalFleet) -> None:
    tight = session_on(local_fleet, max_live_instances=1, timeouts={"provision": 1.0})
    roomy = session_on(local_fleet, max_live_instances=3)
    with tight, roomy:
        first = FleetEnv(TASK, session=tight)
        first.reset()
        # The tight session is full: its next instance waits for a slot, then gives up.
        with FleetEnv(TASK, session=tight) as second, pytest.raises(
                DeadlineExceeded, match="max_live_instances=1"):
            second.reset()
        # The roomy session, created in the same process, is not bound by that cap.
        others = [FleetEnv(TASK, session=roomy) for _ in range(3)]
        for env in others:
            env.reset()
        assert len({env.instance_id for env in others}) == 3
        assert roomy.live.in_use == 3 and tight.live.in_use == 1
        for env in [first, *others]:
            env.close()
        assert roomy.live.in_use == 0 and tight.live.in_use == 0


def test_closing_a_session_deletes_what_it_created(local_fleet: LocalFleet) -> None:
    session = session_on(local_fleet)
    envs = [FleetEnv(TASK, session=session) for _ in range(2)]
    for env in envs:
        env.reset()  # left open on purpose: the session cleans up after them
    ids = set(session.live_instance_ids())
    assert ids == {env.instance_id for env in envs} and ids <= running(local_fleet)
    session.close()
    assert not ids & running(local_fleet)
    assert session.live_instance_ids() == []
    session.close()  # idempotent
    with pytest.raises(FleetEnvError, match="session is closed"):
        FleetEnv(TASK, session=session).reset()
    for env in envs:  # their instances are gone: closing them only ends their MCP sessions
        env.close()
        assert env.grade is not None and env.grade.reason == "instance_gone"


def test_a_private_session_closes_with_its_env(local_fleet: LocalFleet) -> None:
    env = FleetEnv(TASK, api_key=local_fleet.token, base_url=local_fleet.base_url)
    env.reset()
    assert env.session is not Session.shared()
    env.close()
    assert env.session.closed


def test_sessions_sharing_a_key_share_fleets_pause(local_fleet: LocalFleet,
                                                  local_faults: Any) -> None:
    first = session_on(local_fleet, retry_base_s=0.5, retry_cap_s=0.5)
    second = session_on(local_fleet, max_live_instances=2)
    with first, second:
        limiter = first.provisioner.key_limit
        assert second.provisioner.key_limit is limiter  # one limiter per API key
        seen_pause: list[float] = []

        def on_event(event: Any) -> None:
            if isinstance(event, ProvisioningRetry):
                # Fleet told the key to slow down: the *other* session sees the pause too.
                seen_pause.append(second.provisioner.key_limit.paused_for())

        first.events.add_sink(on_event)
        local_faults.add("create_error", status=429, message="Too many requests", times=1)
        with FleetEnv(TASK, session=first) as env:
            env.reset()
        assert len(seen_pause) == 1 and seen_pause[0] > 0


def test_key_limiter_holds_creates_until_the_pause_ends() -> None:
    limiter = KeyLimiter()
    assert limiter.wait(Deadline(1.0)) == 0.0
    limiter.pause(0.3)
    waited = limiter.wait(Deadline(5.0))
    assert waited >= 0.25  # it really held (the pause is the behaviour under test)
    limiter.pause(10.0)
    with pytest.raises(DeadlineExceeded) as info:
        limiter.wait(Deadline(0.2))
    assert info.value.retryable


def _use_in_child(session: Session, out: Any) -> None:
    try:
        session.provisioner  # noqa: B018 - the access is the test
    except FleetEnvError as exc:
        out.put(str(exc))
    else:
        out.put("no error")


def test_a_forked_child_refuses_the_parents_session(local_fleet: LocalFleet) -> None:
    session = session_on(local_fleet)
    with session:
        session.provisioner  # noqa: B018 - build the backend in the parent first
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        child = context.Process(target=_use_in_child, args=(session, out))
        child.start()
        message = out.get(timeout=30)
        child.join(timeout=30)
    assert "parent process" in message


def test_retryable_is_set_on_errors() -> None:
    from fleetenv.errors import (
        ConnectError,
        PermanentProvisioningError,
        ToolCallMayHaveRunError,
    )

    assert TransientProvisioningError("x").retryable
    assert ConnectError("x").retryable
    assert not ConnectError("x", retryable=False).retryable
    assert not PermanentProvisioningError("x").retryable
    assert not ToolCallMayHaveRunError("x").retryable


def test_the_default_session_is_shared_and_replaced_when_closed() -> None:
    first = Session.shared()
    assert Session.shared() is first
    first.close()
    assert Session.shared() is not first


def test_a_shared_session_is_one_per_settings_and_a_key_is_part_of_them(
        local_fleet: LocalFleet) -> None:
    url = local_fleet.base_url
    first = Session.shared(api_key=local_fleet.token, base_url=url)
    other_key = Session.shared(api_key="sk-other-key", base_url=url)
    capped = Session.shared(api_key=local_fleet.token, base_url=url, max_live_instances=3)
    try:
        assert Session.shared(api_key=local_fleet.token, base_url=url) is first
        assert Session.shared(first.config) is first
        assert other_key is not first and capped is not first
        assert other_key.config != first.config  # compared by value, never shown:
        assert "sk-other-key" not in repr(other_key.config) + repr(other_key)
        with pytest.raises(ConfigurationError, match="either a config or settings"):
            Session.shared(first.config, max_steps=3)
        first.close()
        again = Session.shared(api_key=local_fleet.token, base_url=url)
        assert again is not first and not again.closed
    finally:
        for session in (first, other_key, capped, Session.shared(first.config)):
            session.close()


def _shared_in_child(config: Any, out: Any) -> None:
    try:
        Session.shared(config).provisioner  # noqa: B018 - the access is the test
    except FleetEnvError as exc:
        out.put(str(exc))
    else:
        out.put("usable")


def test_a_forked_child_gets_its_own_shared_session(local_fleet: LocalFleet) -> None:
    parent = Session.shared(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with parent:
        parent.provisioner  # noqa: B018 - build the backend in the parent first
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        child = context.Process(target=_shared_in_child, args=(parent.config, out))
        child.start()
        message = out.get(timeout=30)
        child.join(timeout=30)
    assert message == "usable"


def test_session_repr_shows_no_secret(local_fleet: LocalFleet) -> None:
    with session_on(local_fleet) as session:
        assert local_fleet.token not in repr(session)
        assert local_fleet.token not in repr(session.config)



def test_a_runner_on_a_session_honours_its_caps_and_leaves_it_open(
        local_fleet: LocalFleet) -> None:
    from fleetenv import Runner
    from fleetenv.events import InstanceProvisioned

    session = session_on(local_fleet, max_live_instances=2)
    live_seen: list[int] = []
    session.events.add_sink(lambda e: live_seen.append(session.live.in_use)
                            if isinstance(e, InstanceProvisioned) else None)
    tasks = [t for t in fleetenv.load_tasks(bundled_tasks_path())
             if t.modality == "tool_use"][:4]
    with session:
        with Runner(session=session, workers=4, progress=False) as runner:
            results = list(runner.run(tasks, "reference"))
        assert [r.reward for r in results] == [1.0] * 4, [r.error for r in results]
        assert len(live_seen) == 4 and max(live_seen) <= 2  # the session's cap held
        assert not session.closed  # the runner did not own it
        assert session.live_instance_ids() == []


def test_a_worker_session_never_sweeps_a_tag_its_siblings_still_use(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    # Process-pool workers share their run's tag. A worker whose create failed uncertainly
    # must not sweep that tag at exit: a sibling's instance under it is alive.
    tag = "fleetenv-shared-run"
    sibling = session_on(local_fleet, run_tag=tag)
    worker = session_on(local_fleet, run_tag=tag, timeouts={"provision": 0.5},
                        retry_base_s=0.4, retry_cap_s=0.4)
    worker.provisioner.sweeps_shared_tags = False  # what jobs.job_plan sets in a worker
    with sibling:
        alive = FleetEnv(TASK, session=sibling)
        alive.reset()
        local_faults.add("create_error", status=503)  # sent, answered 5xx: "unsure"
        with FleetEnv(TASK, session=worker) as env, pytest.raises(TransientProvisioningError):
            env.reset()
        local_faults.clear()
        worker.close()
        assert alive.instance_id in running(local_fleet)
        alive.close()


def test_a_reset_after_a_failed_mcp_open_offers_the_tools_again(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    # 0.1 kept the half-open router: the second reset() offered zero tools.
    with session_on(local_fleet) as session, FleetEnv(TASK, session=session) as env:
        fault = local_faults.add("http_error", route="/instances/*/mcp*", status=404)
        with pytest.raises(FleetEnvError):
            env.reset()
        local_faults.clear(fault)
        obs, info = env.reset()
        assert obs.tools and info["tools"] == [t["function"]["name"] for t in obs.tools]


def test_provisioning_failed_counts_the_creates_it_sent(local_fleet: LocalFleet,
                                                        local_faults: Any) -> None:
    from fleetenv.events import ProvisioningFailed

    failed: list[ProvisioningFailed] = []
    session = session_on(local_fleet, timeouts={"provision": 1.0}, retry_base_s=0.2,
                         retry_cap_s=0.2)
    session.events.add_sink(lambda e: failed.append(e)
                            if isinstance(e, ProvisioningFailed) else None)
    with session:
        local_faults.add("create_error", status=503)
        with FleetEnv(TASK, session=session) as env, pytest.raises(TransientProvisioningError):
            env.reset()
    (event,) = failed
    assert event.attempts >= 2  # 0.1 always said 0


def test_tools_keep_the_title_and_hints_their_server_declares(local_fleet: LocalFleet) -> None:
    # 0.1 dropped title and annotations: a trainer could not tell a reader from a writer.
    with session_on(local_fleet) as session, FleetEnv(TASK, session=session) as env:
        env.reset()
        tools = {t.name: t for t in env.tools}
    reader, writer = tools["get_ticket"], tools["update_ticket"]
    assert reader.title == "Get ticket"
    assert reader.hints.read_only is True and reader.hints.open_world is False
    assert writer.hints.read_only is False and writer.hints.destructive is False
    assert writer.hints.idempotent is None  # not declared: unknown, not False
    assert reader.to_dict()["annotations"] == {"readOnlyHint": True, "openWorldHint": False}
    safe = [t.name for t in env.tools if t.hints.read_only]
    assert "update_ticket" not in safe and "search_tickets" in safe
