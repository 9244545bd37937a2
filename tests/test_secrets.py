"""Secrets never leak: a full run with DEBUG logging, JSONL events, results files and
failure paths, then a grep for the keys in everything it wrote."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetenv
import fleetenv.errors
from fleetenv import FleetEnv, JsonlSink
from fleetenv.core.errors import redact
from fleetenv.core.event_bus import EventBus
from fleetenv.local import LocalFleet
from fleetenv.local.apps import bundled_tasks_path
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
