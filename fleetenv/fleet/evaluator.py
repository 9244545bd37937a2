"""The task evaluator: score a task with Fleet's harness jobs, k rollouts per model
(docs/evaluate.md).

Fleet runs the agent on its side; over fleet-python's synchronous client this module
imports the task (``POST /v1/tasks``), creates a harness job (``POST /v1/jobs``), polls it
with backoff (``GET /v1/jobs/{id}``) and reads its sessions (``GET /v1/sessions/job/{id}``)
into per-model scores; the async twin runs the calls on the runtime's pool. A session
without a verifier score is ``None``, never 0.0. Polls retry transient answers within the
deadline; creating the job is retried only when Fleet cannot have created it (a 429 or 503
answer, or a request that never left), so a retry never starts a second job.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fleetenv.core.errors import (
    ConfigurationError,
    DeadlineExceeded,
    EvaluationError,
    EvaluationFailed,
    FleetEnvError,
)
from fleetenv.core.retry import Backoff, Deadline, RetryPolicy, is_retryable
from fleetenv.core.tasks import Task
from fleetenv.fleet.classify import request_error
from fleetenv.runtime.plans import Blocking, OnLoop, Plan, run_async, run_sync

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.session import Session

__all__ = [
    "DEFAULT_FLEET_MODELS",
    "DEFAULT_LOCAL_MODELS",
    "EvaluationError",
    "EvaluationFailed",
    "EvaluationResult",
    "Evaluator",
    "ModelScores",
    "SessionScore",
    "evaluate_task",
    "evaluate_task_async",
]

logger = logging.getLogger("fleetenv.evaluator")
T = TypeVar("T")

#: Models evaluated on Fleet when none are named (OpenEnv's ``fleet_env`` default).
DEFAULT_FLEET_MODELS = ("anthropic/claude-sonnet-4.5",)
#: Models evaluated on the embedded local Fleet when none are named.
DEFAULT_LOCAL_MODELS = ("reference",)
#: Job statuses after which nothing changes any more.
TERMINAL_STATUSES = frozenset({"completed", "cancelled", "canceled", "errored", "failed"})
_FAILED_STATUSES = TERMINAL_STATUSES - {"completed"}
_MODES = {"tool_use": "tool-use", "computer_use": "computer-use",
          "browser_use": "browser-use"}
_IMPORTING, _CREATING = "importing the task", "creating the evaluation job"


@dataclass(frozen=True)
class SessionScore:
    """One rollout of the job: ``score`` is the verifier's, ``None`` when unknown."""

    session_id: str
    model: str
    status: str
    score: float | None
    step_count: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ModelScores:
    """The rollouts of one model. Unknown scores are counted apart, never as 0.0."""

    model: str
    sessions: tuple[SessionScore, ...]

    @property
    def scores(self) -> list[float | None]:
        return [s.score for s in self.sessions]

    @property
    def graded(self) -> int:
        """Rollouts with a score."""
        return sum(1 for s in self.sessions if s.score is not None)

    @property
    def passed(self) -> int:
        """Rollouts with full marks (score >= 1)."""
        return sum(1 for s in self.sessions if s.score is not None and s.score >= 1.0)

    @property
    def mean(self) -> float | None:
        """Mean score over the graded rollouts (``None`` when none was graded)."""
        graded = [s.score for s in self.sessions if s.score is not None]
        return sum(graded) / len(graded) if graded else None

    def line(self) -> str:
        mean = "n/a" if self.mean is None else f"{self.mean:.2f}"
        return (f"{self.model}: mean score {mean} over {len(self.sessions)} rollouts "
                f"(passed {self.passed}, graded {self.graded})")


@dataclass(frozen=True)
class EvaluationResult:
    """Per-model scores of one task's harness job."""

    job_id: str
    task_key: str
    status: str
    models: Mapping[str, ModelScores]
    seconds: float

    @property
    def num_sessions(self) -> int:
        return sum(len(m.sessions) for m in self.models.values())

    @property
    def num_errors(self) -> int:
        """Rollouts that produced no score (failed sessions, unknown grades)."""
        return sum(len(m.sessions) - m.graded for m in self.models.values())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["models"] = {name: {**asdict(scores), "mean": scores.mean,
                                 "passed": scores.passed, "graded": scores.graded}
                          for name, scores in self.models.items()}
        data.update(num_sessions=self.num_sessions, num_errors=self.num_errors)
        return data


