"""Verifier execution: worker processes, time limits, crashes, and the faults for them."""

from __future__ import annotations

import base64
import hashlib
import io
import threading
import time
import zipfile
from typing import Any

import cloudpickle
import httpx
import pytest
from _support.waiting import wait_for

from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(20)

COUNTS_NOTES = '''
def count_notes(env, final_answer=None):
    env.instance.load()
    rows = env.db("current").query("SELECT COUNT(*) FROM notes").rows
    print("answer:", final_answer)
    return {"score": 1.0 if rows[0][0] == 2 else 0.0, "answer": final_answer}
'''
LOOPS_FOREVER = "def spin(env):\n    while True:\n        pass\n"
EXITS = "import os\n\ndef leave(env):\n    os._exit(3)\n"
SEGFAULTS = "import ctypes\n\ndef crash(env):\n    ctypes.string_at(0)\n"


def bundle_for(code: str) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("verifier.py", code)
        archive.writestr("requirements.txt", "fleet-python\n")
    return buffer.getvalue(), hashlib.sha256(buffer.getvalue()).hexdigest()


def execute(fleet: LocalFleet, instance_id: str, code: str, *args: Any,
            timeout: float = 30, **kwargs: Any) -> dict[str, Any]:
    """POST /v1/verifiers/execute exactly as fleet-python builds it."""
    response = post_execute(fleet, instance_id, code, *args, timeout=timeout, **kwargs)
    assert response.status_code == 200, response.text
    return dict(response.json())


