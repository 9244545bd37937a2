"""Events, sinks, the bus and exactly-once rollout accounting."""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import threading
from pathlib import Path

import pytest

from fleetenv.core.errors import EpisodeStateError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.event_sinks import JsonlSink, LoggingSink
from fleetenv.core.events import (
    MAX_TEXT,
    Event,
    InstanceDeleted,
    InstanceDeleteFailed,
    InstanceProvisioned,
    ProvisioningFailed,
    ProvisioningRetry,
    ResetFailed,
    RolloutCompleted,
    RolloutRef,
    RolloutStarted,
    ToolCallFailed,
    ToolCallFinished,
    ToolErrorReported,
    VerifierFailed,
    event_from_dict,
    new_rollout_id,
)
from fleetenv.core.rollout_accounting import RolloutAccounting

REF = RolloutRef(rollout_id="r-1", task_key="add-bob", env_key="helpdesk:v1",
                 instance_id="inst-9")


def one_of_each(ref: RolloutRef = REF) -> list[Event]:
    return [
        ref.event(RolloutStarted, modality="tool_use"),
        ref.event(InstanceProvisioned, seconds=12.5, attempts=2),
        ref.event(ProvisioningRetry, attempt=1, delay_s=1.5, error_type="RateLimit",
                  error="429 slow down"),
        ref.event(ProvisioningFailed, attempts=3, error_type="Timeout", error="gave up"),
        ref.event(ResetFailed, error_type="DeadlineExceeded", error="no answer",
                  timeout_s=10.0),
        ref.event(ToolCallFailed, tool_name="create_user", step=3, error_type="ConnectError",
                  error="refused"),
        ref.event(ToolErrorReported, tool_name="create_user", step=4, error="no such user"),
        ref.event(VerifierFailed, error_type="VerifierError", error="500", steps=4),
        ref.event(InstanceDeleted, reason="closed"),
        ref.event(InstanceDeleteFailed, error_type="ConnectError", error="refused"),
        ref.event(RolloutCompleted, reason="done", grade_status="graded", reward=1.0,
                  steps=4, duration_s=33.0),
    ]


# --- the records ------------------------------------------------------------------------

def test_every_event_carries_identity_kind_and_timestamp() -> None:
    events = one_of_each()
    assert len({e.kind for e in events}) == len(events)
    for event in events:
        data = event.to_dict()
        assert list(data)[:6] == ["kind", "rollout_id", "task_key", "env_key",
                                  "instance_id", "timestamp"]
        assert (data["rollout_id"], data["task_key"], data["env_key"],
                data["instance_id"]) == ("r-1", "add-bob", "helpdesk:v1", "inst-9")
        assert data["timestamp"] > 1_600_000_000


def test_events_round_trip_through_json_and_pickle() -> None:
    for event in one_of_each():
        line = event.to_json()
        assert "\n" not in line
        assert event_from_dict(json.loads(line)) == event
        assert pickle.loads(pickle.dumps(event)) == event


def test_event_from_dict_ignores_unknown_fields_and_rejects_unknown_kinds() -> None:
    data = REF.event(InstanceDeleted).to_dict() | {"added_later": 1}
    assert isinstance(event_from_dict(data), InstanceDeleted)
    with pytest.raises(ValueError, match="unknown event kind"):
        event_from_dict({"kind": "nope", "rollout_id": "r"})


def test_events_are_frozen() -> None:
    event = REF.event(RolloutStarted)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.rollout_id = "other"  # type: ignore[misc]


def test_free_text_is_redacted_and_capped_at_construction() -> None:
    event = REF.event(ToolCallFailed, tool_name="t", step=1, error_type="HTTPError",
                      error="401 for Authorization: Bearer sk-abc123 at ?token=xyz789")
    assert "sk-abc123" not in event.error and "xyz789" not in event.error
    assert "sk-abc123" not in event.to_json() and "xyz789" not in repr(event)
    long = REF.event(VerifierFailed, error_type="E", error="x" * (MAX_TEXT + 500))
    assert len(long.error) < MAX_TEXT + 50
    assert long.error.endswith("[500 more characters]")


def test_reward_is_float_or_none_never_nan() -> None:
    assert REF.event(RolloutCompleted, reason="done", grade_status="graded",
                     reward=1).reward == 1.0
    unknown = REF.event(RolloutCompleted, reason="error", grade_status="verifier_error")
    assert unknown.reward is None
    assert json.loads(unknown.to_json())["reward"] is None
    with pytest.raises(ValueError, match="finite"):
        REF.event(RolloutCompleted, reason="done", grade_status="graded",
                  reward=float("nan"))
    with pytest.raises(TypeError):
        REF.event(RolloutCompleted, reason="done", grade_status="graded",
                  reward=True)


