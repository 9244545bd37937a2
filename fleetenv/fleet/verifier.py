"""Grading an instance with the task's Fleet verifier.

The reward is either a graded float or *unknown* (``None``) with a reason. A verifier
that crashed, timed out, or could not reach the instance did not say "0", and a false 0.0
poisons the whole group of a GRPO step. So nothing here ever turns a failure into 0.0.

What OpenEnv's ``fleet_env`` does and trainers rely on, kept here:
transient failures are retried (inside the verification's budget), a run whose LLM judge
failed (``JUDGE ERROR:``) is unknown and retried, a run that returns ``None`` grades
``1.0``, the transcript goes to verifiers that take a ``conversation`` parameter, and the
partial score (accumulators, multi-app) is read from stdout (``verifier_output``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import DeadlineExceeded, FleetEnvError
from fleetenv.core.retry import Deadline, RetryPolicy
from fleetenv.core.types import Grade, GradeReason, GradeStatus
from fleetenv.fleet.classify import is_gone, provisioning_error
from fleetenv.fleet.verifier_output import judge_failed, parse_partial

if TYPE_CHECKING:  # pragma: no cover
    from fleet.client import SyncEnv

__all__ = ["score_of", "verify"]

logger = logging.getLogger("fleetenv.verifier")


def score_of(result: Any) -> float | None:
    """The numeric score in a verifier's return value (a number or ``{"score": n}``)."""
    if isinstance(result, dict):
        result = result.get("score")
    if isinstance(result, bool):
        return float(result)
    if isinstance(result, int | float) and math.isfinite(result):
        return float(result)
    return None  # a NaN or infinite "score" is no grade either


