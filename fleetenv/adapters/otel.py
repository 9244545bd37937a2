"""Rollouts as OpenTelemetry traces and metrics: an event sink for ``fleetenv.EventBus``.

``session = fleetenv.Session(events=fleetenv.EventBus([OtelSink()]))``: each rollout is a
``fleetenv.rollout`` span with children for provisioning, each tool call and the
verification, plus the ``fleetenv`` meter's instruments (docs/opentelemetry.md lists the
spans, attributes and metrics). Events report what *ended*, with its duration, so the
children are back-dated (``timestamp - duration``): nothing here waits or wraps
fleetenv's calls, and events replayed from worker processes still draw the right
timeline. Error texts arrive redacted by the events, so no credential reaches a span.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fleetenv.adapters.otel needs opentelemetry-api: pip install 'fleetenv[otel]'"
    ) from exc

from fleetenv._version import __version__
from fleetenv.core.events import (
    Event,
    InstanceProvisioned,
    ProvisioningFailed,
    ProvisioningRetry,
    ResetFailed,
    RolloutCompleted,
    RolloutStarted,
    ToolCallFinished,
    ToolsChanged,
    VerificationFinished,
)

__all__ = ["INSTRUMENTATION_NAME", "OtelSink"]

#: The tracer's and meter's instrumentation scope.
INSTRUMENTATION_NAME = "fleetenv"

#: Tool-call outcomes that count as errors (``ToolCallFinished.outcome``).
_ERROR_OUTCOMES = frozenset({"tool_error", "bad_arguments", "failed"})


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


@dataclass
class _Open:
    """A rollout whose span is still open."""

    span: Span
    context: Context


@dataclass
class _Scope:
    """One ``reset``/``step``/``close`` call: the attach token to undo at its end."""

    token: contextvars.Token[Context] | None = None


class OtelSink:
    """An event sink that turns fleetenv's events into OpenTelemetry spans and metrics.

    ``tracer_provider`` / ``meter_provider`` default to the global ones
    (``opentelemetry.trace.get_tracer_provider()``); ``parent`` is the context rollout
    spans hang from when the starting thread has no current span. Thread-safe.
    """

    def __init__(self, *, tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None,
                 parent: Context | None = None) -> None:
        self.tracer = trace.get_tracer(INSTRUMENTATION_NAME, __version__,
                                       tracer_provider=tracer_provider)
        meter = metrics.get_meter(INSTRUMENTATION_NAME, __version__,
                                  meter_provider=meter_provider)
        self.parent = parent
        self._tool_duration = meter.create_histogram(
            "fleetenv.tool.duration", unit="s", description="Tool call latency")
        self._tool_errors = meter.create_counter(
            "fleetenv.tool.errors", unit="{call}",
            description="Tool calls that failed or answered with an error")
        self._rollouts = meter.create_counter(
            "fleetenv.rollouts", unit="{rollout}", description="Completed rollouts")
        self._reward = meter.create_histogram(
            "fleetenv.rollout.reward", description="Reward of graded rollouts")
        self._provision = meter.create_histogram(
            "fleetenv.provision.duration", unit="s",
            description="Time to provision an instance")
        self._verification = meter.create_histogram(
            "fleetenv.verification.duration", unit="s",
            description="Verifier run time")
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
            f"fleetenv_otel_scope_{id(self)}", default=None)

    def __repr__(self) -> str:
        return f"OtelSink(open_rollouts={len(self._open)})"

    # ------------------------------------------------------------------ the sink

    def __call__(self, event: Event) -> None:
        if isinstance(event, RolloutStarted):
            self._started(event)
        elif isinstance(event, RolloutCompleted):
            self._completed(event)
        elif isinstance(event, ToolCallFinished):
            self._tool_call(event)
        elif isinstance(event, VerificationFinished):
            self._verification_finished(event)
        elif isinstance(event, InstanceProvisioned):
            self._provisioned(event)
        elif isinstance(event, ProvisioningRetry | ProvisioningFailed | ResetFailed
                        | ToolsChanged):
            self._span_event(event)

    def context(self, rollout_id: str) -> Context | None:
        """The context of a running rollout's span (``None`` once it completed), to
        start your own spans under it: ``tracer.start_span(..., context=ctx)``."""
        with self._lock:
            found = self._open.get(rollout_id)
        return found.context if found else None

    @contextlib.contextmanager
    def scope(self, rollout_id: str) -> Iterator[None]:
        """Make the rollout's span current for one ``reset``/``step``/``close`` call.

        On ``reset`` the span does not exist yet: ``RolloutStarted`` arrives inside this
        scope (the bus emits in the caller's context), and :meth:`_started` makes it
        current then. Attach and detach happen in the same context, in this block.
        """
        state = _Scope()
        with self._lock:
            found = self._open.get(rollout_id)
        if found is not None:
            state.token = otel_context.attach(found.context)
        reset = self._scope.set(state)
        try:
            yield
        finally:
            self._scope.reset(reset)
            if state.token is not None:
                otel_context.detach(state.token)

    def close(self) -> None:
        """End the spans of rollouts that never reported completion (marked as errors)."""
        with self._lock:
            leftover = list(self._open.values())
            self._open.clear()
        for item in leftover:
            item.span.set_status(Status(StatusCode.ERROR, "rollout never completed"))
            item.span.end()

    # ------------------------------------------------------------------ rollouts

    def _started(self, event: RolloutStarted) -> None:
        parent = otel_context.get_current()
        if not trace.get_current_span(parent).get_span_context().is_valid:
            parent = self.parent if self.parent is not None else parent
        span = self.tracer.start_span(
            "fleetenv.rollout", context=parent, kind=SpanKind.INTERNAL,
            start_time=_ns(event.timestamp),
            attributes=_ids(event, {"fleetenv.modality": event.modality}))
        context = trace.set_span_in_context(span)
        with self._lock:
            previous = self._open.pop(event.rollout_id, None)
            self._open[event.rollout_id] = _Open(span, context)
        if previous is not None:  # a duplicate start: do not leave the first one open
            previous.span.end()
        scope = self._scope.get()
        if scope is not None and scope.token is None:  # inside reset(): current from now
            scope.token = otel_context.attach(context)

    def _completed(self, event: RolloutCompleted) -> None:
        with self._lock:
            found = self._open.pop(event.rollout_id, None)
        attributes = {
            "fleetenv.stop_reason": event.reason,
            "fleetenv.grade_status": event.grade_status,
            "fleetenv.grade_reason": event.grade_reason,
            "fleetenv.reward": event.reward,
            "fleetenv.steps": event.steps,
        }
        if found is None:  # never saw the start (a sink attached mid-rollout)
            start = event.timestamp - (event.duration_s or 0.0)
            span = self.tracer.start_span("fleetenv.rollout", context=self.parent,
                                          start_time=_ns(start))
        else:
            span = found.span
        span.set_attributes(_ids(event, attributes))
        if event.error:
            span.set_status(Status(StatusCode.ERROR, event.error))
        span.end(end_time=_ns(event.timestamp))
        env = {"fleetenv.env": event.env_key or ""}
        self._rollouts.add(1, {**env, "fleetenv.stop_reason": str(event.reason),
                               "fleetenv.grade_status": str(event.grade_status)})
        if event.reward is not None:
            self._reward.record(event.reward, {**env, "fleetenv.task": event.task_key or ""})

    # ------------------------------------------------------------------ children

    def _child(self, name: str, event: Event, duration_s: float,
               attributes: Mapping[str, Any], error: str | None = None) -> None:
        """A span that ended at ``event.timestamp`` after ``duration_s``."""
        parent = self.context(event.rollout_id)
        start = event.timestamp - max(duration_s, 0.0)
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.INTERNAL,
                                      start_time=_ns(start),
                                      attributes=_ids(event, attributes))
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(event.timestamp))

    def _tool_call(self, event: ToolCallFinished) -> None:
        failed = event.outcome in _ERROR_OUTCOMES
        self._child(
            f"execute_tool {event.tool_name}", event, event.duration_s,
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.tool_name,
             "fleetenv.tool": event.tool_name, "fleetenv.outcome": event.outcome,
             "fleetenv.step": event.step, "error.type": event.error_type},
            error=(event.error or event.outcome) if failed else None)
        labels = {"fleetenv.tool": event.tool_name, "fleetenv.outcome": event.outcome,
                  "fleetenv.env": event.env_key or ""}
        self._tool_duration.record(event.duration_s, labels)
        if failed:
            self._tool_errors.add(1, labels)

    def _verification_finished(self, event: VerificationFinished) -> None:
        self._child(
            "fleetenv.verification", event, event.duration_s,
            {"fleetenv.outcome": event.outcome, "fleetenv.reward": event.reward,
             "fleetenv.grade_reason": event.reason, "fleetenv.attempts": event.attempts,
             "fleetenv.verifier_execution_id": event.execution_id,
             "error.type": event.error_type},
            error=(event.error or event.reason) if event.error_type else None)
        self._verification.record(event.duration_s, {
            "fleetenv.env": event.env_key or "", "fleetenv.outcome": event.outcome})

    def _provisioned(self, event: InstanceProvisioned) -> None:
        self._child("fleetenv.provision", event, event.seconds,
                    {"fleetenv.attempts": event.attempts})
        with self._lock:
            found = self._open.get(event.rollout_id)
        if found is not None and event.instance_id:
            found.span.set_attribute("fleetenv.instance", event.instance_id)
        self._provision.record(event.seconds, {"fleetenv.env": event.env_key or ""})

    def _span_event(self, event: Event) -> None:
        with self._lock:
            found = self._open.get(event.rollout_id)
        if found is None:
            return
        fields = {f"fleetenv.{key}": value for key, value in event.to_dict().items()
                  if key not in ("kind", "timestamp", "rollout_id", "task_key", "env_key")}
        found.span.add_event(f"fleetenv.{event.kind}", attributes=_clean(fields),
                             timestamp=_ns(event.timestamp))


def _ids(event: Event, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The event's identity plus ``extra``, as OpenTelemetry attribute values."""
    return _clean({"fleetenv.rollout_id": event.rollout_id, "fleetenv.task": event.task_key,
                   "fleetenv.env": event.env_key, "fleetenv.instance": event.instance_id,
                   **extra})


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Drop ``None`` values (OpenTelemetry rejects them) and make enums plain values."""
    clean: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, str) or not isinstance(value, bool | int | float):
            value = str(value)  # a StrEnum (stop reason, outcome) as its plain value
        clean[key] = value
    return clean
