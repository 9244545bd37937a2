"""Grading an episode: the verifier runs once per episode, and its grade is kept.

The grade is stored on the episode state *by the blocking call that computes it*, under
a lock, so a caller that is cancelled while the verifier runs cannot lose it, a second
caller (``close()`` racing a final ``step()``) waits for it instead of running it again,
and every later look returns the same grade.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fleetenv.core.tasks import Task
from fleetenv.core.vocabulary import GradeReason

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.env.state import EpisodeState
    from fleetenv.fleet.provisioning import Instance
    from fleetenv.fleet.session import Session
    from fleetenv.fleet.verifier import Grade

__all__ = ["grade_once"]

#: Unknown grades that an instance which stopped under the episode explains.
_MAYBE_GONE = frozenset({GradeReason.VERIFIER_ERROR, GradeReason.VERIFIER_UNREACHABLE})


def grade_once(session: Session, task: Task, instance: Instance | None,
               state: EpisodeState,
               instance_gone: Callable[[], bool] | None = None) -> tuple[Grade, bool]:
    """Blocking: the episode's grade, running the verifier unless it already ran.

    Returns the grade and whether this call computed it (so the caller reports a
    verifier failure once). When the verifier could not grade and ``instance_gone()``
    says the instance stopped (expired, deleted), the reason is ``instance_gone``: the
    verifier failed because there was nothing left to check, not because it is broken.
    """
    from fleetenv.fleet.verifier import Grade, verify

    with state.grade_lock:
        if state.grade is not None:
            return state.grade, False
        started = time.monotonic()
        if instance is None or instance.deleted:
            grade = Grade.unknown(GradeReason.INSTANCE_GONE,
                                  "the instance was deleted before grading")
        else:
            grade = verify(
                env=instance.env, task_key=task.key, prompt=task.prompt,
                env_key=task.env_key, env_version=task.env_version,
                verifier_code=task.verifier, verifier_id=task.verifier_id,
                final_answer=state.final_answer, retry=session.verifier_retry(),
            )
            if (grade.reason in _MAYBE_GONE and instance_gone is not None
                    and instance_gone()):
                grade = Grade.unknown(GradeReason.INSTANCE_GONE,
                                      f"the instance stopped before grading ({grade.error})",
                                      stdout=grade.stdout, execution_id=grade.execution_id,
                                      seconds=grade.seconds)
        state.timings["verify_s"] = time.monotonic() - started
        state.grade = grade
        return grade, True