class _JudgeFailed(Exception):
    """A run that succeeded but whose LLM judge failed; retryable like a 503."""

    retryable = True

    def __init__(self, response: Any) -> None:
        super().__init__("the verifier's LLM judge failed (a stdout line starts with "
                         "'JUDGE ERROR:')")
        self.response = response


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
    conversation: Sequence[Any] | str | None = None,
    partial_reward: bool = False,
    retry: RetryPolicy | None = None,
    timeout_s: float | None = None,
) -> Grade:
    """Run the verifier remotely (Fleet's ``/v1/verifiers/execute``) and grade.

    Blocking; never raises for a verifier problem (that is an unknown grade). The final
    answer is passed *positionally*: kwargs only travel inside the pickled payload, and a
    control plane that reads ``args_array`` would lose them. ``conversation`` (chat
    messages, sent as a JSON string, as OpenEnv's ``fleet_env`` does) goes as the keyword
    ``conversation=``; pass it only to verifiers that take it.

    A request that failed in transport or with a transient status (429, 5xx) is retried
    under ``retry``, and so is a run whose stdout has a line starting ``JUDGE ERROR:`` (a
    judge brownout): a verifier only reads the instance's state, so running it again is
    safe. A verifier that ran and failed is not retried: it would fail the same way.

    ``timeout_s`` (default: ``retry``'s budget) is an overall deadline on the whole
    verification, retries included, enforced on every socket read of every request
    (``fleetenv.fleet.deadlines``): a control plane that answers one byte at a time or
    stalls mid-body ends in an unknown grade whose error is ``DeadlineExceeded``.
    """
    if not verifier_code:
        return Grade.unknown(GradeReason.NO_VERIFIER, "the task has no verifier code",
                             attempts=0)
    from fleet.tasks import Task as FleetTask

    from fleetenv.fleet.client import last_queue_s
    from fleetenv.fleet.deadlines import deadline_scope

    started = time.monotonic()
    fleet_task = FleetTask(
        key=task_key, prompt=prompt, env_id=env_key, version=env_version,
        verifier_func=verifier_code, verifier_id=verifier_id,
    )
    kwargs: dict[str, Any] = {}
    if conversation is not None:
        kwargs["conversation"] = (conversation if isinstance(conversation, str)
                                  else json.dumps(list(conversation), default=str))
    attempts = 0
    queue_s: float | None = None

    def attempt() -> Any:
        nonlocal attempts, queue_s
        attempts += 1
        try:
            response = fleet_task.verify_detailed(env, final_answer, **kwargs)
        except Exception as exc:
            # Typed as retryable or not; the original stays the cause for the message.
            raise provisioning_error(exc, task=task_key) from exc
        finally:
            waited = last_queue_s()  # what the runner said about this run's queueing
            if waited is not None:
                queue_s = (queue_s or 0.0) + waited
        if response.success and judge_failed(response.stdout):
            raise _JudgeFailed(response)
        return response

    policy = retry or RetryPolicy(max_attempts=1)
    deadline = Deadline(timeout_s) if timeout_s is not None else policy.deadline()

    def on_retry(failed: int, delay: float, exc: Exception) -> None:
        logger.info("verifier for task %s: attempt %d failed (%s); retrying in %.1f s",
                    task_key, failed, type(exc).__name__, delay)

    try:
        with deadline_scope(deadline, what=f"verifying task {task_key}",
                            hint="raise timeouts.verify, or check the verifier",
                            task=task_key, instance=getattr(env, "instance_id", None)):
            response = policy.call(attempt, deadline=deadline, on_retry=on_retry)
    except _JudgeFailed as judged:
        failed = judged.response
        logger.warning("verifier for task %s: the LLM judge failed on every attempt",
                       task_key)
        return Grade.unknown(
            GradeReason.JUDGE_ERROR, _judge_line(failed.stdout), stdout=failed.stdout or None,
            execution_id=failed.execution_id, seconds=time.monotonic() - started,
            queue_s=queue_s, attempts=attempts, error_type="JudgeError")
    except FleetEnvError as wrapped:
        exc: Exception = wrapped
        if not isinstance(wrapped, DeadlineExceeded) and isinstance(wrapped.__cause__,
                                                                    Exception):
            exc = wrapped.__cause__
        seconds = time.monotonic() - started
        reason = (GradeReason.INSTANCE_GONE if is_gone(exc)
                  else GradeReason.VERIFIER_UNREACHABLE)
        logger.warning("verifier for task %s could not run: %s", task_key, exc)
        status = getattr(exc, "status_code", None)
        said = f" (HTTP {status})" if isinstance(status, int) else ""
        return Grade.unknown(reason, f"{type(exc).__name__}{said}: {exc}", seconds=seconds,
                             queue_s=queue_s, attempts=attempts,
                             error_type=type(exc).__name__)
    seconds = time.monotonic() - started
    stdout = response.stdout or None
    execution_id = response.execution_id
    done = {"stdout": stdout, "execution_id": execution_id, "seconds": seconds,
            "queue_s": queue_s, "attempts": attempts}
    if not response.success:
        error_type = (response.error.get("type") if isinstance(response.error, dict)
                      else None)
        return Grade.unknown(GradeReason.VERIFIER_ERROR, _error_text(response.error),
                             error_type=str(error_type or "VerifierError"), **done)
    # None is a pass (1.0): verifiers end without a return value when every check passed.
    score = 1.0 if response.result is None else score_of(response.result)
    if score is None:
        return Grade.unknown(
            GradeReason.BAD_RESULT, f"verifier returned {response.result!r}, not a finite "
            "number or {'score': number}", error_type="BadResult", **done)
    parsed = parse_partial(stdout)
    reward = score
    if partial_reward and score == 0.0 and parsed.score is not None:
        reward = parsed.score
    return Grade(reward=reward, status=GradeStatus.GRADED, score=score,
                 partial=parsed.score, apps=parsed.apps, **done)


def _judge_line(stdout: str | None) -> str:
    for line in (stdout or "").splitlines():
        if line.startswith("JUDGE ERROR:"):
            return line[:500]
    return "JUDGE ERROR"


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        kind = error.get("type") or "Error"
        return f"{kind}: {error.get('message') or error}"
    return str(error) if error else "verifier failed without an error message"
