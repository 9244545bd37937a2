"""Grading an episode: the verifier runs once per episode, and its grade is never lost.

The previous client lost grades in flight: a harness step timeout cancelled the
verifier inside the terminal ``step``, ``final_reward`` stayed ``None``, and ``close()``
neither waited for it nor said why (research note §11 #13). Here:

- The blocking call that computes the grade *owns* it: it stores it on the episode state
  and runs ``on_settled`` (the events, the rollout's completion) itself, so a caller that
  is cancelled or times out while the verifier runs loses only its view of the result;
  ``env.grade`` has it, and the completion is reported with it.
- A second caller (``close()`` or ``reset()`` racing a final ``step()``) waits for the
  grade in flight instead of running the verifier again, for at most ``wait_s``; past
  that bound the grade is recorded as unknown (``grading_timeout``), never dropped.
- An owner interrupted before the verifier answered (Ctrl-C) records the grade as
  unknown (``interrupted``) on its way out, so nobody waits for a grade that will not come.

The first grade stored wins: every later look returns the same grade.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from fleetenv.core.tasks import Task
from fleetenv.core.types import GradeReason

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.types import Grade
    from fleetenv.env.state import EpisodeState
    from fleetenv.fleet.provisioning import Instance
    from fleetenv.fleet.session import Session

__all__ = ["CONVERSATION_KEY", "PARTIAL_REWARD_KEY", "grade_once", "wants_conversation"]

logger = logging.getLogger("fleetenv.verifier")

#: Unknown grades that an instance which stopped under the episode explains.
_MAYBE_GONE = frozenset({GradeReason.VERIFIER_ERROR, GradeReason.VERIFIER_UNREACHABLE})
#: Task metadata that declares whether the verifier takes the conversation (a bool);
#: without it, the verifier's parsed signature decides.
CONVERSATION_KEY = "verifier_conversation"
#: Task metadata that turns partial rewards on for the task (a bool); ``FleetEnv``'s
#: ``partial_reward=`` argument overrides it.
PARTIAL_REWARD_KEY = "partial_reward"


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
            from fleetenv.core.types import Grade as _Grade

            cause = sys.exc_info()[1]  # what is propagating: named, so it can be found
            computed = _Grade.unknown(
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
        from fleetenv.core.types import Grade

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
    from fleetenv.core.types import Grade
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
                                  seconds=grade.seconds, attempts=grade.attempts,
                                  error_type=grade.error_type)
    state.timings["verify_s"] = time.monotonic() - started
    return grade
