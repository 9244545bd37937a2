"""``RayRunner``: the ``Runner`` API, with episodes spread over Ray worker processes.

    import ray
    from fleetenv.rollouts.ray_runner import RayRunner

    ray.init()                                       # or ray.init(address="auto")
    with RayRunner(workers=4, per_worker=16) as runner:
        for result in runner.run(tasks, "reference", samples_per_task=4):
            print(result.task_key, result.reward)    # in the order rollouts finish

Why its own runner and not ``Runner(executor=...)``: a Ray actor keeps a fleetenv
session (loop thread, connection pools, instances) alive across rollouts and runs many
episodes at once on threads, which a ``concurrent.futures`` facade over Ray tasks cannot;
and cancelling, caps and a dead worker's instances need to reach every worker.

Workers
-------
``workers`` Ray actors (:class:`~fleetenv.rollouts.ray_actors.RolloutWorker`), each in
its own process with its own session, each running up to ``per_worker`` episodes at
once on threads (the episodes' MCP traffic runs on the worker's one event-loop thread).
The driver sends each rollout to the least busy live worker. Actors are placed with the
``SPREAD`` strategy and ask for no CPU; ``worker_options`` overrides Ray's actor options
(``num_cpus``, ``resources``, ``runtime_env``, ...). Policies travel with Ray's
serializer (cloudpickle), so closures work; a policy that cannot be serialized is a
``ConfigurationError`` at ``run()`` / ``submit()``.

Caps
----
* Episodes in flight from this runner: ``max_in_flight`` (default
  ``workers * per_worker``).
* Per worker: ``per_worker`` episodes at once; each worker session's
  ``max_live_instances`` is ``per_worker`` and ``max_creating_instances`` is the
  config's divided by ``workers`` (at least 1).
* Cluster-wide live instances: ``max_live_instances`` (default: the config's) through a
  semaphore actor (:class:`~fleetenv.rollouts.ray_actors.LiveInstanceCap`). Runners in
  the same Ray job that pass the same ``cap_name`` share one cap.

Warm instances
--------------
``warm_pool=n``: each worker keeps up to ``n`` idle instances and resets them for its
next episodes of the same environment instead of creating new ones (see
:mod:`fleetenv.fleet.warm_pool`: never a dirty instance, expiry before the TTL). Idle
instances count against ``per_worker`` live instances.

Instances and cleanup
---------------------
Each worker tags its instances with ``<run_tag>-w<n>`` (see ``run_tags``). A worker that
dies (``ray.kill``, OOM, a lost node) turns its rollouts into results with ``error`` set
(``RolloutWorkerError``), its tag is swept at once (its instances deleted through the
control plane, from the driver), and a replacement worker is started. ``cancel()`` (also
on Ctrl-C in ``run()``, and on leaving a ``with`` block by an exception) stops every
episode on every worker and sweeps every tag of the run; ``close()`` shuts the workers
down and sweeps again, so nothing outlives the runner. A driver that ends without
``close()`` (no ``with``: an exception in the training loop, SIGTERM, SIGHUP) sweeps every
tag of its live runners on the way out, with its other exit cleanup (see
:mod:`fleetenv.fleet.registry`): Ray ends the workers with the driver, and nothing else
would delete their instances.

Local mode
----------
Without an API key the workers use the driver's embedded local Fleet (its URL and token
are sent to them). It listens on 127.0.0.1, so this works on a one-machine Ray cluster
only: on a multi-node cluster configure real Fleet (``FLEET_API_KEY``); a local-mode
runner on a multi-node cluster is a ``ConfigurationError``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import itertools
import logging
import queue
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sized
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from fleetenv import runtime
from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import (
    ConfigurationError,
    EpisodeStateError,
    RolloutCancelled,
    RolloutWorkerError,
)
from fleetenv.core.event_bus import EventBus
from fleetenv.core.tasks import Task
from fleetenv.core.types import Modality, RolloutResult, StopReason
from fleetenv.env.options import EpisodeOptions
from fleetenv.fleet.provisioning import new_run_tag
from fleetenv.fleet.registry import install_signal_handlers, track
from fleetenv.fleet.session import Session
from fleetenv.rollouts.jobs import (
    JobOutcome,
    PolicyLike,
    RolloutJob,
    RolloutSettings,
    describe_policy,
    failed_result,
)
from fleetenv.rollouts.policy_spec import PolicySpec, parse_policy_spec
from fleetenv.rollouts.progress import Progress
from fleetenv.rollouts.ray_actors import LiveInstanceCap, RolloutWorker

__all__ = ["RayRunner"]

logger = logging.getLogger("fleetenv.rollouts")

#: How often blocking waits wake up to notice a cancel (and redraw the progress bar).
_POLL_S = 0.25
#: Bound of one control call to an actor (cancel, shutdown, a cap permit).
_CONTROL_TIMEOUT_S = 30.0
#: After a cancel, how long close() waits for the rollouts to unwind.
_CANCEL_GRACE_S = 15.0
#: The Ray namespace of named caps (``cap_name``).
_NAMESPACE = "fleetenv"


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigurationError("RayRunner needs Ray, which is not installed",
                                 hint="pip install 'fleetenv[ray]'") from None


@dataclass
class _Worker:
    index: int
    tag: str
    actor: Any
    in_flight: int = 0
    alive: bool = True


class RayRunner:
    """Runs rollouts of a policy on tasks over Ray workers; see the module docstring."""

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
    ) -> None:
        for name, value in (("workers", workers), ("per_worker", per_worker),
                            ("max_in_flight", max_in_flight),
                            ("max_live_instances", max_live_instances),
                            ("warm_pool", warm_pool)):
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {value}",
                                         field=name)
        if session is not None and config is not None:
            raise ConfigurationError("pass either session= or config=, not both",
                                     hint="the session already holds the settings")
        self._ray = ray = _import_ray()
        if not ray.is_initialized():
            ray.init()  # what Ray's own libraries do: RAY_ADDRESS, else a local cluster
        install_signal_handlers()
        self._owns_session = session is None
        self.session: Session = session if session is not None else Session(
            config, events=events)
        self.config: FleetConfig = self.session.config
        self.run_tag: str = (self.config.run_tag if self._owns_session and self.config.run_tag
                             else new_run_tag())
        self.workers = workers
        self.per_worker = per_worker
        self.max_in_flight = max_in_flight or workers * per_worker
        self.events: EventBus = events if events is not None else self.session.events
        self._worker_options = dict(worker_options or {})
        self._warm_pool = warm_pool
        self._worker_config = self._make_worker_config()
        self._settings = RolloutSettings(
            config=self._worker_config, system_prompt=system_prompt,
            options=EpisodeOptions.of(options, max_steps=max_steps, run_tag=self.run_tag))
        self._id = f"{self.run_tag}:{uuid.uuid4().hex[:8]}"
        self._holders = itertools.count()
        self._slots = threading.Semaphore(self.max_in_flight)
        self._lock = threading.Lock()
        self._running: dict[Future[RolloutResult], Future[Any]] = {}
        self._cancelled = False
        self._closed = False
        self._progress = Progress(enabled=progress)
        self._sweepers: list[Future[list[str]]] = []
        self._tags: list[str] = []
        self._workers: list[_Worker] = []
        self._next_index = 0
        #: Replacements for dead workers still allowed (a crash loop must end).
        self._respawns_left = 2 * workers
        cap_limit = max_live_instances or self.config.max_live_instances
        cap_class = ray.remote(LiveInstanceCap)
        if cap_name is None:
            self._owns_cap = True
            self._cap: Any = cap_class.options(num_cpus=0).remote(cap_limit)
        else:
            self._owns_cap = False
            self._cap = cap_class.options(name=cap_name, namespace=_NAMESPACE,
                                          get_if_exists=True, num_cpus=0).remote(cap_limit)
        self._worker_class = ray.remote(RolloutWorker)
        # Until close() swept them, every exit path of this process (interpreter exit,
        # SIGTERM, SIGHUP) sweeps the workers' tags: Ray ends the workers with the driver.
        self.session.instances.add_sweeper(self._sweep_leftovers)
        track(self.session.instances)
        for _ in range(workers):
            self._spawn()

    def __repr__(self) -> str:
        alive = sum(w.alive for w in self._workers)
        return (f"RayRunner(workers={alive}/{self.workers}, per_worker={self.per_worker}, "
                f"max_in_flight={self.max_in_flight}, run_tag={self.run_tag!r})")

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def run_tags(self) -> list[str]:
        """Every tag the run's instances carry (one per worker ever started)."""
        with self._lock:
            return list(self._tags)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (waits for them to be up)."""
        with self._lock:
            actors = [w.actor for w in self._workers if w.alive]
        return list(self._ray.get([a.pid.remote() for a in actors],
                                  timeout=_CONTROL_TIMEOUT_S))

    # ------------------------------------------------------------------ workers

    def _make_worker_config(self) -> FleetConfig:
        config = self.config
        if config.use_local:
            alive = [n for n in self._ray.nodes() if n.get("Alive")]
            if len(alive) > 1:
                raise ConfigurationError(
                    f"the Ray cluster has {len(alive)} nodes, but without an API key the "
                    "workers would use this machine's local Fleet, which only listens on "
                    "127.0.0.1", field="api_key",
                    hint="set FLEET_API_KEY (or pass config=resolve_config(api_key=...))")
            from fleetenv.fleet.backend import local_fleet

            local = local_fleet()
            config = config.replace(api_key=local.token, base_url=local.base_url,
                                    use_local=False)
        return config.replace(
            max_live_instances=self.per_worker,
            max_creating_instances=max(1, config.max_creating_instances // self.workers))

    def _spawn(self) -> _Worker:
        """Start a worker actor (called with room in the pool; not under the lock)."""
        with self._lock:
            index = self._next_index
            self._next_index += 1
            tag = f"{self.run_tag[:90]}-w{index}"
            self._tags.append(tag)
        settings = dataclasses.replace(
            self._settings, options=EpisodeOptions.of(self._settings.options, run_tag=tag))
        options: dict[str, Any] = {"num_cpus": 0, "scheduling_strategy": "SPREAD",
                                   "max_concurrency": self.per_worker + 2,
                                   "max_restarts": 0, "max_task_retries": 0}
        options.update(self._worker_options)
        actor = self._worker_class.options(**options).remote(settings, self._warm_pool)
        worker = _Worker(index=index, tag=tag, actor=actor)
        with self._lock:
            self._workers.append(worker)
        return worker

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

    # ------------------------------------------------------------------ submitting

    def submit(self, task: Task, policy: PolicyLike, *, sample: int = 0
               ) -> Future[RolloutResult]:
        """Start one rollout; blocks while ``max_in_flight`` rollouts are in flight or the
        cluster-wide cap is full. The future always resolves to a ``RolloutResult``."""
        job = self._make_job(task, self._prepare_policy(policy), sample)
        if not self._take_slot(blocking=True):
            raise EpisodeStateError("the runner was cancelled; no new rollouts start",
                                    hint="create a new RayRunner", task=job.task.key)
        holder = self._take_permit(blocking=True)
        if holder is None:
            self._slots.release()
            raise EpisodeStateError("the runner was cancelled; no new rollouts start",
                                    hint="create a new RayRunner", task=job.task.key)
        return self._start(job, holder)

    def run(self, tasks: Iterable[Task], policy: PolicyLike, *,
            samples_per_task: int = 1) -> Iterator[RolloutResult]:
        """Run every task ``samples_per_task`` times; yield results as they finish.

        Same contract as ``Runner.run``: tasks are read lazily, samples of a task are
        submitted together, breaking out of the loop stops submitting, Ctrl-C cancels the
        whole run (every worker) and re-raises.
        """
        if samples_per_task < 1:
            raise ConfigurationError(
                f"samples_per_task must be at least 1, got {samples_per_task}",
                field="samples_per_task")
        self._check_open()
        prepared = self._prepare_policy(policy)
        total = len(tasks) * samples_per_task if isinstance(tasks, Sized) else None
        pairs = ((task, sample) for task in tasks for sample in range(samples_per_task))
        jobs = (self._make_job(task, prepared, sample) for task, sample in pairs)
        return self._iterate(jobs, total)

    def _iterate(self, jobs: Iterator[RolloutJob], total: int | None
                 ) -> Iterator[RolloutResult]:
        finished: queue.SimpleQueue[Future[RolloutResult]] = queue.SimpleQueue()
        outstanding: set[Future[RolloutResult]] = set()
        progress = self._progress
        progress.set_total(None if total is None else
                           progress.done + progress.running + total)
        pending: RolloutJob | None = None  # holds an in-flight slot, waits for a permit
        exhausted = False
        try:
            while True:
                while not exhausted and not self._cancelled:
                    if pending is None:
                        if not self._take_slot(blocking=not outstanding):
                            break
                        try:
                            pending = next(jobs, None)
                        except BaseException:
                            self._slots.release()
                            raise
                        if pending is None:
                            self._slots.release()
                            exhausted = True
                            break
                    holder = self._take_permit(blocking=not outstanding)
                    if holder is None:
                        break
                    future = self._start(pending, holder)
                    pending = None
                    outstanding.add(future)
                    future.add_done_callback(finished.put)
                if not outstanding:
                    return
                try:
                    future = finished.get(timeout=_POLL_S)
                except queue.Empty:
                    progress.tick()
                    continue
                outstanding.discard(future)
                yield future.result()
        except KeyboardInterrupt:
            self.cancel()
            raise
        finally:
            if pending is not None:
                self._slots.release()
            progress.close()

    def _prepare_policy(self, policy: PolicyLike) -> Any:
        if isinstance(policy, str):
            policy = parse_policy_spec(policy)
        if not isinstance(policy, PolicySpec) and not callable(getattr(policy, "act", None)) \
                and not callable(policy):
            raise ConfigurationError(f"cannot use a {type(policy).__name__} as a policy",
                                     hint="pass a Policy, a PolicySpec, a spec string such "
                                          "as 'reference', or a function of the context")
        try:
            self._ray.cloudpickle.dumps(policy)
        except Exception as exc:
            raise ConfigurationError(
                f"the policy {describe_policy(policy)!r} cannot be sent to a Ray worker "
                f"({type(exc).__name__}: {exc})",
                hint="use a PolicySpec (e.g. PolicySpec('openai', {...})) or a policy "
                     "whose attributes can be pickled (no open clients, locks or "
                     "sockets)") from None
        return policy

    def _make_job(self, task: Task | Mapping[str, Any], policy: Any, sample: int
                  ) -> RolloutJob:
        if not isinstance(task, Task):
            task = Task.model_validate(dict(task))
        return RolloutJob(task=task, policy=policy, settings=self._settings, sample=sample)

    def _take_slot(self, *, blocking: bool) -> bool:
        self._check_open()
        if not blocking:
            return self._slots.acquire(blocking=False)
        while not self._slots.acquire(timeout=_POLL_S):
            if self._cancelled:
                return False
            self._progress.tick()
        if self._cancelled:
            self._slots.release()
            return False
        return True

    def _take_permit(self, *, blocking: bool) -> str | None:
        """A permit of the cluster-wide cap, named for this runner; ``None`` when none is
        free (non-blocking) or the run was cancelled while waiting."""
        holder = f"{self._id}:{next(self._holders)}"
        wait_s = _POLL_S if blocking else 0.0
        while not self._cancelled:
            answered = False
            try:
                got = self._ray.get(self._cap.acquire.remote(holder, wait_s),
                                    timeout=_CONTROL_TIMEOUT_S)
                answered = True
            finally:
                if not answered:  # Ctrl-C or a timeout: it may have been granted after all
                    self._cap.release.remote(holder)
            if got:
                if self._cancelled:
                    self._cap.release.remote(holder)
                    return None
                return holder
            if not blocking:
                return None
            self._progress.tick()
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeStateError("the runner is closed", hint="create a new RayRunner")

    def _start(self, job: RolloutJob, holder: str) -> Future[RolloutResult]:
        """Send the job to a worker (a slot and a permit are held)."""
        outer: Future[RolloutResult] = Future()
        outer.set_running_or_notify_cancel()
        worker = self._pick_worker()
        try:
            if worker is None:
                raise RolloutWorkerError("no Ray worker is left (every worker died and "
                                         "the replacements ran out)",
                                         task=job.task.key, env=job.task.env_spec)
            inner: Future[Any] = worker.actor.run.remote(job).future()
        except Exception as exc:
            if worker is not None:
                with self._lock:
                    worker.in_flight -= 1
            self._cap.release.remote(holder)
            self._slots.release()
            error = exc if isinstance(exc, RolloutWorkerError) else RolloutWorkerError(
                f"Ray refused the rollout: {type(exc).__name__}: {exc}",
                task=job.task.key, env=job.task.env_spec)
            outer.set_result(failed_result(job, error))
            self._progress.finished(failed=True, reward=None)
            return outer
        with self._lock:
            self._running[outer] = inner
        self._progress.started()
        inner.add_done_callback(lambda f: self._finished(job, worker, holder, f, outer))
        return outer

    def _finished(self, job: RolloutJob, worker: _Worker, holder: str, inner: Future[Any],
                  outer: Future[RolloutResult]) -> None:
        """Ray's callback (its thread): turn whatever came back into a result."""
        try:
            result = self._result_of(job, worker, inner)
        except Exception as exc:  # never leave the caller's future unresolved
            result = failed_result(job, RolloutWorkerError(
                f"could not read the rollout's outcome: {type(exc).__name__}: {exc}",
                task=job.task.key, env=job.task.env_spec))
        finally:
            with self._lock:
                self._running.pop(outer, None)
                worker.in_flight -= 1
            try:
                self._cap.release.remote(holder)
            except Exception as exc:  # the cap actor is gone: so are its permits
                logger.debug("could not return a cap permit: %s", exc)
            self._slots.release()
        self._progress.finished(failed=result.error is not None, reward=result.reward)
        outer.set_result(result)

    def _result_of(self, job: RolloutJob, worker: _Worker, inner: Future[Any]
                   ) -> RolloutResult:
        exceptions = self._ray.exceptions
        if inner.cancelled():
            return _cancelled(job)
        exc = inner.exception()
        if exc is None:
            value = inner.result()
            if not isinstance(value, JobOutcome):
                raise TypeError(f"the worker returned a {type(value).__name__}")
            for event in value.events:
                try:
                    self.events.emit(event)
                except Exception:  # strict accounting raising here must not lose the result
                    logger.exception("re-emitting a worker's %s event failed", event.kind)
            return value.result
        if isinstance(exc, exceptions.TaskCancelledError):
            return _cancelled(job)
        if isinstance(exc, exceptions.RayActorError):
            self._lost(worker)
        return failed_result(job, RolloutWorkerError(
            f"the rollout's Ray worker {worker.index} failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            task=job.task.key, env=job.task.env_spec))

    # ------------------------------------------------------------------ stopping

    def cancel(self) -> None:
        """Stop the run now (idempotent): every worker closes its live envs, nothing new
        starts, and every instance tagged with one of ``run_tags`` is deleted."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            actors = [w.actor for w in self._workers if w.alive]
        self._control([a.cancel.remote() for a in actors], "cancel")
        self._sweep(self.run_tags)

    def _control(self, refs: list[Any], what: str) -> None:
        """Wait for control calls to the workers, within a bound; a dead worker is not an
        error here (the sweep reaches its instances)."""
        for ref in refs:
            try:
                self._ray.get(ref, timeout=_CONTROL_TIMEOUT_S)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                logger.debug("%s on a Ray worker failed: %s", what, exc)

    def _sweep_leftovers(self) -> None:
        """The process-wide cleanup's sweeper, for a driver that ends without close()."""
        self._sweep(self.run_tags)

    def _sweep(self, tags: list[str]) -> list[str]:
        swept: list[str] = []
        for tag in tags:
            try:
                swept += self.session.sweep(tag)
            except Exception as exc:  # cleanup goes on; TTLs reap what a failed sweep left
                logger.warning("could not sweep instances tagged %s: %s (they expire with "
                               "their TTL)", tag, exc)
        if swept:
            logger.info("deleted %d instance(s) of run %s", len(swept), self.run_tag)
        return swept

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for running rollouts (at most ``timeout_s``, default: the longest an
        episode can take), shut the workers down, delete whatever the run left, close a
        session the runner created. Rollouts still running after that are cancelled.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._running)
        bound = self._longest_episode_s() if timeout_s is None else timeout_s
        if self._cancelled:
            bound = min(bound, _CANCEL_GRACE_S)
        try:
            _, not_done = concurrent.futures.wait(running, timeout=bound)
            if not_done:
                logger.warning("%d rollout(s) still running after %.0f s; cancelling them",
                               len(not_done), bound)
                self.cancel()
                concurrent.futures.wait(not_done, timeout=_CANCEL_GRACE_S)
        except (KeyboardInterrupt, SystemExit):
            self.cancel()  # Ctrl-C or SIGTERM while waiting: stop every worker now, then re-raise
            self._shutdown_workers()
            raise
        self._shutdown_workers()

    def _shutdown_workers(self) -> None:
        with self._lock:
            workers = list(self._workers)
            sweepers = list(self._sweepers)
        alive = [w.actor for w in workers if w.alive]
        self._control([a.shutdown.remote() for a in alive], "shutdown")
        for worker in workers:
            self._ray.kill(worker.actor)
        concurrent.futures.wait(sweepers, timeout=_CONTROL_TIMEOUT_S)
        # Every episode is over: anything still tagged is a leftover (an uncertain
        # create, a worker killed while creating).
        self._sweep(self.run_tags)
        self.session.instances.remove_sweeper(self._sweep_leftovers)
        try:
            if self._owns_cap:
                self._ray.kill(self._cap)
            else:
                self._ray.get(self._cap.release_prefix.remote(f"{self._id}:"),
                              timeout=_CONTROL_TIMEOUT_S)
        except Exception as exc:  # nothing left to hold permits for
            logger.debug("could not release the cap: %s", exc)
        if self._owns_session:
            self.session.close()
        self._progress.close()

    def _longest_episode_s(self) -> float:
        config = self.config
        longest = max(config.episode_deadline_for(m) for m in Modality)
        return config.timeouts.provision + longest + config.timeouts.verify

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.cancel()
        self.close()


def _cancelled(job: RolloutJob) -> RolloutResult:
    return failed_result(job, RolloutCancelled("the run was cancelled before this rollout "
                                               "started"),
                         stop_reason=StopReason.CANCELLED)
