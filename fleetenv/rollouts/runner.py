"""``Runner``: many rollouts in parallel on any ``concurrent.futures.Executor``.

    from fleetenv import Runner, ResultsWriter

    with Runner(workers=8) as runner, ResultsWriter("results.jsonl") as out:
        for result in runner.run(tasks, "reference", samples_per_task=4):
            out.write(result)                       # in the order rollouts finish

Sessions
--------
A runner runs on a :class:`~fleetenv.Session`: ``Runner(session=s)`` uses yours (and
leaves it open), ``Runner(config=...)`` or ``Runner()`` makes its own and closes it with
the runner. Either way the run tags its instances with its own ``run_tag``, so cancelling
a run sweeps only that run's instances.

Modes
-----
``Runner(mode=...)`` says where episodes run: ``"threads"``, ``"asyncio"``,
``"processes"`` or ``"auto"`` (the default). The public API and the results are the
same in every mode.

* ``"asyncio"``: every episode is a coroutine on fleetenv's one event loop, with no
  thread of its own (see ``async_jobs``): ``workers`` episodes run at once (at most
  ``max_live_instances``), their blocking parts (provisioning, verification, deletion)
  on a small pool, a sync policy on a pool of ``min(32, workers)`` threads, an async
  policy (``async def act`` or a coroutine function) on the loop itself. Event sinks are
  then called on the loop thread: a sink must not block for long.
* ``"auto"``: with ``executor=`` given, ``"threads"`` for a ``ThreadPoolExecutor`` and
  ``"processes"`` for anything else. Without one, each rollout picks by its policy:
  ``"asyncio"`` for an async policy and for the built-in scripted ones (``"reference"``,
  ``"scripted"``, ``ScriptedPolicy``), which cost the loop nothing; ``"threads"`` for
  any other sync policy (a model client blocking on HTTP gets a thread per episode, as
  many as ``workers``).

Executors
---------
* Threads (mode ``"threads"``: ``executor=`` or a ``ThreadPoolExecutor(workers)`` the
  runner owns; any ``concurrent.futures.Executor`` that runs jobs in this process fits,
  no subclass needed). Jobs get the live
  objects: the policy object as given, the session, the runner's ``EventBus`` and its
  ``CancelToken``. MCP traffic of every episode runs on fleetenv's one event-loop thread;
  the worker threads only block, so threads are the right default for LLM agents (the
  time goes to waiting on the model and the tools, not to Python).
* A spawn ``ProcessPoolExecutor`` (mode ``"processes"``: ``executor=``, or one with
  ``workers`` processes the runner owns; for policies that burn CPU in Python). Jobs must
  pickle: a ``PolicySpec``, a spec string, a module-level function or a picklable policy
  object; anything else is a ``ConfigurationError`` at ``submit()``. Each worker process
  has its own event loop and its own session for the run, built from the settings the
  runner sends; in local mode it talks to the *parent's* embedded Fleet (the runner
  rewrites the config with its URL and token). Worker events come back with the
  result and are re-emitted on the runner's bus, so accounting covers them too.
* A distributed executor, e.g. Dask: ``Runner(executor=dask_client.get_executor(),
  workers=<number of worker processes>, config=resolve_config(api_key=...))``. Treated
  like a process pool (jobs are pickled). The embedded local Fleet listens on 127.0.0.1,
  so remote machines need real Fleet (an API key). fleetenv does not depend on dask.

Caps
----
* Episodes in flight: ``max_in_flight`` (default ``workers``), a semaphore around submit,
  so ``run()`` over 10 000 tasks holds at most that many futures, not 10 000. Since an
  episode holds at most one instance, this also bounds live instances of the run.
* Instances being created / live (``FleetConfig.max_creating_instances`` /
  ``max_live_instances``) are the session's caps. With threads they apply as configured.
  With a process pool each worker process has its own session, so the runner divides both
  caps by ``workers`` (at least 1 each) in the config it sends to workers: pass
  ``workers`` equal to the pool's process count for the totals to hold.

Failures and cancellation
-------------------------
Every submitted rollout yields exactly one ``RolloutResult``; a broken episode, a dead
worker process (``BrokenProcessPool``) or an unpicklable result becomes a result with
``error`` set (``RolloutWorkerError``), and the batch goes on. ``cancel()`` closes every
live env of this runner at once (threads), cancels queued rollouts, and deletes every
instance tagged with the runner's ``run_tag`` via the control plane, which also reaches
instances that worker processes created. ``run()`` cancels on Ctrl-C and re-raises;
leaving a ``with Runner()`` block by an exception cancels too.

Traces
------
``Runner(traces="job name")`` (or a :class:`~fleetenv.fleet.traces.TraceOptions`) uploads
every finished episode's transcript to that Fleet trace job, on a background thread, off
the rollouts' path; ``close()`` drains the uploads within a bound. Upload failures never
fail the run: they are logged once and counted in ``runner.trace_report()``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import multiprocessing
import queue
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sized
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from types import TracebackType
from typing import Any

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
from fleetenv.fleet.deadlines import abandon_calls, calls_owner
from fleetenv.fleet.provisioning import new_run_tag
from fleetenv.fleet.registry import install_signal_handlers
from fleetenv.fleet.session import Session
from fleetenv.fleet.traces import TraceOptions, TraceReport, TraceUploader
from fleetenv.rollouts.async_jobs import LoopEpisodes
from fleetenv.rollouts.futures import AwaitableFuture
from fleetenv.rollouts.jobs import (
    JobOutcome,
    PolicyLike,
    RolloutJob,
    RolloutSettings,
    check_picklable,
    failed_result,
    run_job,
    run_job_collecting_events,
)
from fleetenv.rollouts.policy_spec import PolicySpec, parse_policy_spec
from fleetenv.rollouts.progress import Progress
from fleetenv.rollouts.rollout import CancelToken, is_async_policy, runs_on_loop
from fleetenv.rollouts.runner_async import iterate_async, on_pool, take_slot_async

__all__ = ["MODES", "PolicyLike", "Runner"]

#: The values of ``Runner(mode=...)``.
MODES = ("auto", "threads", "asyncio", "processes")

logger = logging.getLogger("fleetenv.rollouts")

#: How often blocking waits wake up to notice a cancel (and redraw the progress bar).
_POLL_S = 0.25
#: After close() cancelled what was still running, how long it waits for it to unwind.
_CANCEL_GRACE_S = 15.0


class Runner:
    """Runs rollouts of a policy on tasks in parallel; see the module docstring."""

    def __init__(
        self,
        *,
        workers: int = 8,
        mode: str = "auto",
        executor: Executor | None = None,
        session: Session | None = None,
        config: FleetConfig | None = None,
        events: EventBus | None = None,
        max_in_flight: int | None = None,
        max_steps: int | None = None,
        system_prompt: str | None = None,
        options: EpisodeOptions | None = None,
        progress: bool | None = None,
        traces: str | TraceOptions | None = None,
    ) -> None:
        if workers < 1:
            raise ConfigurationError(f"workers must be at least 1, got {workers}",
                                     field="workers")
        if max_in_flight is not None and max_in_flight < 1:
            raise ConfigurationError(f"max_in_flight must be at least 1, got {max_in_flight}",
                                     hint="leave it unset to use the number of workers",
                                     field="max_in_flight")
        if session is not None and config is not None:
            raise ConfigurationError("pass either session= or config=, not both",
                                     hint="the session already holds the settings")
        mode = _check_mode(mode, executor)
        trace_options = TraceOptions.of(traces) if traces is not None else None
        install_signal_handlers()  # SIGTERM deletes instances that worker threads create
        self._owns_session = session is None
        self.session: Session = session if session is not None else Session(
            config, events=events)
        self.config: FleetConfig = self.session.config
        self.run_tag: str = (self.config.run_tag if self._owns_session and self.config.run_tag
                             else new_run_tag())
        self.workers = workers
        self.max_in_flight = max_in_flight or workers
        self.events: EventBus = events if events is not None else self.session.events
        #: ``"auto"``, ``"threads"``, ``"asyncio"`` or ``"processes"`` (as resolved for
        #: a given executor: ``"auto"`` stays only without one, deciding per policy).
        self.mode = mode
        self._owns_executor = executor is None
        self._given_executor = executor
        self._made_executor: Executor | None = None
        self._in_process = mode != "processes"
        job_config = (self.config if self._in_process
                      else _worker_config(self.session, workers))
        self._settings = RolloutSettings(
            config=job_config, system_prompt=system_prompt,
            options=EpisodeOptions.of(options, max_steps=max_steps, run_tag=self.run_tag))
        self._slots = threading.Semaphore(self.max_in_flight)
        self._token = CancelToken()
        self._loop_episodes: LoopEpisodes | None = None
        self._lock = threading.Lock()
        #: Coroutines waiting for a slot (``submit_async``): woken when one frees.
        self._slot_waiters: list[Future[None]] = []
        #: Caller's future -> the executor's future, for every rollout not yet finished.
        self._running: dict[Future[RolloutResult], Future[Any]] = {}
        self._cancelled = False
        self._closed = False
        # Set when a worker failed outside run_episode (a dead process): instances it had
        # created are orphans, so close() sweeps the run's tag.
        self._worker_lost = False
        self._progress = Progress(enabled=progress)
        #: Uploads finished episodes to a Fleet trace job (``traces=``), else None.
        self.traces: TraceUploader | None = (
            TraceUploader(self.session, trace_options) if trace_options else None)

    def __repr__(self) -> str:
        kind = (self.mode if self._given_executor is None
                else f"{self.mode}: {type(self._given_executor).__name__}")
        return (f"Runner({kind}, workers={self.workers}, max_in_flight={self.max_in_flight}, "
                f"run_tag={self.run_tag!r})")

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def _executor(self) -> Executor:
        """The executor of thread / process rollouts, made on first use (a runner whose
        rollouts all run on the loop never starts a pool)."""
        if self._given_executor is not None:
            return self._given_executor
        with self._lock:
            if self._made_executor is None:
                self._made_executor = (
                    ProcessPoolExecutor(self.workers,
                                        mp_context=multiprocessing.get_context("spawn"))
                    if self.mode == "processes" else
                    ThreadPoolExecutor(max_workers=self.workers,
                                       thread_name_prefix="fleetenv-rollout"))
            return self._made_executor

    def _on_loop(self, policy: Any) -> bool:
        """Whether a rollout of ``policy`` runs on fleetenv's loop (see Modes)."""
        if self.mode == "asyncio":
            return True
        return self.mode == "auto" and runs_on_loop(policy)

    def _loop(self) -> LoopEpisodes:
        with self._lock:
            if self._loop_episodes is None:
                self._loop_episodes = LoopEpisodes(workers=self.workers, session=self.session,
                                                   events=self.events, cancel=self._token)
            return self._loop_episodes

    # ------------------------------------------------------------------ submitting

    def submit(self, task: Task, policy: PolicyLike, *, sample: int = 0
               ) -> AwaitableFuture[RolloutResult]:
        """Start one rollout; blocks while ``max_in_flight`` rollouts are in flight.

        The future always resolves to a ``RolloutResult`` (failures are results with
        ``error``). It reports itself running at once and ``future.cancel()`` returns
        ``False``: an episode in flight is stopped with ``Runner.cancel()``. It is a
        ``concurrent.futures.Future`` that asyncio and trio code may also ``await``
        (``submit_async`` is the twin that waits for a slot without blocking a loop).

        Raises ``ConfigurationError`` for a policy that cannot be used with this executor,
        ``EpisodeStateError`` after ``cancel()`` or ``close()``.
        """
        job = self._make_job(task, self._prepare_policy(policy), sample)
        if not self._take_slot(blocking=True):
            raise EpisodeStateError("the runner was cancelled; no new rollouts start",
                                    hint="create a new Runner", task=job.task.key)
        return self._start(job)

    def run(self, tasks: Iterable[Task], policy: PolicyLike, *,
            samples_per_task: int = 1) -> Iterator[RolloutResult]:
        """Run every task ``samples_per_task`` times; yield results as they finish.

        Tasks are read lazily, and at most ``max_in_flight`` rollouts are submitted at
        once. The samples of one task are submitted one after another (a GRPO group
        finishes together). Breaking out of the loop cancels rollouts not yet started;
        Ctrl-C cancels the whole run (see ``cancel()``) and re-raises.
        """
        return self._iterate(*self._plan(tasks, policy, samples_per_task))

    def _plan(self, tasks: Iterable[Task], policy: PolicyLike, samples_per_task: int
              ) -> tuple[Iterator[RolloutJob], int | None]:
        """The jobs of a run, made lazily, and their number when it is known."""
        if samples_per_task < 1:
            raise ConfigurationError(
                f"samples_per_task must be at least 1, got {samples_per_task}",
                field="samples_per_task")
        self._check_open()
        prepared = self._prepare_policy(policy)
        total = len(tasks) * samples_per_task if isinstance(tasks, Sized) else None
        pairs = ((task, sample) for task in tasks for sample in range(samples_per_task))
        return (self._make_job(task, prepared, sample) for task, sample in pairs), total

    # ------------------------------------------------------------------ awaitable twins

    async def submit_async(self, task: Task, policy: PolicyLike, *, sample: int = 0
                           ) -> AwaitableFuture[RolloutResult]:
        """`submit` for asyncio / trio code: waits for a free slot without blocking the
        caller's loop, then returns the rollout's (awaitable) future::

            future = await runner.submit_async(task, policy)
            result = await future
        """
        job = self._make_job(task, self._prepare_policy(policy), sample)
        self._check_open()
        if not await take_slot_async(self):
            raise EpisodeStateError("the runner was cancelled; no new rollouts start",
                                    hint="create a new Runner", task=job.task.key)
        return self._start(job)

    def run_async(self, tasks: Iterable[Task], policy: PolicyLike, *,
                  samples_per_task: int = 1) -> AsyncIterator[RolloutResult]:
        """`run` for ``async for``: the same rollouts, slots and order, awaited without
        blocking the caller's loop. Leaving the loop early (or cancelling the consuming
        task) cancels rollouts not yet started; ``cancel_async()`` stops the run."""
        return iterate_async(self, *self._plan(tasks, policy, samples_per_task))

    async def cancel_async(self) -> None:
        """`cancel` for async code (its control-plane calls run on the runtime's pool)."""
        await on_pool(self.cancel)

    async def close_async(self, timeout_s: float | None = None) -> None:
        """`close` for async code: waits for running rollouts without blocking the
        caller's loop (on the runtime's pool)."""
        await on_pool(lambda: self.close(timeout_s))

    async def __aenter__(self) -> Runner:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            await self.cancel_async()
        await self.close_async()

    def _iterate(self, jobs: Iterator[RolloutJob], total: int | None
                 ) -> Iterator[RolloutResult]:
        finished: queue.SimpleQueue[Future[RolloutResult]] = queue.SimpleQueue()
        outstanding: set[Future[RolloutResult]] = set()
        progress = self._progress
        progress.set_total(None if total is None else
                           progress.done + progress.running + total)
        exhausted = False
        try:
            while True:
                while not exhausted and not self._cancelled:
                    if not self._take_slot(blocking=not outstanding):
                        break
                    try:
                        job = next(jobs, None)
                    except BaseException:
                        self._slots.release()
                        raise
                    if job is None:
                        self._slots.release()
                        exhausted = True
                        break
                    started = self._start(job)
                    outstanding.add(started)
                    started.add_done_callback(finished.put)
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
            self._drop_queued(outstanding)
            progress.close()

    def _drop_queued(self, outstanding: Iterable[Future[RolloutResult]]) -> None:
        """A run left early (break, or an error in the loop body): its rollouts still
        queued in the executor are cancelled; the running ones finish (close() waits)."""
        with self._lock:
            queued = [self._running.get(f) for f in outstanding]
        for inner in queued:
            if inner is not None:
                inner.cancel()

    def _prepare_policy(self, policy: PolicyLike) -> Any:
        """Validate once per run, not once per rollout: a typo in a spec should fail
        here, not as 10 000 error results."""
        if isinstance(policy, str):
            policy = parse_policy_spec(policy)
        if isinstance(policy, PolicySpec):
            if self._in_process:  # a process pool's workers may import what we cannot
                policy.build()  # raises ConfigurationError for an unknown kind or bad import
        elif not callable(getattr(policy, "act", None)) and not callable(policy):
            raise ConfigurationError(f"cannot use a {type(policy).__name__} as a policy",
                                     hint="pass a Policy, a PolicySpec, a spec string such "
                                          "as 'reference', or a function of the context")
        elif is_async_policy(policy) and self.mode in ("threads", "processes"):
            raise ConfigurationError(
                f"an async policy cannot run in mode={self.mode!r}",
                hint="use Runner(mode='asyncio') or the default mode='auto'",
                field="mode")
        return policy

    def _make_job(self, task: Task | Mapping[str, Any], policy: Any, sample: int
                  ) -> RolloutJob:
        if not isinstance(task, Task):
            task = Task.model_validate(dict(task))
        job = RolloutJob(task=task, policy=policy, settings=self._settings, sample=sample)
        if not self._in_process:
            check_picklable(job)
        return job

    def _take_slot(self, *, blocking: bool) -> bool:
        """An in-flight slot; ``False`` when none is free (non-blocking) or cancelled."""
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

    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeStateError("the runner is closed", hint="create a new Runner")

    def _start(self, job: RolloutJob) -> AwaitableFuture[RolloutResult]:
        """Hand the job to the executor (a slot is held); the returned future resolves
        to a result whatever happens to the job."""
        outer: AwaitableFuture[RolloutResult] = AwaitableFuture()
        # Running from the caller's point of view at once: cancelling one rollout's future
        # cannot stop an episode in another thread or process, so it must not pretend to.
        outer.set_running_or_notify_cancel()
        inner: Future[Any]
        replay_in: contextvars.Context | None = None
        # The caller's context (its current trace span, say) goes along with each job:
        # one copy per job, as a context may be entered once at a time. The job's HTTP
        # calls are this run's, for `close()` to give up on after a cancel.
        context = contextvars.copy_context()
        context.run(calls_owner.set, self._token)
        try:
            if self._on_loop(job.policy):
                inner = context.run(self._loop().start, job)
            elif self._in_process:
                inner = self._executor.submit(context.run, run_job, job,
                                              session=self.session, events=self.events,
                                              cancel=self._token)
            else:
                inner = self._executor.submit(run_job_collecting_events, job)
                # The worker's events are replayed here later, in a copy of the caller's
                # context, so a tracing sink hangs them from the caller's current span.
                replay_in = contextvars.copy_context()
        except Exception as exc:  # a broken or shut-down pool: this rollout fails, not us
            self._slots.release()
            self._worker_lost = True
            error = RolloutWorkerError(f"the executor refused the rollout: "
                                       f"{type(exc).__name__}: {exc}",
                                       task=job.task.key, env=job.task.env_spec)
            outer.set_result(failed_result(job, error))
            self._progress.finished(failed=True, reward=None)
            return outer
        with self._lock:
            self._running[outer] = inner
        self._progress.started()
        inner.add_done_callback(lambda f: self._finished(job, f, outer, replay_in))
        return outer

    def _finished(self, job: RolloutJob, inner: Future[Any], outer: Future[RolloutResult],
                  replay_in: contextvars.Context | None = None) -> None:
        """Executor callback (any thread): turn whatever came back into a result."""
        try:
            result = (self._result_of(job, inner) if replay_in is None
                      else replay_in.run(self._result_of, job, inner))
        except Exception as exc:  # never leave the caller's future unresolved
            result = failed_result(job, RolloutWorkerError(
                f"could not read the rollout's outcome: {type(exc).__name__}: {exc}",
                task=job.task.key, env=job.task.env_spec))
        finally:
            with self._lock:
                self._running.pop(outer, None)
                waiters, self._slot_waiters = self._slot_waiters, []
            self._slots.release()
            for waiter in waiters:
                if waiter.set_running_or_notify_cancel():
                    waiter.set_result(None)
        self._progress.finished(failed=result.error is not None, reward=result.reward)
        if self.traces is not None and not _never_started(result):
            self.traces.submit(result)  # never blocks: a bounded queue, counted if full
        outer.set_result(result)

    def _result_of(self, job: RolloutJob, inner: Future[Any]) -> RolloutResult:
        if inner.cancelled():
            return failed_result(job, RolloutCancelled("the run was cancelled before this "
                                                       "rollout started"),
                                 stop_reason=StopReason.CANCELLED)
        exc = inner.exception()
        if exc is None:
            value = inner.result()
            if isinstance(value, JobOutcome):
                self._replay_events(value)
                return value.result
            if isinstance(value, RolloutResult):
                return value
            raise TypeError(f"the worker returned a {type(value).__name__}")
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C reached a worker process
            return failed_result(job, RolloutCancelled("the worker was interrupted"),
                                 stop_reason=StopReason.CANCELLED)
        self._worker_lost = True
        return failed_result(job, RolloutWorkerError(
            f"the rollout's worker failed: {type(exc).__name__}: {exc}",
            task=job.task.key, env=job.task.env_spec))

    def _replay_events(self, outcome: JobOutcome) -> None:
        for event in outcome.events:
            try:
                self.events.emit(event)
            except Exception:  # strict accounting raising here must not lose the result
                logger.exception("re-emitting a worker's %s event failed", event.kind)

    # ------------------------------------------------------------------ stopping

    def cancel(self) -> None:
        """Stop the run now (idempotent): close this runner's live envs, cancel queued
        rollouts, then delete every instance tagged with ``run_tag``."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            running = list(self._running.values())
        # Queued rollouts first: closing the live envs frees workers, which would
        # otherwise pick up the queued ones before they are cancelled.
        for future in running:
            future.cancel()
        self._token.cancel()
        self._sweep()

    def _sweep(self) -> list[str]:
        try:
            swept = self.session.sweep(self.run_tag)
        except Exception as exc:  # cleanup continues; TTLs reap what a failed sweep left
            logger.warning("could not sweep instances tagged %s: %s (they expire with their "
                           "TTL; `fleetenv` can sweep leftovers later)", self.run_tag, exc)
            return []
        if swept:
            logger.info("deleted %d instance(s) tagged %s", len(swept), self.run_tag)
        return swept

    def _sweep_uncertain_creates(self) -> None:
        """Leftovers of creates that failed after the server may have made the instance;
        sends nothing unless such a failure happened under this run's tag."""
        try:
            self.session.provisioner.sweep(self.run_tag)
        except Exception as exc:  # TTLs reap what a failed sweep left
            logger.warning("could not sweep leftovers tagged %s: %s", self.run_tag, exc)

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for running rollouts (at most ``timeout_s`` seconds, default: the longest
        an episode can take under this config), then shut down an executor the runner
        created, and close a session it created. Rollouts still running after that are
        cancelled. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._running.values())
        bound = self._longest_episode_s() if timeout_s is None else timeout_s
        if self._cancelled:  # what is left is unwinding; it has no real work to finish
            bound = min(bound, _CANCEL_GRACE_S)
        try:
            _, not_done = concurrent.futures.wait(running, timeout=bound)
        except BaseException:
            # Ctrl-C or SIGTERM while waiting (the end of a `with Runner()` block): stop
            # the rollouts now, or interpreter exit would wait for them in the executor.
            self.cancel()  # closes the live envs and sweeps the run's tag
            if self.traces is not None:
                self.traces.close(timeout_s=0)  # interrupted: stop uploading, count the rest
            raise
        if not_done and not self._cancelled:
            logger.warning("%d rollout(s) still running after %.0f s; cancelling them",
                           len(not_done), bound)
            self.cancel()
            _, not_done = concurrent.futures.wait(not_done, timeout=_CANCEL_GRACE_S)
        if not_done:
            # Still unwinding after the grace: what holds them is a call that does not
            # answer (a create, say). Give up this run's calls, or the workers (and
            # interpreter exit, which joins them) wait for the calls' whole budgets.
            abandon_calls("the run was cancelled", grace_s=0, owner=self._token)
            if not self._in_process and self._owns_executor and self._made_executor:
                # Worker processes do not share this process's calls: stop them. Each
                # deletes the instances it holds on SIGTERM, then exits; the run's tag
                # is swept below for what they could not.
                _terminate_workers(self._made_executor)
                self._worker_lost = True
            _, not_done = concurrent.futures.wait(not_done, timeout=_CANCEL_GRACE_S)
        if self._cancelled or self._worker_lost:
            # After cancel(): again, for creates that finished during the first sweep.
            # After a lost worker: the instances it held have nobody left to delete them.
            self._sweep()
        elif self._in_process and not not_done:
            self._sweep_uncertain_creates()
        elif not not_done:
            # Worker processes cannot sweep the run's shared tag themselves (a sibling's
            # instances may be alive); now that every rollout is done, nothing under it
            # is in use, and what is left is a leftover of an uncertain create.
            self._sweep()
        if self._owns_executor and self._made_executor is not None:
            self._made_executor.shutdown(wait=not not_done, cancel_futures=True)
        if self._loop_episodes is not None:
            self._loop_episodes.stop(wait=not not_done)
        if self.traces is not None:  # before the session closes its HTTP client
            self.traces.close()
        if self._owns_session:
            self.session.close()
        self._progress.close()

    def trace_report(self) -> TraceReport | None:
        """What the trace upload did so far (``None`` without ``traces=``)."""
        return self.traces.report() if self.traces is not None else None

    def _longest_episode_s(self) -> float:
        config = self.config
        longest = max(config.episode_deadline_for(m) for m in Modality)
        return config.timeouts.provision + longest + config.timeouts.verify

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.cancel()
        self.close()