class Evaluator:
    """Evaluates tasks with Fleet's harness jobs: ``k`` rollouts for each of ``models``.

    ``session`` is the Fleet to use (default: the default session, the embedded local
    Fleet without an API key). ``models`` default to :data:`DEFAULT_FLEET_MODELS` on
    Fleet and :data:`DEFAULT_LOCAL_MODELS` locally. ``timeout_s`` bounds one evaluation,
    import to results; ``poll_interval_s`` is the longest pause between two polls (the
    first polls come sooner, with backoff up to it). Thread-safe; holds no connections
    of its own.
    """

    def __init__(self, *, session: Session | None = None, k: int = 4,
                 models: Sequence[str] | None = None, max_steps: int | None = None,
                 timeout_s: float = 1800.0, poll_interval_s: float = 10.0,
                 project_key: str | None = None, job_name: str | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"k must be an integer >= 1, got {k!r}", field="k",
                                     hint="k is the number of rollouts per model, e.g. 4")
        if max_steps is not None and (isinstance(max_steps, bool)
                                      or not isinstance(max_steps, int) or max_steps < 1):
            raise ConfigurationError(f"max_steps must be an integer >= 1, got {max_steps!r}",
                                     field="max_steps")
        for name, value in (("timeout_s", timeout_s), ("poll_interval_s", poll_interval_s)):
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number, got {value!r}",
                                         field=name)
        if models is not None and (isinstance(models, str) or not models or not all(
                isinstance(m, str) and m.strip() for m in models)):
            raise ConfigurationError(
                f"models must be a non-empty list of model ids, got {models!r}",
                field="models", hint='e.g. models=["anthropic/claude-sonnet-4.5"]')
        self._session = session
        self.k = k
        self._models = tuple(models) if models is not None else None
        self.max_steps = max_steps
        self.timeout_s = float(timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self.project_key = project_key
        self.job_name = job_name

    def __repr__(self) -> str:
        return (f"Evaluator(k={self.k}, models={list(self._models or ['<default>'])}, "
                f"timeout_s={self.timeout_s:g})")

    @property
    def session(self) -> Session:
        if self._session is None:
            from fleetenv.fleet.session import Session

            self._session = Session.shared()
        return self._session

    @property
    def models(self) -> tuple[str, ...]:
        if self._models is not None:
            return self._models
        return DEFAULT_LOCAL_MODELS if self.session.is_local else DEFAULT_FLEET_MODELS

    # ------------------------------------------------------------------ public API

    def evaluate(self, task: Task | Mapping[str, Any]) -> EvaluationResult:
        """Import ``task``, run its job and return the per-model scores (blocking)."""
        return run_sync(self._evaluate_plan(as_task(task)))

    async def evaluate_async(self, task: Task | Mapping[str, Any]) -> EvaluationResult:
        """:meth:`evaluate` for asyncio code: HTTP calls run in a worker thread and the
        pauses on the caller's loop, which never blocks. Cancelling stops the polling."""
        return await run_async(self._evaluate_plan(as_task(task)))

    def wait(self, job_id: str, *, task_key: str = "") -> EvaluationResult:
        """Poll an existing job (e.g. one that outlived an earlier deadline) to its end."""
        return run_sync(self._wait_plan(job_id, task_key, Deadline(self.timeout_s),
                                        time.monotonic()))

    async def wait_async(self, job_id: str, *, task_key: str = "") -> EvaluationResult:
        return await run_async(self._wait_plan(job_id, task_key, Deadline(self.timeout_s),
                                               time.monotonic()))

    # ------------------------------------------------------------------ the plan

    def _evaluate_plan(self, task: Task) -> Plan[EvaluationResult]:
        started = time.monotonic()
        deadline = Deadline(self.timeout_s)
        if not task.verifier:
            raise ConfigurationError(
                "the task has no verifier: Fleet grades a job's rollouts with it",
                field="verifier", task=task.key,
                hint="set the task's verifier (verifier_func / verifier_code) to the source "
                "of its verifier function")
        models = list(self.models)
        yield from self._call(_IMPORTING, deadline, self._import, task,
                              task=task.key)
        job_id: str = yield from self._call(
            _CREATING, deadline, self._create_job, task, models,
            retryable=_create_retryable, task=task.key)
        logger.info("evaluation job %s started for task %s (%d x %s)", job_id, task.key,
                    self.k, ", ".join(models))
        return (yield from self._wait_plan(job_id, task.key, deadline, started, models))

    def _wait_plan(self, job_id: str, task_key: str, deadline: Deadline, started: float,
                   models: Sequence[str] | None = None) -> Plan[EvaluationResult]:
        backoff = Backoff(base=min(1.0, self.poll_interval_s), cap=self.poll_interval_s)
        polls = 0
        status = "unknown"
        while True:
            try:
                job = yield from self._call("polling the evaluation job", deadline,
                                            self._get_job, job_id, job=job_id,
                                            task=task_key or None)
            except DeadlineExceeded as exc:
                if deadline.expired():  # the evaluation's deadline, not one request's
                    raise self._deadline_error(job_id, task_key, status) from exc
                raise
            status = str(job.get("status") or "unknown").lower()
            if status in TERMINAL_STATUSES:
                break
            remaining = deadline.remaining()
            if remaining is not None and remaining <= 0:
                raise self._deadline_error(job_id, task_key, status)
            pause = deadline.cap(backoff.delay(polls))
            polls += 1
            yield OnLoop(_sleep, (pause,))
        if status in _FAILED_STATUSES:
            reason = job.get("error") or "Fleet gave no reason"
            raise EvaluationFailed(f"evaluation job {job_id} ended {status}: {reason}",
                                   job=job_id, task=task_key or None)
        sessions = yield from self._call("reading the job's sessions", deadline,
                                         self._sessions, job_id, job=job_id,
                                         task=task_key or None)
        return _result(job_id, task_key, status, sessions, models or self._models or (),
                       time.monotonic() - started)

    def _deadline_error(self, job_id: str, task_key: str, status: str) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"evaluation job {job_id} did not finish within {self.timeout_s:g} s "
            f"(last status {status!r})",
            hint=f"the job keeps running on Fleet: collect it later with "
            f"Evaluator(...).wait({job_id!r}) or `fleetenv evaluate --job {job_id}`, or "
            "raise timeout_s (--timeout)", job=job_id, task=task_key or None)

    def _call(self, what: str, deadline: Deadline, fn: Callable[..., T], *args: Any,
              retryable: Callable[[Exception], bool] = is_retryable,
              **context: Any) -> Plan[T]:
        """Run one request in a worker (``Blocking``), retrying with backoff within the
        deadline what ``retryable`` allows; pauses are ``OnLoop`` sleeps."""
        policy = RetryPolicy(base_s=0.5, cap_s=max(0.5, self.poll_interval_s),
                             budget_s=None)
        failures = 0
        while True:
            try:
                value: T = yield Blocking(self._request, (what, deadline, fn, args, context))
                return value
            except Exception as exc:
                failures += 1
                delay = policy.next_delay(failures, deadline) if retryable(exc) else None
                if delay is None:
                    raise
                logger.info("%s failed (%s); retrying in %.1f s", what, exc, delay)
            yield OnLoop(_sleep, (delay,))

    def _request(self, what: str, deadline: Deadline, fn: Callable[..., T],
                 args: tuple[Any, ...], context: dict[str, Any]) -> T:
        from fleetenv.fleet.deadlines import deadline_scope

        if deadline.expired():
            raise DeadlineExceeded(f"{what}: the evaluation's {self.timeout_s:g} s ran out",
                                   **context)
        # One request's bound is the session's read timeout, within the evaluation's.
        with deadline_scope(deadline.cap(self.session.config.timeouts.read), what=what,
                            retryable=True, **context):
            try:
                return fn(*args)
            except FleetEnvError:
                raise
            except Exception as exc:
                refused = ("check the model ids (models= / --model) and the job settings"
                           if what == _CREATING else None)
                error = request_error(exc, what, FleetEnvError, hint=refused, **context)
                if what == _IMPORTING and error.context.get("status") in ("400", "404", "422"):
                    raise ConfigurationError(error.message, hint="fix the field the "
                                             "message names", **context) from exc
                raise EvaluationError(error.message, hint=error.hint,
                                      retryable=error.retryable, **error.context) from exc

    # ------------------------------------------------------------------ the requests

    def _import(self, task: Task) -> None:
        from fleet.tasks import Task as FleetTask

        fleet_task = FleetTask(
            key=task.key, prompt=task.prompt, env_id=task.env_key, version=task.env_version,
            data_id=task.data_key, data_version=task.data_version,
            env_variables=dict(task.to_fleet_dict()["env_variables"]),
            verifier_func=task.verifier, verifier_id=task.verifier_id,
            metadata=task.to_fleet_dict()["metadata"])
        params = {"project_key": self.project_key} if self.project_key else None
        self.session.client.sdk.client.request("POST", "/v1/tasks",
                                               json=fleet_task.model_dump(mode="json"),
                                               params=params)

    def _create_job(self, task: Task, models: list[str]) -> str:
        response = self.session.client.sdk.create_job(
            models=models, name=self.job_name, pass_k=self.k, task_keys=[task.key],
            max_steps=self.max_steps, mode=_MODES.get(str(task.modality)))
        return str(response.job_id)

    def _get_job(self, job_id: str) -> dict[str, Any]:
        from fleet.models import JobResponse

        raw = self.session.client.sdk.client.request("GET", f"/v1/jobs/{job_id}").json()
        JobResponse(**raw)  # the SDK's own model: fails loudly on a wire-format drift
        return dict(raw)

    def _sessions(self, job_id: str) -> dict[str, Any]:
        from fleet.models import JobSessionsResponse

        raw = self.session.client.sdk.client.request("GET", f"/v1/sessions/job/{job_id}").json()
        JobSessionsResponse(**raw)  # the SDK's own model, as for the job
        return dict(raw)


