"""Rollout jobs: plain, picklable data plus top-level functions that run them.

A :class:`RolloutJob` is everything one rollout needs (task, policy, sample index,
settings) and nothing live, so it can cross into a worker process or a Ray actor. The
settings carry the ``FleetConfig`` *with* its API key (``SecretStr`` pickles on purpose,
see ``fleetenv.core.config``): a worker that lost the key would fall back to the local
sample apps and produce plausible nonsense. Functions are module-level so that
``pickle`` can send them by name.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import ConfigurationError, RolloutCancelled, RolloutWorkerError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event
from fleetenv.core.redaction import redact
from fleetenv.core.tasks import Task
from fleetenv.core.types import RolloutResult, StopReason
from fleetenv.env.options import EpisodeOptions
from fleetenv.fleet.session import Session
from fleetenv.rollouts.policy import Policy, PolicyContext
from fleetenv.rollouts.policy_spec import PolicySpec
from fleetenv.rollouts.rollout import CancelToken, episode_plan
from fleetenv.runtime.plans import Plan, run_sync

__all__ = [
    "JobOutcome",
    "PolicyLike",
    "RolloutJob",
    "RolloutSettings",
    "cancelled_result",
    "check_sendable",
    "describe_policy",
    "failed_result",
    "job_plan",
    "run_job",
    "run_job_collecting_events",
    "worker_config",
    "worker_failed",
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
    """A ``PolicyLike``; typed ``Any`` because an in-process job may carry any object."""
    settings: RolloutSettings
    sample: int = 0


@dataclass(frozen=True)
class JobOutcome:
    """What a worker process returns: the result and the events it emitted, which the
    runner re-emits on its own bus."""

    result: RolloutResult
    events: tuple[Event, ...] = ()

    def __post_init__(self) -> None:
        # It leaves the worker, whose credentials (runner token, a policy's key) stay.
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


def job_plan(job: RolloutJob, *, session: Session | None = None,
             events: EventBus | None = None,
             cancel: CancelToken | None = None) -> Plan[RolloutResult]:
    """One rollout of a run, as a plan; never raises for a broken episode.

    ``session``, ``events`` and ``cancel`` are live objects, for in-process runs. In a
    worker process the rollout runs on the shared session of the job's settings (one per
    run: they carry its tag, so the run's caps and budgets hold in every worker).
    """
    if cancel is not None and cancel.is_set():  # picked up after the run was cancelled
        return cancelled_result(job)
    if session is None:
        try:
            session = Session.shared(job.settings.effective_config())
        except Exception as exc:
            return failed_result(job, exc)
        # The run's tag is shared with sibling workers: only the runner may sweep it.
        session.provisioner.sweeps_shared_tags = False
    settings = job.settings
    result = yield from episode_plan(
        job.task, job.policy, session=session, sample=job.sample, events=events,
        options=settings.options, system_prompt=settings.system_prompt, cancel=cancel)
    if cancel is not None and cancel.is_set() and result.stop_reason in _CANCELLATION_SYMPTOMS:
        # It ended by the cancellation's doing, whichever symptom it ended on.
        result.stop_reason = StopReason.CANCELLED
        result.reward = None
        if result.error is None:
            result.error = {"type": "RolloutCancelled", "message": "the run was cancelled"}
    return result


#: How an episode ends when a cancel closes its env under a tool call.
_CANCELLATION_SYMPTOMS = (StopReason.ERROR, StopReason.INSTANCE_EXPIRED)


def run_job(job: RolloutJob, *, session: Session | None = None,
            events: EventBus | None = None,
            cancel: CancelToken | None = None) -> RolloutResult:
    """Run one rollout in this thread (see `job_plan`)."""
    return run_sync(job_plan(job, session=session, events=events, cancel=cancel),
                    finish_here=True)


def run_job_collecting_events(job: RolloutJob, *, session: Session | None = None,
                              cancel: CancelToken | None = None) -> JobOutcome:
    """Run one rollout in a worker and return its events with the result, so the
    runner's bus (and its rollout accounting) sees every rollout, wherever it ran."""
    collected: list[Event] = []
    result = run_job(job, session=session, events=EventBus(sinks=[collected.append]),
                     cancel=cancel)
    return JobOutcome(result=result, events=tuple(collected))


def failed_result(job: RolloutJob, exc: BaseException, *,
                  stop_reason: StopReason = StopReason.ERROR) -> RolloutResult:
    """A result record for a rollout that never produced its own."""
    return RolloutResult(
        task_key=job.task.key, env_key=job.task.env_spec, sample=job.sample,
        policy=describe_policy(job.policy), stop_reason=stop_reason,
        error={"type": type(exc).__name__, "message": redact(str(exc))[:2000]},
    )


def worker_failed(job: RolloutJob, exc: BaseException, what: str) -> RolloutResult:
    """The result of a rollout whose worker failed (not its episode: that is a result)."""
    return failed_result(job, exc if isinstance(exc, RolloutWorkerError) else
                         RolloutWorkerError(f"{what}: {type(exc).__name__}: {exc}",
                                            task=job.task.key, env=job.task.env_spec))


def cancelled_result(job: RolloutJob, why: str = "the run was cancelled before this "
                     "rollout started") -> RolloutResult:
    return failed_result(job, RolloutCancelled(why), stop_reason=StopReason.CANCELLED)


def check_sendable(policy: Any, to: str, dumps: Callable[[Any], object] = pickle.dumps
                   ) -> None:
    """Raise a clear ``ConfigurationError`` now rather than a pickling traceback later
    (a process pool pickles in a background thread and reports it on the future)."""
    try:
        dumps(policy)
    except Exception as exc:
        raise ConfigurationError(
            f"the policy {describe_policy(policy)!r} cannot be sent to {to} "
            f"({type(exc).__name__}: {exc})",
            hint="use a PolicySpec (e.g. PolicySpec('openai', {...}) or "
                 "PolicySpec('import', {'target': 'pkg.mod:attr'})), a module-level "
                 "function, or a policy whose attributes pickle (no open clients, locks "
                 "or sockets)") from None


def worker_config(config: FleetConfig, workers: int, *,
                  max_live_instances: int | None = None) -> FleetConfig:
    """The settings worker processes build their sessions from: the session caps split
    among them, and in local mode this process's embedded Fleet (started here, once),
    which a worker would otherwise start on its own."""
    if config.use_local:
        from fleetenv.fleet.backend import local_fleet

        local = local_fleet()
        config = config.replace(api_key=local.token, base_url=local.base_url,
                                use_local=False)
    return config.replace(
        max_creating_instances=max(1, config.max_creating_instances // workers),
        max_live_instances=max_live_instances or max(1, config.max_live_instances // workers))
