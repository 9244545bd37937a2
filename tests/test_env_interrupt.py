"""Ctrl-C during a step, in a real subprocess: the process exits and leaves no live instance."""

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
    from fleetenv.local.apps import bundled_tasks_path

    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
                if t.modality == "tool_use")
    env = fleetenv.FleetEnv(task, api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"])
    env.reset()
    call = task.reference_solution[0]
    print("STEPPING", env.instance_id, flush=True)
    env.step(fleetenv.ToolCall(call.name, call.arguments))   # hangs: the fault holds it
    print("UNREACHABLE", flush=True)
""")


def test_ctrl_c_during_step_leaves_no_live_instance(local_fleet: LocalFleet,
                                                    local_faults: Any) -> None:
    local_faults.add("tool_hang")
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url)
    child = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("STEPPING"), (line, child.stderr.read() if child.stderr else "")
        instance_id = line.split()[1]
        # Interrupt once the server holds the call (or after 10 s, and let the asserts judge).
        poll_until(lambda: local_faults.list()[0].get("hits"), timeout=10)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert "UNREACHABLE" not in out
    assert "KeyboardInterrupt" in err
    statuses = {i["instance_id"]: i["status"] for i in local_fleet.instances()}
    assert statuses[instance_id] == "stopped"
