"""The OpenTelemetry sink on real episodes of the local Fleet, read back through the
OpenTelemetry SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

import fleetenv
from fleetenv import EventBus, FleetEnv, Runner, Session, ToolCall, bundled_tasks_path
from fleetenv.adapters.otel import OtelSink
from fleetenv.core.config import resolve_config
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASKS = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}
TASK = TASKS["helpdesk-assign-api-ticket"]


class Telemetry:
    """An SDK tracer and meter provider writing to memory, and a sink on them."""

    def __init__(self, parent: otel_context.Context | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.sink = OtelSink(tracer_provider=self.tracer_provider,
                             meter_provider=self.meter_provider, parent=parent)
        self.tracer = self.tracer_provider.get_tracer("test")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans()
                if name is None or s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """``(attributes, value)`` per data point (a histogram's value is its count)."""
        found = []
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name != metric:
                        continue
                    for point in item.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count
                        found.append((dict(point.attributes or {}), value))
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    yield t
    t.sink.close()
    t.tracer_provider.shutdown()
    t.meter_provider.shutdown()


def session_for(fleet: LocalFleet, sink: OtelSink) -> Session:
    return Session(api_key=fleet.token, base_url=fleet.base_url, events=EventBus([sink]))


def play_reference(env: FleetEnv) -> float | None:
    env.reset()
    for call in env.task.reference_solution or []:
        env.step(ToolCall(call.name, call.arguments))
    _, reward, terminated, _, _ = env.step({"done": True})
    assert terminated
    return reward


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None
            and s.parent.span_id == parent.context.span_id]


def test_an_episode_is_one_trace_under_the_callers_span(local_fleet: LocalFleet,
                                                       telemetry: Telemetry) -> None:
    with (session_for(local_fleet, telemetry.sink) as session,
          telemetry.tracer.start_as_current_span("train step") as step_span,
          FleetEnv(TASK, session=session) as env):
        reward = play_reference(env)
        instance = env.instance_id
    assert reward == 1.0

    spans = telemetry.spans()
    (rollout,) = telemetry.spans("fleetenv.rollout")
    assert rollout.parent is not None
    assert rollout.parent.span_id == step_span.get_span_context().span_id
    assert {s.context.trace_id for s in spans} == {step_span.get_span_context().trace_id}
    attributes = dict(rollout.attributes or {})
    assert attributes["fleetenv.task"] == TASK.key
    assert attributes["fleetenv.env"] == TASK.env_spec
    assert attributes["fleetenv.instance"] == instance
    assert attributes["fleetenv.stop_reason"] == "agent_done"
    assert attributes["fleetenv.grade_status"] == "graded"
    assert attributes["fleetenv.reward"] == 1.0
    assert rollout.status.status_code is StatusCode.UNSET

    names = [s.name for s in sorted(children(spans, rollout), key=lambda s: s.start_time)]
    tool_names = [f"execute_tool {c.name}" for c in TASK.reference_solution or []]
    assert names == ["fleetenv.provision", *tool_names, "fleetenv.verification"]
    for child in children(spans, rollout):
        # Back-dated: each child lies inside the rollout, and took time.
        assert rollout.start_time <= child.start_time < child.end_time <= rollout.end_time
        assert dict(child.attributes or {})["fleetenv.rollout_id"] == env.rollout_id
    (verification,) = telemetry.spans("fleetenv.verification")
    assert dict(verification.attributes or {})["fleetenv.outcome"] == "graded"

    # Metrics: latency by tool, one completed rollout, its reward, provisioning time.
    by_tool = {p[0]["fleetenv.tool"]: p[1] for p in telemetry.points("fleetenv.tool.duration")}
    assert by_tool == {c.name: 1 for c in TASK.reference_solution or []}
    assert telemetry.points("fleetenv.rollouts") == [
        ({"fleetenv.env": TASK.env_spec, "fleetenv.stop_reason": "agent_done",
          "fleetenv.grade_status": "graded"}, 1)]
    assert telemetry.points("fleetenv.rollout.reward") == [
        ({"fleetenv.env": TASK.env_spec, "fleetenv.task": TASK.key}, 1)]
    assert [p[1] for p in telemetry.points("fleetenv.provision.duration")] == [1]
    assert [p[1] for p in telemetry.points("fleetenv.verification.duration")] == [1]
    assert telemetry.points("fleetenv.tool.errors") == []

    # Never a secret: the API key appears in no attribute, event or status.
    token = local_fleet.token
    for span in spans:
        texts = [str(v) for v in (span.attributes or {}).values()]
        texts += [str(v) for e in span.events for v in (e.attributes or {}).values()]
        texts.append(span.status.description or "")
        assert not any(token in text for text in texts), span.name


