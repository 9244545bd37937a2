"""Grading an episode: the verifier runs once per episode, and its grade is never lost.

The blocking call that computes the grade *owns* it: it stores it and runs
``on_settled`` itself, so a caller cancelled meanwhile (a harness step timeout) loses
only its view. A second caller (``close()`` or ``reset()`` racing a final ``step()``)
waits for the grade in flight for at most ``wait_s``, then records it unknown
(``grading_timeout``); an owner interrupted by Ctrl-C records ``interrupted``. The first
grade stored wins. docs/grading.md, "A grade in flight is never lost".
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from fleetenv.core.events import RolloutCompleted, VerificationFinished, VerifierFailed
from fleetenv.core.tasks import Task
from fleetenv.core.types import Grade, GradeReason, StopReason
from fleetenv.runtime.plans import Blocking, Plan

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.env.instance import InstanceLease
    from fleetenv.env.options import ResolvedOptions
    from fleetenv.env.state import EpisodeState
    from fleetenv.fleet.provisioning import Instance
    from fleetenv.fleet.session import Session

__all__ = ["CONVERSATION_KEY", "Grader", "grade_once", "wants_conversation"]

logger = logging.getLogger("fleetenv.verifier")

#: Unknown grades that an instance which stopped under the episode explains.
_MAYBE_GONE = frozenset({GradeReason.VERIFIER_ERROR, GradeReason.VERIFIER_UNREACHABLE})
#: Task metadata that declares whether the verifier takes the conversation (a bool);
#: without it, the verifier's parsed signature decides.
CONVERSATION_KEY = "verifier_conversation"
#: How much longer than ``timeouts.verify`` ``close()``/``reset()`` wait for a grade
#: in flight (the verification itself is bounded by ``timeouts.verify``).
_GRADE_WAIT_SLACK_S = 10.0


class Grader:
    """Finishes one env's episodes: grades each once, and reports how it ended once."""

    def __init__(self, session: Session, task: Task, lease: InstanceLease,
                 options: ResolvedOptions, emit: Callable[..., None]) -> None:
        self._session = session
        self._task = task
        self._lease = lease
        self._options = options
        self._emit = emit

    def finish_plan(self, state: EpisodeState, reason: StopReason) -> Plan[Grade]:
        """Grade once (cached), then report the completion once.

        The blocking grading call reports the verification and the completion itself,
        so a caller cancelled while the verifier runs (a step timeout) loses nothing
        but its own view: the grade lands on ``env.grade`` and ``close()`` waits for it.
        """
        grade: Grade = yield Blocking(self._grade, (state, reason))
        self.complete(state, reason)
        return grade

    def complete(self, state: EpisodeState, reason: StopReason, *,
                 error: BaseException | None = None) -> None:
        """Report the episode's end (``RolloutCompleted``), unless it was reported."""
        if not state.claim_completion():
            return
        grade = state.grade
        self._emit(RolloutCompleted, reason=reason, grade_status=state.grade_status,
                   grade_reason=grade.reason if grade else None,
                   reward=grade.reward if grade else None, steps=state.step,
                   error=str(error) if error else None, duration_s=state.elapsed_s())

    def _grade(self, state: EpisodeState, reason: StopReason) -> Grade:
        grade, _settled = grade_once(
            self._session, self._task, self._lease.instance, state, self._lease.is_gone,
            partial_reward=self._options.partial_reward,
            wait_s=self._session.config.timeouts.verify + _GRADE_WAIT_SLACK_S,
            on_settled=lambda settled: self._on_graded(settled, state, reason))
        return grade

    def _on_graded(self, grade: Grade, state: EpisodeState, reason: StopReason) -> None:
        """Report a grade once, from whichever call settled it."""
        if grade.reason is not GradeReason.NO_VERIFIER:
            self._emit(VerificationFinished, outcome=str(grade.status),
                       duration_s=grade.seconds, queue_s=grade.queue_s, reward=grade.reward,
                       reason=None if grade.reason is None else str(grade.reason),
                       attempts=grade.attempts, error_type=grade.error_type,
                       error=grade.error, execution_id=grade.execution_id)
            if not grade.graded:
                self._emit(VerifierFailed, error_type=str(grade.reason or "unknown"),
                           error=grade.error or "", steps=state.step)
        self.complete(state, reason)


