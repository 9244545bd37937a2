"""The state of one episode: counters, outcome, deadline and timings.

``FleetEnv.reset()`` starts a fresh :class:`EpisodeState`; everything that describes
"this episode so far" lives here, so the env object itself only routes actions.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import ConfigurationError, EpisodeStateError
from fleetenv.core.redaction import scrub_secrets
from fleetenv.core.retry import Deadline
from fleetenv.core.types import GradeStatus, StopReason
from fleetenv.env.context_tools import ContextTools

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.types import Grade, Observation, StepInfo, ToolCall

__all__ = ["EpisodeState", "EpisodeStats", "check_conversation"]

#: Longest tool-error message kept per error (the agent saw the whole one).
_ERROR_CHARS = 500


@dataclass(frozen=True)
class EpisodeStats:
    """A snapshot of an episode's counters, for result records and logs."""

    turns: int = 0
    tool_calls: int = 0
    """Calls to the env's tools, sent or refused (bad arguments, unknown tool)."""
    tool_errors: int = 0
    """The calls among them that failed (never more than ``tool_calls``)."""
    tool_error_messages: tuple[str, ...] = ()
    parse_errors: int = 0
    """Turns whose tool calls could not be read (each one a turn, see docs/episodes.md)."""
    noop_turns: int = 0
    """Turns without a tool call that did nothing (``no_tool_call="noop"``)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``provision_s``, ``steps_s``, ``verify_s``."""
    tool_timings: tuple[dict[str, Any], ...] = ()
    """Per tool call sent: ``{"tool", "seconds", "outcome"}`` (``ok``, ``tool_error``,
    ``failed``), in order."""


class EpisodeState:
    """Mutable record of one episode; owned by one ``FleetEnv``."""

    def __init__(self, deadline_s: float | None = None, *, active: bool = False) -> None:
        self.active = active
        self.step = 0
        self.tool_calls = 0
        self.tool_error_messages: list[str] = []
        self.parse_errors = 0
        self.noop_turns = 0
        self.stop_reason: StopReason | None = None
        self.final_answer: str | None = None
        self.grade: Grade | None = None
        #: The grade being computed (or computed): a second caller waits on it.
        self.grading: Future[Grade] | None = None
        self.grade_lock = threading.Lock()
        #: Chat messages for verifiers that take ``conversation`` (set by the caller).
        self.conversation: list[Any] | None = None
        #: Context tools only: the chat history the agent sees (trimmed by
        #: ``manage_context``), and the tools' full history / last long output.
        self.history: list[dict[str, Any]] = []
        self.context = ContextTools()
        self._history_replaced = False
        self.deadline = Deadline(deadline_s)
        self.started_at = time.monotonic()
        self.timings: dict[str, float] = {"provision_s": 0.0, "steps_s": 0.0, "verify_s": 0.0}
        self.tool_timings: list[dict[str, Any]] = []
        self._completed = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def stop(self, reason: StopReason) -> None:
        """Record why the episode ends (the first reason wins)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def record_tool_error(self, tool: str, message: str) -> None:
        # Scrubbed before the cut: half a key at the cut would no longer be found later.
        self.tool_error_messages.append(f"{tool}(): {scrub_secrets(message)[:_ERROR_CHARS]}")

    # ------------------------------------------------------------------ context tools

    def record_call(self, call: ToolCall, prompt: str) -> None:
        """Add the assistant message of one tool call (after the task prompt, for the
        first one) to the visible and the full history."""
        if not self.history and not self.context.full_history:
            self._record({"role": "user", "content": [{"type": "text", "text": prompt}]})
        self._record({"role": "assistant", "content": None, "tool_calls": [call.to_openai()]})

    def record_observation(self, observation: Observation) -> list[dict[str, Any]] | None:
        """Add an observation's messages; returns the whole new visible history when a
        ``manage_context`` call replaced it in this call (else ``None``)."""
        for message in observation.to_messages():
            self._record(message)
        if not self._history_replaced:
            return None
        self._history_replaced = False
        return [dict(m) for m in self.history]

    def replace_history(self, history: list[dict[str, Any]]) -> None:
        """Adopt the history ``manage_context`` returned."""
        self.history = list(history)
        self._history_replaced = True

    def _record(self, message: dict[str, Any]) -> None:
        self.history.append(message)
        self.context.track(message)

    def claim_completion(self) -> bool:
        """True exactly once per active episode: whoever gets it reports the completion."""
        with self._lock:
            if self._completed or not self.active:
                return False
            self._completed = True
            return True

    @property
    def completed(self) -> bool:
        return self._completed

    @property
    def grade_status(self) -> GradeStatus:
        return GradeStatus.NOT_GRADED if self.grade is None else self.grade.status

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at

    def stats(self) -> EpisodeStats:
        return EpisodeStats(turns=self.step, tool_calls=self.tool_calls,
                            tool_errors=len(self.tool_error_messages),
                            tool_error_messages=tuple(self.tool_error_messages),
                            parse_errors=self.parse_errors, noop_turns=self.noop_turns,
                            timings=dict(self.timings),
                            tool_timings=tuple(dict(t) for t in self.tool_timings))

    def require_running(self, task_key: str) -> None:
        """Refuse a step before ``reset()`` and after the episode ended."""
        if not self.active:
            raise EpisodeStateError("step() before reset()", hint="call reset() first",
                                    task=task_key)
        if self.stop_reason is not None:
            raise EpisodeStateError(
                f"the episode is over ({self.stop_reason})",
                hint="call reset() to start a new episode", task=task_key)

    def end_step(self, started: float, max_steps: int) -> None:
        """Count a step's time (since ``started``, monotonic); stop the episode at the
        step limit or past its deadline."""
        self.timings["steps_s"] += time.monotonic() - started
        if self.step >= max_steps:
            self.stop(StopReason.MAX_STEPS)
        if self.deadline.expired():
            self.stop(StopReason.TIME_LIMIT)

    def outcome_info(self, instance_id: str | None) -> StepInfo:
        """The last keys of ``step()``'s ``info``: the grade once there is one, then the
        stop reason, the counters and the instance."""
        info: StepInfo = {}
        grade = self.grade
        if grade is not None:
            info.update({
                "reward_status": grade.status, "reward_reason": grade.reason,
                "verifier_stdout": grade.stdout, "verifier_error": grade.error,
                "verifier_execution_id": grade.execution_id,
                "verifier_score": grade.score, "partial_reward": grade.partial,
                "app_scores": {name: app.score for name, app in grade.apps.items()},
                "final_answer": self.final_answer})
        info.update({"stop_reason": self.stop_reason, "tool_calls": self.tool_calls,
                     "tool_errors": len(self.tool_error_messages),
                     "instance_id": instance_id})
        return info


def check_conversation(messages: object) -> list[Any] | None:
    """A conversation as a list of messages (``None``: none), checked where it is given."""
    if messages is None:
        return None
    if isinstance(messages, str | bytes) or not isinstance(messages, list | tuple):
        raise ConfigurationError(
            f"conversation must be a list of chat messages, got a {type(messages).__name__}",
            hint='pass e.g. [{"role": "user", "content": "..."}, ...] (the chat history)')
    return list(messages)
