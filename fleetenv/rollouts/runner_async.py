"""The awaitable half of ``Runner``: waiting for slots and results without a thread.

An async trainer (asyncio or trio) awaits ``Runner.submit_async`` / ``run_async``; its
loop stays free while rollouts run, and no thread is parked per call: waiting for a free
slot or the next result is a done-callback on the rollouts' futures that wakes the
caller's loop (:func:`fleetenv.runtime.await_future`). Only ``close_async`` /
``cancel_async`` (once per runner, and made of blocking control-plane calls) take a
thread of the runtime's pool.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

import anyio

from fleetenv import runtime
from fleetenv.rollouts.futures import _Shield

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.types import RolloutResult
    from fleetenv.rollouts.jobs import RolloutJob
    from fleetenv.rollouts.runner import Runner

__all__ = ["iterate_async", "on_pool", "take_slot_async"]

T = TypeVar("T")

#: How often an async wait wakes up to redraw the progress bar and notice a cancel.
_POLL_S = 0.25


async def take_slot_async(runner: Runner) -> bool:
    """``Runner._take_slot(blocking=True)`` for a coroutine: it waits to be woken by
    the next rollout that finishes (which frees a slot), not on the semaphore."""
    while True:
        if runner._take_slot(blocking=False):
            if runner.cancelled:
                runner._slots.release()
                return False
            return True
        if runner.cancelled:
            return False
        freed: Future[None] = Future()
        with runner._lock:
            runner._slot_waiters.append(freed)
        if runner._take_slot(blocking=False):  # freed between the first try and now
            freed.cancel()
            if runner.cancelled:
                runner._slots.release()
                return False
            return True
        with anyio.move_on_after(_POLL_S):
            await runtime.await_future(freed)
        runner._progress.tick()


class _Finished:
    """Futures as they finish, for one ``async for``: one done-callback per rollout (a
    wait adds none), and a wake-up future the waiting coroutine awaits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: list[Future[RolloutResult]] = []
        self._wake: Future[None] | None = None

    def watch(self, future: Future[RolloutResult]) -> None:
        future.add_done_callback(self._finished)

    def _finished(self, future: Future[RolloutResult]) -> None:
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
        """Return when a watched future finished since the last `take`, or after
        ``timeout`` seconds."""
        with self._lock:
            if self._done:
                return
            wake = self._wake = Future()
        with anyio.move_on_after(timeout):
            await runtime.await_future(wake)


async def iterate_async(runner: Runner, jobs: Iterator[RolloutJob],
                        total: int | None) -> AsyncIterator[RolloutResult]:
    """``Runner._iterate`` for ``async for``: the same slots, order and early-exit rule
    (leaving the loop, or cancelling the consuming task, cancels queued rollouts)."""
    outstanding: set[Future[RolloutResult]] = set()
    finishing = _Finished()
    progress = runner._progress
    progress.set_total(None if total is None else progress.done + progress.running + total)
    exhausted = False
    try:
        while True:
            while not exhausted and not runner.cancelled:
                took = (await take_slot_async(runner) if not outstanding
                        else runner._take_slot(blocking=False))
                if not took:
                    break
                job = next(jobs, None)
                if job is None:
                    runner._slots.release()
                    exhausted = True
                    break
                started = runner._start(job)
                outstanding.add(started)
                finishing.watch(started)
            if not outstanding:
                return
            finished = finishing.take()
            if not finished:
                await finishing.wait(_POLL_S)
                progress.tick()
                continue
            for future in finished:
                outstanding.discard(future)
                yield future.result()
    finally:
        runner._drop_queued(outstanding)
        progress.close()


async def on_pool(fn: Callable[[], T]) -> T:
    """Await ``fn()`` run on the runtime's pool. It runs to its end even if the awaiting
    task is cancelled meanwhile: what it does (closing a runner) must happen."""
    future = runtime.current().submit_blocking(fn)
    await runtime.await_future(_Shield(future))
    return future.result()
