"""Notebooks and the REPL: an env dropped without close() warns and gives its instance
back; observations, results and summaries display richly; wrong argument types say what
to pass.

Against the local Fleet, over real HTTP/MCP. The notebook test runs a real Jupyter kernel
(ipykernel, driven by nbclient) that re-runs a cell rebinding ``env = FleetEnv(...)``;
the display tests use IPython's own display formatter.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import uuid
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from _support.waiting import wait_for

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.core.config import resolve_config
from fleetenv.core.errors import ArgumentTypeError, ConfigurationError
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.env.unclosed import UnclosedEnvWarning
from fleetenv.fleet.session import Session
from fleetenv.local import LocalFleet
from fleetenv.rollouts.metrics import summarize
from fleetenv.rollouts.policy import ScriptedPolicy
from fleetenv.rollouts.rollout import run_episode

pytestmark = pytest.mark.timeout(120)

TOOL_TASK = "helpdesk-count-unassigned-open"
SCREEN_TASK = "helpdesk-ui-reply-and-resolve"


def _task(key: str) -> Task:
    return next(t for t in load_tasks(bundled_tasks_path()) if t.key == key)


@pytest.fixture
def session(local_fleet: LocalFleet) -> Iterator[Session]:
    with Session(resolve_config(api_key=local_fleet.token,
                                base_url=local_fleet.base_url)) as s:
        yield s


def _running(fleet: LocalFleet, tag: str) -> list[str]:
    return [i["instance_id"] for i in fleet.instances(status="running")
            if i.get("run_id") == tag]


# ---------------------------------------------------------------------- garbage collection


def test_an_env_dropped_without_close_warns_once_and_its_instance_is_deleted(
        local_fleet: LocalFleet, session: Session) -> None:
    tag = f"nb-{uuid.uuid4().hex[:8]}"
    task = _task(TOOL_TASK)
    env = FleetEnv(task, session=session, run_tag=tag)
    env.reset()
    first = env.instance_id
    assert first is not None
    watch = weakref.ref(env)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = FleetEnv(task, session=session, run_tag=tag)  # the cell, run again
        env.reset()
        gc.collect()
        assert watch() is None  # the finalizer did not keep (or bring back) the old env
        gc.collect()
    unclosed = [w for w in caught if issubclass(w.category, UnclosedEnvWarning)]
    assert len(unclosed) == 1, [str(w.message) for w in caught]
    message = str(unclosed[0].message)
    assert TOOL_TASK in message and first in message and "close()" in message
    second = env.instance_id
    wait_for(lambda: _running(local_fleet, tag) == [second], timeout=20,
             what="the collected env's instance to be deleted")
    assert first not in session.instances.live_ids()

    # A closed env is not watched any more: collecting it says nothing, deletes nothing.
    env.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del env
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, UnclosedEnvWarning)]
    wait_for(lambda: second not in _running(local_fleet, tag), timeout=10,
             what="the closed env's instance to be gone")


def test_an_env_that_never_started_is_collected_silently(session: Session) -> None:
    env = FleetEnv(_task(TOOL_TASK), session=session)
    watch = weakref.ref(env)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del env
        gc.collect()
    assert watch() is None
    assert not [w for w in caught if issubclass(w.category, UnclosedEnvWarning)]


def test_the_warning_is_shown_by_default() -> None:
    # ResourceWarning is ignored by Python's default filters; this one costs money.
    code = ("import warnings, fleetenv.env.unclosed as u\n"
            "warnings.warn(u.UnclosedEnvWarning('dropped env'), stacklevel=1)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "UnclosedEnvWarning: dropped env" in done.stderr


# A fresh process drops an env unclosed, then reports what is left once its instance
# is gone: any thread besides the main one and the runtime's (its loop, the idle threads
# of its bounded pool) is a leak (the threads of earlier tests cannot hide it, as they
# can in this process).
DROPPED_ENV_SCRIPT = f"""
import gc, os, threading, time, warnings
import fleetenv
from fleetenv import bundled_tasks_path

