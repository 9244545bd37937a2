"""Ctrl-C or SIGTERM during a step, in a real subprocess: the process exits and leaves no
live instance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from _support.waiting import poll_until

from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import os, sys
    import fleetenv
    from fleetenv import bundled_tasks_path

    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
                if t.modality == "tool_use")
    env = fleetenv.FleetEnv(task, api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"])
    env.reset()
    call = task.reference_solution[0]
    print("STEPPING", env.instance_id, flush=True)
    env.step(fleetenv.ToolCall(call.name, call.arguments))   # hangs: the fault holds it
    print("UNREACHABLE", flush=True)
""")


def interrupt_mid_step(fleet: LocalFleet, faults: Any, signum: int) -> tuple[str, str, str]:
    """Run SCRIPT in a child, send ``signum`` while its tool call is held by the server;
    return the instance id and the child's stdout and stderr."""
    faults.add("tool_hang")
    env = dict(os.environ, T_KEY=fleet.token, T_URL=fleet.base_url)
    child = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("STEPPING"), (line, child.stderr.read() if child.stderr else "")
        # Signal once the server holds the call (or after 10 s, and let the asserts judge).
        poll_until(lambda: faults.list()[0].get("hits"), timeout=10)
        child.send_signal(signum)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    return line.split()[1], out, err


def status_of(fleet: LocalFleet, instance_id: str) -> str:
    return {i["instance_id"]: i["status"] for i in fleet.instances()}[instance_id]


def test_ctrl_c_during_step_leaves_no_live_instance(local_fleet: LocalFleet,
                                                    local_faults: Any) -> None:
    instance_id, out, err = interrupt_mid_step(local_fleet, local_faults, signal.SIGINT)
    assert "UNREACHABLE" not in out
    assert "KeyboardInterrupt" in err
    assert status_of(local_fleet, instance_id) == "stopped"


def test_sigterm_during_step_leaves_no_live_instance(local_fleet: LocalFleet,
                                                     local_faults: Any) -> None:
    instance_id, out, _ = interrupt_mid_step(local_fleet, local_faults, signal.SIGTERM)
    assert "UNREACHABLE" not in out
    assert status_of(local_fleet, instance_id) == "stopped"