def evaluate_task(task: Task | Mapping[str, Any], *, k: int = 4,
                  models: Sequence[str] | None = None, session: Session | None = None,
                  **options: Any) -> EvaluationResult:
    """Evaluate one task with a harness job (``Evaluator(...).evaluate(task)``)."""
    return Evaluator(session=session, k=k, models=models, **options).evaluate(task)


async def evaluate_task_async(task: Task | Mapping[str, Any], *, k: int = 4,
                              models: Sequence[str] | None = None,
                              session: Session | None = None,
                              **options: Any) -> EvaluationResult:
    """The async twin of :func:`evaluate_task` (never blocks the caller's loop)."""
    evaluator = Evaluator(session=session, k=k, models=models, **options)
    return await evaluator.evaluate_async(task)


def as_task(task: Task | Mapping[str, Any]) -> Task:
    """A :class:`Task`, from a task or a mapping in any accepted spelling; a bad one is a
    ``ConfigurationError`` naming the field."""
    if isinstance(task, Task):
        return task
    if isinstance(task, Mapping):
        return Task(**dict(task))
    raise ConfigurationError(f"cannot evaluate a {type(task).__name__}",
                             hint="pass a fleetenv.Task or a task dict", field="task")


async def _sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)


def _create_retryable(exc: Exception) -> bool:
    """Only retry a job creation that Fleet cannot have carried out."""
    context = getattr(exc, "context", None) or {}
    return bool(getattr(exc, "retryable", False)) and context.get("status") in (
        "429", "503", "connect")


