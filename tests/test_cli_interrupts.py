"""``fleetenv run`` as a person at a terminal sees it: Ctrl-C, and the live progress.

Real subprocesses against the session's local Fleet (so the test can see which instances
are left running after the process is gone). The moment to press Ctrl-C is found by
polling the local Fleet's fault counters (a held create, a held tool call) with a
deadline, never by sleeping. The progress display is checked under a pseudo-terminal
(``pty.openpty``) and with plain pipes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetenv import bundled_tasks_path
from fleetenv.core.config import ENV_API_KEY, ENV_BASE_URL
from fleetenv.core.task_files import load_tasks
from fleetenv.local import LocalFleet
from fleetenv.rollouts.results import read_manifest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and ptys")

BUNDLED = {t.key: t for t in load_tasks(bundled_tasks_path())}
NOISE = ("Traceback", "ERROR", "ClosedResourceError", "provisioning_failed", "unexpected",
         "report it")


def write_tasks(path: Path, keys: list[str]) -> Path:
    path.write_text("\n".join(json.dumps(BUNDLED[k].to_fleet_dict()) for k in keys) + "\n")
    return path


def env_for(fleet: LocalFleet) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPENAI_API_KEY")}
    env.update({ENV_API_KEY: fleet.token, ENV_BASE_URL: fleet.base_url})
    return env


def running_ids(fleet: LocalFleet) -> set[str]:
    return {str(i["instance_id"]) for i in fleet.instances(status="running")}


def wait_for(condition: Callable[[], bool], *, what: str, deadline_s: float = 30.0) -> None:
    """Poll ``condition`` with a growing pause until it holds or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    pause = 0.01
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def fault_hits(fleet: LocalFleet, fault_id: str) -> int:
    return next((int(f.get("hits", 0)) for f in fleet.faults.list() if f["id"] == fault_id), 0)


@pytest.fixture
def faults(local_fleet: LocalFleet) -> Iterator[list[str]]:
    """Fault ids to clear after the test (held requests then proceed)."""
    ids: list[str] = []
    yield ids
    for fault_id in ids:
        local_fleet.faults.clear(fault_id)


def interrupt_run(fleet: LocalFleet, tmp_path: Path, when: Callable[[], bool], what: str,
                  signals: tuple[int, ...] = (signal.SIGINT,), prefix: tuple[str, ...] = (),
                  ) -> tuple[int, str, Path]:
    """Start ``fleetenv run`` (after ``prefix``, a command such as ``nohup``), wait for
    ``when``, then send ``signals`` in order."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    out = tmp_path / "results.jsonl"
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "fleetenv", "run", str(tasks), "--policy",
         "reference", "-n", "3", "--workers", "3", "--out", str(out)],
        env=env_for(fleet), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: when() or proc.poll() is not None, what=what)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        for signum in signals:
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err, out


def quiet_lines(code: int, err: str) -> list[str]:
    """The lines of an interrupted run's stderr, checked: exit 130 and none of the noise."""
    assert code == 130, err
    for word in NOISE:
        assert word not in err, err
    return err.strip().splitlines()


@pytest.mark.timeout(120)
def test_ctrl_c_during_tool_calls_prints_one_line_and_deletes_the_instances(
        local_fleet: LocalFleet, tmp_path: Path, faults: list[str]) -> None:
    before = running_ids(local_fleet)
    fault = local_fleet.faults.add("tool_hang")
    faults.append(fault)
    code, err, out = interrupt_run(local_fleet, tmp_path,
                                   lambda: fault_hits(local_fleet, fault) >= 3,
                                   "three held tool calls")
    lines = quiet_lines(code, err)
    assert lines[0].startswith("running 1 task(s) x 3 sample(s)")
    assert len(lines) == 2, err  # the start line, then the one interrupt line
    assert lines[1] == (f"fleetenv run: interrupted: stopped 3 running episode(s) and "
                        f"deleted 3 instance(s); 0 finished episode(s) are in {out} "
                        f"(finish with --resume {out})")
    assert running_ids(local_fleet) <= before
    assert read_manifest(out) is not None  # beside the file, every line of which is a result
    assert all("record" not in json.loads(line) for line in out.read_text().splitlines())


@pytest.mark.timeout(120)
def test_ctrl_c_during_provisioning_is_not_reported_as_a_bug(
        local_fleet: LocalFleet, tmp_path: Path, faults: list[str]) -> None:
    """Creates in flight when Ctrl-C lands finish (a create cannot be recalled), and
    their instances are deleted; nothing says "unexpected ... report it"."""
    before = running_ids(local_fleet)
    fault = local_fleet.faults.add("http_delay", route="/v1/env/instances*", method="POST",
                                   seconds=2.0)
    faults.append(fault)
    code, err, out = interrupt_run(local_fleet, tmp_path,
                                   lambda: fault_hits(local_fleet, fault) >= 1,
                                   "a create in flight")
    *_, last = quiet_lines(code, err)
    assert last.startswith("fleetenv run: interrupted: stopped ")
    assert f"0 finished episode(s) are in {out}" in last
    assert len([line for line in err.splitlines() if "interrupted" in line]) == 1
    assert running_ids(local_fleet) <= before


