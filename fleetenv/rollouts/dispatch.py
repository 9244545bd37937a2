"""How a `Runner`'s episodes run: the one moving part behind it, as httpx puts its
transports behind its client.

The Runner keeps what every run shares (slots, iteration, results, progress, cancel and
sweep, close); a :class:`Dispatch` only starts rollouts and stops what it started. The
kinds (``Runner(mode=...)``): `ThreadDispatch`, `LoopDispatch` (asyncio), `AutoDispatch`
(one of those two per policy), `ProcessDispatch`, and ``RayDispatch`` in
``fleetenv.rollouts.ray_runner`` (Ray is imported there, lazily).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import multiprocessing
import threading
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from fleetenv import runtime
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.types import RolloutResult
from fleetenv.fleet.session import Session
from fleetenv.rollouts.jobs import (
    RolloutJob,
    RolloutSettings,
    cancelled_result,
    check_sendable,
    job_plan,
    run_job,
    run_job_collecting_events,
    worker_config,
)
from fleetenv.rollouts.policy_spec import PolicySpec
from fleetenv.rollouts.rollout import CancelToken, is_async_policy, runs_on_loop
from fleetenv.runtime.plans import run_async

__all__ = ["MODES", "AutoDispatch", "Dispatch", "LoopDispatch", "ProcessDispatch",
           "ThreadDispatch", "make_dispatch"]

#: The values of ``Runner(mode=...)``.
MODES = ("auto", "threads", "asyncio", "processes")


class Dispatch:
    """Starts a Runner's rollouts somewhere. The defaults suit an in-process dispatch,
    whose episodes the Runner's `CancelToken` reaches and whose session is the Runner's."""

    #: The ``Runner.mode`` it stands for.
    mode = "threads"
    #: Whether it can await an async policy (episodes on an event loop).
    awaits = False
    #: Whether jobs run in this process (with live objects), or are sent to workers.
    in_process = True

    def prepare(self, policy: Any) -> Any:
        """Check a policy once per run (not per rollout: a typo in a spec should fail
        here, not as 10 000 error results); return what the jobs carry."""
        if is_async_policy(policy) and not self.awaits:
            raise ConfigurationError(f"an async policy cannot run in mode={self.mode!r}",
                                     hint="use Runner(mode='asyncio') or the default "
                                          "mode='auto'", field="mode")
        if isinstance(policy, PolicySpec) and self.in_process:
            policy.build()  # a worker elsewhere may import what this process cannot
        return policy

    def start(self, job: RolloutJob) -> Future[Any]:
        """Start ``job``. The future stays pending while the job is queued (cancelling it
        drops the job), resolves to a ``RolloutResult`` or a ``JobOutcome``, and fails
        only when the worker did (the Runner records a ``RolloutWorkerError``)."""
        raise NotImplementedError

    def tags(self) -> list[str]:
        """The tags of the instances its workers create outside this process (the Runner
        sweeps them); none in process, where the Runner's session knows its instances."""
        return []

    def cancel(self) -> None:
        """Stop the episodes that the Runner's `CancelToken` does not reach."""

    def abandon(self) -> None:
        """Stop what still runs after ``close()``'s grace (workers blocked on calls that
        never answer)."""

    def close(self, *, wait: bool) -> None:
        """Release the workers, waiting for them when ``wait``."""


class _Pool(Dispatch):
    """A dispatch over an ``Executor``: the given one, or one of ``workers`` it makes on
    first use (a runner whose rollouts all run on the loop never starts a pool)."""

    def __init__(self, workers: int, executor: Executor | None) -> None:
        self.workers = workers
        self._given = executor
        self._made: Executor | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        given = f": {type(self._given).__name__}" if self._given is not None else ""
        return f"{self.mode}{given}, workers={self.workers}"

    def _make(self) -> Executor:
        raise NotImplementedError

    @property
    def executor(self) -> Executor:
        if self._given is not None:
            return self._given
        with self._lock:
            if self._made is None:
                self._made = self._make()
            return self._made

    def close(self, *, wait: bool) -> None:
        if self._made is not None:
            self._made.shutdown(wait=wait, cancel_futures=True)


class ThreadDispatch(_Pool):
    """A thread per running episode (the Runner's ``fleetenv-rollout`` pool, or any
    in-process executor); jobs get the live objects: the policy as given, the session,
    the Runner's bus and token."""

    def __init__(self, workers: int, executor: Executor | None, *, session: Session,
                 events: EventBus, cancel: CancelToken) -> None:
        super().__init__(workers, executor)
        self._session, self._events, self._cancel = session, events, cancel

    def _make(self) -> Executor:
        return ThreadPoolExecutor(self.workers, thread_name_prefix="fleetenv-rollout")

    def start(self, job: RolloutJob) -> Future[Any]:
        # In the caller's context (its trace span, whose calls these are): a copy per job.
        return self.executor.submit(contextvars.copy_context().run, self._run, job)

    def _run(self, job: RolloutJob) -> RolloutResult:
        return run_job(job, session=self._session, events=self._events, cancel=self._cancel)


