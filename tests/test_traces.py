"""Trace upload, end to end against the session's LocalFleet: real sockets, real episodes,
real trace routes; failures injected with the local Fleet's fault hooks."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import fleet
import httpx
import pytest
from _support.fixtures_local import tiny_png
from _support.waiting import wait_for

from fleetenv import bundled_tasks_path
from fleetenv.cli.main import main
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.core.types import RolloutResult
from fleetenv.fleet.session import Session
from fleetenv.fleet.traces import (
    TraceOptions,
    TraceUploader,
    TraceUploadError,
    ingest_request,
    trace_body,
)
from fleetenv.local import LocalFleet
from fleetenv.local.traces import TraceStore, page_url, view_key
from fleetenv.rollouts.policy_spec import PolicySpec
from fleetenv.rollouts.runner import Runner

pytestmark = pytest.mark.timeout(90)

REFERENCE = PolicySpec("reference")


def _config(local: LocalFleet, **settings: Any) -> FleetConfig:
    return resolve_config(api_key=local.token, base_url=local.base_url, **settings)


def _tasks(modality: str, count: int) -> list[Task]:
    return [t for t in load_tasks(bundled_tasks_path()) if t.modality == modality][:count]


def _get(local: LocalFleet, path: str) -> Any:
    response = httpx.get(f"{local.base_url}{path}", timeout=10.0,
                         headers={"Authorization": f"Bearer {local.token}"})
    response.raise_for_status()
    return response.json()


def _job_sessions(local: LocalFleet, job_id: str) -> list[dict[str, Any]]:
    job = _get(local, f"/v1/traces/jobs/{job_id}")
    return [_get(local, f"/v1/traces/sessions/{s['session_id']}") for s in job["sessions"]]


def _png_url(width: int) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(tiny_png(width, 8)).decode()


def _result(**fields: Any) -> RolloutResult:
    base: dict[str, Any] = {"task_key": "hand-made", "env_key": "helpdesk",
                            "rollout_id": f"r-{uuid.uuid4().hex[:8]}", "policy": "reference",
                            "reward": 1.0, "grade_status": "graded", "stop_reason": "agent_done",
                            "transcript": [{"role": "user", "content": "hello"}]}
    return RolloutResult(**{**base, **fields})


def _job_name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------------------- happy path


def test_runner_uploads_every_episode_with_reward_task_model_instance_and_verifier(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    tasks = _tasks("tool_use", 2) + _tasks("computer_use", 1)
    name = _job_name()
    with Runner(workers=3, config=_config(local_fleet), traces=name) as runner:
        results = list(runner.run(tasks, REFERENCE))
    report = runner.trace_report()
    assert report is not None and report.ok, report
    assert report.uploaded == 3 and report.job_id is not None
    jobs = {j["job_id"]: j for j in _get(local_fleet, "/v1/traces/jobs")}
    assert jobs[report.job_id]["name"] == name and jobs[report.job_id]["session_count"] == 3
    stored = {s["metadata"]["rollout_id"]: s for s in _job_sessions(local_fleet, report.job_id)}
    for result in results:
        session = stored[result.rollout_id]
        assert report.session_ids[result.rollout_id] == session["session_id"]
        assert session["task_key"] == result.task_key
        assert session["model"] == "reference"
        assert session["instance_id"] == result.instance_id is not None
        assert session["verifier_execution_id"] == result.verifier_execution_id
        assert result.verifier_execution_id is not None
        assert session["metadata"]["score"] == result.reward == 1.0
        assert session["status"] == "completed"
        assert len(session["messages"]) == len(result.transcript)
        calls = [m for m in session["messages"] if m.get("tool_calls")]
        assert calls and calls[0]["tool_calls"] == next(
            m["tool_calls"] for m in result.transcript if m.get("tool_calls"))
    computer = stored[results[[r.task_key for r in results].index(tasks[2].key)].rollout_id]
    images = [p for m in computer["messages"] if isinstance(m.get("content"), list)
              for p in m["content"] if p.get("type") == "image_url"]
    assert images and images[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert local_fleet.token not in json.dumps(list(stored.values()))


def test_fleet_python_sdk_writes_traces_to_the_local_fleet(fleet_client: Any,
                                                           local_fleet: LocalFleet) -> None:
    """The local routes take what fleet-python itself sends, and answer its models."""
    job_id = fleet_client.trace_job("sdk-job")
    created = fleet_client.create_session(model="m", task_key="t", job_id=job_id,
                                          initial_message={"role": "user", "content": "hi"})
    assert isinstance(created, fleet.models.SessionIngestResponse) and created.success
    appended = fleet_client.append_message(created.session_id,
                                           {"role": "assistant", "content": "hello"})
    assert appended.message_count == 2 and not appended.created_new_session
    session = fleet_client.start_session(job_id=job_id, model="m2", task_key="t2")
    session.log([{"role": "user", "content": "q"}], {"role": "assistant", "content": "a"})
    session.complete()
    stored = {s["task_key"]: s for s in _job_sessions(local_fleet, job_id)}
    assert [m["content"] for m in stored["t"]["messages"]] == ["hi", "hello"]
    assert stored["t2"]["status"] == "completed" and len(stored["t2"]["messages"]) == 2


def test_a_repeated_request_id_stores_the_transcript_once(local_fleet: LocalFleet) -> None:
    headers = {"Authorization": f"Bearer {local_fleet.token}", "X-Request-ID": "same-id-1"}
    job = httpx.post(f"{local_fleet.base_url}/v1/traces/jobs", json={"name": "dedupe"},
                     headers={**headers, "X-Request-ID": "job-1"}, timeout=10).json()
    body = {"messages": [{"role": "user", "content": "x"}], "job_id": job["job_id"]}
    first = httpx.post(f"{local_fleet.base_url}/v1/sessions/ingest", json=body,
                       headers=headers, timeout=10).json()
    again = httpx.post(f"{local_fleet.base_url}/v1/sessions/ingest", json=body,
                       headers=headers, timeout=10).json()
    assert first == again
    assert len(_get(local_fleet, f"/v1/traces/jobs/{job['job_id']}")["sessions"]) == 1


def test_local_trace_routes_reject_bad_bodies_with_a_reason(local_fleet: LocalFleet) -> None:
    auth = {"Authorization": f"Bearer {local_fleet.token}"}
    url = f"{local_fleet.base_url}/v1/sessions/ingest"
    empty = httpx.post(url, json={"messages": []}, headers=auth, timeout=10)
    assert empty.status_code == 422 and "at least one message" in empty.json()["detail"]
    unknown = httpx.post(url, json={"messages": [{"role": "user"}], "job_id": "nope"},
                         headers=auth, timeout=10)
    assert unknown.status_code == 404 and "POST /v1/traces/jobs" in unknown.json()["detail"]


# ----------------------------------------------------------------------------- failures


def test_transient_failures_are_retried_within_the_budget(local_fleet: LocalFleet,
                                                          local_faults: Any) -> None:
    job_fault = local_faults.add("http_error", route="/v1/traces*", status=503, times=2)
    ingest_fault = local_faults.add("http_error", route="/v1/sessions/ingest", status=502,
                                    times=2)
    tasks = _tasks("tool_use", 2)
    config = _config(local_fleet, retry_base_s=0.05, retry_cap_s=0.2)
    with Runner(workers=2, config=config, traces=_job_name()) as runner:
        results = list(runner.run(tasks, REFERENCE))
    report = runner.trace_report()
    assert report is not None and report.ok and report.uploaded == 2, report
    left = {f["id"] for f in local_faults.list()}
    assert job_fault not in left and ingest_fault not in left  # both used up: retried
    assert report.job_id is not None
    sessions = _job_sessions(local_fleet, report.job_id)
    assert sorted(s["metadata"]["rollout_id"] for s in sessions) == sorted(
        r.rollout_id for r in results)  # each episode once: no duplicate from a retry


def test_a_permanent_failure_is_reported_and_the_run_still_succeeds(
        local_fleet: LocalFleet, local_faults: Any, caplog: pytest.LogCaptureFixture) -> None:
    fault = local_faults.add("http_error", route="/v1/sessions/ingest", status=400,
                             message="traces are disabled for this team")
    tasks = _tasks("tool_use", 2)
    with (caplog.at_level(logging.WARNING, logger="fleetenv.traces"),
          Runner(workers=2, config=_config(local_fleet), traces=_job_name()) as runner):
        results = list(runner.run(tasks, REFERENCE))
    assert [r.reward for r in results] == [1.0, 1.0] and not any(r.error for r in results)
    report = runner.trace_report()
    assert report is not None and report.failed == 2 and report.uploaded == 0
    assert "400" in report.errors[0] and "traces are disabled" in report.errors[0]
    assert "2 failed" in report.summary()
    assert [f["hits"] for f in local_faults.list() if f["id"] == fault] == [2]  # no retry
    assert "trace upload" in caplog.text and "the run goes on" in caplog.text


def test_retries_stop_when_the_upload_budget_is_spent(local_fleet: LocalFleet,
                                                      local_faults: Any) -> None:
    fault = local_faults.add("http_error", route="/v1/sessions/ingest", status=503)
    config = _config(local_fleet, retry_base_s=0.05, retry_cap_s=0.2)
    options = TraceOptions(_job_name(), budget_s=1.0)
    with Runner(workers=1, config=config, traces=options) as runner:
        results = list(runner.run(_tasks("tool_use", 1), REFERENCE))
    assert results[0].reward == 1.0
    report = runner.trace_report()
    assert report is not None and report.failed == 1
    assert "within its 1 s budget" in report.errors[0]
    hits = next(f["hits"] for f in local_faults.list() if f["id"] == fault)
    assert hits >= 2  # retried, and then given up


def test_a_job_that_cannot_be_created_fails_every_upload_without_sending_them(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    local_faults.add("http_error", route="/v1/traces/jobs", status=403,
                     message="no trace access")
    ingest = local_faults.add("http_delay", route="/v1/sessions/ingest", seconds=0)
    with Runner(workers=2, config=_config(local_fleet), traces=_job_name()) as runner:
        list(runner.run(_tasks("tool_use", 2), REFERENCE))
    report = runner.trace_report()
    assert report is not None and report.failed == 2 and report.job_id is None
    assert all("trace job" in e for e in report.errors)
    assert next(f.get("hits", 0) for f in local_faults.list() if f["id"] == ingest) == 0


def test_close_is_bounded_and_counts_what_it_could_not_send(local_fleet: LocalFleet,
                                                            local_faults: Any) -> None:
    hang = local_faults.add("http_hang", route="/v1/sessions/ingest")
    with Session(_config(local_fleet)) as session:
        uploader = TraceUploader(session, TraceOptions(_job_name(), max_pending=1))
        assert uploader.submit(_result())
        wait_for(lambda: any(f.get("hits") for f in local_faults.list() if f["id"] == hang),
                 timeout=20, what="the first upload to reach the server")
        assert uploader.submit(_result())       # waits in the queue
        assert not uploader.submit(_result())   # the queue is full: not sent, counted
        report = uploader.close(timeout_s=0.5)
        assert report.uploaded == 0 and report.dropped == 3, report
        assert not uploader.submit(_result())   # closed
        local_faults.clear()                    # the held upload ends; counted once only
        wait_for(lambda: not uploader.running, timeout=20,
                 what="the upload thread to end")
        assert uploader.report().dropped == 4 and uploader.report().uploaded == 0


# ----------------------------------------------------------------------------- the payload


def test_secrets_never_reach_a_trace(local_fleet: LocalFleet, local_faults: Any) -> None:
    runner_token = local_fleet.runner_token()
    assert runner_token
    leaky = (f"key {local_fleet.token} runner {runner_token} "
             "Authorization: Bearer sk-abcdef0123456789")
    result = _result(transcript=[
        {"role": "user", "content": leaky},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "echo", "arguments": json.dumps({"text": leaky})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": leaky}]},
    ], error={"type": "X", "message": leaky})
    with Session(_config(local_fleet)) as session:
        uploader = TraceUploader(session, _job_name())
        uploader.submit(result)
        report = uploader.close()
    assert report.uploaded == 1 and report.job_id
    stored = json.dumps(_job_sessions(local_fleet, report.job_id))
    assert local_fleet.token not in stored and runner_token not in stored
    assert "sk-abcdef0123456789" not in stored and "***" in stored


def test_images_stay_inline_under_their_caps() -> None:
    small, large = _png_url(2), _png_url(400)
    result = _result(transcript=[
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": small}},
                                     {"type": "image_url", "image_url": {"url": large}},
                                     {"type": "image_url", "image_url": {
                                         "url": "https://example.invalid/a.png"}}]}])
    body = ingest_request(result, job_id="tj-1", model=None,
                          max_image_bytes=len(small) + 10, max_trace_bytes=10_000_000)
    parts = body["messages"][0]["content"]
    assert parts[1] == {"type": "image_url", "image_url": {"url": small}}
    assert parts[2]["type"] == "text" and "per-image cap" in parts[2]["text"]
    assert "sha256" in parts[2]["text"] and large not in json.dumps(body)
    assert parts[3]["image_url"]["url"] == "https://example.invalid/a.png"
    assert body["metadata"]["images_omitted"] == 1
    tight = ingest_request(result, job_id="tj-1", model="m", max_image_bytes=10_000_000,
                           max_trace_bytes=len(small) + 10)
    kept = [p for p in tight["messages"][0]["content"] if p["type"] == "image_url"
            and p["image_url"]["url"].startswith("data:")]
    assert len(kept) == 1 and "per-trace cap" in json.dumps(tight)



def test_an_image_url_part_may_hold_the_url_as_a_string_or_an_object() -> None:
    """OpenAI accepts ``{"image_url": "<url>"}`` beside ``{"image_url": {"url": ...}}``."""
    small, large = _png_url(2), _png_url(400)
    link = "https://example.invalid/a.png?token=abcdef123456"
    parts = [{"type": "image_url", "image_url": small},
             {"type": "image_url", "image_url": large},
             {"type": "image_url", "image_url": {"url": small, "detail": "low"}},
             {"type": "image_url", "image_url": link},
             {"type": "image_url", "image_url": None}]
    body = trace_body([{"role": "user", "content": parts}], job_id="tj-1", task_key="t",
                      model="m", reward=1.0, max_image_bytes=len(small) + 10)
    sent = body["messages"][0]["content"]
    assert sent[0] == {"type": "image_url", "image_url": small}
    assert sent[1]["type"] == "text" and "per-image cap" in sent[1]["text"]
    assert sent[2] == parts[2]
    assert sent[3] == {"type": "image_url", "image_url": "https://example.invalid/a.png?token=***"}
    assert sent[4] == {"type": "image_url", "image_url": None}
    assert body["metadata"]["images_omitted"] == 1 and large not in json.dumps(body)

def test_a_failed_episode_without_a_transcript_is_still_traced_with_its_reason() -> None:
    result = _result(transcript=[], reward=None, grade_status="not_graded",
                     stop_reason="error", error={"type": "ProvisioningError",
                                                 "message": "no capacity"})
    body = ingest_request(result, job_id="tj-1", model="gpt-x")
    assert body["status"] == "failed" and body["model"] == "gpt-x"
    assert "no capacity" in body["messages"][0]["content"]
    assert "score" not in body["metadata"] or body["metadata"]["score"] is None
    fleet.models.SessionIngestRequest.model_validate(body)


def test_bad_trace_options_fail_at_construction_naming_the_option(
        local_fleet: LocalFleet) -> None:
    with pytest.raises(ConfigurationError, match="job name"):
        Runner(workers=1, config=_config(local_fleet), traces="  ")
    with pytest.raises(ConfigurationError, match="budget_s"):
        TraceOptions("x", budget_s=0)
    with pytest.raises(ConfigurationError, match="traces= takes"):
        Runner(workers=1, config=_config(local_fleet), traces=3)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- page and CLI


def test_the_trace_page_shows_jobs_sessions_and_images_behind_its_view_key(
        local_fleet: LocalFleet) -> None:
    result = _result(task_key="page-<task>", transcript=[
        {"role": "user", "content": [{"type": "text", "text": "<script>alert(1)</script>"},
                                     {"type": "image_url", "image_url": {"url": _png_url(3)}}]}])
    with Session(_config(local_fleet)) as session:
        uploader = TraceUploader(session, "page-job")
        uploader.submit(result)
        report = uploader.close()
    assert report.job_id is not None
    denied = httpx.get(f"{local_fleet.base_url}/traces", timeout=10)
    assert denied.status_code == 401 and "view key" in denied.text
    url = page_url(local_fleet.base_url, local_fleet.token)
    assert local_fleet.token not in url
    jobs = httpx.get(url, timeout=10)
    assert jobs.status_code == 200 and "page-job" in jobs.text
    assert "script-src" not in jobs.headers["content-security-policy"]
    assert "default-src 'none'" in jobs.headers["content-security-policy"]
    key = view_key(local_fleet.token)
    job = httpx.get(f"{local_fleet.base_url}/traces/jobs/{report.job_id}?key={key}",
                    timeout=10)
    assert "page-&lt;task&gt;" in job.text
    session_id = report.session_ids[result.rollout_id or ""]
    page = httpx.get(f"{local_fleet.base_url}/traces/sessions/{session_id}?key={key}",
                     timeout=10)
    assert page.status_code == 200
    assert "&lt;script&gt;" in page.text and "<script>" not in page.text
    assert '<img alt="image" src="data:image/png;base64,' in page.text
    assert local_fleet.token not in page.text


@pytest.mark.timeout(90)
def test_cli_run_with_trace_uploads_and_prints_the_count(
        local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEET_API_KEY", local_fleet.token)
    monkeypatch.setenv("FLEET_BASE_URL", local_fleet.base_url)
    task = _tasks("tool_use", 1)[0]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task.to_fleet_dict()) + "\n")
    name = _job_name()
    level = logging.getLogger("fleetenv").level
    try:
        code = main(["run", str(tasks), "--policy", "reference", "-n", "2",
                     "--out", str(tmp_path / "out.jsonl"), "--trace", name])
    finally:
        logging.getLogger("fleetenv").setLevel(level)
    assert code == 0
    printed = capsys.readouterr().out
    assert f"traces: 2 uploaded to trace job {name!r}" in printed
    jobs = [j for j in _get(local_fleet, "/v1/traces/jobs") if j["name"] == name]
    assert len(jobs) == 1 and jobs[0]["session_count"] == 2


def test_the_local_store_forgets_the_oldest_sessions_past_its_bounds() -> None:
    store = TraceStore(max_sessions=2, max_bytes=1000)
    job = store.create_job(None)["job_id"]
    ids = [store.ingest({"messages": [{"role": "user", "content": str(i)}], "job_id": job},
                        size=100)["session_id"] for i in range(3)]
    assert list(store.sessions) == ids[1:]
    big = store.ingest({"messages": [{"role": "user", "content": "big"}]}, size=950)
    assert list(store.sessions) == [big["session_id"]]  # bytes: older ones went first


def test_cli_serve_prints_the_trace_page_address() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FLEET_API_KEY", "FLEET_BASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetenv.cli.main", "serve", "--port", "0",
         "--apps", "_support.fixtures_local:TEST_APPS"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(4)]
        token = lines[2].split("=", 1)[1].strip()
        url = lines[3].split(": ", 1)[1].strip()
        assert "/traces?key=" in url and token not in url
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "Trace jobs" in page.text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_trace_body_takes_a_raw_chat_history_as_openenvs_upload_trace_did() -> None:
    body = trace_body([{"role": "user", "content": "q"},
                       {"role": "assistant", "content": "a", "thinking": "hmm"}],
                      job_id="tj-1", task_key="t", model="m", reward=0.5,
                      instance_id="i-1", verifier_execution_id="ve-1",
                      metadata={"note": "api_key=sk-live-123456"}, secrets=("sk-live-123456",))
    assert body["metadata"]["score"] == 0.5 and body["metadata"]["note"] == "api_key=***"
    assert body["messages"][1]["thinking"] == "hmm" and body["instance_id"] == "i-1"
    with pytest.raises(TraceUploadError, match="SessionIngestRequest refuses"):
        trace_body([], job_id="tj-1", task_key="t", model="m", reward=None)