@pytest.mark.timeout(120)
def test_ctrl_c_with_a_create_that_never_answers_still_exits(
        local_fleet: LocalFleet, tmp_path: Path, faults: list[str]) -> None:
    """The control plane holds the creates and never answers. Before, Ctrl-C left the
    worker threads blocked on them and the exit joined those threads for the whole
    provisioning budget (600 s). Now the run gives its creates a grace, then abandons
    them: exit 130 and the one line, well within the 60 s ``interrupt_run`` allows."""
    before = running_ids(local_fleet)
    fault = local_fleet.faults.add("http_hang", route="/v1/env/instances*", method="POST")
    faults.append(fault)
    code, err, _ = interrupt_run(local_fleet, tmp_path,
                                 lambda: fault_hits(local_fleet, fault) >= 3,
                                 "three creates held")
    *_, last = quiet_lines(code, err)
    assert last.startswith("fleetenv run: interrupted: stopped 3 running episode(s)"), last
    assert running_ids(local_fleet) <= before


@pytest.mark.timeout(120)
def test_a_closed_terminal_deletes_the_instances_of_a_run(
        local_fleet: LocalFleet, tmp_path: Path, faults: list[str]) -> None:
    """SIGHUP (the terminal closed, the ssh session dropped). Before, its default action
    ended the run at once and its instances ran on until their TTL. Now it is SIGTERM's
    twin: the instances are deleted, and the exit status is 128 + SIGHUP."""
    before = running_ids(local_fleet)
    fault = local_fleet.faults.add("tool_hang")
    faults.append(fault)
    code, err, _ = interrupt_run(local_fleet, tmp_path,
                                 lambda: fault_hits(local_fleet, fault) >= 3,
                                 "three held tool calls", signals=(signal.SIGHUP,))
    assert code == 128 + signal.SIGHUP, err
    assert running_ids(local_fleet) <= before


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("nohup") is None, reason="needs nohup")
def test_under_nohup_a_closed_terminal_does_not_end_the_run(
        local_fleet: LocalFleet, tmp_path: Path, faults: list[str]) -> None:
    """``nohup`` ignores SIGHUP so the run outlives the terminal: fleetenv leaves it
    ignored. The SIGINT sent right after it is what ends the run (130, not 129)."""
    before = running_ids(local_fleet)
    fault = local_fleet.faults.add("tool_hang")
    faults.append(fault)
    code, err, _ = interrupt_run(local_fleet, tmp_path,
                                 lambda: fault_hits(local_fleet, fault) >= 3,
                                 "three held tool calls",
                                 signals=(signal.SIGHUP, signal.SIGINT), prefix=("nohup",))
    *_, last = quiet_lines(code, err)
    assert last.startswith("fleetenv run: interrupted: stopped 3 running episode(s)"), last
    assert running_ids(local_fleet) <= before


@pytest.mark.timeout(120)
def test_ctrl_c_in_fleetenv_tools_prints_one_line(
        local_fleet: LocalFleet, faults: list[str]) -> None:
    before = running_ids(local_fleet)
    fault = local_fleet.faults.add("http_delay", route="/v1/env/instances*", method="POST",
                                   seconds=2.0)
    faults.append(fault)
    proc = subprocess.Popen([sys.executable, "-m", "fleetenv", "tools", "helpdesk"],
                            env=env_for(local_fleet), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: fault_hits(local_fleet, fault) >= 1 or proc.poll() is not None,
                 what="a create in flight")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    [line] = err.strip().splitlines()
    assert line.startswith("fleetenv tools: interrupted while listing the tools of helpdesk")
    assert not out
    assert running_ids(local_fleet) <= before


# ----------------------------------------------------------------------------- progress

def run_on_pty(argv: list[str], env: dict[str, str], deadline_s: float) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal; return the exit status and what it drew."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=secondary)
    os.close(secondary)
    chunks: list[bytes] = []
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    data = os.read(primary, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(primary)
    return code, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.timeout(120)
def test_progress_is_drawn_on_a_terminal_and_not_into_a_pipe(
        local_fleet: LocalFleet, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent",
                                                   "shop-count-shipped"])
    argv = [sys.executable, "-m", "fleetenv", "run", str(tasks), "--policy", "reference",
            "-n", "2", "--workers", "4"]
    code, drawn = run_on_pty([*argv, "--out", str(tmp_path / "a.jsonl")],
                             env_for(local_fleet), deadline_s=90)
    assert code == 0, drawn
    assert "4/4" in drawn and "failed 0" in drawn and "pass 100%" in drawn
    if importlib.util.find_spec("rich") is not None:  # else fleetenv's plain one-liner
        assert "episodes" in drawn and "/min" in drawn and "eta" in drawn

    piped = subprocess.run([*argv, "--out", str(tmp_path / "b.jsonl")],
                           env=env_for(local_fleet), capture_output=True, text=True,
                           timeout=90)
    assert piped.returncode == 0, piped.stderr
    assert "4/4" not in piped.stderr and "pass 100%" not in piped.stderr
    assert "\r" not in piped.stderr and "\x1b[" not in piped.stderr
