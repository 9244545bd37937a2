"""Secrets never leak: a full run with DEBUG logging, JSONL events, results files and
failure paths, then a grep for the keys in everything it wrote."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetenv
import fleetenv.errors
from fleetenv import FleetEnv, JsonlSink, bundled_tasks_path
from fleetenv.core.event_bus import EventBus
from fleetenv.core.redaction import redact
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import PolicyContext
from fleetenv.rollouts.results import ResultsWriter, manifest_path, read_results
from fleetenv.rollouts.runner import Runner

pytestmark = pytest.mark.timeout(120)

LOCAL_TOKEN = "lt-0123456789abcdef-local-token-under-test"
WRONG_KEY = "fk-live-9876543210-wrong-key-under-test"
MODEL_KEY = "sk-proj-model-key-under-test-000111"


@pytest.fixture
def debug_log() -> Iterator[io.StringIO]:
    """Everything every logger says at DEBUG, captured."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def raising_policy(context: PolicyContext) -> Any:
    raise RuntimeError(f"policy failed while holding {context.task.key}")


def test_keys_appear_in_no_log_event_repr_error_or_results_file(
        debug_log: io.StringIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", MODEL_KEY)
    tasks = fleetenv.load_tasks(bundled_tasks_path())[:3]
    events_path, results_path = tmp_path / "events.jsonl", tmp_path / "results.jsonl"
    texts: list[str] = []
    with LocalFleet(token=LOCAL_TOKEN, log_level="DEBUG") as local:
        config = fleetenv.resolve_config(api_key=local.token, base_url=local.base_url)
        bus = EventBus()  # the logging sink, at DEBUG
        sink = JsonlSink(events_path)
        bus.add_sink(sink)
        texts += [repr(config), str(config), repr(local), json.dumps(config.model_dump(
            mode="json"))]
        with Runner(workers=3, config=config, events=bus, progress=False) as runner, \
                ResultsWriter(results_path) as out:
            texts.append(repr(runner))
            for result in runner.run(tasks, "reference"):
                out.write(result)
            for result in runner.run(tasks[:1], raising_policy):
                out.write(result)
            broken = tasks[0].replace(key="missing-env", env_key="no-such-env",
                                      env_version=None)
            for result in runner.run([broken], "reference"):
                out.write(result)
        # A failure path with a wrong key, and an OpenAI policy built from the env var.
        wrong = fleetenv.resolve_config(api_key=WRONG_KEY, base_url=local.base_url)
        with FleetEnv(tasks[0], config=wrong, events=bus) as env:
            texts.append(repr(env))
            with pytest.raises(fleetenv.errors.PermanentProvisioningError) as info:
                env.reset()
            texts += [str(info.value), repr(info.value), repr(info.value.__cause__)]
        from fleetenv.rollouts.openai_policy import OpenAIChatPolicy

        texts.append(repr(OpenAIChatPolicy("some-model", base_url="https://llm.example/v1")))
        sink.close()
    results = read_results(results_path)
    assert sum(r.passed for r in results) == 3 and any(r.error for r in results)
    everything = "\n".join([debug_log.getvalue(), events_path.read_text(),
                            results_path.read_text(), manifest_path(results_path).read_text(),
                            *texts])
    assert "rollout_completed" in everything and "instance_provisioned" in everything
    assert "httpcore" in debug_log.getvalue() and " DEBUG " in debug_log.getvalue()
    assert local.base_url in debug_log.getvalue()  # the capture sees the HTTP traffic
    for secret in (LOCAL_TOKEN, WRONG_KEY, MODEL_KEY):
        assert secret not in everything, f"secret leaked: ...{secret[-12:]}"


@pytest.mark.parametrize("text, secret", [
    ("401 for Authorization: Bearer sk-abc123.def", "sk-abc123.def"),
    ("authorization=Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("GET /x?token=xyz789&page=2", "xyz789"),
    ('{"api_key": "fk-live-42"}', "fk-live-42"),
    ("FLEET_API_KEY=fk-live-43 fleetenv run", "fk-live-43"),
])
def test_redaction_blanks_credentials(text: str, secret: str) -> None:
    redacted = redact(text)
    assert secret not in redacted and "***" in redacted


@pytest.mark.parametrize("hint", [
    "pass api_key=... (and base_url=...) for a key",
    "set FLEET_API_KEY (or pass config=resolve_config(api_key=...))",
    "api_key=None means: read FLEET_API_KEY",
    "token=<your key>",
    "Authorization: Bearer ***",
    "basic auth works; the token expired",
])
def test_redaction_leaves_hints_that_name_no_credential_as_written(hint: str) -> None:
    """Before, 'resolve_config(api_key=...))' came out as 'resolve_config(api_key=***'."""
    assert redact(hint) == hint
    error = fleetenv.errors.ConfigurationError("no Fleet API key", hint=hint)
    assert str(error).endswith(f"(hint: {hint})")


# ------------------------------------------------- keys echoed by tools, policies, servers
#
# A Fleet whose key is a distinctive value; a tool that answers with an error echoing the
# key, the runner token and the model endpoint's key; a policy that raises with the key in
# its message. Then every place a run writes or prints is searched for the values.

FLEET_KEY = "fk-live-5c1e9d27a4-distinctive-fleet-key"
ECHOED_MODEL_KEY = "sk-proj-3b8d71f0e6-distinctive-model-key"
LEAKY_TASK = "helpdesk-assign-api-ticket"  # its reference solution starts with get_ticket
LLM = "https://llm.example/v1"


@pytest.fixture(scope="module")
def keyed_fleet() -> Iterator[LocalFleet]:
    with LocalFleet(token=FLEET_KEY) as local:  # the runner-token gate is on by default
        yield local


@pytest.fixture
def leaked(keyed_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, ...]]:
    """The secrets a tool error of ``get_ticket`` echoes: Fleet key, runner token, model key."""
    monkeypatch.delenv("RUNNER_AUTH_TOKEN", raising=False)  # fleet-python fetches it
    runner_token = keyed_fleet.runner_token()
    assert runner_token
    keyed_fleet.faults.clear()
    keyed_fleet.faults.add("tool_error", tool="get_ticket",
                           message=f"denied for key {FLEET_KEY} (runner {runner_token}, "
                                   f"model {ECHOED_MODEL_KEY})")
    yield FLEET_KEY, runner_token, ECHOED_MODEL_KEY
    keyed_fleet.faults.clear()


def echo_then_raise(context: PolicyContext) -> Any:
    """Calls the leaky tool, then fails the way a policy holding the key might."""
    if context.turn == 0:
        return fleetenv.ToolCall("get_ticket", {"ticket_id": 1124})
    raise RuntimeError(f"policy lost its client, which was using key {FLEET_KEY}")


def _assistant(message: dict[str, Any]) -> str:
    return json.dumps({"choices": [{"index": 0, "message": message,
                                    "finish_reason": "stop"}]})


def _model_reply(request: Any) -> tuple[int, dict[str, str], str]:
    """A model that calls get_ticket once, then stops."""
    body = json.loads(request.body)
    if any(m.get("role") == "tool" for m in body["messages"]):
        return 200, {}, _assistant({"role": "assistant", "content": "done"})
    return 200, {}, _assistant({"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function",
        "function": {"name": "get_ticket", "arguments": '{"ticket_id": 1124}'}}]})