def test_tool_errors_are_error_spans_and_counted(local_fleet: LocalFleet,
                                                 telemetry: Telemetry) -> None:
    with (session_for(local_fleet, telemetry.sink) as session,
          FleetEnv(TASK.replace(verifier=None), session=session) as env):
        env.reset()
        env.step(ToolCall("get_ticket", {}))                       # missing argument
        env.step(ToolCall("no_such_tool", {}))                     # unknown tool
        env.step(ToolCall("get_ticket", {"ticket_id": 999_999}))   # the tool says no
        env.step(ToolCall("get_ticket", {"ticket_id": 1124}))      # fine
        _, reward, _, _, _ = env.step({"done": True})
    assert reward is None  # no verifier: the grade is unknown

    tools = sorted(telemetry.spans(), key=lambda s: s.start_time)
    calls = [(s.name, dict(s.attributes or {})["fleetenv.outcome"], s.status.status_code)
             for s in tools if s.name.startswith("execute_tool")]
    assert calls == [
        ("execute_tool get_ticket", "bad_arguments", StatusCode.ERROR),
        ("execute_tool no_such_tool", "bad_arguments", StatusCode.ERROR),
        ("execute_tool get_ticket", "tool_error", StatusCode.ERROR),
        ("execute_tool get_ticket", "ok", StatusCode.UNSET),
    ]
    errors = sorted((p[0]["fleetenv.tool"], p[0]["fleetenv.outcome"], p[1])
                    for p in telemetry.points("fleetenv.tool.errors"))
    assert errors == [("get_ticket", "bad_arguments", 1), ("get_ticket", "tool_error", 1),
                      ("no_such_tool", "bad_arguments", 1)]
    (rollout,) = telemetry.spans("fleetenv.rollout")
    attributes = dict(rollout.attributes or {})
    assert attributes["fleetenv.grade_status"] == "unknown"
    assert attributes["fleetenv.grade_reason"] == "no_verifier"
    assert "fleetenv.reward" not in attributes
    assert telemetry.points("fleetenv.rollout.reward") == []
    assert [p[0]["fleetenv.grade_status"] for p in telemetry.points("fleetenv.rollouts")] == [
        "unknown"]


def test_runner_rollouts_hang_from_the_given_parent(local_fleet: LocalFleet,
                                                    telemetry: Telemetry) -> None:
    tasks = [t for t in TASKS.values() if t.modality == "tool_use"][:4]
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with telemetry.tracer.start_as_current_span("evaluation") as evaluation:
        telemetry.sink.parent = otel_context.get_current()
        with Runner(workers=4, config=config, events=EventBus([telemetry.sink]),
                    progress=False) as runner:
            results = list(runner.run(tasks, "reference"))
    assert [r.reward for r in results] == [1.0] * len(tasks)

    spans = telemetry.spans()
    rollouts = telemetry.spans("fleetenv.rollout")
    assert len(rollouts) == len(tasks)
    evaluation_id = evaluation.get_span_context().span_id
    assert all(r.parent is not None and r.parent.span_id == evaluation_id for r in rollouts)
    for rollout in rollouts:  # every episode's calls under its own rollout, none astray
        rollout_id = dict(rollout.attributes or {})["fleetenv.rollout_id"]
        mine = children(spans, rollout)
        assert len(mine) >= 3  # provision, at least one tool call, verification
        assert {dict(s.attributes or {})["fleetenv.rollout_id"] for s in mine} == {rollout_id}
    assert telemetry.sink.context(rollouts[0].attributes["fleetenv.rollout_id"]) is None


def test_runner_threads_inherit_the_callers_current_span(local_fleet: LocalFleet,
                                                          telemetry: Telemetry) -> None:
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with (telemetry.tracer.start_as_current_span("evaluation") as evaluation,
          Runner(workers=2, config=config, events=EventBus([telemetry.sink]),
                 progress=False) as runner):
        results = list(runner.run([TASK], "reference"))
    assert results[0].reward == 1.0
    (rollout,) = telemetry.spans("fleetenv.rollout")
    assert rollout.parent is not None
    assert rollout.parent.span_id == evaluation.get_span_context().span_id


