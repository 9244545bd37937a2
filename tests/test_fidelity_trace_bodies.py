"""Trace bodies Fleet's session viewer shows as the previous client's did, and the trace
jobs route on a separate host.

The previous Fleet client (fleet-ai/OpenEnv, ``src/envs/fleet_env/trace.py``) rewrites
the history it uploads because the viewer drops images from ``user`` messages. Its tests
(``tests/envs/test_fleet_trace_image_shape.py``) give the histories below; the expected
messages are the ones it builds for them, written out here, with one documented
difference: images stay inline ``data:`` URLs instead of being copied to a bucket.
Then the same end to end: a computer-use run uploaded to the local Fleet, whose trace page
(like Fleet's viewer) shows no images in user messages, opened in a real Chromium.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from _support.browser import chromium_page

from fleetenv import PolicySpec, Runner, Session, bundled_tasks_path, load_tasks, resolve_config
from fleetenv.cli.main import main
from fleetenv.cli.run import trace_options
from fleetenv.errors import ConfigurationError, TraceUploadError
from fleetenv.fleet.traces import TraceClient, TraceOptions, trace_body
from fleetenv.local import LocalFleet
from fleetenv.local.traces import view_key

pytestmark = pytest.mark.timeout(120)

JPEG = "data:image/jpeg;base64,/9j/4AAQ"
PNG = "data:image/png;base64,iVBORw0KGgo="
GENERATED = re.compile(r"call_[0-9a-f]{8}")


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def uploaded(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    body = trace_body(history, job_id="tj-1", task_key="t", model="m", reward=1.0)
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def same_up_to_generated_ids(sent: list[dict[str, Any]],
                             expected: list[dict[str, Any]]) -> bool:
    """Equal, except that a ``GENERATED`` placeholder matches any new ``call_xxxxxxxx``."""
    for got, want in zip(sent, expected, strict=True):
        if want.get("tool_call_id") is GENERATED:
            assert GENERATED.fullmatch(got.get("tool_call_id", "")), got
            want = {**want, "tool_call_id": got["tool_call_id"]}
        assert got == want, (got, want)
    return True


# The original's test histories, and the messages it uploads for each.
ORIGINAL_CASES = {
    "footer stripped from a multimodal observation": (
        [{"role": "tool", "content": [image(JPEG), text("[Turn 3/64]")]}],
        [{"role": "tool", "content": [image(JPEG)]}]),
    "footer variants: padded, spaced, with a newline": (
        [{"role": "tool", "content": [image(PNG), text("  [Turn 12/64]  "),
                                      text("[Turn 64 / 64]"), text("[Turn 1/64]\n")]}],
        [{"role": "tool", "content": [image(PNG)]}]),
    "other text kept": (
        [{"role": "tool", "content": [text("search returned 12 results"), image(JPEG),
                                      text("[Turn 5/64]")]}],
        [{"role": "tool", "content": [text("search returned 12 results"), image(JPEG)]}]),
    "a user message with an image goes as tool, with a new call id": (
        [{"role": "system", "content": "you are a helpful agent"},
         {"role": "user", "content": "open the page"},
         {"role": "assistant", "content": "I'll click."},
         {"role": "user", "content": [text("[Turn 1/64]"), image(JPEG)]}],
        [{"role": "system", "content": "you are a helpful agent"},
         {"role": "user", "content": "open the page"},
         {"role": "assistant", "content": "I'll click."},
         {"role": "tool", "content": [image(JPEG)], "tool_call_id": GENERATED}]),
    "it answers the preceding assistant's first tool call": (
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": "calling tool", "tool_calls": [
             {"id": "call_abc123", "type": "function",
              "function": {"name": "computer", "arguments": "{}"}}]},
         {"role": "user", "content": [image(PNG)]}],
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": "calling tool", "tool_calls": [
             {"id": "call_abc123", "type": "function",
              "function": {"name": "computer", "arguments": "{}"}}]},
         {"role": "tool", "content": [image(PNG)], "tool_call_id": "call_abc123"}]),
    "user text messages stay user": (
        [{"role": "user", "content": "the task prompt"},
         {"role": "assistant", "content": "ok"},
         {"role": "user", "content": "follow-up text only, no image"}],
        [{"role": "user", "content": "the task prompt"},
         {"role": "assistant", "content": "ok"},
         {"role": "user", "content": "follow-up text only, no image"}]),
    "a tool message keeps its role and its own call id": (
        [{"role": "tool", "tool_call_id": "call_existing", "content": [image(PNG)]}],
        [{"role": "tool", "tool_call_id": "call_existing", "content": [image(PNG)]}]),
    "assistant tool_calls are forwarded and the screenshot bound to them": (
        [{"role": "system", "content": "sys"},
         {"role": "user", "content": "do a thing"},
         {"role": "assistant", "content": "calling computer screenshot", "tool_calls": [{
             "id": "call_1", "type": "function",
             "function": {"name": "computer", "arguments": '{"action": "screenshot"}'}}]},
         {"role": "user", "content": [image(PNG)]}],
        [{"role": "system", "content": "sys"},
         {"role": "user", "content": "do a thing"},
         {"role": "assistant", "content": "calling computer screenshot", "tool_calls": [{
             "id": "call_1", "type": "function",
             "function": {"name": "computer", "arguments": '{"action": "screenshot"}'}}]},
         {"role": "tool", "content": [image(PNG)], "tool_call_id": "call_1"}]),
    "tool_calls only on assistant messages": (
        [{"role": "system", "content": "sys", "tool_calls": [{"id": "x"}]},
         {"role": "user", "content": "task"}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]),
    "no empty tool_calls on an assistant without calls": (
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
         {"role": "assistant", "content": "plain text, no parseable call",
          "tool_calls": []}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
         {"role": "assistant", "content": "plain text, no parseable call"}]),
}


@pytest.mark.parametrize("case", list(ORIGINAL_CASES))
def test_the_upload_is_the_original_clients_for_each_of_its_test_histories(case: str) -> None:
    history, expected = ORIGINAL_CASES[case]
    assert same_up_to_generated_ids(uploaded(history), expected)


def test_each_image_message_answers_its_own_call_and_ids_are_never_shared() -> None:
    call = {"type": "function", "function": {"name": "computer", "arguments": "{}"}}
    sent = uploaded([
        {"role": "user", "content": [text("task"), image(PNG)]},      # before any call
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", **call},
                                                              {"id": "c2", **call}]},
        {"role": "tool", "tool_call_id": "c1", "content": [text("done")]},
        {"role": "user", "content": [text("Image output of computer:"), image(PNG)]},
        {"role": "user", "content": [image(JPEG)]},                   # c1 is answered
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]},
        {"role": "user", "content": [image(PNG)]},                    # a call without id
    ])
    ids = [m.get("tool_call_id") for m in sent]
    assert [m["role"] for m in sent] == ["tool", "assistant", "tool", "tool", "tool",
                                         "assistant", "tool"]
    assert ids[2] == ids[3] == "c1"
    for generated in (ids[0], ids[4], ids[6]):
        assert generated and GENERATED.fullmatch(generated)
    assert len({ids[0], ids[4], ids[6]}) == 3


def test_only_whole_footer_parts_are_left_out_and_caps_and_scrubbing_still_hold() -> None:
    not_footers = [text("see [Turn 2/64] below"), text("[Turn 2/64] done"),
                   text("[turn 3/64]"), text("[Turn 1/" + "9" * 60 + "]"),
                   {"type": "text", "text": None}, "[Turn 4/64]"]
    sent = uploaded([{"role": "user", "content": [
        text(" \n[Turn 1/64]" + " " * 100), *not_footers, text("api_key=sk-live-123456")]}])
    assert sent[0]["content"] == [*not_footers, text("api_key=***")]
    big = "data:image/png;base64," + "A" * 5_000
    body = trace_body([{"role": "user", "content": [image(big), text("[Turn 1/2]")]}],
                      job_id="tj-1", task_key="t", model="m", reward=None,
                      max_image_bytes=1_000)
    message = body["messages"][0]
    assert message["role"] == "tool" and GENERATED.fullmatch(message["tool_call_id"])
    assert [p["type"] for p in message["content"]] == ["text"]
    assert "per-image cap" in message["content"][0]["text"]


# ----------------------------------------------------------------------------- end to end


def _config(local: LocalFleet, **settings: Any) -> Any:
    return resolve_config(api_key=local.token, base_url=local.base_url, **settings)


def _get(local: LocalFleet, path: str) -> Any:
    response = httpx.get(f"{local.base_url}{path}", timeout=10.0,
                         headers={"Authorization": f"Bearer {local.token}"})
    response.raise_for_status()
    return response.json()


def test_a_computer_use_runs_screenshots_show_on_the_local_trace_page_in_chromium(
        local_fleet: LocalFleet) -> None:
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.modality == "computer_use")
    with Runner(workers=1, config=_config(local_fleet),
                traces=f"cu-{uuid.uuid4().hex[:6]}") as runner:
        result = next(iter(runner.run([task], PolicySpec("reference"))))
    report = runner.trace_report()
    assert report is not None and report.ok and report.job_id, report
    shots = sum(1 for m in result.transcript if isinstance(m.get("content"), list)
                for p in m["content"] if p.get("type") == "image_url")
    assert shots >= 2 and any(m["role"] == "user" and isinstance(m.get("content"), list)
                              and any(p.get("type") == "image_url" for p in m["content"])
                              for m in result.transcript)  # the case the viewer drops
    session_id = report.session_ids[result.rollout_id or ""]
    url = (f"{local_fleet.base_url}/traces/sessions/{session_id}"
           f"?key={view_key(local_fleet.token)}")
    with chromium_page("test_fidelity_trace_bodies") as page:
        page.navigate(url)
        shown = page.eval("Array.from(document.images)"
                          ".filter(i => i.complete && i.naturalWidth > 0).length")
        hidden = page.eval("document.body.innerText.includes('not shown')")
    assert (shown, hidden) == (shots, False), "every screenshot is drawn by the page"
    stored = _get(local_fleet, f"/v1/traces/sessions/{session_id}")["messages"]
    calls = [c["id"] for m in stored if m["role"] == "assistant"
             for c in m.get("tool_calls") or []]
    for message in stored:
        has_image = isinstance(message.get("content"), list) and any(
            p.get("type") == "image_url" for p in message["content"])
        assert not (has_image and message["role"] == "user"), message["role"]
        if has_image and message is not stored[0]:  # answers the call that took it
            assert message["tool_call_id"] in calls, message.get("tool_call_id")


def test_the_local_trace_page_shows_no_images_in_user_messages_as_fleets_viewer(
        fleet_client: Any, local_fleet: LocalFleet) -> None:
    job_id = fleet_client.trace_job("viewer")
    created = fleet_client.create_session(
        model="m", task_key="t", job_id=job_id,
        initial_message={"role": "user", "content": [text("look"), image(PNG),
                                                     {"type": "image_url",
                                                      "image_url": PNG}]})
    page = httpx.get(f"{local_fleet.base_url}/traces/sessions/{created.session_id}"
                     f"?key={view_key(local_fleet.token)}", timeout=10)
    assert page.status_code == 200
    assert "<img" not in page.text and "2 image(s) not shown" in page.text


# ----------------------------------------------------------------------------- jobs_url


class PlatformHost:
    """A second host that serves ``POST /v1/traces/jobs`` over a job pool it shares with
    the local Fleet (as Fleet's platform host shares one with its orchestrator): records
    each request, creates the job on the local Fleet, answers with its answer."""

    def __init__(self, fleet_url: str) -> None:
        self.requests: list[dict[str, Any]] = []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), 65_536)
                body = self.rfile.read(length)
                auth = self.headers.get("Authorization") or ""
                host.requests.append({"path": self.path, "auth": auth,
                                      "body": json.loads(body or b"null")})
                answer = httpx.post(f"{fleet_url}{self.path}", content=body, timeout=10,
                                    headers={"Authorization": auth,
                                             "Content-Type": "application/json"})
                self.send_response(answer.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="platform-host")
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


@pytest.fixture
def platform(local_fleet: LocalFleet) -> Iterator[PlatformHost]:
    host = PlatformHost(local_fleet.base_url)
    yield host
    host.close()


def test_a_fleet_without_the_jobs_route_gets_a_first_warning_that_names_the_setting(
        local_fleet: LocalFleet, local_faults: Any, platform: PlatformHost,
        caplog: pytest.LogCaptureFixture) -> None:
    # The base URL answers the jobs route 404, as the previous client found it.
    local_faults.add("http_error", route="/v1/traces/jobs", status=404, message="Not Found")
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use")
    with (caplog.at_level(logging.WARNING, logger="fleetenv.traces"),
          Runner(workers=1, config=_config(local_fleet), traces="no-jobs-route") as runner):
        list(runner.run([task, task], PolicySpec("reference")))
    report = runner.trace_report()
    assert report is not None and report.failed == 2 and report.job_id is None
    first = next(r for r in caplog.records if "failed" in r.getMessage()).getMessage()
    assert "404" in first and "TraceOptions(jobs_url=URL)" in first
    assert "--trace-jobs-url" in first
    assert all("jobs_url" in error for error in report.errors)

    # Named, the jobs route goes to that host, with the key; uploads stay on the Fleet.
    local_faults.clear()  # (the platform host creates its jobs in the Fleet's pool)
    options = TraceOptions(f"jobs-{uuid.uuid4().hex[:6]}", jobs_url=platform.url + "/")
    with Runner(workers=1, config=_config(local_fleet), traces=options) as runner:
        results = list(runner.run([task], PolicySpec("reference")))
    report = runner.trace_report()
    assert report is not None and report.ok and report.uploaded == 1, report
    assert [(r["path"], r["body"]) for r in platform.requests] == [
        ("/v1/traces/jobs", {"name": options.job})]
    assert platform.requests[0]["auth"] == f"Bearer {local_fleet.token}"
    stored = _get(local_fleet, f"/v1/traces/jobs/{report.job_id}")["sessions"]
    assert [s["session_id"] for s in stored] == [report.session_ids[results[0].rollout_id
                                                                    or ""]]


def test_the_jobs_host_is_named_by_the_drop_in_and_the_cli_too(
        local_fleet: LocalFleet, platform: PlatformHost, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetenv.adapters.openenv import create_trace_job

    monkeypatch.setenv("FLEET_BASE_URL", local_fleet.base_url)
    job_id = asyncio.run(create_trace_job(local_fleet.token, "drop-in",
                                          jobs_url=platform.url))
    assert platform.requests[-1]["body"] == {"name": "drop-in"} and job_id.startswith("tj-")

    monkeypatch.setenv("FLEET_API_KEY", local_fleet.token)
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task.to_fleet_dict()) + "\n")
    level = logging.getLogger("fleetenv").level
    try:
        code = main(["run", str(tasks), "--policy", "reference", "--no-preflight",
                     "--out", str(tmp_path / "out.jsonl"), "--trace", "cli-jobs",
                     "--trace-jobs-url", platform.url])
        printed = capsys.readouterr().out
        refused = main(["run", str(tasks), "--policy", "reference",
                        "--trace-jobs-url", platform.url])
    finally:
        logging.getLogger("fleetenv").setLevel(level)
    assert code == 0 and "traces: 1 uploaded to trace job 'cli-jobs'" in printed
    assert platform.requests[-1]["body"] == {"name": "cli-jobs"}
    assert refused == 1 and "--trace-jobs-url only applies with --trace" in \
        capsys.readouterr().err


def test_a_bad_jobs_url_is_refused_naming_the_option(local_fleet: LocalFleet) -> None:
    for bad in ("ftp://host", "https://", "https://u:secret-pass@host", "https://h/?x=1", 3):
        with pytest.raises(ConfigurationError, match="jobs_url") as info:
            TraceOptions("job", jobs_url=bad)  # type: ignore[arg-type]
        assert "secret-pass" not in str(info.value)
    assert trace_options("job", None) == "job"
    named = trace_options("job", "https://traces.example.com/")
    assert isinstance(named, TraceOptions) and named.jobs_url == "https://traces.example.com"
    with Session(_config(local_fleet)) as session:
        client = TraceClient(session, budget_s=2.0, jobs_url="http://127.0.0.1:9")
        with pytest.raises(TraceUploadError, match=r"jobs_url \(http://127.0.0.1:9\)"):
            client.create_job("unreachable")