def test_secrets_echoed_by_a_tool_or_a_policy_reach_no_output(
        keyed_fleet: LocalFleet, leaked: tuple[str, ...], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    import traceback

    import responses

    from fleetenv.reports import load_run, write_html
    from fleetenv.rollouts.openai_policy import OpenAIChatPolicy

    caplog.set_level(logging.DEBUG)
    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.key == LEAKY_TASK)
    events: list[Any] = []
    bus = EventBus()  # the logging sink (caught by caplog) ...
    bus.add_sink(events.append)  # ... and a callable sink that sees every event
    results_path, html_path = tmp_path / "results.jsonl", tmp_path / "report.html"
    config = fleetenv.resolve_config(api_key=FLEET_KEY, base_url=keyed_fleet.base_url)
    texts: list[str] = []
    model = OpenAIChatPolicy("m", base_url=LLM, api_key=ECHOED_MODEL_KEY)
    with Runner(workers=2, config=config, events=bus, progress=False) as runner, \
            ResultsWriter(results_path) as out:
        results = list(runner.run([task], echo_then_raise))
        with responses.RequestsMock(passthru_prefixes=("http://127.0.0.1",)) as mock:
            mock.add_callback(responses.POST, f"{LLM}/chat/completions",
                              callback=_model_reply)
            results += list(runner.run([task], model))
        for result in results:
            out.write(result)
            texts += [repr(result), str(result)]
    # Each secret really was echoed into the run (else this test proves nothing).
    raised, answered = results
    assert raised.error is not None and raised.error["type"] == "RuntimeError"
    assert raised.tool_errors == 1 and answered.tool_errors == 1 and answered.error is None
    # A provisioning error whose server message echoes the key, raised to the user.
    keyed_fleet.faults.add("create_error", status=400, times=1,
                           message=f"bad request from key {FLEET_KEY}")
    with FleetEnv(task, config=config, events=bus) as env, \
            pytest.raises(fleetenv.errors.FleetEnvError) as info:
        env.reset()
    texts += [str(info.value), repr(info.value),
              "".join(traceback.format_exception(info.value))]
    write_html(load_run(results_path), html_path)

    event_texts = [json.dumps(e.to_dict()) + e.summary() for e in events]
    assert any(e.kind == "tool_error_reported" for e in events)
    assert any(e.kind == "tool_call_finished" and e.error for e in events)
    fleetenv_logs = [r for r in caplog.records if r.name.startswith("fleetenv")]
    outputs = {
        "fleetenv log records": "\n".join(
            logging.Formatter().format(r) + json.dumps(getattr(r, "fleetenv_event", None))
            for r in fleetenv_logs),
        "events": "\n".join(event_texts),
        "reprs and exceptions": "\n".join(texts),
        **_files(tmp_path),  # the results file (and its manifest), the HTML report
    }
    assert "get_ticket" in outputs["results.jsonl"] and "denied for key" in outputs["events"]
    leaks = _leaks(outputs, leaked)
    assert not leaks, "\n".join(leaks)