class ProcessDispatch(_Pool):
    """Worker processes (a spawn pool of ``workers`` it makes, or the executor given):
    jobs are pickled, each worker runs them on a session of its own for the run, built
    from settings with the caps divided among the workers, and sends back the events
    with the result."""

    mode = "processes"
    in_process = False

    def __init__(self, workers: int, executor: Executor | None, *,
                 settings: RolloutSettings) -> None:
        super().__init__(workers, executor)
        self._settings = dataclasses.replace(
            settings, config=worker_config(settings.config, workers))

    def _make(self) -> Executor:
        return ProcessPoolExecutor(self.workers,
                                   mp_context=multiprocessing.get_context("spawn"))

    def prepare(self, policy: Any) -> Any:
        check_sendable(super().prepare(policy), "a worker process")
        return policy

    def start(self, job: RolloutJob) -> Future[Any]:
        return self.executor.submit(run_job_collecting_events,
                                    dataclasses.replace(job, settings=self._settings))

    def tags(self) -> list[str]:
        return [self._settings.run_tag] if self._settings.run_tag else []

    def abandon(self) -> None:
        """SIGTERM the processes of a pool it made (each deletes what it holds on the way
        out): ``terminate_workers`` on Python 3.14+, the pool's processes before."""
        pool = self._made
        terminate = getattr(pool, "terminate_workers", None)
        if callable(terminate):
            terminate()
            return
        processes: dict[Any, Any] = getattr(pool, "_processes", None) or {}
        for process in list(processes.values()):
            with contextlib.suppress(Exception):  # already gone
                process.terminate()


class LoopDispatch(Dispatch):
    """Episodes as coroutines on fleetenv's loop, with no thread of their own: the
    blocking parts (provisioning, verification, deletion, a sync policy) on the runtime's
    bounded pool, an async or scripted policy on the loop.

    ``min(workers, max_live_instances)`` run at once: a running episode holds at most one
    instance, so provisioning never waits for a live-instance slot while holding a pool
    thread that another episode needs to delete its instance (which could deadlock the
    bounded pool). A job waiting for its place is pending (cancellable), as in a queue.
    """

    mode = "asyncio"
    awaits = True

    def __init__(self, workers: int, *, session: Session, events: EventBus,
                 cancel: CancelToken) -> None:
        self.workers = workers
        self.places = max(1, min(workers, session.config.max_live_instances))
        self._session, self._events, self._cancel = session, events, cancel
        self._gate: asyncio.Semaphore | None = None
        self._gate_generation = -1
        self._tasks: set[Future[None]] = set()

    def __repr__(self) -> str:
        return f"asyncio, workers={self.workers}"

    def start(self, job: RolloutJob) -> Future[Any]:
        outcome: Future[RolloutResult] = Future()
        task = runtime.current().submit(self._run, job, outcome,
                                        name=f"fleetenv-rollout {job.task.key}#{job.sample}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return outcome

    def _running_gate(self) -> asyncio.Semaphore:
        """Made on the loop, once per runtime (a new loop after shutdown or fork)."""
        if self._gate is None or self._gate_generation != runtime.current().generation:
            self._gate = asyncio.Semaphore(self.places)
            self._gate_generation = runtime.current().generation
        return self._gate

    async def _run(self, job: RolloutJob, outcome: Future[RolloutResult]) -> None:
        try:
            async with self._running_gate():
                if not outcome.set_running_or_notify_cancel():
                    return  # cancelled while it waited for a place: never started
                try:
                    result = await run_async(job_plan(
                        job, session=self._session, events=self._events, cancel=self._cancel),
                        finish_here=True)
                except asyncio.CancelledError:  # the loop is shutting down
                    outcome.set_result(cancelled_result(
                        job, "the fleetenv loop stopped the rollout"))
                    raise
                except Exception as exc:  # never leave the runner's future unresolved
                    outcome.set_exception(exc)
                    return
                outcome.set_result(result)
        except asyncio.CancelledError:
            outcome.cancel()  # still queued (a no-op once it has a result)
            raise

    def abandon(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class AutoDispatch(Dispatch):
    """``mode="auto"`` without an executor: the loop for the policies that cost it
    nothing (`runs_on_loop`), a thread per episode for any other."""

    mode = "auto"
    awaits = True

    def __init__(self, loop: LoopDispatch, threads: ThreadDispatch) -> None:
        self._loop = loop
        self._threads = threads

    def __repr__(self) -> str:
        return f"auto, workers={self._loop.workers}"

    def start(self, job: RolloutJob) -> Future[Any]:
        return (self._loop if runs_on_loop(job.policy) else self._threads).start(job)

    def abandon(self) -> None:
        self._loop.abandon()

    def close(self, *, wait: bool) -> None:
        self._threads.close(wait=wait)


def make_dispatch(mode: object, executor: Executor | None, *, workers: int,
                  session: Session, events: EventBus, cancel: CancelToken,
                  settings: RolloutSettings) -> Dispatch:
    """The dispatch of ``Runner(mode=..., executor=...)``, the mode checked where given."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ConfigurationError(f"Runner(mode={mode!r:.40}) is not a known mode",
                                 hint=f"use one of {', '.join(MODES)}", field="mode")
    if executor is not None and mode == "asyncio":
        raise ConfigurationError("mode='asyncio' runs episodes on fleetenv's loop and "
                                 "takes no executor",
                                 hint="drop executor=, or use mode='threads' / 'processes'",
                                 field="mode")
    if executor is not None and mode == "auto":
        mode = "threads" if isinstance(executor, ThreadPoolExecutor) else "processes"
    if mode == "processes":
        return ProcessDispatch(workers, executor, settings=settings)
    threads = ThreadDispatch(workers, executor, session=session, events=events,
                             cancel=cancel)
    if mode == "threads":
        return threads
    loop = LoopDispatch(workers, session=session, events=events, cancel=cancel)
    return loop if mode == "asyncio" else AutoDispatch(loop, threads)