def test_a_policy_can_nest_its_own_spans_under_the_rollout(local_fleet: LocalFleet,
                                                           telemetry: Telemetry) -> None:
    with (session_for(local_fleet, telemetry.sink) as session,
          FleetEnv(TASK, session=session) as env):
        env.reset()
        context = telemetry.sink.context(env.rollout_id)
        assert context is not None
        with telemetry.tracer.start_as_current_span("chat completion", context=context):
            pass
        env.step({"done": True})
    assert telemetry.sink.context(env.rollout_id) is None
    (rollout,) = telemetry.spans("fleetenv.rollout")
    (llm,) = telemetry.spans("chat completion")
    assert llm.parent is not None and llm.parent.span_id == rollout.context.span_id


def test_with_no_current_span_and_no_parent_a_rollout_is_a_root_span(
        local_fleet: LocalFleet, telemetry: Telemetry) -> None:
    assert not trace.get_current_span().get_span_context().is_valid
    with (session_for(local_fleet, telemetry.sink) as session,
          FleetEnv(TASK, session=session) as env):
        env.reset()
    (rollout,) = telemetry.spans("fleetenv.rollout")
    assert rollout.parent is None
    assert dict(rollout.attributes or {})["fleetenv.stop_reason"] == "abandoned"


def test_a_sink_attached_mid_rollout_still_draws_the_rollout(local_fleet: LocalFleet,
                                                             telemetry: Telemetry) -> None:
    bus = EventBus([])
    with (Session(api_key=local_fleet.token, base_url=local_fleet.base_url,
                  events=bus) as session,
          FleetEnv(TASK, session=session) as env):
        env.reset()
        bus.add_sink(telemetry.sink)
        env.step(ToolCall("get_ticket", {"ticket_id": 1124}))
        env.step({"done": True})
    assert bus.sink_failures(telemetry.sink) == 0
    (rollout,) = telemetry.spans("fleetenv.rollout")
    (call,) = telemetry.spans("execute_tool get_ticket")
    assert rollout.start_time < call.start_time < call.end_time <= rollout.end_time
    assert dict(rollout.attributes or {})["fleetenv.stop_reason"] == "agent_done"


def test_mcp_spans_nest_under_the_rollout(local_fleet: LocalFleet,
                                          telemetry: Telemetry) -> None:
    # mcp records its own spans ("MCP send tools/call") through the *global* tracer
    # provider, on fleetenv's loop thread; they must land in the rollout's trace.
    global_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(global_spans))
    trace.set_tracer_provider(provider)  # once per process; nothing else here sets it
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another global tracer provider was set first in this process")
    try:
        with (session_for(local_fleet, telemetry.sink) as session,
              FleetEnv(TASK, session=session) as env):
            assert play_reference(env) == 1.0
    finally:
        provider.force_flush()
    (rollout,) = telemetry.spans("fleetenv.rollout")
    mcp_spans = [s for s in global_spans.get_finished_spans()
                 if s.name.startswith("MCP send")
                 and s.context.trace_id == rollout.context.trace_id]
    names = {s.name for s in mcp_spans}
    assert {"MCP send initialize", "MCP send tools/list"} <= names
    for span in mcp_spans:  # reset's handshake and every step's call: children
        assert span.parent is not None and span.parent.span_id == rollout.context.span_id
    calls = [s.name for s in mcp_spans if s.name.startswith("MCP send tools/call")]
    assert calls == [f"MCP send tools/call {c.name}" for c in TASK.reference_solution or []]
    # Outside fleetenv's calls the rollout is not current: the caller's context is clean.
    assert not trace.get_current_span().get_span_context().is_valid


def test_worker_process_rollouts_hang_from_the_callers_span(local_fleet: LocalFleet,
                                                            telemetry: Telemetry) -> None:
    # Their events come back with the result and are replayed in this process, in the
    # context the rollout was submitted from.
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with (telemetry.tracer.start_as_current_span("evaluation") as evaluation,
          Runner(workers=1, mode="processes", config=config,
                 events=EventBus([telemetry.sink]), progress=False) as runner):
        results = list(runner.run([TASK], "reference"))
    assert results[0].reward == 1.0
    (rollout,) = telemetry.spans("fleetenv.rollout")
    assert rollout.parent is not None
    assert rollout.parent.span_id == evaluation.get_span_context().span_id
    assert len(children(telemetry.spans(), rollout)) >= 3