def _leaks(outputs: dict[str, str], secrets: tuple[str, ...]) -> list[str]:
    """``"<where>: ...<secret's end>"`` for each secret found in each output."""
    return [f"{where}: ...{secret[-10:]}" for where, text in outputs.items()
            for secret in secrets if secret in text]


def _files(directory: Path) -> dict[str, str]:
    """Every file under ``directory``, by name: what a run wrote there."""
    return {path.name: path.read_bytes().decode("utf-8", "replace")
            for path in sorted(directory.rglob("*")) if path.is_file()}


LEAKY_POLICY = """
import os

import fleetenv


def act(context):
    if context.turn == 0:
        return fleetenv.ToolCall("get_ticket", {"ticket_id": 1124})
    raise RuntimeError("policy lost its client, which was using key "
                       + os.environ["FLEET_API_KEY"])
"""


@pytest.mark.timeout(180)
def test_fleetenv_run_and_report_print_and_write_no_echoed_secret(
        keyed_fleet: LocalFleet, leaked: tuple[str, ...], tmp_path: Path) -> None:
    import subprocess
    import sys

    from fleetenv.cli.main import main

    work = tmp_path / "run"
    work.mkdir()
    (work / "leaky.py").write_text(LEAKY_POLICY)
    tasks = work / "tasks.jsonl"
    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.key == LEAKY_TASK)
    tasks.write_text(json.dumps(task.to_fleet_dict()) + "\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RUNNER_AUTH_TOKEN", "OPENAI_API_KEY")}
    env.update(FLEET_API_KEY=FLEET_KEY, FLEET_BASE_URL=keyed_fleet.base_url,
               PYTHONPATH=os.pathsep.join(sys.path))
    # --debug: every logger at DEBUG on stderr, the most a run ever prints.
    proc = subprocess.run([sys.executable, "-m", "fleetenv", "--debug", "run", str(tasks),
                           "--policy", "import:leaky:act", "--out", "r.jsonl"],
                          cwd=work, capture_output=True, text=True, timeout=150, env=env)
    assert proc.returncode == 1, proc.stderr  # the one episode failed: the policy raised
    assert "every episode failed; the first: RuntimeError: policy lost its client" \
        in proc.stderr
    [result] = read_results(work / "r.jsonl")
    assert result.tool_errors == 1 and "denied for key" in result.tool_error_messages[0]
    assert main(["report", str(work / "r.jsonl"), "--html", str(work / "r.html")]) == 0
    outputs = {"stderr": proc.stderr, "stdout": proc.stdout, **_files(work)}
    assert "r.html" in outputs and "denied for key" in outputs["r.html"]
    leaks = _leaks(outputs, leaked[:2])  # the model key: no model in this run
    assert not leaks, "\n".join(leaks)


