"""Browser leases for ``browser_use`` tasks (issue 15, item 1), over real HTTP and MCP
against the embedded local Fleet: the lease's lifecycle next to its instance, its
health check, its deletion on every exit path, and the two local-Fleet fixes that came
with it (the computer-use UI resets with the episode; heartbeats extend an instance's TTL).
"""

from __future__ import annotations

import _thread
import base64
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import httpx
import pytest
from _support.waiting import wait_for

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.cli.main import main as cli_main
from fleetenv.core.errors import FleetEnvError, ProvisioningError
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.fleet.leases import BrowserLease, LeaseClient, wait_until_ready
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(90)


def _ui_task(app: str = "helpdesk", modality: str = "browser_use") -> Task:
    task = next(t for t in load_tasks(bundled_tasks_path())
                if t.modality in ("computer_use", "browser_use") and t.env_key == app)
    return Task.model_validate({**task.model_dump(), "modality": modality})


def _leases(fleet: LocalFleet, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{fleet.base_url}/v1/browser", params=params, timeout=10,
                         headers={"Authorization": f"Bearer {fleet.token}"})
    response.raise_for_status()
    leases: list[dict[str, Any]] = response.json()
    return leases


def _running_leases(fleet: LocalFleet, tag: str) -> list[str]:
    return [lease["lease_id"] for lease in _leases(fleet, run_id=tag, status="running")]


def _running_instances(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances(status="running")
            if i.get("run_id") == tag]


def _session(fleet: LocalFleet, **settings: Any) -> fleetenv.Session:
    return fleetenv.Session(api_key=fleet.token, base_url=fleet.base_url, retry_base_s=0.05,
                            retry_cap_s=0.2, **settings)


def _image(content: list[dict[str, Any]]) -> bytes:
    url = next(p["image_url"]["url"] for p in content if p["type"] == "image_url")
    return base64.b64decode(url.partition(",")[2])


def _nothing_left(fleet: LocalFleet, session: fleetenv.Session) -> None:
    assert _running_leases(fleet, session.run_tag) == []
    assert _running_instances(fleet, session.run_tag) == []
    assert session.live_instance_ids() == []


# ---------------------------------------------------------------------------- the episode

def test_a_browser_use_episode_acts_through_its_lease_and_the_reference_solves_it(
        local_fleet: LocalFleet) -> None:
    task = _ui_task()
    with _session(local_fleet) as session:
        env = fleetenv.FleetEnv(task, session=session)
        obs, info = env.reset()
        assert info["tools"] == ["computer"]
        leases = _leases(local_fleet, run_id=session.run_tag)
        assert len(leases) == 1 and leases[0]["status"] == "running"
        lease = leases[0]
        # The browser was navigated to the instance's web UI, whose host it may reach.
        assert lease["url"] == env.root_url and lease["instance_id"] == env.instance_id
        assert lease["allowed_hosts"] == ["127.0.0.1"]
        assert lease["lease_id"] in session.live_instance_ids()  # registered like an instance
        assert _image(obs.content).startswith(b"\x89PNG")
        for call in task.metadata["reference_solution"]:
            _, _, _, _, info = env.step(
                fleetenv.ToolCall(call["name"], call["arguments"]))
            assert not info.get("tool_error"), info
        # The calls went to the lease's MCP endpoint, not to the instance's own one.
        assert env._toolbox.router is not None
        assert env._toolbox.router.endpoint_of("computer") == lease["mcp_url"]
        env.close()
        assert env.reward == 1.0
        _nothing_left(local_fleet, session)
        assert _leases(local_fleet, run_id=session.run_tag)[0]["stop_reason"] == "deleted"


def _type_into_search(env: fleetenv.FleetEnv) -> bytes:
    env.step(fleetenv.ToolCall("computer", {"action": "click", "x": 400, "y": 70}))
    env.step(fleetenv.ToolCall("computer", {"action": "type", "text": "zzz"}))
    observation, *_ = env.step(fleetenv.ToolCall("computer", {"action": "screenshot"}))
    return _image(observation.content)


@pytest.mark.parametrize("modality", ["computer_use", "browser_use"])
def test_the_ui_state_resets_with_the_episode(local_fleet: LocalFleet, modality: str) -> None:
    # 0.x: the screen (view, focus, typed text) survived reset(); a new episode must
    # start on the app's start screen, as the data does.
    with _session(local_fleet) as session, \
            fleetenv.FleetEnv(_ui_task(modality=modality), session=session) as env:
        first, _ = env.reset()
        start = _image(first.content)
        changed = _type_into_search(env)
        assert changed != start
        second, _ = env.reset()
        assert _image(second.content) == start


# ---------------------------------------------------------------------------- exit paths

