"""``Runner``: many rollouts in parallel, from blocking code or from async code.

    from fleetenv import Runner, ResultsWriter

    with Runner(workers=8) as runner, ResultsWriter("results.jsonl") as out:
        for result in runner.run(tasks, "reference", samples_per_task=4):
            out.write(result)                       # in the order rollouts finish

The Runner keeps what every run shares: slots, iteration, results, progress, cancel and
sweep, close, traces. Where episodes run is its dispatch (`fleetenv.rollouts.dispatch`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sized
from concurrent.futures import Executor, Future
from types import TracebackType
from typing import Any

import anyio

from fleetenv import runtime
from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import (
    ConfigurationError,
    EpisodeStateError,
    RolloutCancelled,
)
from fleetenv.core.event_bus import EventBus
from fleetenv.core.tasks import Task
from fleetenv.core.types import Modality, RolloutResult, StopReason
from fleetenv.env.options import EpisodeOptions
from fleetenv.fleet.deadlines import abandon_calls, calls_owner
from fleetenv.fleet.provisioning import new_run_tag
from fleetenv.fleet.registry import install_signal_handlers, track
from fleetenv.fleet.session import Session
from fleetenv.fleet.traces import TraceOptions, TraceReport, TraceUploader
from fleetenv.rollouts.dispatch import MODES, Dispatch, make_dispatch
from fleetenv.rollouts.futures import AwaitableFuture, _Shield
from fleetenv.rollouts.jobs import (
    JobOutcome,
    PolicyLike,
    RolloutJob,
    RolloutSettings,
    cancelled_result,
    worker_failed,
)
from fleetenv.rollouts.policy_spec import PolicySpec, parse_policy_spec
from fleetenv.rollouts.progress import Progress
from fleetenv.rollouts.rollout import CancelToken

__all__ = ["MODES", "PolicyLike", "Runner"]

logger = logging.getLogger("fleetenv.rollouts")

#: How often waits wake up to notice a cancel (and redraw the progress bar).
_POLL_S = 0.25
#: After close() cancelled what was still running, how long it waits for it to unwind.
_CANCEL_GRACE_S = 15.0


class Runner:
    """Runs rollouts of a policy on tasks in parallel.

    **Sessions.** ``Runner(session=s)`` runs on your session (and leaves it open);
    ``Runner(config=...)`` or ``Runner()`` makes its own and closes it with the runner.
    Either way the run tags its instances with its own ``run_tag``.

    **Modes** (where episodes run; the API, events and results are the same in each):

    * ``"threads"``: a thread per running episode (``workers``, or ``executor=``, any
      in-process executor); jobs get the live policy, session, bus and token.
    * ``"asyncio"``: episodes as coroutines on fleetenv's loop, no thread each:
      ``min(workers, max_live_instances)`` at once, their blocking parts and a sync
      policy on the runtime's pool, an async policy on the loop. Event sinks are then
      called on the loop thread: a sink must not block for long.
    * ``"processes"``: a spawn pool of ``workers`` processes, or ``executor=`` (a process
      pool, or a distributed one such as Dask's, whose machines need real Fleet). Jobs
      are pickled (the policy: a ``PolicySpec``, a spec string, a module-level function
      or a picklable object, else a ``ConfigurationError`` at ``submit()``); each worker
      has a session of its own, with the caps divided by ``workers`` and, in local mode,
      this process's embedded Fleet; its events are re-emitted on the runner's bus.
    * ``"auto"`` (default): with ``executor=``, ``"threads"`` for a
      ``ThreadPoolExecutor``, else ``"processes"``. Without, per policy: ``"asyncio"``
      for an async policy and the built-in scripted ones, ``"threads"`` for any other.

    ``RayRunner`` is this runner with its episodes on Ray actors.

    **Caps.** ``max_in_flight`` (default ``workers``) rollouts submitted and not
    finished, so ``run()`` over 10 000 tasks holds that many futures; the session's
    ``max_creating_instances`` and ``max_live_instances`` bound what reaches Fleet.

    **Failures and cancellation.** Every submitted rollout yields exactly one
    ``RolloutResult``: a broken episode, a dead worker or an unpicklable result is a
    result with ``error`` set, and the batch goes on. ``cancel()`` closes the run's live
    envs, cancels queued rollouts and deletes every instance tagged with ``run_tags``
    (worker processes' too). ``run()`` cancels on Ctrl-C and re-raises; leaving a
    ``with`` block by an exception cancels too.

    **Traces.** ``traces="job name"`` (or a :class:`~fleetenv.fleet.traces.TraceOptions`)
    uploads every finished episode to that Fleet trace job, off the rollouts' path;
    failures are counted in ``trace_report()``, never fail the run.
    """

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
        for name, value in (("workers", workers), ("max_in_flight", max_in_flight)):
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {value}",
                                         field=name)
        if session is not None and config is not None:
            raise ConfigurationError("pass either session= or config=, not both",
                                     hint="the session already holds the settings")
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
        self._settings = RolloutSettings(
            config=self.config, system_prompt=system_prompt,
            options=EpisodeOptions.of(options, max_steps=max_steps, run_tag=self.run_tag))
        self._slots = threading.Semaphore(self.max_in_flight)
        self._token = CancelToken()
        self._lock = threading.Lock()
        #: Coroutines waiting for a slot (``submit_async``): woken when one frees.
        self._slot_waiters: list[Future[None]] = []
        #: Caller's future -> the dispatch's future, for every rollout not yet finished.
        self._running: dict[Future[RolloutResult], Future[Any]] = {}
        self._cancelled = False
        self._closed = False
        # A worker died outside its episode: its instances are orphans, close() sweeps.
        self._worker_lost = False
        self._progress = Progress(enabled=progress)
        try:
            self._dispatch = self._make_dispatch(mode, executor)
        except BaseException:
            if self._owns_session:
                self.session.close()
            raise
        #: One of `MODES` (``"auto"`` only without an executor), ``"ray"`` for a RayRunner.
        self.mode: str = self._dispatch.mode
        if not self._dispatch.in_process:
            # Workers elsewhere: until close(), every exit path sweeps their instances.
            self.session.instances.add_sweeper(self._sweep)
            track(self.session.instances)
        #: Uploads finished episodes to a Fleet trace job (``traces=``), else None.
        self.traces: TraceUploader | None = (
            TraceUploader(self.session, trace_options) if trace_options else None)

    def _make_dispatch(self, mode: str, executor: Executor | None) -> Dispatch:
        return make_dispatch(mode, executor, workers=self.workers, session=self.session,
                             events=self.events, cancel=self._token,
                             settings=self._settings)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self._dispatch!r}, "
                f"max_in_flight={self.max_in_flight}, run_tag={self.run_tag!r})")

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def run_tags(self) -> list[str]:
        """Every tag the run's instances carry (``run_tag``, or one per Ray worker)."""
        return self._dispatch.tags() or [self.run_tag]

    # ------------------------------------------------------------------ submitting

    def submit(self, task: Task, policy: PolicyLike, *, sample: int = 0
               ) -> AwaitableFuture[RolloutResult]:
        """Start one rollout; blocks while ``max_in_flight`` rollouts are in flight.

        The future always resolves to a ``RolloutResult`` (failures are results with
        ``error``). It reports itself running at once and ``future.cancel()`` returns
        ``False``: an episode in flight is stopped with ``Runner.cancel()``. Asyncio and
        trio code may ``await`` it (and use ``submit_async``, which waits for a slot
        without blocking a loop).

        Raises ``ConfigurationError`` for a policy that cannot run in this mode,
        ``EpisodeStateError`` after ``cancel()`` or ``close()``.
        """
        job = self._make_job(task, self._prepare_policy(policy), sample)
        if not self._take_slot(blocking=True):
            raise self._refused(job)
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

    async def submit_async(self, task: Task, policy: PolicyLike, *, sample: int = 0
                           ) -> AwaitableFuture[RolloutResult]:
        """`submit` for asyncio / trio code: waits for a free slot without blocking the
        caller's loop, then returns the rollout's (awaitable) future::

            future = await runner.submit_async(task, policy)
            result = await future
        """
        job = self._make_job(task, self._prepare_policy(policy), sample)
        if not await self._take_slot_async():
            raise self._refused(job)
        return self._start(job)

    def run_async(self, tasks: Iterable[Task], policy: PolicyLike, *,
                  samples_per_task: int = 1) -> AsyncIterator[RolloutResult]:
        """`run` for ``async for``: the same rollouts, slots and order, awaited without
        blocking the caller's loop and without a thread per wait. Leaving the loop early
        (or cancelling the consuming task) cancels rollouts not yet started;
        ``cancel_async()`` stops the run."""
        return self._iterate_async(*self._plan(tasks, policy, samples_per_task))

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

    def _prepare_policy(self, policy: PolicyLike) -> Any:
        if isinstance(policy, str):
            policy = parse_policy_spec(policy)
        if not isinstance(policy, PolicySpec) and not callable(getattr(policy, "act", None)) \
                and not callable(policy):
            raise ConfigurationError(f"cannot use a {type(policy).__name__} as a policy",
                                     hint="pass a Policy, a PolicySpec, a spec string such "
                                          "as 'reference', or a function of the context")
        return self._dispatch.prepare(policy)

    def _make_job(self, task: Task | Mapping[str, Any], policy: Any, sample: int
                  ) -> RolloutJob:
        if not isinstance(task, Task):
            task = Task.model_validate(dict(task))
        return RolloutJob(task=task, policy=policy, settings=self._settings, sample=sample)

    def _refused(self, job: RolloutJob) -> EpisodeStateError:
        return EpisodeStateError("the runner was cancelled; no new rollouts start",
                                 hint=f"create a new {type(self).__name__}",
                                 task=job.task.key)

    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeStateError("the runner is closed",
                                    hint=f"create a new {type(self).__name__}")

    # ------------------------------------------------------------------ slots

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

    async def _take_slot_async(self) -> bool:
        """`_take_slot` for a coroutine, woken by the next rollout that finishes."""
        while True:
            freed: Future[None] = Future()
            with self._lock:  # before trying: a slot freed after the try wakes it
                self._slot_waiters.append(freed)
            if self._take_slot(blocking=False):
                break
            if self._cancelled:
                return False
            with anyio.move_on_after(_POLL_S):
                await runtime.await_future(freed)
            self._progress.tick()
        if self._cancelled:
            self._slots.release()
            return False
        return True

    def _free_slot(self) -> None:
        self._slots.release()
        with self._lock:  # after the release: a waiter that missed it is woken
            waiters, self._slot_waiters = self._slot_waiters, []
        for waiter in waiters:
            if waiter.set_running_or_notify_cancel():
                waiter.set_result(None)

    # ------------------------------------------------------------------ one rollout

    def _start(self, job: RolloutJob) -> AwaitableFuture[RolloutResult]:
        """Hand the job to the dispatch (a slot is held); the returned future resolves
        to a result whatever happens to the job."""
        outer: AwaitableFuture[RolloutResult] = AwaitableFuture()
        # Running at once: cancelling this future could not stop an episode elsewhere.
        outer.set_running_or_notify_cancel()
        # The caller's context (its trace span) for the job and its replayed events; the
        # job's calls are this run's, for `close()` to abandon (`calls_owner`).
        context = contextvars.copy_context()
        context.run(calls_owner.set, self._token)
        try:
            inner = context.run(self._dispatch.start, job)
        except Exception as exc:  # a broken or shut-down pool: this rollout fails, not us
            self._free_slot()
            self._worker_lost = True
            outer.set_result(worker_failed(job, exc, "the rollout could not start"))
            self._progress.finished(failed=True, reward=None)
            return outer
        with self._lock:
            self._running[outer] = inner
        self._progress.started()
        inner.add_done_callback(lambda f: self._finished(job, f, outer, context))
        return outer

    def _finished(self, job: RolloutJob, inner: Future[Any], outer: Future[RolloutResult],
                  context: contextvars.Context) -> None:
        """The dispatch's callback (any thread): turn whatever came back into a result."""
        try:
            result = context.run(self._result_of, job, inner)
        except Exception as exc:  # never leave the caller's future unresolved
            result = worker_failed(job, exc, "could not read the rollout's outcome")
        finally:
            with self._lock:
                self._running.pop(outer, None)
            self._free_slot()
        self._progress.finished(failed=result.error is not None, reward=result.reward)
        if self.traces is not None and not _never_started(result):
            self.traces.submit(result)  # never blocks: a bounded queue, counted if full
        outer.set_result(result)

    def _result_of(self, job: RolloutJob, inner: Future[Any]) -> RolloutResult:
        if inner.cancelled():
            return cancelled_result(job)
        exc = inner.exception()
        if exc is None:
            value = inner.result()
            if isinstance(value, JobOutcome):
                for event in value.events:
                    try:
                        self.events.emit(event)
                    except Exception:  # strict accounting raising must not lose the result
                        logger.exception("re-emitting a worker's %s event failed",
                                         event.kind)
                return value.result
            if isinstance(value, RolloutResult):
                return value
            raise TypeError(f"the worker returned a {type(value).__name__}")
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C reached a worker process
            return cancelled_result(job, "the worker was interrupted")
        if isinstance(exc, RolloutCancelled):
            return cancelled_result(job, exc.message)
        self._worker_lost = True
        return worker_failed(job, exc, "the rollout's worker failed")

    # ------------------------------------------------------------------ iterating

    def _iterate(self, jobs: Iterator[RolloutJob], total: int | None
                 ) -> Iterator[RolloutResult]:
        finished: queue.SimpleQueue[Future[RolloutResult]] = queue.SimpleQueue()
        outstanding: set[Future[RolloutResult]] = set()
        self._set_total(total)
        exhausted = False
        try:
            while True:
                while not exhausted and not self._cancelled:
                    if not self._take_slot(blocking=not outstanding):
                        break
                    exhausted = not self._start_next(jobs, outstanding, finished.put)
                if not outstanding:
                    return
                try:
                    future = finished.get(timeout=_POLL_S)
                except queue.Empty:
                    self._progress.tick()
                    continue
                outstanding.discard(future)
                yield future.result()
        except KeyboardInterrupt:
            self.cancel()
            raise
        finally:
            self._drop_queued(outstanding)
            self._progress.close()

    async def _iterate_async(self, jobs: Iterator[RolloutJob], total: int | None
                             ) -> AsyncIterator[RolloutResult]:
        """`_iterate` for ``async for``: the same slots, order and early-exit rule;
        waiting is a done-callback that wakes the caller's loop."""
        outstanding: set[Future[RolloutResult]] = set()
        finishing = _Finished()
        self._set_total(total)
        exhausted = False
        try:
            while True:
                while not exhausted and not self._cancelled:
                    took = (await self._take_slot_async() if not outstanding
                            else self._take_slot(blocking=False))
                    if not took:
                        break
                    exhausted = not self._start_next(jobs, outstanding, finishing.add)
                if not outstanding:
                    return
                finished = finishing.take()
                if not finished:
                    await finishing.wait(_POLL_S)
                    self._progress.tick()
                    continue
                for future in finished:
                    outstanding.discard(future)
                    yield future.result()
        finally:
            self._drop_queued(outstanding)
            self._progress.close()

    def _set_total(self, total: int | None) -> None:
        progress = self._progress
        progress.set_total(None if total is None else progress.done + progress.running + total)

    def _start_next(self, jobs: Iterator[RolloutJob], outstanding: set[Future[RolloutResult]],
                    on_done: Callable[[Future[RolloutResult]], object]) -> bool:
        """Start the next job of a run (a slot is held: given back if there is none)."""
        try:
            job = next(jobs, None)
        except BaseException:
            self._slots.release()
            raise
        if job is None:
            self._slots.release()
            return False
        started = self._start(job)
        outstanding.add(started)
        started.add_done_callback(on_done)
        return True

    def _drop_queued(self, outstanding: Iterable[Future[RolloutResult]]) -> None:
        """A run left early (break, or an error in the loop body): its rollouts still
        queued are cancelled; the running ones finish (close() waits)."""
        with self._lock:
            queued = [self._running.get(f) for f in outstanding]
        for inner in queued:
            if inner is not None:
                inner.cancel()

    # ------------------------------------------------------------------ stopping

    def cancel(self) -> None:
        """Stop the run now (idempotent): close this runner's live envs, cancel queued
        rollouts, then delete every instance tagged with ``run_tags``."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            running = list(self._running.values())
        # Queued rollouts first, or the workers the closed envs free would start them.
        for future in running:
            future.cancel()
        self._token.cancel()
        self._dispatch.cancel()
        self._sweep()

    def _sweep(self, tags: list[str] | None = None) -> None:
        """Delete every running instance tagged with ``tags`` (default: ``run_tags``)."""
        swept: list[str] = []
        for tag in tags or self.run_tags:
            try:
                swept += self.session.sweep(tag)
            except Exception as exc:  # cleanup goes on; TTLs reap what a failed sweep left
                logger.warning("could not sweep instances tagged %s: %s (they expire with "
                               "their TTL; `fleetenv` can sweep leftovers later)", tag, exc)
        if swept:
            logger.info("deleted %d instance(s) of run %s", len(swept), self.run_tag)

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for running rollouts (at most ``timeout_s`` seconds, default: the longest
        an episode can take under this config), cancel what still runs, release the
        workers, delete what the run left, close a session the runner made. Idempotent."""
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
            # Ctrl-C or SIGTERM while waiting: stop now, or interpreter exit waits for them.
            self.cancel()
            self._dispatch.close(wait=False)
            if self.traces is not None:
                self.traces.close(timeout_s=0)  # interrupted: stop uploading, count the rest
            raise
        if not_done and not self._cancelled:
            logger.warning("%d rollout(s) still running after %.0f s; cancelling them",
                           len(not_done), bound)
            self.cancel()
            _, not_done = concurrent.futures.wait(not_done, timeout=_CANCEL_GRACE_S)
        if not_done:
            # Held by calls that do not answer: give them up, or exit waits out their budgets.
            abandon_calls("the run was cancelled", grace_s=0, owner=self._token)
            self._dispatch.abandon()
            _, not_done = concurrent.futures.wait(not_done, timeout=_CANCEL_GRACE_S)
        self._dispatch.close(wait=not not_done)
        if self._cancelled or self._worker_lost or not self._dispatch.in_process:
            # What nobody here deletes: creates late for a cancel, dead or remote workers'.
            self._sweep()
        elif not not_done:  # leftovers of uncertain creates, if any happened
            try:
                self.session.provisioner.sweep(self.run_tag)
            except Exception as exc:  # TTLs reap what a failed sweep left
                logger.warning("could not sweep leftovers tagged %s: %s", self.run_tag, exc)
        self.session.instances.remove_sweeper(self._sweep)
        if self.traces is not None:  # before the session closes its HTTP client
            self.traces.close()
        if self._owns_session:
            self.session.close()
        self._progress.close()

    async def cancel_async(self) -> None:
        """`cancel` for async code (its control-plane calls run on the runtime's pool)."""
        await _on_pool(self.cancel)

    async def close_async(self, timeout_s: float | None = None) -> None:
        """`close` for async code: waits for running rollouts without blocking the
        caller's loop (on the runtime's pool)."""
        await _on_pool(lambda: self.close(timeout_s))

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

    async def __aenter__(self) -> Runner:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            await self.cancel_async()
        await self.close_async()


class _Finished:
    """Futures as they finish, for one ``async for``: a wake-up future the waiting
    coroutine awaits, set by the first rollout that finishes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: list[Future[RolloutResult]] = []
        self._wake: Future[None] | None = None

    def add(self, future: Future[RolloutResult]) -> None:
        with self._lock:
            self._done.append(future)
            wake, self._wake = self._wake, None
        if wake is not None and wake.set_running_or_notify_cancel():
            wake.set_result(None)

    def take(self) -> list[Future[RolloutResult]]:
        with self._lock:
            done, self._done = self._done, []
            return done

    async def wait(self, timeout: float) -> None:
        """Return when a future finished since the last `take`, or after ``timeout``."""
        with self._lock:
            if self._done:
                return
            wake = self._wake = Future()
        with anyio.move_on_after(timeout):
            await runtime.await_future(wake)


async def _on_pool(fn: Callable[[], object]) -> None:
    """Await ``fn()`` run on the runtime's pool. It runs to its end even if the awaiting
    task is cancelled meanwhile: what it does (closing a runner) must happen."""
    future = runtime.current().submit_blocking(fn)
    await runtime.await_future(_Shield(future))
    future.result()


def _never_started(result: RolloutResult) -> bool:
    """A rollout cancelled before it began has nothing to trace."""
    return result.stop_reason is StopReason.CANCELLED and not result.transcript