def _result(job_id: str, task_key: str, status: str, sessions: Mapping[str, Any],
            requested: Sequence[str], seconds: float) -> EvaluationResult:
    """Per-model scores from a ``JobSessionsResponse``; session models are matched to the
    requested ids with or without their provider prefix (``anthropic/x`` == ``x``)."""
    by_model: dict[str, list[SessionScore]] = {model: [] for model in requested}
    for group in sessions.get("tasks") or []:
        for info in group.get("sessions") or []:
            model = _match(str(info["model"]), requested)
            by_model.setdefault(model, []).append(SessionScore(
                session_id=str(info["session_id"]), model=str(info["model"]),
                status=str(info["status"]), score=_score(info.get("verifier_execution")),
                step_count=int(info.get("step_count") or 0),
                error=info["error"] if isinstance(info.get("error"), str) else None))
    return EvaluationResult(job_id=job_id, task_key=task_key, status=status,
                            models={m: ModelScores(m, tuple(s)) for m, s in by_model.items()},
                            seconds=seconds)


def _score(execution: Any) -> float | None:
    """The verifier's score; ``None`` (unknown) when it did not run, failed or gave none."""
    if not isinstance(execution, Mapping) or not execution.get("success"):
        return None
    score = execution.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        return None
    return float(score)


def _match(model: str, requested: Sequence[str]) -> str:
    if model in requested:
        return model
    short = model.rsplit("/", 1)[-1]
    for wanted in requested:
        if wanted.rsplit("/", 1)[-1] == short:
            return wanted
    return model