warnings.simplefilter("ignore")
task = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.key == {TOOL_TASK!r})
session = fleetenv.Session(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"])
env = fleetenv.FleetEnv(task, session=session)
env.reset()
print("INSTANCE", env.instance_id, flush=True)
del env
gc.collect()

def others():
    return sorted(t.name for t in threading.enumerate()
                  if t is not threading.main_thread() and t.name != "fleetenv-loop"
                  and not t.name.startswith("fleetenv-io_"))

deadline, pause = time.monotonic() + 20, 0.01
while (session.live_instance_ids() or others()) and time.monotonic() < deadline:
    time.sleep(pause)  # polling for the cleanup to finish, with backoff
    pause = min(pause * 2, 0.2)
print("LIVE", session.live_instance_ids(), flush=True)
print("THREADS", others(), flush=True)
"""


def test_a_dropped_envs_cleanup_leaves_no_thread_behind(local_fleet: LocalFleet) -> None:
    # Before, the first FleetEnv started a cleanup thread that never ended (the chaos
    # suite's "STRAY THREADS: ['fleetenv-unclosed-envs']"), whether or not an env was
    # ever dropped.
    env = {"T_KEY": local_fleet.token, "T_URL": local_fleet.base_url}
    done = subprocess.run([sys.executable, "-c", DROPPED_ENV_SCRIPT], capture_output=True,
                          text=True, timeout=90, env={**os.environ, **env})
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert done.returncode == 0, done.stderr[-3000:]
    assert lines["LIVE"] == "[]" and lines["THREADS"] == "[]", done.stdout
    status = {i["instance_id"]: i["status"] for i in local_fleet.instances()}
    assert status[lines["INSTANCE"]] == "stopped"


# ---------------------------------------------------------------------- a real kernel


def test_rerunning_a_notebook_cell_leaks_no_instance_and_displays_richly(
        local_fleet: LocalFleet) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    tag = f"nb-{uuid.uuid4().hex[:8]}"
    setup = (
        "import gc, fleetenv\n"
        "from fleetenv import bundled_tasks_path\n"
        f"session = fleetenv.Session(api_key={local_fleet.token!r}, "
        f"base_url={local_fleet.base_url!r})\n"
        "tasks = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}\n")
    rebind = (f"env = fleetenv.FleetEnv(tasks[{SCREEN_TASK!r}], session=session, "
              f"run_tag={tag!r})\nobs, info = env.reset()\nenv.instance_id")
    cells = [setup, rebind, rebind, rebind, "gc.collect()", "obs",
             f"fleetenv.summarize([fleetenv.run_episode(tasks[{TOOL_TASK!r}], "
             "'reference', session=session)])",
             "fleetenv.FleetEnv('helpdesk')"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(notebook, timeout=90, kernel_name="python3",
                                     allow_errors=True)
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
        ids = [_result(c)["text/plain"].strip("'") for c in notebook.cells[1:4]]
        assert len(set(ids)) == 3
        # Two envs were dropped by the re-runs: both warned, both instances deleted.
        text = "".join(o.get("text", "") for c in notebook.cells[1:5] for o in c.outputs
                       if o.get("output_type") == "stream")
        assert text.count("UnclosedEnvWarning") == 2, text
        assert ids[0] in text and ids[1] in text and SCREEN_TASK in text
        wait_for(lambda: _running(local_fleet, tag) == [ids[2]], timeout=30,
                 what="the instances of the rebound envs to be deleted")
        # The observation shows its screenshot; the summary its table.
        shown = _result(notebook.cells[5])
        assert "image/png" in shown and "text/html" in shown
        assert "<img" in shown["text/html"] and SCREEN_TASK in shown["text/html"]
        table = _result(notebook.cells[6])["text/html"]
        assert "pass rate (graded)" in table
        error = next(o for o in notebook.cells[7].outputs if o["output_type"] == "error")
        assert error["ename"] == "ArgumentTypeError"
        assert "environment, not a task" in error["evalue"]
        notebook.cells.append(nbformat.v4.new_code_cell("env.close(); session.close()"))
        client.execute_cell(notebook.cells[-1], len(notebook.cells) - 1)
    wait_for(lambda: _running(local_fleet, tag) == [], timeout=20,
             what="the last env's instance to be deleted")


def _result(cell: Any) -> dict[str, Any]:
    """The data of a cell's ``execute_result`` (its last expression, displayed)."""
    results = [o for o in cell.outputs if o["output_type"] == "execute_result"]
    assert len(results) == 1, cell.outputs
    return dict(results[0]["data"])


# ---------------------------------------------------------------------- rich display


def _formatted(value: Any) -> dict[str, Any]:
    formatters = pytest.importorskip("IPython.core.formatters")
    data, _ = formatters.DisplayFormatter().format(value)
    return dict(data)


def test_observations_results_and_summaries_display_richly(session: Session) -> None:
    with FleetEnv(_task(SCREEN_TASK), session=session) as env:
        obs, _ = env.reset()
        shown = _formatted(obs)
        assert shown["image/png"].startswith(b"\x89PNG")
        assert "<img" in shown["text/html"] and "step 0" in shown["text/html"]
        step, *_ = env.step(fleetenv.ToolCall("computer", {"action": "no-such-action"}))
        shown = _formatted(step)
        assert "image/png" not in shown  # no screenshot: no image
        assert "tool <code>computer</code>" in shown["text/html"]

    result = run_episode(_task(TOOL_TASK), ScriptedPolicy.reference(), session=session)
    shown = _formatted(result)
    assert "passed" in shown["text/html"] and TOOL_TASK in shown["text/html"]
    assert "transcript (" in shown["text/html"]
    shown = _formatted(summarize([result]))
    assert "pass@1 (n=1)" in shown["text/html"]


def test_markup_in_a_displayed_result_is_escaped() -> None:
    result = fleetenv.RolloutResult(task_key="<b>t</b>", env_key="e:v1", transcript=[
        {"role": "tool", "tool_call_id": "1", "content": "<script>alert(1)</script>"}])
    html = result._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>t</b>" not in html


# ---------------------------------------------------------------------- wrong types


def test_a_string_task_says_how_to_get_the_task(session: Session) -> None:
    with pytest.raises(ArgumentTypeError) as raised:
        FleetEnv("helpdesk")  # type: ignore[arg-type]
    error = raised.value
    assert isinstance(error, TypeError) and isinstance(error, ConfigurationError)
    assert "got the string 'helpdesk'" in error.message
    assert "names an environment, not a task" in (error.hint or "")

    with pytest.raises(TypeError) as raised:
        FleetEnv(TOOL_TASK)  # type: ignore[arg-type]
    assert "bundled_tasks_path()" in str(raised.value)
    assert f"FleetEnv(tasks[{TOOL_TASK!r}])" in str(raised.value)

    with pytest.raises(TypeError, match="got a list"):
        FleetEnv([_task(TOOL_TASK)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pass config="):
        FleetEnv(_task(TOOL_TASK), session=session.config)  # type: ignore[arg-type]


def test_run_episode_refuses_a_string_task_before_provisioning() -> None:
    with pytest.raises(ArgumentTypeError) as raised:
        fleetenv.run_episode(TOOL_TASK, "reference")  # type: ignore[arg-type]
    assert f"run_episode(tasks[{TOOL_TASK!r}])" in str(raised.value)


def test_summarize_says_what_to_pass(tmp_path: Any) -> None:
    with pytest.raises(TypeError, match="read_results"):
        summarize(str(tmp_path / "run.jsonl"))
    with pytest.raises(TypeError, match="from_dict"):
        summarize([{"task_key": "t", "env_key": "e"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="iterable"):
        summarize(3)  # type: ignore[arg-type]