def wants_conversation(task: Task) -> bool:
    """Should the verifier get the conversation? The task's metadata declaration
    (``verifier_conversation: true|false``) if any, else the verifier's signature."""
    from fleetenv.fleet.verifier_output import accepts_conversation

    declared = task.metadata.get(CONVERSATION_KEY)
    if isinstance(declared, bool):
        return declared
    return accepts_conversation(task.verifier)


def grade_once(session: Session, task: Task, instance: Instance | None,
               state: EpisodeState,
               instance_gone: Callable[[], bool] | None = None, *,
               partial_reward: bool = False,
               wait_s: float | None = None,
               on_settled: Callable[[Grade], None] | None = None) -> tuple[Grade, bool]:
    """Blocking: the episode's grade, running the verifier unless it ran or runs already.

    Returns the grade and whether this call settled it; whoever settles it runs
    ``on_settled(grade)`` once (events, completion). When the verifier could not grade and
    ``instance_gone()`` says the instance stopped (expired, deleted), the reason is
    ``instance_gone``: there was nothing left to check, the verifier is not broken.
    """
    with state.grade_lock:
        if state.grade is not None:
            return state.grade, False
        pending = state.grading
        owner = pending is None
        if pending is None:
            pending = state.grading = Future()
    if not owner:
        return _wait(pending, state, wait_s, on_settled)
    computed: Grade | None = None
    try:
        computed = _compute(session, task, instance, state, instance_gone, partial_reward)
    finally:
        if computed is None:  # interrupted (Ctrl-C, a bug): record why, then propagate
            cause = sys.exc_info()[1]  # what is propagating: named, so it can be found
            computed = Grade.unknown(
                GradeReason.INTERRUPTED,
                "grading was interrupted before the verifier answered"
                + (f" ({type(cause).__name__}: {cause})" if cause is not None else ""))
        settled = _settle(state, computed)
        try:  # reported before waiters go on: a reset() must not report it first
            if settled and on_settled is not None:
                on_settled(computed)
        finally:
            pending.set_result(state.grade or computed)
    return state.grade or computed, settled


def _wait(pending: Future[Grade], state: EpisodeState, wait_s: float | None,
          on_settled: Callable[[Grade], None] | None) -> tuple[Grade, bool]:
    try:
        return pending.result(timeout=wait_s), False
    except FutureTimeout:
        late = Grade.unknown(
            GradeReason.GRADING_TIMEOUT,
            f"the grade was still being computed after waiting {wait_s:.0f} s",
            attempts=0)
        settled = _settle(state, late)
        if settled and on_settled is not None:
            on_settled(late)
        return state.grade or late, settled


def _settle(state: EpisodeState, grade: Grade) -> bool:
    """Store ``grade`` unless one is stored already; True if this one was stored."""
    with state.grade_lock:
        if state.grade is not None:
            logger.warning("a grade arrived after the episode's grade was recorded (%s); "
                           "it is ignored: reward=%s reason=%s", state.grade.reason,
                           grade.reward, grade.reason)
            return False
        state.grade = grade
    return True


def _compute(session: Session, task: Task, instance: Instance | None, state: EpisodeState,
             instance_gone: Callable[[], bool] | None, partial_reward: bool) -> Grade:
    from fleetenv.fleet.verifier import verify

    started = time.monotonic()
    if instance is None or instance.deleted:
        grade = Grade.unknown(GradeReason.INSTANCE_GONE,
                              "the instance was deleted before grading", attempts=0)
    else:
        conversation: list[Any] | None = None
        if state.conversation is not None and wants_conversation(task):
            conversation = list(state.conversation)
        grade = verify(
            env=instance.env, task_key=task.key, prompt=task.prompt,
            env_key=task.env_key, env_version=task.env_version,
            verifier_code=task.verifier, verifier_id=task.verifier_id,
            final_answer=state.final_answer, conversation=conversation,
            partial_reward=partial_reward, retry=session.verifier_retry(),
        )
        if (grade.reason in _MAYBE_GONE and instance_gone is not None
                and instance_gone()):
            grade = Grade.unknown(GradeReason.INSTANCE_GONE,
                                  f"the instance stopped before grading ({grade.error})",
                                  stdout=grade.stdout, execution_id=grade.execution_id,
                                  seconds=grade.seconds, queue_s=grade.queue_s,
                                  attempts=grade.attempts, error_type=grade.error_type)
    state.timings["verify_s"] = time.monotonic() - started
    if grade.queue_s is not None:  # of verify_s, the wait for a free verifier runner
        state.timings["verify_queue_s"] = grade.queue_s
    return grade
