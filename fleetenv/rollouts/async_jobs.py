"""The Runner's asyncio mode: rollouts as coroutines on fleetenv's one loop.

Each rollout is a task on the ``fleetenv-loop`` thread (no thread per episode): MCP work
is awaited there directly; the blocking parts of an episode (provisioning, verification,
deletion, through fleet-python) and a sync policy run on the runtime's bounded pool, an
async or scripted policy on the loop (see ``rollout``).

To the Runner it looks like an executor: :meth:`LoopEpisodes.start` returns a
``concurrent.futures.Future`` that stays *pending* while the rollout waits for one of
the ``workers`` running places (so ``Runner.cancel()`` cancels it, as a thread pool
cancels a queued job), turns *running* when it starts, and resolves to its
``RolloutResult``.

Running places are ``min(workers, max_live_instances)``: a running episode holds at
most one instance, so provisioning never waits for a live-instance slot while holding a
pool thread that another episode needs to delete its instance (which could deadlock the
bounded pool). Each running episode uses at most one pool thread at a time; episodes
beyond the pool's bound queue for a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from concurrent.futures import Future

from fleetenv import runtime
from fleetenv.core.errors import RolloutCancelled
from fleetenv.core.event_bus import EventBus
from fleetenv.core.types import RolloutResult, StopReason
from fleetenv.fleet.session import Session
from fleetenv.rollouts.jobs import RolloutJob, blame_cancellation, failed_result
from fleetenv.rollouts.rollout import CancelToken, run_episode_async

__all__ = ["LoopEpisodes"]


class LoopEpisodes:
    """Runs a runner's rollouts on fleetenv's loop; see the module docstring."""

    def __init__(self, *, workers: int, session: Session, events: EventBus,
                 cancel: CancelToken) -> None:
        config = session.config
        self.running_places = max(1, min(workers, config.max_live_instances))
        self._session = session
        self._events = events
        self._cancel = cancel
        self._gate: asyncio.Semaphore | None = None
        self._gate_generation = -1
        self._tasks: set[Future[None]] = set()

    def start(self, job: RolloutJob) -> Future[RolloutResult]:
        """Schedule ``job`` on the loop; see the module docstring for the future's states."""
        outcome: Future[RolloutResult] = Future()
        task = runtime.current().submit(self._run, job, outcome,
                              name=f"fleetenv-rollout {job.task.key}#{job.sample}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return outcome

    def _running_gate(self) -> asyncio.Semaphore:
        """Created on the loop, once per runtime (a new loop after shutdown or fork)."""
        if self._gate is None or self._gate_generation != runtime.current().generation:
            self._gate = asyncio.Semaphore(self.running_places)
            self._gate_generation = runtime.current().generation
        return self._gate

    async def _run(self, job: RolloutJob, outcome: Future[RolloutResult]) -> None:
        try:
            async with self._running_gate():
                if not outcome.set_running_or_notify_cancel():
                    return  # cancelled while it waited for a place: never started
                try:
                    result = await self._episode(job)
                except asyncio.CancelledError:  # the loop is shutting down
                    outcome.set_result(failed_result(
                        job, RolloutCancelled("the fleetenv loop stopped the rollout"),
                        stop_reason=StopReason.CANCELLED))
                    raise
                except Exception as exc:  # never leave the runner's future unresolved
                    outcome.set_exception(exc)
                    return
                outcome.set_result(result)
        except asyncio.CancelledError:
            outcome.cancel()  # still queued (a no-op once it has a result)
            raise

    async def _episode(self, job: RolloutJob) -> RolloutResult:
        """`run_job` for the loop: same early exit, same cancellation rule."""
        cancel = self._cancel
        if cancel.is_set():  # picked up after the run was cancelled
            return failed_result(job, RolloutCancelled("the run was cancelled before this "
                                                       "rollout started"),
                                 stop_reason=StopReason.CANCELLED)
        settings = job.settings
        result = await run_episode_async(
            job.task, job.policy, session=self._session, sample=job.sample,
            events=self._events, options=settings.options,
            system_prompt=settings.system_prompt, cancel=cancel)
        if cancel.is_set():
            blame_cancellation(result)
        return result

    def stop(self, *, wait: bool) -> None:
        """Cancel the loop tasks still there (only after the runner gave up waiting for
        them)."""
        if not wait:
            for task in list(self._tasks):
                task.cancel()
            concurrent.futures.wait(list(self._tasks), timeout=5)
