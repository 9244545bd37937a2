"""What a report shows, computed once from a results file: per-task and per-tool numbers.

Kept apart from the rendering so the HTML page, the text table and the comparison of two
runs all count the same way, with the rules of :func:`fleetenv.summarize`. Where the
per-tool latencies come from: docs/reports.md.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.rendering import OUTCOMES, outcome_of
from fleetenv.core.types import RolloutResult

__all__ = ["RunData", "TaskStats", "ToolStats", "load_run"]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _variance(values: list[float]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


@dataclass(frozen=True)
class TaskStats:
    """One task's numbers over its episodes."""

    task_key: str
    episodes: int
    graded: int
    passed: int
    errors: int
    """Episodes that failed (provisioning, policy error, cancelled)."""
    tool_errors: int
    pass_rate: float | None
    """Passed / graded (``None`` when nothing was graded)."""
    mean_reward: float | None
    reward_variance: float | None
    """Population variance of the graded rewards (0.0 for one sample)."""
    mean_time_s: float | None
    """Mean ``total_s`` of the task's episodes."""

    @classmethod
    def of(cls, task_key: str, results: list[RolloutResult]) -> TaskStats:
        rewards = [r.reward for r in results if r.graded and r.reward is not None]
        times = [r.timings["total_s"] for r in results if "total_s" in r.timings]
        passed = sum(1 for r in rewards if r >= 1.0)
        return cls(
            task_key=task_key, episodes=len(results), graded=len(rewards), passed=passed,
            errors=sum(1 for r in results if r.error is not None),
            tool_errors=sum(r.tool_errors for r in results),
            pass_rate=passed / len(rewards) if rewards else None,
            mean_reward=_mean(rewards), reward_variance=_variance(rewards),
            mean_time_s=_mean(times),
        )


@dataclass
class ToolStats:
    """One tool's calls, errors and latencies in seconds (when the run recorded them)."""

    name: str
    calls: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.calls if self.calls else None


@dataclass
class RunData:
    """One run, ready to report: its results, manifest (if the file has one) and stats."""

    path: Path
    results: list[RolloutResult]
    manifest: dict[str, Any] | None = None
    tasks: list[TaskStats] = field(default_factory=list)
    tools: list[ToolStats] = field(default_factory=list)
    latency_source: str | None = None
    """Where the tool latencies came from: the events file, ``"results"``, or ``None``
    (no latencies)."""

    @property
    def name(self) -> str:
        return self.path.name

    def outcomes(self) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for result in self.results:
            counts[outcome_of(result)] += 1
        return counts

    def task(self, key: str) -> TaskStats | None:
        return next((t for t in self.tasks if t.task_key == key), None)


def load_run(path: str | os.PathLike[str], *,
             events: str | os.PathLike[str] | None = None) -> RunData:
    """Read a results file, its run manifest and optionally an events file into a
    :class:`RunData`.

    Raises ``ConfigurationError`` for a missing or empty file, ``ResultsFileError`` (from
    :func:`fleetenv.read_results`) for a malformed line.
    """
    from fleetenv.rollouts.results import read_run

    file = Path(path)
    if not file.is_file():
        raise ConfigurationError("results file not found", file=str(file),
                                 hint="pass the .jsonl path that 'fleetenv run' printed")
    manifest, results = read_run(file)
    if not results:
        raise ConfigurationError("the results file has no results", file=str(file),
                                 hint="it is written as episodes finish; was the run "
                                 "interrupted before the first one?")
    by_task: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in results:
        by_task[result.task_key].append(result)
    run = RunData(path=file, results=results, manifest=manifest,
                  tasks=[TaskStats.of(key, rs) for key, rs in sorted(by_task.items())])
    tools = _tool_counts(results)
    if events is not None:
        run.latency_source = str(events)
        _add_latencies(tools, Path(events), {r.rollout_id for r in results if r.rollout_id})
    elif any(r.tool_timings for r in results):
        run.latency_source = "results"
        _add_result_latencies(tools, results)
    run.tools = sorted(tools.values(), key=lambda t: (-t.calls, t.name))
    return run


def _tool_counts(results: list[RolloutResult]) -> dict[str, ToolStats]:
    """Calls per tool from the assistant messages; errors from ``tool_error_messages``
    (``"name(): message"``, one per failed call)."""
    tools: dict[str, ToolStats] = {}
    for result in results:
        for message in result.transcript:
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                if isinstance(name, str):
                    tools.setdefault(name, ToolStats(name)).calls += 1
        for text in result.tool_error_messages:
            name, sep, _ = text.partition("(): ")
            if sep:
                stats = tools.setdefault(name, ToolStats(name))
                stats.errors += 1
                stats.calls = max(stats.calls, stats.errors)
    return tools


def _add_result_latencies(tools: dict[str, ToolStats], results: list[RolloutResult]) -> None:
    """Durations from the results' own ``tool_timings`` (one per call sent)."""
    for result in results:
        for timing in result.tool_timings:
            name, seconds = timing.get("tool"), timing.get("seconds")
            if isinstance(name, str) and isinstance(seconds, int | float):
                tools.setdefault(name, ToolStats(name)).latencies_s.append(float(seconds))


def _add_latencies(tools: dict[str, ToolStats], events: Path, rollouts: set[str]) -> None:
    """Durations of ``tool_call_finished`` events of this run's rollouts."""
    try:
        handle = events.open(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the events file: {exc.strerror}",
                                 file=str(events),
                                 hint="pass the file a JsonlSink wrote, or leave --events "
                                 "out") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigurationError(f"{events}:{number}: not valid JSON",
                                         file=str(events),
                                         hint="is this an events file written by "
                                         "fleetenv.JsonlSink?") from None
            if not isinstance(event, dict) or event.get("kind") != "tool_call_finished":
                continue
            if rollouts and event.get("rollout_id") not in rollouts:
                continue
            name, duration = event.get("tool_name"), event.get("duration_s")
            if isinstance(name, str) and isinstance(duration, int | float):
                tools.setdefault(name, ToolStats(name)).latencies_s.append(float(duration))