BODY_KEY = "sk-provider-9a7e6b5c4d-extra-body-key"


@pytest.mark.timeout(120)
def test_a_credential_in_extra_body_is_stored_as_a_digest_that_resume_compares(
        keyed_fleet: LocalFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import responses

    from fleetenv.cli.main import main
    from fleetenv.rollouts.results import read_manifest

    monkeypatch.setenv("FLEET_API_KEY", FLEET_KEY)
    monkeypatch.setenv("FLEET_BASE_URL", keyed_fleet.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-run-0123456789")
    keyed_fleet.faults.clear()
    tasks = tmp_path / "tasks.jsonl"
    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.key == LEAKY_TASK)
    tasks.write_text(json.dumps(task.to_fleet_dict()) + "\n")
    out = tmp_path / "r.jsonl"
    sent: list[dict[str, Any]] = []

    def done(request: Any) -> tuple[int, dict[str, str], str]:
        sent.append(json.loads(request.body))
        return 200, {}, _assistant({"role": "assistant", "content": "done"})

    def run(body: dict[str, Any], *extra: str) -> int:
        with responses.RequestsMock(passthru_prefixes=("http://127.0.0.1",),
                                    assert_all_requests_are_fired=False) as mock:
            mock.add_callback(responses.POST, f"{LLM}/chat/completions", callback=done)
            return main(["run", str(tasks), "--policy", "openai", "--model", "m",
                         "--base-url", LLM, "--extra-body", json.dumps(body), *extra])

    body = {"top_p": 0.5, "api_key": BODY_KEY, "headers": {"Authorization": "Bearer "
                                                            + BODY_KEY[::-1]}}
    assert run(body, "--out", str(out)) == 0
    assert sent and all(b["api_key"] == BODY_KEY for b in sent)  # the server still gets it
    assert main(["report", str(out), "--html", str(tmp_path / "r.html")]) == 0
    outputs = {**_files(tmp_path), "output": str(capsys.readouterr())}
    leaks = _leaks(outputs, (BODY_KEY, BODY_KEY[::-1]))
    assert not leaks, "\n".join(leaks)
    manifest = read_manifest(out)
    assert manifest is not None
    extra = manifest["sampling"]["extra_body"]
    assert extra["top_p"] == 0.5  # settings that are not credentials stay readable
    assert extra["api_key"].startswith("[secret sha256:")
    assert extra["headers"]["Authorization"].startswith("[secret sha256:")
    assert manifest["policy_spec"]["options"]["extra_body"] == extra

    # The same key again: the same run, nothing left to do. Another key: refused, and
    # the refusal names what changed without showing either key.
    assert run(body, "--resume", str(out)) == 0
    assert "(+1 from before)" in capsys.readouterr().out
    other = {**body, "api_key": BODY_KEY.replace("9a7e", "0000")}
    assert run(other, "--resume", str(out)) == 1
    err = capsys.readouterr().err
    assert "not comparable" in err and "extra_body" in err and "sha256:" in err, err
    assert BODY_KEY not in err and other["api_key"] not in err


@pytest.mark.timeout(180)
def test_a_worker_process_sends_back_results_without_the_secrets_it_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent never provisions here, so it never learns the runner token the worker
    fetched; the worker's results must arrive without it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    monkeypatch.delenv("RUNNER_AUTH_TOKEN", raising=False)
    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.key == LEAKY_TASK)
    with LocalFleet() as local:  # a runner token no earlier test made this process hold
        token = local.runner_token()
        assert token
        local.faults.add("tool_error", tool="get_ticket", message=f"runner {token} denied")
        config = fleetenv.resolve_config(api_key=local.token, base_url=local.base_url)
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        try:
            with Runner(workers=1, executor=pool, config=config, events=EventBus(sinks=[]),
                        progress=False) as runner, \
                    ResultsWriter(tmp_path / "r.jsonl") as out:
                [result] = runner.run([task], echo_then_raise)
                out.write(result)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    assert result.tool_errors == 1 and "denied" in result.tool_error_messages[0]
    outputs = {"result": json.dumps(result.to_dict()), "repr": repr(result),
               **_files(tmp_path)}
    leaks = _leaks(outputs, (token,))
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize(("body", "hidden"), [
    ({"api_key": "k-0123456789"}, ["api_key"]),
    ({"headers": {"Authorization": "Bearer abcdefgh12"}}, ["headers.Authorization"]),
    ({"access_token": "t-0123456789", "client_secret": "s-0123456789"},
     ["access_token", "client_secret"]),
    ({"provider": "sk-ant-0123456789abcdef"}, ["provider"]),  # shaped like a key
    # Settings, not credentials: they stay readable in the manifest.
    ({"max_tokens": 64, "max_completion_tokens": 9, "stop_token_ids": [1, 2],
      "skip_special_tokens": True, "api_key_env": "OPENAI_API_KEY", "top_p": 0.5,
      "chat_template_kwargs": {"enable_thinking": False}, "note": "sketch"}, []),
])
def test_credential_looking_settings_are_hidden_and_others_kept(
        body: dict[str, Any], hidden: list[str]) -> None:
    from fleetenv.core.redaction import hide_credentials

    shown = hide_credentials(body)

    def at(data: Any, dotted: str) -> Any:
        for part in dotted.split("."):
            data = data[part]
        return data

    for name in hidden:
        assert at(shown, name).startswith("[secret sha256:")
        assert at(body, name) not in json.dumps(shown)
    if not hidden:
        assert shown == body


