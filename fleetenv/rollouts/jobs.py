"""Rollout jobs: plain, picklable data plus top-level functions that run them.

A :class:`RolloutJob` is everything one rollout needs (task, policy, sample index,
settings) and nothing live, so any ``concurrent.futures.Executor`` can run
:func:`run_job`: a thread pool (the runner's default), a spawn ``ProcessPoolExecutor``,
or a distributed executor. The settings carry the ``FleetConfig`` *with* its API key
(``SecretStr`` pickles on purpose, see ``fleetenv.core.config``): a worker that lost the
key would fall back to the local sample apps and produce plausible nonsense.

Functions are module-level on purpose: ``pickle`` sends a function by its qualified name,
so a worker process can import it; a lambda or a closure cannot cross.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import ConfigurationError, RolloutCancelled
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event
from fleetenv.core.redaction import redact
from fleetenv.core.tasks import Task
from fleetenv.core.types import RolloutResult, StopReason
from fleetenv.env.options import EpisodeOptions
from fleetenv.fleet.session import Session
from fleetenv.rollouts.policy import Policy, PolicyContext
from fleetenv.rollouts.policy_spec import PolicySpec
from fleetenv.rollouts.rollout import CancelToken, run_episode

__all__ = [
    "JobOutcome",
    "PolicyLike",
    "RolloutJob",
    "RolloutSettings",
    "blame_cancellation",
    "check_picklable",
    "describe_policy",
    "failed_result",
    "run_job",
    "run_job_collecting_events",
    "worker_session",
]

PolicyLike = Policy | PolicySpec | Callable[[PolicyContext], Any] | str
"""Anything ``as_policy`` accepts: a policy, a spec, a function of the context, a spec
string such as ``"reference"`` or ``"import:pkg.mod:attr"``."""


@dataclass(frozen=True)
class RolloutSettings:
    """What every rollout of a run shares."""

    config: FleetConfig
    options: EpisodeOptions = field(default_factory=EpisodeOptions)
    """The options of every episode (its ``run_tag`` is the run's)."""
    system_prompt: str | None = None

    @property
    def run_tag(self) -> str | None:
        """Tag of every instance the rollout creates, so the runner can sweep them."""
        return self.options.run_tag

    def effective_config(self) -> FleetConfig:
        if self.run_tag and self.config.run_tag != self.run_tag:
            return self.config.replace(run_tag=self.run_tag)
        return self.config


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: picklable when its policy is (a ``PolicySpec``, a spec string,
    a module-level function or a picklable policy object)."""

    task: Task
    policy: Any
    """A ``PolicyLike``; typed ``Any`` because a thread job may carry any live object."""
    settings: RolloutSettings
    sample: int = 0


@dataclass(frozen=True)
class JobOutcome:
    """What :func:`run_job_collecting_events` returns from a worker process: the result
    and the events it emitted, which the parent re-emits on its own bus."""

    result: RolloutResult
    events: tuple[Event, ...] = ()

    def __post_init__(self) -> None:
        # It leaves the worker: its parent may not know the worker's credentials (the
        # runner token it fetched, the key of a policy it built), so scrub them here.
        object.__setattr__(self, "result", self.result.scrubbed())


def describe_policy(policy: Any) -> str:
    """A short, secret-free label of a policy for result records."""
    describe = getattr(policy, "describe", None)
    if callable(describe):
        try:
            return str(describe())
        except Exception:  # a label is not worth failing a result record over
            pass
    if isinstance(policy, str):
        return policy
    return getattr(policy, "__qualname__", None) or type(policy).__name__


def run_job(job: RolloutJob, *, session: Session | None = None,
            events: EventBus | None = None,
            cancel: CancelToken | None = None) -> RolloutResult:
    """Run one rollout; never raises for a broken episode (see ``run_episode``).

    ``session``, ``events`` and ``cancel`` are live objects, for thread executors only.
    In another process the rollout runs on that process's session for the job's settings
    (one per run, see :func:`worker_session`) and cannot be cancelled from the parent
    (the runner sweeps its instances by tag instead).
    """
    settings = job.settings
    if cancel is not None and cancel.is_set():  # picked up after the run was cancelled
        return failed_result(job, RolloutCancelled("the run was cancelled before this "
                                                   "rollout started"),
                             stop_reason=StopReason.CANCELLED)
    try:
        session = session or worker_session(settings)
    except Exception as exc:
        return failed_result(job, exc)
    result = run_episode(job.task, job.policy, session=session, sample=job.sample,
                         events=events, options=settings.options,
                         system_prompt=settings.system_prompt, cancel=cancel)
    if cancel is not None and cancel.is_set():
        blame_cancellation(result)
    return result


#: How an episode whose env the cancellation closed under a tool call ends: the call
#: fails (an error), or the env finds its instance deleted (``instance_expired``).
_CANCELLATION_SYMPTOMS = (StopReason.ERROR, StopReason.INSTANCE_EXPIRED)


def blame_cancellation(result: RolloutResult) -> None:
    """Record a rollout of a cancelled run that ended by the cancellation's doing as
    cancelled (no reward), whichever symptom it ended on."""
    if result.stop_reason in _CANCELLATION_SYMPTOMS:
        result.stop_reason = StopReason.CANCELLED
        result.reward = None
        if result.error is None:
            result.error = {"type": "RolloutCancelled", "message": "the run was cancelled"}


def worker_session(settings: RolloutSettings) -> Session:
    """The session a worker process runs a run's rollouts on: the shared session of the
    settings the runner sent (one per run: they carry its tag), so the run's caps and
    budgets hold in every worker. Closed at interpreter exit with the other sessions."""
    session = Session.shared(settings.effective_config())
    # The run's tag is shared with the other workers: sweeping it from here could delete
    # their live instances. The runner sweeps it after the last rollout.
    session.provisioner.sweeps_shared_tags = False
    return session


def run_job_collecting_events(job: RolloutJob) -> JobOutcome:
    """Run one rollout in a worker process and return its events with the result, so the
    parent's bus (and its rollout accounting) sees every rollout, wherever it ran."""
    collected: list[Event] = []
    bus = EventBus(sinks=[collected.append])
    result = run_job(job, events=bus)
    return JobOutcome(result=result, events=tuple(collected))


def failed_result(job: RolloutJob, exc: BaseException, *,
                  stop_reason: StopReason = StopReason.ERROR) -> RolloutResult:
    """A result record for a rollout that never produced its own."""
    return RolloutResult(
        task_key=job.task.key, env_key=job.task.env_spec, sample=job.sample,
        policy=describe_policy(job.policy), stop_reason=stop_reason,
        error={"type": type(exc).__name__, "message": redact(str(exc))[:2000]},
    )


def check_picklable(job: RolloutJob) -> None:
    """Raise a clear ``ConfigurationError`` now rather than a pickling traceback later
    (a process pool pickles in a background thread and reports it on the future)."""
    try:
        pickle.dumps(job.policy)
    except Exception as exc:
        raise ConfigurationError(
            f"the policy {describe_policy(job.policy)!r} cannot be sent to a worker "
            f"process ({type(exc).__name__}: {exc})",
            hint="use a PolicySpec (e.g. PolicySpec('openai', {...}) or "
                 "PolicySpec('import', {'target': 'pkg.mod:attr'})) or a module-level "
                 "function, or run with the default thread executor",
            task=job.task.key) from None
    try:
        pickle.dumps(job)
    except Exception as exc:
        raise ConfigurationError(
            f"the rollout job cannot be sent to a worker process ({type(exc).__name__}: "
            f"{exc})", hint="task metadata must be picklable plain data",
            task=job.task.key) from None
