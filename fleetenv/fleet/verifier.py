"""Grading an instance with the task's Fleet verifier.

The reward is either a graded float or *unknown* (``None``) with a reason. A verifier
that crashed, timed out, or could not reach the instance did not say "0": a census of the
previous client found 23% of its zero rewards were such failures, which poisoned about
42% of GRPO groups. So nothing here ever turns a failure into 0.0.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from fleetenv.core.errors import redact

if TYPE_CHECKING:  # pragma: no cover
    from fleet.client import SyncEnv

logger = logging.getLogger("fleetenv.verifier")

GradeStatus = Literal["graded", "unknown"]


@dataclass(frozen=True)
class Grade:
    """The outcome of one verification."""

    reward: float | None
    status: GradeStatus
    reason: str | None = None
    """Why the grade is unknown: ``no_verifier``, ``verifier_error``, ``instance_gone``,
    ``bad_result``, ``verifier_unreachable`` ... (``None`` when graded)."""
    stdout: str | None = None
    error: str | None = None
    execution_id: str | None = None
    seconds: float = 0.0

    @classmethod
    def unknown(cls, reason: str, error: str | None = None, **fields: Any) -> Grade:
        return cls(reward=None, status="unknown", reason=reason,
                   error=redact(error) if error else None, **fields)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_of(result: Any) -> float | None:
    """The numeric score in a verifier's return value (a number or ``{"score": n}``)."""
    if isinstance(result, dict):
        result = result.get("score")
    if isinstance(result, bool):
        return float(result)
    if isinstance(result, int | float):
        return float(result)
    return None


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
) -> Grade:
    """Run the verifier remotely (Fleet's ``/v1/verifiers/execute``) and grade.

    Blocking; never raises for a verifier problem (that is an unknown grade). The final
    answer is passed *positionally*: kwargs only travel inside the pickled payload, and a
    control plane that reads ``args_array`` would lose them.
    """
    if not verifier_code:
        return Grade.unknown("no_verifier", "the task has no verifier code")
    from fleet.tasks import Task as FleetTask

    started = time.monotonic()
    try:
        fleet_task = FleetTask(
            key=task_key, prompt=prompt, env_id=env_key, version=env_version,
            verifier_func=verifier_code, verifier_id=verifier_id,
        )
        response = fleet_task.verify_detailed(env, final_answer)
    except Exception as exc:
        seconds = time.monotonic() - started
        reason = "instance_gone" if _looks_gone(exc) else "verifier_unreachable"
        logger.warning("verifier for task %s could not run: %s", task_key, exc)
        return Grade.unknown(reason, f"{type(exc).__name__}: {exc}", seconds=seconds)
    seconds = time.monotonic() - started
    stdout = response.stdout or None
    execution_id = response.execution_id
    if not response.success:
        return Grade.unknown("verifier_error", _error_text(response.error),
                             stdout=stdout, execution_id=execution_id, seconds=seconds)
    score = score_of(response.result)
    if score is None:
        return Grade.unknown(
            "bad_result", f"verifier returned {response.result!r}, not a number or "
            "{'score': number}", stdout=stdout, execution_id=execution_id, seconds=seconds)
    return Grade(reward=score, status="graded", stdout=stdout, execution_id=execution_id,
                 seconds=seconds)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        kind = error.get("type") or "Error"
        return f"{kind}: {error.get('message') or error}"
    return str(error) if error else "verifier failed without an error message"


def _looks_gone(exc: Exception) -> bool:
    from fleet import exceptions as fx

    return isinstance(exc, fx.FleetAPIError) and exc.status_code in (404, 410)
