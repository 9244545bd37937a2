"""What an episode tells Tinker: stop reasons, Fleet metrics and verifier logs.

The stop reason is the one-hot metric ``stop/<reason>`` on the final transition (the
cookbook mirrors it onto ``Trajectory.stop_reason``), under the cookbook's name where one
means the same thing, so ``TerminationRewardPolicy`` sees the limits it knows. Per-call
tool latency comes from ``ToolCallFinished`` events, kept by a :class:`ToolCallTap`.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event, ToolCallFinished
from fleetenv.core.types import StopReason

__all__ = ["ToolCallTap", "episode_logs", "episode_metrics", "tinker_stop_reason",
           "turn_metrics"]

# fleetenv's reason -> the cookbook's StopReason value (tinker_cookbook.rl.types).
_STOP_NAMES = {
    StopReason.AGENT_DONE: "completed",
    StopReason.MAX_STEPS: "max_turns",
    StopReason.TIME_LIMIT: "rollout_timeout",
}

#: How much verifier output goes into ``logs`` (its end: where the failures are).
VERIFIER_LOG_CHARS = 4000


def tinker_stop_reason(reason: StopReason | str) -> str:
    """The cookbook's name for fleetenv's stop reason; fleetenv's own name where the
    cookbook has none (``instance_expired``, ``abandoned``, ...)."""
    if isinstance(reason, StopReason):
        return _STOP_NAMES.get(reason, str(reason))
    return reason


class ToolCallTap:
    """An event sink keeping ``(outcome, duration_s)`` of each tool call, for the
    rollouts being watched. Thread-safe; one per event bus (:meth:`on`)."""

    _taps: dict[int, ToolCallTap] = {}
    _taps_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, list[tuple[str, float]]] = {}

    @classmethod
    def on(cls, bus: EventBus) -> ToolCallTap:
        """The tap attached to ``bus`` (attached on first use)."""
        with cls._taps_lock:
            tap = cls._taps.get(id(bus))
            if tap is None or tap not in bus.sinks:
                tap = cls._taps[id(bus)] = ToolCallTap()
                bus.add_sink(tap)
            return tap

    def watch(self, rollout_id: str) -> None:
        with self._lock:
            self._calls.setdefault(rollout_id, [])

    def take(self, rollout_id: str) -> list[tuple[str, float]]:
        """The calls recorded for ``rollout_id`` since the last take."""
        with self._lock:
            calls = self._calls.get(rollout_id)
            if calls is None:
                return []
            self._calls[rollout_id] = []
            return calls

    def forget(self, rollout_id: str) -> None:
        with self._lock:
            self._calls.pop(rollout_id, None)

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ToolCallFinished) or event.outcome == "local":
            return
        with self._lock:
            calls = self._calls.get(event.rollout_id)
            if calls is not None:
                calls.append((event.outcome, event.duration_s))


def turn_metrics(calls: list[tuple[str, float]]) -> dict[str, float | int]:
    """One turn's tool calls: how many, how many failed, and how long they took."""
    metrics: dict[str, float | int] = {
        "fleet/turn_tool_calls": len(calls),
        "fleet/turn_tool_errors": sum(1 for outcome, _ in calls if outcome != "ok"),
    }
    if calls:
        durations = [duration for _, duration in calls]
        metrics["fleet/tool_latency_s"] = statistics.fmean(durations)
        metrics["fleet/tool_latency_max_s"] = max(durations)
    return metrics


def episode_metrics(stats: Any, grade: Any, *, reward_unknown: bool) -> dict[str, float | int]:
    """The episode's totals, for the final transition (``stats`` is fleetenv's
    ``EpisodeStats``, ``grade`` its ``Grade`` or ``None``)."""
    timings = stats.timings
    metrics: dict[str, float | int] = {
        "fleet/provision_s": float(timings.get("provision_s", 0.0)),
        "fleet/turns": stats.turns,
        "fleet/tool_calls": stats.tool_calls,
        "fleet/tool_errors": stats.tool_errors,
        "fleet/parse_errors": stats.parse_errors,
        "fleet/reward_unknown": 1 if reward_unknown else 0,
        "fleet/graded": 1 if grade is not None and grade.graded else 0,
    }
    if grade is not None and grade.graded:
        metrics["fleet/verify_s"] = float(grade.seconds)
    return metrics


def episode_logs(env: Any, reason: StopReason | None = None) -> dict[str, str | int | float]:
    """What the verifier said, and where the episode ran (``env`` is the FleetEnv;
    ``reason`` fleetenv's stop reason when the adapter, not fleetenv, ended it)."""
    logs: dict[str, str | int | float] = {
        "fleet/task_key": env.task.key,
        "fleet/instance_id": env.last_instance_id or "",
        "fleet/stop_reason": str(env.stop_reason or reason or ""),
    }
    grade = env.grade
    if grade is None:
        logs["fleet/grade_status"] = "not_graded"
        return logs
    logs["fleet/grade_status"] = str(grade.status)
    if grade.reason is not None:
        logs["fleet/grade_reason"] = str(grade.reason)
    if grade.stdout:
        logs["fleet/verifier_stdout"] = grade.stdout[-VERIFIER_LOG_CHARS:]
    if grade.error:
        logs["fleet/verifier_error"] = grade.error[-VERIFIER_LOG_CHARS:]
    if grade.execution_id:
        logs["fleet/verifier_execution_id"] = grade.execution_id
    return logs
