"""``RayRunner``: the `Runner`, with its episodes on Ray actors (the Ray dispatch).

    import ray
    from fleetenv import RayRunner

    ray.init()                                       # or ray.init(address="auto")
    with RayRunner(workers=4, per_worker=16) as runner:
        for result in runner.run(tasks, "reference", samples_per_task=4):
            print(result.task_key, result.reward)    # in the order rollouts finish

The two actors are plain classes here, made actors by the dispatch
(``ray.remote(cls).options(...)``), so importing this module needs neither Ray nor a
cluster, and they can be tested and type-checked like any other code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib
import itertools
import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from fleetenv import runtime
from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import ConfigurationError, RolloutCancelled, RolloutWorkerError
from fleetenv.core.event_bus import EventBus
from fleetenv.env.options import EpisodeOptions
from fleetenv.fleet.session import Session
from fleetenv.fleet.traces import TraceOptions
from fleetenv.fleet.warm_pool import WarmPool
from fleetenv.rollouts.dispatch import Dispatch
from fleetenv.rollouts.jobs import (
    JobOutcome,
    RolloutJob,
    RolloutSettings,
    check_sendable,
    run_job_collecting_events,
    worker_config,
)
from fleetenv.rollouts.rollout import CancelToken
from fleetenv.rollouts.runner import Runner

__all__ = ["LiveInstanceCap", "RayDispatch", "RayRunner", "RolloutWorker"]

logger = logging.getLogger("fleetenv.rollouts")

#: Bound of one control call to an actor (cancel, shutdown, a pid).
_CONTROL_TIMEOUT_S = 30.0
#: How long one request for a cap permit waits in the cap actor before it is asked again.
_PERMIT_WAIT_S = 2.0
#: The Ray namespace of named caps (``cap_name``).
_NAMESPACE = "fleetenv"


class RayRunner(Runner):
    """The `Runner` API (``run``, ``submit``, their async twins, ``cancel``, ``close``,
    ``traces=``) with its episodes spread over Ray worker processes.

    **Workers.** ``workers`` Ray actors, each in its own process with its own session,
    each running up to ``per_worker`` episodes at once on threads. Each rollout goes to
    the least busy live worker. Actors ask for no CPU and are placed with ``SPREAD``;
    ``worker_options`` overrides Ray's actor options (``num_cpus``, ``resources``,
    ``runtime_env``...). Policies travel with Ray's serializer (closures work); one that
    cannot be sent is a ``ConfigurationError`` at ``run()`` / ``submit()``.

    **Caps.** ``max_in_flight`` defaults to ``workers * per_worker``. Each worker's
    session has ``per_worker`` live instances and the config's creating cap divided by
    ``workers``. Live instances across the cluster: ``max_live_instances`` (default: the
    config's), through a semaphore actor that runners passing the same ``cap_name``
    share. ``warm_pool=n``: each worker keeps up to ``n`` idle instances and resets them
    for its next episodes of the same environment (:mod:`fleetenv.fleet.warm_pool`).

    **Cleanup.** Each worker tags its instances ``<run_tag>-w<n>`` (``run_tags``). A
    worker that dies (``ray.kill``, OOM, a lost node) turns its rollouts into
    ``RolloutWorkerError`` results, its tag is swept at once and a replacement starts
    (at most ``2 * workers`` over the run). ``cancel()``, ``close()`` and a driver that
    ends without ``close()`` (an exception, SIGTERM, SIGHUP) sweep every tag of the run:
    Ray ends the workers with the driver, and nothing else would delete their instances.

    **Local mode.** Without an API key the workers use the driver's embedded local Fleet
    over loopback: one machine only; on a multi-node cluster that is a
    ``ConfigurationError`` (configure real Fleet).
    """

    def __init__(
        self,
        *,
        workers: int = 2,
        per_worker: int = 8,
        max_in_flight: int | None = None,
        max_live_instances: int | None = None,
        cap_name: str | None = None,
        session: Session | None = None,
        config: FleetConfig | None = None,
        events: EventBus | None = None,
        max_steps: int | None = None,
        system_prompt: str | None = None,
        options: EpisodeOptions | None = None,
        progress: bool | None = None,
        worker_options: Mapping[str, Any] | None = None,
        warm_pool: int | None = None,
        traces: str | TraceOptions | None = None,
    ) -> None:
        for name, value in (("workers", workers), ("per_worker", per_worker),
                            ("max_in_flight", max_in_flight),
                            ("max_live_instances", max_live_instances),
                            ("warm_pool", warm_pool)):
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {value}",
                                         field=name)
        try:
            self._ray = importlib.import_module("ray")
        except ImportError:
            raise ConfigurationError("RayRunner needs Ray, which is not installed",
                                     hint="pip install 'fleetenv[ray]'") from None
        if not self._ray.is_initialized():
            self._ray.init()  # what Ray's own libraries do: RAY_ADDRESS, else a local cluster
        self.per_worker = per_worker
        self._cap_limit, self._cap_name = max_live_instances, cap_name
        self._worker_options, self._warm_pool = dict(worker_options or {}), warm_pool
        super().__init__(workers=workers, max_in_flight=max_in_flight or workers * per_worker,
                         session=session, config=config, events=events, max_steps=max_steps,
                         system_prompt=system_prompt, options=options, progress=progress,
                         traces=traces)

    def _make_dispatch(self, mode: str, executor: Executor | None) -> Dispatch:
        self._ray_dispatch = RayDispatch(
            self._ray, workers=self.workers, per_worker=self.per_worker,
            settings=self._settings, sweep=self._sweep, max_live_instances=self._cap_limit,
            cap_name=self._cap_name, worker_options=self._worker_options,
            warm_pool=self._warm_pool)
        return self._ray_dispatch

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (waits for them to be up)."""
        return self._ray_dispatch.worker_pids()


@dataclass
class _Worker:
    index: int
    tag: str
    actor: Any
    in_flight: int = 0
    alive: bool = True


class RayDispatch(Dispatch):
    """Rollouts on `RolloutWorker` actors: least-busy placement, a permit of the
    cluster-wide `LiveInstanceCap` per episode, dead workers swept and replaced."""

    mode = "ray"
    in_process = False

    def __init__(self, ray: Any, *, workers: int, per_worker: int,
                 settings: RolloutSettings, sweep: Callable[[list[str]], None],
                 max_live_instances: int | None, cap_name: str | None,
                 worker_options: dict[str, Any], warm_pool: int | None) -> None:
        config = settings.config
        nodes = len([n for n in ray.nodes() if n.get("Alive")]) if config.use_local else 1
        if nodes > 1:
            raise ConfigurationError(
                f"the Ray cluster has {nodes} nodes, but without an API key the workers "
                "would use this machine's local Fleet, which only listens on 127.0.0.1",
                field="api_key",
                hint="set FLEET_API_KEY (or pass config=resolve_config(api_key=...))")
        self._ray = ray
        self.workers = workers
        self.per_worker = per_worker
        self._settings = dataclasses.replace(settings, config=worker_config(
            config, workers, max_live_instances=per_worker))
        self._sweep = sweep
        self._warm_pool = warm_pool
        self._id = f"{settings.run_tag}:{uuid.uuid4().hex[:8]}"
        self._holders = itertools.count()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._tags: list[str] = []
        self._sweepers: list[Future[None]] = []
        self._asking: set[Future[Any]] = set()  # permit requests not answered yet
        self._closing = False
        #: Replacements for dead workers still allowed (a crash loop must end).
        self._respawns_left = 2 * workers
        self._actor_options = {"num_cpus": 0, "scheduling_strategy": "SPREAD",
                               "max_concurrency": per_worker + 2, "max_restarts": 0,
                               "max_task_retries": 0, **worker_options}
        self._worker_class = ray.remote(RolloutWorker)
        cap_class = ray.remote(LiveInstanceCap)
        self._owns_cap = cap_name is None
        named = {} if cap_name is None else {"name": cap_name, "namespace": _NAMESPACE,
                                             "get_if_exists": True}
        self._cap: Any = cap_class.options(num_cpus=0, **named).remote(
            max_live_instances or config.max_live_instances)
        for _ in range(workers):
            self._spawn()

    def __repr__(self) -> str:
        alive = sum(w.alive for w in self._workers)
        return f"ray, workers={alive}/{self.workers}, per_worker={self.per_worker}"

    def prepare(self, policy: Any) -> Any:
        check_sendable(super().prepare(policy), "a Ray worker", self._ray.cloudpickle.dumps)
        return policy

    def tags(self) -> list[str]:
        with self._lock:
            return list(self._tags)

    def worker_pids(self) -> list[int]:
        with self._lock:
            actors = [w.actor for w in self._workers if w.alive]
        return list(self._ray.get([a.pid.remote() for a in actors],
                                  timeout=_CONTROL_TIMEOUT_S))

    # ------------------------------------------------------------------ workers

    def _spawn(self) -> None:
        with self._lock:
            index = len(self._tags)
            tag = f"{(self._settings.run_tag or '')[:90]}-w{index}"
            self._tags.append(tag)
        settings = dataclasses.replace(
            self._settings, options=EpisodeOptions.of(self._settings.options, run_tag=tag))
        actor = self._worker_class.options(**self._actor_options).remote(
            settings, self._warm_pool)
        with self._lock:
            self._workers.append(_Worker(index=index, tag=tag, actor=actor))

    def _pick_worker(self) -> _Worker | None:
        """The least busy live worker, after replacing dead ones while allowed."""
        with self._lock:
            missing = self.workers - sum(w.alive for w in self._workers)
            spawn = min(missing, self._respawns_left)
            self._respawns_left -= spawn
        for _ in range(spawn):
            self._spawn()
        with self._lock:
            alive = [w for w in self._workers if w.alive]
            if not alive:
                return None
            worker = min(alive, key=lambda w: w.in_flight)
            worker.in_flight += 1
            return worker

    def _lost(self, worker: _Worker) -> None:
        """A worker died: delete its instances now (their episodes are over)."""
        with self._lock:
            if not worker.alive:
                return
            worker.alive = False
        logger.warning("Ray worker %d died; deleting the instances tagged %s",
                       worker.index, worker.tag)
        # Not on Ray's callback thread: a sweep is HTTP requests.
        sweeper = runtime.current().submit_blocking(self._sweep, [worker.tag])
        with self._lock:
            self._sweepers.append(sweeper)

    # ------------------------------------------------------------------ rollouts

    def start(self, job: RolloutJob) -> Future[Any]:
        """The job waits for a permit of the cluster-wide cap (pending, so cancellable),
        then goes to a worker."""
        outcome: Future[Any] = Future()
        self._ask(job, f"{self._id}:{next(self._holders)}", outcome)
        return outcome

    def _ask(self, job: RolloutJob, holder: str, outcome: Future[Any]) -> None:
        answer: Future[Any] = self._cap.acquire.remote(holder, _PERMIT_WAIT_S).future()
        with self._lock:
            self._asking.add(answer)
        answer.add_done_callback(lambda f: self._answered(job, holder, outcome, f))

    def _answered(self, job: RolloutJob, holder: str, outcome: Future[Any],
                  answer: Future[Any]) -> None:
        """Ray's callback (its thread) with the cap's answer."""
        with self._lock:
            self._asking.discard(answer)
        try:
            if not answer.result():  # the cap is full: ask again, unless given up
                if self._closing or outcome.cancelled():
                    _settle(outcome, _never_started())
                else:
                    self._ask(job, holder, outcome)
            elif self._closing or not outcome.set_running_or_notify_cancel():
                self._cap.release.remote(holder)  # it waited in vain
                _settle(outcome, _never_started())
            else:
                self._send(job, holder, outcome)
        except Exception as exc:
            _settle(outcome, RolloutWorkerError(
                f"the cluster-wide cap failed: {type(exc).__name__}: {exc}",
                task=job.task.key, env=job.task.env_spec))

    def _send(self, job: RolloutJob, holder: str, outcome: Future[Any]) -> None:
        worker = self._pick_worker()
        try:
            if worker is None:
                raise RolloutWorkerError("no Ray worker is left (every worker died and "
                                         "the replacements ran out)",
                                         task=job.task.key, env=job.task.env_spec)
            sent: Future[Any] = worker.actor.run.remote(job).future()
        except Exception as exc:
            self._done(worker, holder)
            _settle(outcome, exc if isinstance(exc, RolloutWorkerError) else
                    RolloutWorkerError(f"Ray refused the rollout: {type(exc).__name__}: "
                                       f"{exc}", task=job.task.key, env=job.task.env_spec))
            return
        sent.add_done_callback(lambda f: self._returned(job, worker, holder, f, outcome))

    def _done(self, worker: _Worker | None, holder: str) -> None:
        if worker is not None:
            with self._lock:
                worker.in_flight -= 1
        try:
            self._cap.release.remote(holder)
        except Exception as exc:  # the cap actor is gone: so are its permits
            logger.debug("could not return a cap permit: %s", exc)

    def _returned(self, job: RolloutJob, worker: _Worker, holder: str, sent: Future[Any],
                  outcome: Future[Any]) -> None:
        """Ray's callback (its thread): the worker's outcome, or why there is none."""
        self._done(worker, holder)
        exc = sent.exception()
        if exc is None:
            outcome.set_result(sent.result())
        elif isinstance(exc, self._ray.exceptions.TaskCancelledError):
            outcome.set_exception(_never_started())
        else:
            if isinstance(exc, self._ray.exceptions.RayActorError):
                self._lost(worker)
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            outcome.set_exception(RolloutWorkerError(
                f"the rollout's Ray worker {worker.index} failed: {type(exc).__name__}: "
                f"{first_line}", task=job.task.key, env=job.task.env_spec))

    # ------------------------------------------------------------------ stopping

    def _control(self, what: str) -> None:
        """Call ``what`` on every live worker, within a bound; a dead worker is not an
        error here (the sweep reaches its instances)."""
        with self._lock:
            actors = [w.actor for w in self._workers if w.alive]
        for ref in [getattr(actor, what).remote() for actor in actors]:
            try:
                self._ray.get(ref, timeout=_CONTROL_TIMEOUT_S)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                logger.debug("%s on a Ray worker failed: %s", what, exc)

    def cancel(self) -> None:
        self._control("cancel")

    def abandon(self) -> None:
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            self._ray.kill(worker.actor)

    def close(self, *, wait: bool) -> None:
        """Shut the workers down (each deletes what it holds), then return the permits."""
        self._control("shutdown")
        self.abandon()
        with self._lock:
            self._closing = True
            pending = [*self._sweepers, *self._asking]
        concurrent.futures.wait(pending, timeout=_PERMIT_WAIT_S + _CONTROL_TIMEOUT_S)
        try:
            if self._owns_cap:
                self._ray.kill(self._cap)
            else:
                self._ray.get(self._cap.release_prefix.remote(f"{self._id}:"),
                              timeout=_CONTROL_TIMEOUT_S)
        except Exception as exc:  # nothing left to hold permits for
            logger.debug("could not release the cap: %s", exc)


def _settle(outcome: Future[Any], error: BaseException) -> None:
    """Fail ``outcome`` unless it is done already (cancelled meanwhile, say)."""
    if outcome.done():
        return
    if outcome.running() or outcome.set_running_or_notify_cancel():
        outcome.set_exception(error)


def _never_started() -> RolloutCancelled:
    return RolloutCancelled("the run was cancelled before this rollout started")


class RolloutWorker:
    """Runs rollouts in one Ray worker process on a session of its own, up to
    ``per_worker`` at once (a threaded actor).

    Every instance it creates carries the worker's own tag (the run's tag plus a worker
    suffix), so when this process dies the driver can delete exactly its instances at
    once, without touching the live ones of other workers.
    """

    def __init__(self, settings: RolloutSettings, warm_pool: int | None = None) -> None:
        self._settings = settings
        self._session = Session(settings.effective_config())
        self._cancel = CancelToken()
        #: Idle instances this worker keeps between episodes (``RayRunner(warm_pool=)``).
        self._pool = (WarmPool(self._session, max_instances=warm_pool)
                      if warm_pool else None)

    def run(self, job: RolloutJob) -> JobOutcome:
        """One rollout, on the worker's settings (its own tag and caps)."""
        return run_job_collecting_events(dataclasses.replace(job, settings=self._settings),
                                         session=self._session, cancel=self._cancel)

    def cancel(self) -> None:
        """Stop every episode of this worker now (their envs close, which fails any tool
        call in flight); rollouts that arrive later come back cancelled at once."""
        self._cancel.cancel()

    def shutdown(self) -> None:
        """Close the session: deletes the instances it still holds (warm ones too)."""
        if self._pool is not None:
            self._pool.close()
        self._session.close()

    def pid(self) -> int:
        """The worker's process id (readiness probe, and for tests)."""
        return os.getpid()


class LiveInstanceCap:
    """A counting semaphore in a Ray actor (async, so waiting holders cost no thread),
    shared by everything that dispatches episodes: a cluster-wide cap on live instances.

    Permits are named by their holder, so releasing is idempotent and the permits of a
    runner that went away can be returned in one call. ``acquire`` waits at most
    ``timeout_s`` and says whether it got the permit.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the cap must be at least 1, got {limit}")
        self._limit = limit
        self._holders: set[str] = set()
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        # Created on the actor's own loop, at first use (not in __init__).
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def acquire(self, holder: str, timeout_s: float) -> bool:
        changed = self._condition()
        async with changed:
            if holder in self._holders:
                return True
            if len(self._holders) < self._limit:  # also answers a zero timeout
                self._holders.add(holder)
                return True
            if timeout_s <= 0:
                return False
            try:
                await asyncio.wait_for(
                    changed.wait_for(lambda: len(self._holders) < self._limit), timeout_s)
            except asyncio.TimeoutError:
                return False
            self._holders.add(holder)
            return True

    async def release(self, holder: str) -> None:
        changed = self._condition()
        async with changed:
            if holder in self._holders:
                self._holders.discard(holder)
                changed.notify_all()

    async def release_prefix(self, prefix: str) -> int:
        """Return every permit whose holder starts with ``prefix`` (a runner's leftovers)."""
        changed = self._condition()
        async with changed:
            mine = {h for h in self._holders if h.startswith(prefix)}
            self._holders -= mine
            if mine:
                changed.notify_all()
            return len(mine)

    async def held(self) -> int:
        return len(self._holders)

    async def limit(self) -> int:
        return self._limit