def test_rollout_id_is_required() -> None:
    with pytest.raises(ValueError, match="rollout_id"):
        RolloutStarted(rollout_id="")


def test_rollout_ref_helpers() -> None:
    ref = RolloutRef(task_key="t")
    assert len(ref.rollout_id) == 32 and ref.rollout_id != new_rollout_id()
    assert ref.instance_id is None
    assert ref.with_instance("i-1").event(RolloutStarted).instance_id == "i-1"


# --- sinks ------------------------------------------------------------------------------

def test_logging_sink_uses_the_events_logger_and_level_by_kind(
        caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()  # default: one LoggingSink
    with caplog.at_level(logging.DEBUG, logger="fleetenv.events"):
        for event in one_of_each():
            bus.emit(event)
    records = {r.fleetenv_event["kind"]: r for r in caplog.records  # type: ignore[attr-defined]
               if r.name == "fleetenv.events"}
    assert records["rollout_started"].levelno == logging.INFO
    assert records["provisioning_retry"].levelno == logging.WARNING
    assert records["tool_call_failed"].levelno == logging.ERROR
    assert records["tool_error_reported"].levelno == logging.INFO
    assert records["verifier_failed"].levelno == logging.ERROR
    message = records["rollout_completed"].getMessage()
    assert message.startswith("rollout_completed rollout_id=r-1 task_key=add-bob")
    assert "reward=1" in message and "reason=done" in message


def test_completed_with_error_logs_as_warning(caplog: pytest.LogCaptureFixture) -> None:
    sink = LoggingSink()
    with caplog.at_level(logging.INFO, logger="fleetenv.events"):
        sink(REF.event(RolloutCompleted, reason="error", grade_status="not_run",
                       error="provisioning failed"))
    assert caplog.records[-1].levelno == logging.WARNING


def test_jsonl_sink_writes_one_flushed_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = one_of_each()
    with JsonlSink(path) as sink:
        bus = EventBus([sink])
        for event in events:
            bus.emit(event)
        lines = path.read_text(encoding="utf-8").splitlines()  # flushed: readable now
    assert [event_from_dict(json.loads(line)) for line in lines] == events


def test_jsonl_sink_appends(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for _ in range(2):
        with JsonlSink(path) as sink:
            sink(REF.event(InstanceDeleted))
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2


def test_jsonl_sink_bad_path_fails_at_construction(tmp_path: Path) -> None:
    from fleetenv.core.errors import ConfigurationError
    with pytest.raises(ConfigurationError) as err:
        JsonlSink(tmp_path / "missing-dir" / "events.jsonl")
    assert "missing-dir" in err.value.context["file"]


def test_jsonl_sink_is_thread_safe_under_16_threads(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    per_thread = 200
    padding = "p" * 1500  # long lines make torn writes likely if the lock were missing
    start = threading.Barrier(16)

    def worker(n: int) -> None:
        ref = RolloutRef(rollout_id=f"r-{n}")
        start.wait()
        for step in range(per_thread):
            sink(ref.event(ToolErrorReported, tool_name="t", step=step, error=padding))

    with JsonlSink(path) as sink:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 16 * per_thread
    events = [json.loads(line) for line in lines]  # every line is one whole object
    for n in range(16):
        steps = [e["step"] for e in events if e["rollout_id"] == f"r-{n}"]
        assert steps == list(range(per_thread))


def test_any_callable_is_a_sink() -> None:
    seen: list[Event] = []
    bus = EventBus([seen.append])
    bus.emit(REF.event(RolloutStarted))
    assert [e.kind for e in seen] == ["rollout_started"]
    bus.remove_sink(seen.append)  # a fresh but equal bound method removes it
    assert bus.sinks == ()


def test_add_and_remove_sink() -> None:
    seen: list[str] = []

    def sink(event: Event) -> None:
        seen.append(event.kind)

    bus = EventBus([])
    bus.add_sink(sink)
    bus.emit(REF.event(RolloutStarted))
    bus.remove_sink(sink)
    bus.emit(REF.event(InstanceDeleted))
    assert seen == ["rollout_started"]


def test_a_bus_wants_only_events_that_reach_a_sink_or_the_books() -> None:
    bus = EventBus([])
    # no sink: only what the accounting keeps (emitters skip building the rest)
    assert bus.wants(RolloutStarted) and bus.wants(RolloutCompleted)
    assert not bus.wants(ToolCallFailed) and not bus.wants(InstanceDeleted)
    seen: list[Event] = []
    bus.add_sink(seen.append)
    assert bus.wants(ToolCallFailed) and bus.wants(RolloutStarted)
    bus.remove_sink(seen.append)
    assert not bus.wants(ToolCallFailed)
    # the default LoggingSink wants what its logger would log
    logger = logging.getLogger("fleetenv.events")
    default = EventBus()
    level = logger.level
    try:
        logger.setLevel(logging.INFO)
        assert default.wants(InstanceDeleted) and not default.wants(ToolCallFinished)
        logger.setLevel(logging.DEBUG)
        assert default.wants(ToolCallFinished)
    finally:
        logger.setLevel(level)


def test_failing_sink_is_isolated_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def broken(event: Event) -> None:
        raise RuntimeError("metrics backend down")

    bus = EventBus([broken, lambda e: seen.append(e.kind)])
    with caplog.at_level(logging.WARNING, logger="fleetenv.core.event_bus"):
        for event in one_of_each():
            bus.emit(event)
    assert len(seen) == 11  # the healthy sink got everything
    assert bus.sink_failures(broken) == 11
    warnings = [r for r in caplog.records if r.name == "fleetenv.core.event_bus"]
    assert len(warnings) == 1
    assert warnings[0].exc_info is not None
    assert "metrics backend down" in caplog.text


def test_keyboard_interrupt_in_a_sink_is_not_swallowed() -> None:
    def interrupted(event: Event) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        EventBus([interrupted]).emit(REF.event(RolloutStarted))


# --- accounting -------------------------------------------------------------------------

def start(bus: EventBus, rollout: str) -> None:
    bus.emit(RolloutStarted(rollout_id=rollout))


def complete(bus: EventBus, rollout: str, reason: str = "done") -> None:
    bus.emit(RolloutCompleted(rollout_id=rollout, reason=reason, grade_status="graded",
                              reward=1.0))


def test_accounting_counts_started_completed_and_reasons() -> None:
    bus = EventBus([])
    for n in range(5):
        start(bus, f"r{n}")
    for n, reason in enumerate(["done", "done", "max_steps", "error"]):
        complete(bus, f"r{n}", reason)
    report = bus.report()
    assert (report.started, report.completed) == (5, 4)
    assert report.by_reason == {"done": 2, "max_steps": 1, "error": 1}
    assert report.in_flight == ("r4",)
    assert not report.balanced
    with pytest.raises(EpisodeStateError, match="1 rollout\\(s\\) never completed: r4"):
        bus.accounting.check_balanced()
    complete(bus, "r4", "truncated")
    assert bus.report().balanced
    bus.accounting.check_balanced()


def test_second_completion_is_dropped_logged_and_recorded(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[RolloutCompleted] = []
    bus = EventBus([lambda e: seen.append(e) if isinstance(e, RolloutCompleted) else None])
    start(bus, "r1")
    complete(bus, "r1", "done")
    with caplog.at_level(logging.ERROR):
        complete(bus, "r1", "abandoned")
    assert [e.reason for e in seen] == ["done"]  # the first outcome wins, sinks see one
    report = bus.report()
    assert (report.started, report.completed, report.by_reason) == (1, 1, {"done": 1})
    assert report.violations == ("rollout r1 completed twice ('done', then 'abandoned')",)
    assert not report.balanced
    assert "completed twice" in caplog.text


def test_strict_accounting_raises_on_broken_rules() -> None:
    bus = EventBus([], accounting=RolloutAccounting(strict=True))
    start(bus, "r1")
    complete(bus, "r1")
    with pytest.raises(EpisodeStateError, match="completed twice"):
        complete(bus, "r1", "again")
    with pytest.raises(EpisodeStateError, match="started twice"):
        start(bus, "r1")


def test_completion_without_start_is_delivered_but_unbalanced() -> None:
    seen: list[str] = []
    bus = EventBus([lambda e: seen.append(e.kind)])
    complete(bus, "ghost")
    assert seen == ["rollout_completed"]
    report = bus.report()
    assert report.violations == ("rollout ghost completed without being started",)
    assert not report.balanced


def test_other_events_after_completion_are_fine() -> None:
    bus = EventBus([])
    start(bus, "r1")
    complete(bus, "r1")
    bus.emit(InstanceDeleted(rollout_id="r1", reason="closed"))  # close() runs after
    assert bus.report().balanced


def test_accounting_is_exact_under_concurrent_emitters() -> None:
    bus = EventBus([])
    barrier = threading.Barrier(16)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(100):
            rollout = f"{n}-{i}"
            start(bus, rollout)
            complete(bus, rollout, "done" if i % 2 else "max_steps")
            complete(bus, rollout, "duplicate")  # every one of these must be dropped

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    logging.getLogger("fleetenv.core.rollout_accounting").disabled = True
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        logging.getLogger("fleetenv.core.rollout_accounting").disabled = False
    report = bus.report()
    assert (report.started, report.completed) == (1600, 1600)
    assert report.by_reason == {"done": 800, "max_steps": 800}
    assert len(report.violations) == 1600
    assert report.in_flight == ()
