"""Futures that blocking code waits on and async code awaits: Tinker's ``APIFuture`` shape.

``Runner.submit`` returns an :class:`AwaitableFuture`: a real
``concurrent.futures.Future`` (so ``.result()``, ``concurrent.futures.wait`` and
``as_completed`` keep working), which an asyncio or trio coroutine may also ``await``
(or ``await fut.result_async(timeout=...)``). Awaiting parks no thread: the caller's loop
is woken by a done-callback (:func:`fleetenv.runtime.await_future`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Generator
from typing import Any, TypeVar

from fleetenv import runtime

__all__ = ["AwaitableFuture"]

T = TypeVar("T")


class AwaitableFuture(concurrent.futures.Future[T]):
    """A ``concurrent.futures.Future`` that asyncio and trio callers can ``await``."""

    def __await__(self) -> Generator[Any, None, T]:
        return runtime.await_future(self).__await__()

    async def result_async(self, timeout: float | None = None) -> T:
        """Await the result; after ``timeout`` seconds raise
        ``concurrent.futures.TimeoutError``, as ``result(timeout)`` does. Timing out
        does not cancel the work (``Runner`` futures cannot be cancelled anyway)."""
        if timeout is None:
            return await runtime.await_future(self)
        import anyio

        with anyio.move_on_after(timeout):
            await runtime.await_future(_Shield(self))
        if not self.done():
            raise concurrent.futures.TimeoutError(
                f"the result was not ready within {timeout:g} s")
        return self.result()


class _Shield(concurrent.futures.Future[Any]):
    """Done when ``inner`` is; cancelling it leaves ``inner`` alone (``await_future``
    cancels what it awaits when its caller is cancelled, a timeout included)."""

    def __init__(self, inner: concurrent.futures.Future[Any]) -> None:
        super().__init__()
        inner.add_done_callback(self._settle)

    def _settle(self, _: concurrent.futures.Future[Any]) -> None:
        if self.set_running_or_notify_cancel():
            self.set_result(None)