def test_a_lease_that_never_shows_the_app_is_deleted_and_reset_fails(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("tool_error", tool="computer", message="browser crashed")
    with _session(local_fleet, timeouts={"connect": 1.0}) as session:
        env = fleetenv.FleetEnv(_ui_task(), session=session)
        with pytest.raises(ProvisioningError, match="browser crashed"):
            env.reset()
        assert _running_leases(local_fleet, session.run_tag) == []
        assert env.instance_id is not None  # the instance stays for close()
        env.close()
        _nothing_left(local_fleet, session)


def test_a_refused_lease_create_fails_reset_and_leaves_nothing(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("http_error", route="/v1/browser", method="POST", status=403,
                     message="browser leases are not enabled for this team")
    with _session(local_fleet) as session:
        env = fleetenv.FleetEnv(_ui_task(), session=session)
        with pytest.raises(ProvisioningError, match="not enabled") as raised:
            env.reset()
        assert "FLEET_BROWSER_API_KEY" in str(raised.value)  # says what to check
        env.close()
        _nothing_left(local_fleet, session)


def test_a_failed_manager_reset_replaces_both_the_instance_and_its_lease(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    with _session(local_fleet) as session, \
            fleetenv.FleetEnv(_ui_task(), session=session) as env:
        env.reset()
        old_lease = _running_leases(local_fleet, session.run_tag)
        local_faults.add("http_error", route="/instances/*/api/v1/env/reset", status=500,
                         times=1)
        _, info = env.reset()
        assert info["reset"] == "instance_replaced"
        new_lease = _running_leases(local_fleet, session.run_tag)
        assert len(new_lease) == 1 and new_lease != old_lease
    _nothing_left(local_fleet, session)


def test_ctrl_c_during_the_lease_health_check_leaves_no_lease(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("tool_delay", tool="computer", seconds=5.0, times=1)

    with _session(local_fleet) as session:
        def interrupt_when_held() -> None:  # the browser navigated: a screenshot is held
            wait_for(lambda: [lease for lease in _leases(local_fleet, run_id=session.run_tag)
                              if lease["url"]], 30, "the navigation")
            _thread.interrupt_main()

        env = fleetenv.FleetEnv(_ui_task(), session=session)
        threading.Thread(target=interrupt_when_held, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            env.reset()
        assert len(_running_leases(local_fleet, session.run_tag)) == 1
        env.close()
        _nothing_left(local_fleet, session)


def test_a_lease_created_behind_a_ctrl_c_is_swept_at_session_close(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    # The lease API holds the create's answer; Ctrl-C arrives meanwhile: the lease is
    # created server-side, but the client never learns its id. Only its tag finds it.
    local_faults.add("http_delay", route="/v1/browser", method="POST", seconds=1.0, times=1)
    session = _session(local_fleet)
    env = fleetenv.FleetEnv(_ui_task(), session=session)

    def interrupt_when_creating() -> None:
        wait_for(lambda: _running_instances(local_fleet, session.run_tag), 30,
                 "the instance")
        time.sleep(0.3)  # the scenario: Ctrl-C while the create's answer is held
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_creating, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        env.reset()
    env.close()
    wait_for(lambda: _running_leases(local_fleet, session.run_tag), 10, "the orphan lease")
    session.close()
    _nothing_left(local_fleet, session)


def test_a_lease_whose_delete_keeps_failing_is_deleted_by_fleetenv_sweep(
        local_fleet: LocalFleet, local_faults: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    session = _session(local_fleet)
    fault = local_faults.add("http_error", route="/v1/browser/*", method="DELETE", status=503)
    env = fleetenv.FleetEnv(_ui_task(), session=session)
    env.reset()
    env.close(grade=False)
    session.close()  # its retry of the lease delete fails too
    local_faults.clear(fault)
    leaked = _running_leases(local_fleet, session.run_tag)
    assert len(leaked) == 1
    assert _running_instances(local_fleet, session.run_tag) == []
    monkeypatch.setenv("FLEET_API_KEY", local_fleet.token)
    monkeypatch.setenv("FLEET_BASE_URL", local_fleet.base_url)
    assert cli_main(["sweep", "--tag", session.run_tag, "--dry-run"]) == 0
    assert leaked[0] in capsys.readouterr().out
    assert cli_main(["sweep", "--tag", session.run_tag]) == 0
    assert leaked[0] in capsys.readouterr().out
    assert _running_leases(local_fleet, session.run_tag) == []


SIGTERM_SCRIPT = """
    import os, sys, threading
    import fleetenv
    from fleetenv import bundled_tasks_path

    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
                if t.modality == "computer_use")
    task = fleetenv.Task.model_validate({**task.model_dump(), "modality": "browser_use"})
    session = fleetenv.Session(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                               run_tag=os.environ["T_TAG"])
    env = fleetenv.FleetEnv(task, session=session)
    worker = threading.Thread(target=env.reset, daemon=True)  # created off the main thread
    worker.start()
    worker.join()
    print("READY", env.instance_id, flush=True)
    sys.stdin.readline()
    print("UNREACHABLE", flush=True)
"""


def test_sigterm_deletes_the_lease_with_the_instance(local_fleet: LocalFleet) -> None:
    tag = f"test-lease-sigterm-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url, T_TAG=tag)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SIGTERM_SCRIPT)],
                             env=env, text=True, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("READY"), child.stderr.read() if child.stderr else line
        assert len(_running_leases(local_fleet, tag)) == 1
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=40)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
    assert "UNREACHABLE" not in out
    assert child.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert _running_leases(local_fleet, tag) == []
    assert _running_instances(local_fleet, tag) == []


# ---------------------------------------------------------------------------- the lease API

def _client(fleet: LocalFleet) -> LeaseClient:
    return LeaseClient(fleet.base_url, {"Authorization": f"Bearer {fleet.token}"})


def test_the_browser_refuses_hosts_the_lease_does_not_allow(
        local_fleet: LocalFleet, fleet_client: Any) -> None:
    instance = fleet_client.make("helpdesk")
    client = _client(local_fleet)
    lease = client.create(["example.com"], ttl_seconds=60, run_tag=None)
    try:
        with pytest.raises(FleetEnvError, match="blocked"):
            wait_until_ready(lease, instance.urls.root, budget_s=10, connect_timeout_s=5,
                             call_timeout_s=10)
    finally:
        client.delete(lease)
        fleet_client.delete(instance.instance_id)
    client.delete(lease)  # idempotent


def test_the_health_check_polls_until_the_page_has_loaded(
        local_fleet: LocalFleet, fleet_client: Any) -> None:
    instance = fleet_client.make("shop")
    client = _client(local_fleet)
    lease = client.create(["127.0.0.1"], ttl_seconds=60, run_tag=None)
    try:
        image = wait_until_ready(lease, instance.urls.root, budget_s=20,
                                 connect_timeout_s=5, call_timeout_s=10)
        assert image.startswith(b"\x89PNG") and len(image) >= 4096
        # The page was still loading at the first screenshot (blank): it polled again.
        assert local_fleet.tool_call_counts(instance.instance_id)["computer"] >= 2
    finally:
        client.delete(lease)
        fleet_client.delete(instance.instance_id)


def test_a_lease_expires_after_its_ttl(local_fleet: LocalFleet) -> None:
    client = _client(local_fleet)
    tag = f"test-lease-ttl-{uuid.uuid4().hex[:8]}"
    lease = client.create(["127.0.0.1"], ttl_seconds=1, run_tag=tag)
    assert _running_leases(local_fleet, tag) == [lease.lease_id]
    wait_for(lambda: _running_leases(local_fleet, tag) == [], 10, "the lease to expire")
    stopped = _leases(local_fleet, run_id=tag)[0]
    assert stopped["stop_reason"] == "expired (ttl_seconds=1)"


def test_a_bad_lease_request_is_refused_with_what_to_fix(local_fleet: LocalFleet) -> None:
    client = _client(local_fleet)
    with pytest.raises(ProvisioningError, match="allowed_hosts"):
        client.create([], ttl_seconds=60, run_tag=None)
    with pytest.raises(FleetEnvError, match="not http"):
        LeaseClient("ftp://nowhere", {})
    assert "headers" not in repr(BrowserLease("l", "http://x/mcp", headers={"A": "secret"}))
    assert "secret" not in repr(BrowserLease("l", "http://x/mcp", headers={"A": "secret"}))


# ---------------------------------------------------------------------------- instance TTL

def test_heartbeats_extend_an_instances_ttl(local_fleet: LocalFleet, fleet_client: Any) -> None:
    env = fleet_client.make("helpdesk", ttl_seconds=3)

    def expires_at() -> str:
        return next(str(i["expires_at"]) for i in local_fleet.instances()
                    if i["instance_id"] == env.instance_id)

    before = expires_at()
    time.sleep(1.5)  # the scenario: time passes before the heartbeat (not a readiness wait)
    assert env.heartbeat().success is True
    assert expires_at() > before
    # Past the creation TTL, the heartbeat kept it alive...
    time.sleep(2.0)
    assert fleet_client.instance(env.instance_id).status == "running"
    # ...and without further heartbeats it expires.
    wait_for(lambda: fleet_client.instance(env.instance_id).status == "stopped", 15,
             "the instance to expire")