def _terminate_workers(executor: Executor) -> None:
    """SIGTERM the worker processes of a process pool (``terminate_workers`` on Python
    3.14+, the pool's processes before)."""
    terminate = getattr(executor, "terminate_workers", None)
    if callable(terminate):
        terminate()
        return
    processes: dict[Any, Any] = getattr(executor, "_processes", None) or {}
    for process in list(processes.values()):
        with contextlib.suppress(Exception):  # already gone
            process.terminate()


def _check_mode(mode: object, executor: Executor | None) -> str:
    """The mode, checked where it is given, and resolved for a given executor."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ConfigurationError(f"Runner(mode={mode!r:.40}) is not a known mode",
                                 hint=f"use one of {', '.join(MODES)}", field="mode")
    if executor is None:
        return mode
    if mode == "asyncio":
        raise ConfigurationError("mode='asyncio' runs episodes on fleetenv's loop and "
                                 "takes no executor",
                                 hint="drop executor=, or use mode='threads' / 'processes'",
                                 field="mode")
    if mode == "auto":
        return "threads" if isinstance(executor, ThreadPoolExecutor) else "processes"
    return mode


def _never_started(result: RolloutResult) -> bool:
    """A rollout cancelled before it began has nothing to trace."""
    return result.stop_reason is StopReason.CANCELLED and not result.transcript


def _worker_config(session: Session, processes: int) -> FleetConfig:
    """The settings worker processes build their sessions from.

    Each worker process has its own session and caps, so the totals are split among them.
    In local mode the workers are pointed at this process's embedded Fleet (started here,
    once); a worker would otherwise start its own.
    """
    config = session.config
    if config.use_local:
        from fleetenv.fleet.backend import local_fleet

        local = local_fleet()
        config = config.replace(api_key=local.token, base_url=local.base_url,
                                use_local=False)
    return config.replace(
        max_creating_instances=max(1, config.max_creating_instances // processes),
        max_live_instances=max(1, config.max_live_instances // processes))