def post_execute(fleet: LocalFleet, instance_id: str, code: str, *args: Any,
                 timeout: float = 30, **kwargs: Any) -> httpx.Response:
    bundle, sha = bundle_for(code)
    marker = {"env": instance_id}
    pickled = cloudpickle.dumps({"args": (None, *args, marker), "kwargs": kwargs})
    body = {
        "key": "test-verifier",
        "sha256": sha,
        "args": base64.b64encode(pickled).decode(),
        "args_array": [*args, marker],
        "function_name": code.split("def ", 1)[1].split("(", 1)[0],
        "timeout": timeout,
        "bundle": base64.b64encode(bundle).decode(),
    }
    return httpx.post(f"{fleet.base_url}/v1/verifiers/execute", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {fleet.token}"})


@pytest.fixture
def instance_id(notes_client: Any) -> Any:
    env = notes_client.make("notes")
    yield env.instance_id
    env.close()


def test_kwargs_positional_args_and_stdout(notes_fleet: LocalFleet, instance_id: str) -> None:
    by_kwarg = execute(notes_fleet, instance_id, COUNTS_NOTES, final_answer="42")
    assert by_kwarg["success"] is True, by_kwarg["error"]
    assert by_kwarg["result"] == {"score": 1.0, "answer": "42"}
    assert by_kwarg["stdout"] == "answer: 42\n"
    positional = execute(notes_fleet, instance_id, COUNTS_NOTES, "7")
    assert positional["result"]["answer"] == "7"
    assert positional["execution_id"].startswith("exec-") and positional["key"] == "test-verifier"


def test_bundle_cache_and_check(notes_fleet: LocalFleet, instance_id: str) -> None:
    headers = {"Authorization": f"Bearer {notes_fleet.token}"}
    url = notes_fleet.base_url + "/v1/verifiers"
    _, sha = bundle_for(COUNTS_NOTES + "\n# cache test\n")
    assert httpx.get(f"{url}/check", params={"sha256": sha}, headers=headers,
                     timeout=5).json()["success"] is False
    body = {"sha256": sha, "args_array": [{"env": instance_id}], "key": "k",
            "function_name": "count_notes"}
    missing = httpx.post(f"{url}/execute", json=body, headers=headers, timeout=5)
    assert missing.status_code == 404 and "not found" in missing.json()["detail"]
    execute(notes_fleet, instance_id, COUNTS_NOTES + "\n# cache test\n")
    assert httpx.get(f"{url}/check", params={"sha256": sha}, headers=headers,
                     timeout=5).json()["success"] is True
    cached = httpx.post(f"{url}/execute", json=body, headers=headers, timeout=30).json()
    assert cached["success"] is True and cached["bundle_cache_hit"] is True


@pytest.mark.parametrize("code, kind", [(EXITS, "VerifierCrashed"),
                                        (SEGFAULTS, "VerifierCrashed"),
                                        (LOOPS_FOREVER, "TimeoutError")],
                         ids=["os_exit", "segfault", "endless_loop"])
def test_runaway_verifiers_are_contained(
    notes_fleet: LocalFleet, instance_id: str, code: str, kind: str
) -> None:
    started = time.monotonic()
    outcome = execute(notes_fleet, instance_id, code, timeout=1)
    elapsed = time.monotonic() - started
    assert outcome["success"] is False
    assert outcome["error"]["type"] == kind, outcome["error"]
    # A hang bound, not a speed claim: the request's 1 s budget (~1.1 s for the endless
    # loop, less for crashes) plus generous slack, below the fixture's 10 s verifier cap.
    assert elapsed < 6
    # the server keeps serving, and a replacement worker runs the next verifier
    assert execute(notes_fleet, instance_id, COUNTS_NOTES)["success"] is True


def test_verifier_faults(notes_fleet: LocalFleet, notes_faults: Any, instance_id: str) -> None:
    notes_faults.add("verifier_crash", instance=instance_id, times=1)
    crashed = execute(notes_fleet, instance_id, COUNTS_NOTES)
    assert crashed["error"]["type"] == "VerifierCrashed"
    notes_faults.add("verifier_hang", key="test-verifier", times=1)
    started = time.monotonic()
    hung = execute(notes_fleet, instance_id, COUNTS_NOTES, timeout=1)
    assert hung["error"]["type"] == "TimeoutError"
    assert time.monotonic() - started < 6  # hang bound: the 1 s budget + slack, as above
    assert execute(notes_fleet, instance_id, COUNTS_NOTES)["success"] is True


JUDGE = '''
import json

def judge(env, final_answer=None, conversation=None):
    messages = json.loads(conversation)
    print(">>> ERROR_ACCUMULATOR >>>")
    print([])
    print("<<< ERROR_ACCUMULATOR <<<")
    print(">>> SUCCESS_ACCUMULATOR >>>")
    print([m["content"] for m in messages])
    print("<<< SUCCESS_ACCUMULATOR <<<")
    return None
'''


def test_conversation_kwarg_prints_and_a_none_result(notes_fleet: LocalFleet,
                                                     instance_id: str) -> None:
    """What judge verifiers need from the runner: the ``conversation`` keyword (a JSON
    string, as clients send it), their prints as stdout, and ``None`` passed back."""
    chat = '[{"role": "assistant", "content": "told them"}]'
    outcome = execute(notes_fleet, instance_id, JUDGE, None, conversation=chat)
    assert outcome["success"] is True and outcome["result"] is None, outcome["error"]
    assert ">>> SUCCESS_ACCUMULATOR >>>\n['told them']\n" in outcome["stdout"]


def test_grading_faults(notes_fleet: LocalFleet, notes_faults: Any, instance_id: str) -> None:
    notes_faults.add("verifier_unavailable", instance=instance_id, status=502, times=2)
    for _ in range(2):  # nothing ran: an answer like an overloaded runner's
        refused = post_execute(notes_fleet, instance_id, COUNTS_NOTES)
        assert refused.status_code == 502 and "unavailable" in refused.json()["detail"]
    assert execute(notes_fleet, instance_id, COUNTS_NOTES)["success"] is True

    notes_faults.add("verifier_judge_error", key="test-verifier", message="judge down",
                     times=1)
    judged = execute(notes_fleet, instance_id, COUNTS_NOTES, "7")
    assert judged["success"] is True and judged["result"]["answer"] == "7"
    assert judged["stdout"] == "JUDGE ERROR: judge down\nanswer: 7\n"
    assert "JUDGE ERROR" not in execute(notes_fleet, instance_id, COUNTS_NOTES)["stdout"]

    fault = notes_faults.add("verifier_delay", instance=instance_id, seconds=0.2, times=1)
    assert execute(notes_fleet, instance_id, COUNTS_NOTES)["success"] is True
    assert fault not in [f["id"] for f in notes_faults.list()]  # it was used


def test_sdk_timeout_is_capped_by_the_server_limit() -> None:
    from _support.fixtures_local import TEST_APPS

    with LocalFleet(apps=TEST_APPS, verifier_timeout=1.0, verifier_workers=1) as local:
        client = local.client()
        env = client.make("notes")
        task = client.load_task_from_json(
            {"key": "spin", "prompt": "p", "env_id": "notes", "verifier_func": LOOPS_FOREVER}
        )
        started = time.monotonic()
        response = task.verify_detailed(env)  # fleet-python always asks for 30 s
        assert response.success is False and response.error["type"] == "TimeoutError"
        # A hang bound: the server's 1 s cap plus generous slack, far below the 30 s asked.
        assert time.monotonic() - started < 10
        env.close()


def start_hung_verification(local: LocalFleet, instance_id: str) -> threading.Thread:
    """A verification on ``instance_id`` that hangs (until the server's time limit) in
    its worker; returns once the worker has it."""
    fault = local.faults.add("verifier_hang", instance=instance_id, times=1)
    hung = threading.Thread(target=post_execute, args=(local, instance_id, COUNTS_NOTES),
                            daemon=True)
    hung.start()
    wait_for(lambda: fault not in [f["id"] for f in local.faults.list()], 10,
             "the hung verification to start")
    return hung


def test_a_hung_verifier_does_not_hold_up_the_others() -> None:
    """With every worker busy (here the only one, hung until its 30 s limit), the next
    verification gets a worker started for it instead of queueing behind the hang."""
    from _support.fixtures_local import TEST_APPS

    with LocalFleet(apps=TEST_APPS, verifier_timeout=30.0, verifier_workers=1) as local:
        client = local.client()
        stuck, free = client.make("notes"), client.make("notes")
        hung = start_hung_verification(local, stuck.instance_id)
        answer = post_execute(local, free.instance_id, COUNTS_NOTES)
        assert answer.status_code == 200 and answer.json()["success"] is True
        assert hung.is_alive()  # answered while the hung one still runs
        assert int(answer.headers["X-Verifier-Queue-Ms"]) >= 0
    hung.join(30)


def test_the_wait_for_a_worker_is_answered_apart_from_the_run() -> None:
    """At ``verifier_workers_max`` the pool grows no more: the next run waits for the
    hung one's worker, and says how long in ``X-Verifier-Queue-Ms``, apart from its own
    ``execution_time_ms``."""
    from _support.fixtures_local import TEST_APPS

    with LocalFleet(apps=TEST_APPS, verifier_timeout=5.0, verifier_workers=1,
                    verifier_workers_max=1) as local:
        client = local.client()
        stuck, free = client.make("notes"), client.make("notes")
        started = time.monotonic()
        hung = start_hung_verification(local, stuck.instance_id)
        answer = post_execute(local, free.instance_id, COUNTS_NOTES)
        took_ms = (time.monotonic() - started) * 1000
        body = answer.json()
        assert answer.status_code == 200 and body["success"] is True
        queued_ms = int(answer.headers["X-Verifier-Queue-Ms"])
        # It waited for the hang's 5 s limit, less the moment it took to be sent.
        assert 1000 <= queued_ms <= took_ms
        assert 0 <= body["execution_time_ms"] <= took_ms - queued_ms
    hung.join(30)


def test_verifications_waiting_for_a_worker_do_not_starve_the_server() -> None:
    """The server's blocking work (tool calls, manager-API queries, setting up an
    instance) runs on one shared set of threads. Verifications queued for a worker must
    not hold those threads, or everything else (a running verifier's own queries too)
    waits for the queue."""
    from _support.fixtures_local import TEST_APPS

    with LocalFleet(apps=TEST_APPS, verifier_timeout=15.0, verifier_workers=1,
                    verifier_workers_max=1) as local:
        client = local.client()
        stuck, free = client.make("notes"), client.make("notes")
        hung = start_hung_verification(local, stuck.instance_id)
        # 40 more, queued behind it; the fault marks each one as it reaches the pool.
        marker = local.faults.add("verifier_delay", instance=free.instance_id, seconds=0,
                                  times=40)
        queued = [threading.Thread(target=post_execute,
                                   args=(local, free.instance_id, COUNTS_NOTES), daemon=True)
                  for _ in range(40)]
        for thread in queued:
            thread.start()
        wait_for(lambda: marker not in [f["id"] for f in local.faults.list()], 15,
                 "40 verifications to queue")
        client.make("notes").close()  # set up (and torn down) in the server's threads
        assert hung.is_alive()  # answered while the queue still waits behind the hang
    for thread in (hung, *queued):
        thread.join(30)