def test_other_libraries_log_records_and_exception_text_are_scrubbed() -> None:
    """Records are scrubbed when created, so a handler of the user's on any logger (here
    a library's own, which fleetenv's logger filters would never see) gets clean text."""
    from fleetenv.core.redaction import register_secret

    secret = "lib-secret-3f9a2b7c-under-test"
    register_secret(secret)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    library = logging.getLogger("some.library")
    library.addHandler(handler)
    library.setLevel(logging.DEBUG)
    try:
        library.debug("sent %s", {"token": secret})
        try:
            raise ValueError(f"refused {secret}")
        except ValueError:
            library.exception("request failed")
    finally:
        library.removeHandler(handler)
    text = buffer.getvalue()
    assert "sent {'token': '***'}" in text and "ValueError: refused ***" in text
    assert secret not in text


def test_the_browser_api_key_is_scrubbed_like_the_fleet_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetenv.core.redaction import scrub_secrets
    from fleetenv.fleet.leases import LEASE_API_KEY_ENV, LeaseClient

    key = "browser-api-key-1f3a9c77d2"
    monkeypatch.setenv(LEASE_API_KEY_ENV, key)
    LeaseClient.configured("http://127.0.0.1:9", {})
    assert key not in scrub_secrets(f"the browser API echoed {key} back")
