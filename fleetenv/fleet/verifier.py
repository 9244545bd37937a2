"""Grading an instance with the task's Fleet verifier.

The reward is either a graded float or *unknown* (``None``) with a reason. A verifier
that crashed, timed out, or could not reach the instance did not say "0": a census of the
previous client found 23% of its zero rewards were such failures, which poisoned about
42% of GRPO groups. So nothing here ever turns a failure into 0.0.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import DeadlineExceeded, FleetEnvError, VerifierError, redact
from fleetenv.core.retry import Deadline, RetryPolicy
from fleetenv.core.vocabulary import GradeReason, GradeStatus
from fleetenv.fleet.classify import provisioning_error

if TYPE_CHECKING:  # pragma: no cover
    from fleet.client import SyncEnv

__all__ = ["Grade", "score_of", "verify"]

logger = logging.getLogger("fleetenv.verifier")


@dataclass(frozen=True)
class Grade:
    """The outcome of one verification: a graded reward, or unknown with a reason."""

    reward: float | None
    status: GradeStatus
    reason: GradeReason | None = None
    """Why the grade is unknown (``None`` when graded)."""
    stdout: str | None = None
    error: str | None = None
    execution_id: str | None = None
    seconds: float = 0.0

    @classmethod
    def unknown(cls, reason: GradeReason, error: str | None = None, **fields: Any) -> Grade:
        return cls(reward=None, status=GradeStatus.UNKNOWN, reason=reason,
                   error=redact(error) if error else None, **fields)

    @property
    def graded(self) -> bool:
        return self.status is GradeStatus.GRADED

    def raise_for_status(self) -> Grade:
        """Return the grade if it is one; raise ``VerifierError`` if it is unknown.

        For callers (evaluation scripts, CI checks) that would rather stop than carry a
        ``None`` reward along; like ``requests.Response.raise_for_status``.
        """
        if self.graded:
            return self
        raise VerifierError(
            f"the grade is unknown ({self.reason}): {self.error or 'no error message'}",
            hint="see the verifier's stdout and error; an unknown grade is not a 0.0",
            execution=self.execution_id)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        data["reason"] = None if self.reason is None else str(self.reason)
        return data


def score_of(result: Any) -> float | None:
    """The numeric score in a verifier's return value (a number or ``{"score": n}``)."""
    if isinstance(result, dict):
        result = result.get("score")
    if isinstance(result, bool):
        return float(result)
    if isinstance(result, int | float) and math.isfinite(result):
        return float(result)
    return None  # a NaN or infinite "score" is no grade either


def verify(
    *,
    env: SyncEnv,
    task_key: str,
    prompt: str,
    env_key: str,
    env_version: str | None,
    verifier_code: str | None,
    verifier_id: str | None = None,
    final_answer: str | None = None,
    retry: RetryPolicy | None = None,
    timeout_s: float | None = None,
) -> Grade:
    """Run the verifier remotely (Fleet's ``/v1/verifiers/execute``) and grade.

    Blocking; never raises for a verifier problem (that is an unknown grade). The final
    answer is passed *positionally*: kwargs only travel inside the pickled payload, and a
    control plane that reads ``args_array`` would lose them.

    A request that failed in transport or with a transient status (429, 5xx) is retried
    under ``retry``: a verifier only reads the instance's state, so running it again is
    safe. A verifier that ran and failed is not retried: it would fail the same way.

    ``timeout_s`` (default: ``retry``'s budget) is an overall deadline on the whole
    verification, retries included, enforced on every socket read of every request
    (``fleetenv.fleet.deadlines``): a control plane that answers one byte at a time or
    stalls mid-body ends in an unknown grade whose error is ``DeadlineExceeded``.
    """
    if not verifier_code:
        return Grade.unknown(GradeReason.NO_VERIFIER, "the task has no verifier code")
    from fleet.tasks import Task as FleetTask

    from fleetenv.fleet.deadlines import deadline_scope

    started = time.monotonic()
    fleet_task = FleetTask(
        key=task_key, prompt=prompt, env_id=env_key, version=env_version,
        verifier_func=verifier_code, verifier_id=verifier_id,
    )

    def attempt() -> Any:
        try:
            return fleet_task.verify_detailed(env, final_answer)
        except Exception as exc:
            # Typed as retryable or not; the original stays the cause for the message.
            raise provisioning_error(exc, task=task_key) from exc

    policy = retry or RetryPolicy(max_attempts=1)
    deadline = Deadline(timeout_s) if timeout_s is not None else policy.deadline()
    try:
        with deadline_scope(deadline, what=f"verifying task {task_key}",
                            hint="raise verifier_timeout_s, or check the verifier",
                            task=task_key, instance=getattr(env, "instance_id", None)):
            response = policy.call(attempt, deadline=deadline)
    except FleetEnvError as wrapped:
        exc: Exception = wrapped
        if not isinstance(wrapped, DeadlineExceeded) and isinstance(wrapped.__cause__,
                                                                    Exception):
            exc = wrapped.__cause__
        seconds = time.monotonic() - started
        reason = (GradeReason.INSTANCE_GONE if _looks_gone(exc)
                  else GradeReason.VERIFIER_UNREACHABLE)
        logger.warning("verifier for task %s could not run: %s", task_key, exc)
        return Grade.unknown(reason, f"{type(exc).__name__}: {exc}", seconds=seconds)
    seconds = time.monotonic() - started
    stdout = response.stdout or None
    execution_id = response.execution_id
    if not response.success:
        return Grade.unknown(GradeReason.VERIFIER_ERROR, _error_text(response.error),
                             stdout=stdout, execution_id=execution_id, seconds=seconds)
    score = score_of(response.result)
    if score is None:
        return Grade.unknown(
            GradeReason.BAD_RESULT, f"verifier returned {response.result!r}, not a finite "
            "number or {'score': number}", stdout=stdout, execution_id=execution_id,
            seconds=seconds)
    return Grade(reward=score, status=GradeStatus.GRADED, stdout=stdout,
                 execution_id=execution_id, seconds=seconds)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        kind = error.get("type") or "Error"
        return f"{kind}: {error.get('message') or error}"
    return str(error) if error else "verifier failed without an error message"


def _looks_gone(exc: Exception) -> bool:
    from fleet import exceptions as fx

    return isinstance(exc, fx.FleetAPIError) and exc.status_code in (404, 410)
