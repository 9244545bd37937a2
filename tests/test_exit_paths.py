"""Every exit path against every resource (issue 11, "Reliability II"): SIGTERM whatever
thread created the instances, SIGTERM during a hung tool call, deletes that keep failing,
interrupts while an instance is being created, and ``close()`` in a forked child.

Subprocess tests talk to this process's local Fleet through its URL and token, and check
from here (the admin API) what the child left running.
"""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
from _support.waiting import poll_until, wait_child, wait_for

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.cli.main import main as cli_main
from fleetenv.core.errors import FleetEnvError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event, InstanceDeleteFailed
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(90)


def _tool_use_task() -> Task:
    return next(t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use")


def _running_with_tag(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances(status="running")
            if i.get("run_id") == tag]


def _created_with_tag(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances() if i.get("run_id") == tag]


def _status_of(fleet: LocalFleet, instance_id: str) -> str:
    return {i["instance_id"]: i["status"] for i in fleet.instances()}[instance_id]


def _hits(faults: Any, kind: str) -> int:
    return sum(int(f.get("hits") or 0) for f in faults.list() if f["kind"] == kind)


def _child(script: str, fleet: LocalFleet, tag: str) -> subprocess.Popen[str]:
    env = dict(os.environ, T_KEY=fleet.token, T_URL=fleet.base_url, T_TAG=tag)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env,
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _finish(child: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)


# ---------------------------------------------------------------------------- 1. SIGTERM

RUNNER_SCRIPT = """
    import os
    from fleetenv.core.config import resolve_config
    from fleetenv.core.task_files import load_tasks
    from fleetenv import bundled_tasks_path
    from fleetenv.rollouts.runner import Runner

    config = resolve_config(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                            run_tag=os.environ["T_TAG"])
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"][:4]
    with Runner(workers=2, config=config, progress=False) as runner:
        print("RUNNING", flush=True)
        for result in runner.run(tasks, "reference"):
            print("RESULT", result.task_key, flush=True)
    print("UNREACHABLE", flush=True)
"""


def test_sigterm_to_a_runner_deletes_the_instances_its_worker_threads_created(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    # The instances are created in the runner's worker threads, where no signal handler
    # can be installed; SIGTERM must still delete them (default action: the process
    # died at once and they kept running until their TTL).
    local_faults.add("tool_hang")
    tag = f"test-sigterm-runner-{uuid.uuid4().hex[:8]}"
    child = _child(RUNNER_SCRIPT, local_fleet, tag)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("RUNNING"), line
    wait_for(lambda: _hits(local_faults, "tool_hang") >= 2, 20, "2 held tool calls")
    signalled = time.monotonic()
    child.send_signal(signal.SIGTERM)
    out, err = _finish(child, 40)
    took = time.monotonic() - signalled
    assert "UNREACHABLE" not in out
    assert len(_created_with_tag(local_fleet, tag)) >= 2
    assert _running_with_tag(local_fleet, tag) == [], err[-3000:]
    assert child.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert took < 25, f"exit took {took:.1f} s"  # a hang bound, not a speed claim


CHAINED_SCRIPT = """
    import os, signal, sys, threading
    import fleetenv
    from fleetenv import bundled_tasks_path

    def mine(signum, frame):
        print("USER HANDLER", flush=True)
        sys.stdin.readline()  # until the test saw the instance deleted
        sys.exit(7)

    signal.signal(getattr(signal, os.environ["T_SIGNAL"]), mine)
    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
                if t.modality == "tool_use")
    session = fleetenv.Session(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                               run_tag=os.environ["T_TAG"])
    env = fleetenv.FleetEnv(task, session=session)
    worker = threading.Thread(target=env.reset, daemon=True)  # created off the main thread
    worker.start()
    worker.join()
    print("READY", env.instance_id, flush=True)
    signal.pause()
    print("UNREACHABLE", flush=True)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_sigterm_chains_to_the_users_own_handler_after_starting_the_cleanup(
        local_fleet: LocalFleet, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # SIGHUP (a closed terminal) as SIGTERM: before, fleetenv did not handle it at all.
    monkeypatch.setenv("T_SIGNAL", name)
    tag = f"test-sigterm-chain-{uuid.uuid4().hex[:8]}"
    child = _child(CHAINED_SCRIPT, local_fleet, tag)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("READY"), line
    child.send_signal(getattr(signal, name))
    try:
        assert child.stdout.readline().startswith("USER HANDLER")
        # Started before the user's handler ran, the cleanup does not wait for it.
        stopped = poll_until(lambda: _status_of(local_fleet, line.split()[1]) == "stopped",
                             10)
        assert stopped and child.poll() is None
    finally:
        out, err = _finish(child, 30)  # closes stdin: the user's handler goes on
    assert "UNREACHABLE" not in out
    assert child.returncode == 7, err[-3000:]


def test_importing_fleetenv_changes_no_signal_handler() -> None:
    code = ("import signal, fleetenv, fleetenv.rollouts.runner; "
            "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "
            "signal.getsignal(signal.SIGHUP) is signal.SIG_DFL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "True True"


# ---------------------------------------------------------------------------- 5. hung call

HUNG_CALL_SCRIPT = """
    import os, threading
    import fleetenv
    from fleetenv import bundled_tasks_path

    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
                if t.modality == "tool_use")
    session = fleetenv.Session(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                               run_tag=os.environ["T_TAG"], timeouts={"call": 300})
    env = fleetenv.FleetEnv(task, session=session)
    env.reset()
    call = task.reference_solution[0]

    def work():
        print("STEPPING", env.instance_id, flush=True)
        env.step(fleetenv.ToolCall(call.name, call.arguments))  # held by the server

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    print("UNREACHABLE", flush=True)
"""


def test_sigterm_does_not_wait_for_a_hung_tool_call_in_another_thread(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    # The tool call may hang for timeouts.call (300 s here): SIGTERM must delete the
    # instance at once, and the held call must not keep the process alive.
    local_faults.add("tool_hang")
    tag = f"test-sigterm-hang-{uuid.uuid4().hex[:8]}"
    child = _child(HUNG_CALL_SCRIPT, local_fleet, tag)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("STEPPING"), line
    instance_id = line.split()[1]
    wait_for(lambda: _hits(local_faults, "tool_hang") >= 1, 20, "a held tool call")
    child.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        # A hang bound: the delete starts in the signal handler, it takes milliseconds.
        stopped = poll_until(lambda: _status_of(local_fleet, instance_id) == "stopped", 5)
        deleted_after = time.monotonic() - signalled
    finally:
        out, err = _finish(child, 30)
    exited_after = time.monotonic() - signalled
    assert stopped, f"the instance was still running 5 s after SIGTERM: {err[-3000:]}"
    assert deleted_after < 5
    assert "UNREACHABLE" not in out
    assert child.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert exited_after < 20, f"the process took {exited_after:.1f} s to exit"


PENDING_FUTURES_SCRIPT = """
    import os, sys
    import fleetenv
    from fleetenv import bundled_tasks_path

    tasks = [t for t in fleetenv.load_tasks(bundled_tasks_path())
             if t.modality == "tool_use"][:2]
    config = fleetenv.resolve_config(api_key=os.environ["T_KEY"],
                                     base_url=os.environ["T_URL"],
                                     run_tag=os.environ["T_TAG"], timeouts={"call": 300})
    if os.environ.get("T_WARM"):  # an instance made on the main thread first
        with fleetenv.FleetEnv(tasks[0], config=config) as env:
            env.reset()
    print("READY", flush=True)
    sys.stdin.readline()
    runner = fleetenv.Runner(config=config, workers=2, progress=False)
    futures = [runner.submit(task, "reference") for task in tasks]
    print("RUNNING", flush=True)
    for future in futures:  # no `with`: nothing cancels the rollouts on the way out
        print("RESULT", future.result().task_key, flush=True)
    print("UNREACHABLE", flush=True)
"""


@pytest.mark.parametrize("warm", [False, True], ids=["first-instance-in-worker",
                                                     "first-instance-on-main-thread"])
def test_sigterm_does_not_wait_for_hung_rollouts_of_an_unclosed_runner(
        local_fleet: LocalFleet, local_faults: Any, warm: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Interpreter exit joins the runner's worker threads before atexit runs, and they are
    # held in tool calls for up to timeouts.call (300 s): SIGTERM must not wait for that.
    # (With the first instance made on the main thread, SIGTERM was already handled; the
    # exit then waited for the held calls.)
    if warm:
        monkeypatch.setenv("T_WARM", "1")
    tag = f"test-sigterm-futures-{uuid.uuid4().hex[:8]}"
    child = _child(PENDING_FUTURES_SCRIPT, local_fleet, tag)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().startswith("READY")
    local_faults.add("tool_hang")
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline().startswith("RUNNING")
    wait_for(lambda: _hits(local_faults, "tool_hang") >= 2, 20, "2 held tool calls")
    child.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        gone = poll_until(lambda: not _running_with_tag(local_fleet, tag), 5)
    finally:
        out, err = _finish(child, 40)
    exited_after = time.monotonic() - signalled
    assert gone, f"instances still running 5 s after SIGTERM: {err[-3000:]}"
    assert len(_created_with_tag(local_fleet, tag)) == 2 + warm
    assert "UNREACHABLE" not in out
    assert child.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert exited_after < 20, f"the process took {exited_after:.1f} s to exit"


CLOSING_RUNNER_SCRIPT = """
    import os
    import fleetenv
    from fleetenv import bundled_tasks_path

    tasks = [t for t in fleetenv.load_tasks(bundled_tasks_path())
             if t.modality == "tool_use"][:2]
    config = fleetenv.resolve_config(api_key=os.environ["T_KEY"],
                                     base_url=os.environ["T_URL"],
                                     run_tag=os.environ["T_TAG"], timeouts={"call": 300})
    with fleetenv.Runner(config=config, workers=2, progress=False) as runner:
        futures = [runner.submit(task, "reference") for task in tasks]
        print("RUNNING", flush=True)
    # leaving the block: close() waits for the rollouts, which the server holds
    print("UNREACHABLE", flush=True)
"""


def test_ctrl_c_while_a_runner_closes_stops_its_rollouts(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("tool_hang")
    tag = f"test-ctrl-c-close-{uuid.uuid4().hex[:8]}"
    child = _child(CLOSING_RUNNER_SCRIPT, local_fleet, tag)
    assert child.stdout is not None
    assert child.stdout.readline().startswith("RUNNING")
    wait_for(lambda: _hits(local_faults, "tool_hang") >= 2, 20, "2 held tool calls")
    child.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    out, err = _finish(child, 40)
    exited_after = time.monotonic() - signalled
    assert "KeyboardInterrupt" in err and "UNREACHABLE" not in out
    assert len(_created_with_tag(local_fleet, tag)) == 2
    assert _running_with_tag(local_fleet, tag) == [], err[-3000:]
    assert exited_after < 20, f"the process took {exited_after:.1f} s to exit"


# ---------------------------------------------------------------------------- 3. deletes


def _delete_fault(faults: Any, **extra: Any) -> str:
    fault_id: str = faults.add("http_error", route="/v1/env/instances/*", method="DELETE",
                               status=503, **extra)
    return fault_id


def _session(fleet: LocalFleet, events: list[Event], **settings: Any) -> fleetenv.Session:
    return fleetenv.Session(api_key=fleet.token, base_url=fleet.base_url,
                            events=EventBus(sinks=[events.append]), retry_base_s=0.05,
                            retry_cap_s=0.2, **settings)


def test_a_delete_that_keeps_failing_frees_its_slot_and_is_swept_at_close(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    events: list[Event] = []
    session = _session(local_fleet, events, max_live_instances=1, timeouts={"provision": 5})
    task = _tool_use_task()
    with session:
        fault = _delete_fault(local_faults)  # every delete fails, retries included
        first = fleetenv.FleetEnv(task, session=session)
        first.reset()
        leaked = first.instance_id
        assert leaked is not None
        first.close(grade=False)
        assert _status_of(local_fleet, leaked) == "running"
        # The one max_live_instances slot was handed back with the instance: the next
        # episode gets an instance instead of DeadlineExceeded after 5 s.
        second = fleetenv.FleetEnv(task, session=session)
        second.reset()
        failed = [e for e in events if isinstance(e, InstanceDeleteFailed)]
        assert len(failed) == 1, events
        assert failed[0].instance_id == leaked
        assert f"fleetenv sweep --tag {session.run_tag}" in failed[0].error
        local_faults.clear(fault)
        second.close(grade=False)
    # Closing the session retried the delete that had failed.
    assert _status_of(local_fleet, leaked) == "stopped"
    assert _running_with_tag(local_fleet, session.run_tag) == []


def test_a_delete_that_fails_a_few_times_is_retried_and_frees_its_slot(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    events: list[Event] = []
    task = _tool_use_task()
    with _session(local_fleet, events, max_live_instances=1, timeouts={"provision": 5}) as session:
        _delete_fault(local_faults, times=2)
        for _ in range(2):
            with fleetenv.FleetEnv(task, session=session) as env:
                env.reset()
        assert not [e for e in events if isinstance(e, InstanceDeleteFailed)]
        assert session.live_instance_ids() == []
        assert _running_with_tag(local_fleet, session.run_tag) == []


def test_after_an_explicit_runtime_shutdown_deletes_get_their_retries_again(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    """``fleetenv.runtime.shutdown()`` runs the exit hook (every live instance deleted,
    each with one quick retry), and fleetenv goes on working after it. Before, the hook's
    at-exit mode stayed on for good: every later delete had two attempts, and two 503s
    left the instance behind (``InstanceDeleteFailed``)."""
    events: list[Event] = []
    task = _tool_use_task()
    with (_session(local_fleet, events) as session,
          fleetenv.FleetEnv(task, session=session) as env):
        env.reset()  # a live instance: the exit hook is installed, and runs below
        fleetenv.runtime.shutdown()
    with _session(local_fleet, events, max_live_instances=1,
                  timeouts={"provision": 5}) as session:
        _delete_fault(local_faults, times=2)
        with fleetenv.FleetEnv(task, session=session) as env:
            env.reset()
        assert not [e for e in events if isinstance(e, InstanceDeleteFailed)]
        assert session.live_instance_ids() == []
        assert _running_with_tag(local_fleet, session.run_tag) == []


def test_fleetenv_sweep_deletes_the_running_instances_of_a_tag(
        local_fleet: LocalFleet, local_faults: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    events: list[Event] = []
    task = _tool_use_task()
    session = _session(local_fleet, events)
    fault = _delete_fault(local_faults)
    env = fleetenv.FleetEnv(task, session=session)
    env.reset()
    leaked = env.instance_id
    assert leaked is not None
    env.close(grade=False)
    session.close()  # its retry fails too: the hint names the command
    local_faults.clear(fault)
    assert _running_with_tag(local_fleet, session.run_tag) == [leaked]
    monkeypatch.setenv("FLEET_API_KEY", local_fleet.token)
    monkeypatch.setenv("FLEET_BASE_URL", local_fleet.base_url)
    assert cli_main(["sweep", "--tag", session.run_tag, "--dry-run"]) == 0
    assert leaked in capsys.readouterr().out
    assert _running_with_tag(local_fleet, session.run_tag) == [leaked]
    assert cli_main(["sweep", "--tag", session.run_tag]) == 0
    out = capsys.readouterr().out
    assert leaked in out and "deleted 1" in out
    assert _running_with_tag(local_fleet, session.run_tag) == []
    assert cli_main(["sweep", "--tag", session.run_tag]) == 0
    assert "no running instance" in capsys.readouterr().out


# ---------------------------------------------------------------------------- 4. creates

@pytest.mark.parametrize("how", ["ctrl-c", "unreadable-200"])
def test_an_instance_created_behind_an_interrupt_or_bad_reply_is_swept_at_close(
        local_fleet: LocalFleet, local_faults: Any, how: str) -> None:
    # The local Fleet creates the instance, then holds its answer (a Ctrl-C arrives while
    # the client waits) or answers 200 with a proxy's error page: the client never learns
    # the instance's id, so only the tag can find it.
    events: list[Event] = []
    session = _session(local_fleet, events, timeouts={"provision": 3})
    expected: type[BaseException]
    if how == "ctrl-c":
        local_faults.add("create_reply", payload="delay", seconds=1.0, times=1)
        interrupt = threading.Timer(0.3, _thread.interrupt_main)
        interrupt.start()
        expected = KeyboardInterrupt
    else:
        local_faults.add("create_reply", payload="malformed", times=1)
        expected = FleetEnvError
    env = fleetenv.FleetEnv(_tool_use_task(), session=session)
    with pytest.raises(expected):
        env.reset()
    assert env.instance_id is None  # the id never arrived: nobody knows the instance
    orphans = _running_with_tag(local_fleet, session.run_tag)
    assert orphans, "the server did create it"
    env.close()
    session.close()
    assert _running_with_tag(local_fleet, session.run_tag) == []


# ---------------------------------------------------------------------------- 6. fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_close_in_a_forked_child_leaves_the_parents_instance_alone(
        local_fleet: LocalFleet) -> None:
    task = _tool_use_task()
    call = task.reference_solution[0]
    session = fleetenv.Session(api_key=local_fleet.token, base_url=local_fleet.base_url)
    env = fleetenv.FleetEnv(task, session=session)
    env.reset()
    instance_id = env.instance_id
    assert instance_id is not None
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports one line through the pipe and never returns to pytest
        report = "child crashed"
        try:
            try:
                env.step(fleetenv.ToolCall(call.name, call.arguments))
                report = "the parent's env was usable in the child"
            except FleetEnvError as exc:
                if "fork" not in str(exc):
                    raise
                env.close()  # a no-op in the child: the instance is the parent's
                env.close()
                session.close()
                report = "ok"
        except Exception as exc:
            report = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_fd, report.encode())
            os._exit(0)
    os.close(write_fd)
    try:
        assert wait_child(pid, timeout=30) == 0
        assert os.read(read_fd, 4096).decode() == "ok"
    finally:
        os.close(read_fd)
    assert _status_of(local_fleet, instance_id) == "running"
    with session:  # the parent's env and session still work
        _, _, _, _, info = env.step(fleetenv.ToolCall(call.name, call.arguments))
        assert "tool_error" not in info, info
        env.close()
    assert _status_of(local_fleet, instance_id) == "stopped"


# One tool-use task and a config for this process's local Fleet, in a child process.
ONE_TASK_PREAMBLE = """
    import os, sys, threading
    import fleetenv
    from fleetenv.errors import FleetEnvError
    from fleetenv import bundled_tasks_path

    task = [t for t in fleetenv.load_tasks(bundled_tasks_path())
            if t.modality == "tool_use"][0]
    config = fleetenv.resolve_config(api_key=os.environ["T_KEY"],
                                     base_url=os.environ["T_URL"],
                                     run_tag=os.environ["T_TAG"])
"""

HUNG_CREATE_SCRIPT = ONE_TASK_PREAMBLE + """
    def episode():
        try:
            fleetenv.FleetEnv(task, config=config).reset()
        except FleetEnvError as exc:
            print("ENDED", type(exc).__name__, exc, flush=True)

    threading.Thread(target=episode).start()  # not a daemon: exit joins it
    print("STARTED", flush=True)
    sys.stdin.readline()  # the create is held: the main thread ends
"""


def test_exit_does_not_wait_out_a_create_that_never_answers(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    """The main thread ends while a (non-daemon) thread waits on a create the control
    plane holds forever. Interpreter exit joins that thread: before, for the create's
    whole budget (600 s). Now exit gives calls under way ``EXIT_GRACE_S`` (10 s), then
    abandons them, and the thread ends with an error that says so."""
    local_faults.add("http_hang", route="/v1/env/instances*", method="POST")
    tag = f"test-exit-hung-create-{uuid.uuid4().hex[:8]}"
    child = _child(HUNG_CREATE_SCRIPT, local_fleet, tag)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().startswith("STARTED")
    wait_for(lambda: _hits(local_faults, "http_hang") >= 1, 20, "a held create")
    child.stdin.write("\n")
    child.stdin.flush()
    out, err = _finish(child, 60)  # the hang bound: grace plus the exit-time sweep
    assert child.returncode == 0, err[-3000:]
    assert "ENDED ProvisioningDeadlineExceeded" in out and "was abandoned" in out, err[-3000:]
    assert _running_with_tag(local_fleet, tag) == []


PROCESS_RUNNER_SCRIPT = ONE_TASK_PREAMBLE + """
    print("RUNNING", flush=True)
    with fleetenv.Runner(workers=2, mode="processes", config=config, progress=False) as r:
        for result in r.run([task, task], "reference"):
            print("RESULT", result.task_key, flush=True)
"""


def _processes_marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (the child and its workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if mark.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_closed_terminal_leaves_no_instance_and_no_worker_process(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    """The terminal closes: its SIGHUP reaches the whole foreground process group, the
    Runner's worker processes included. Before, SIGHUP's default action ended every one
    of them at once and their instances ran on until their TTL. Now each process deletes
    what it holds and exits with 129."""
    local_faults.add("tool_hang")
    tag = f"test-exit-sighup-{uuid.uuid4().hex[:8]}"
    mark = f"FLEETENV_TEST_MARK_{uuid.uuid4().hex}"
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url, T_TAG=tag)
    env[mark] = "1"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PROCESS_RUNNER_SCRIPT)],
                             env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL,  # workers must not hold our pipes
                             start_new_session=True)  # a process group, as a terminal's job
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("RUNNING")
        wait_for(lambda: _hits(local_faults, "tool_hang") >= 2, 60, "two held tool calls")
        assert len(_running_with_tag(local_fleet, tag)) == 2
        os.killpg(child.pid, signal.SIGHUP)
        assert child.wait(60) == 128 + signal.SIGHUP  # the hang bound: well within it
        assert poll_until(lambda: _processes_marked(mark) == [], 20), _processes_marked(mark)
        assert poll_until(lambda: not _running_with_tag(local_fleet, tag), 10), \
            _running_with_tag(local_fleet, tag)
    finally:
        if child.poll() is None:
            child.kill()
        for pid in _processes_marked(mark):
            os.kill(pid, signal.SIGKILL)
    assert len(_created_with_tag(local_fleet, tag)) == 2


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_ctrl_c_stops_worker_processes_blocked_on_a_create(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    """Process mode, creates that never answer, Ctrl-C. Before, the parent's exit joined
    worker processes blocked on their creates for the whole budget (600 s), and killing
    the parent left them running. Now the Runner terminates its own pool's workers after
    its grace: the parent exits well within the bound and no worker is left."""
    local_faults.add("http_hang", route="/v1/env/instances*", method="POST")
    tag = f"test-exit-process-create-{uuid.uuid4().hex[:8]}"
    mark = f"FLEETENV_TEST_MARK_{uuid.uuid4().hex}"
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url, T_TAG=tag)
    env[mark] = "1"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PROCESS_RUNNER_SCRIPT)],
                             env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)  # workers must not hold our pipes
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("RUNNING")
        wait_for(lambda: _hits(local_faults, "http_hang") >= 2, 60, "two held creates")
        child.send_signal(signal.SIGINT)
        child.wait(60)  # the hang bound: a 15 s grace, then the workers are stopped
        assert poll_until(lambda: _processes_marked(mark) == [], 20), _processes_marked(mark)
    finally:
        if child.poll() is None:
            child.kill()
        for pid in _processes_marked(mark):
            os.kill(pid, signal.SIGKILL)
    assert _running_with_tag(local_fleet, tag) == []
