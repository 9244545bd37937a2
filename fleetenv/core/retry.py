"""The one retry and deadline policy: jittered exponential backoff inside a total budget.

Every layer that retries (provisioning, deletion, the verifier, MCP session setup, a
policy calling a model server) uses this module, so "how long to wait" and "when to give
up" have one definition. Tool calls are never retried through it: a call that may have
run must not be replayed.

What may be retried is decided by the caller's ``retryable`` predicate, usually
``lambda exc: getattr(exc, "retryable", False)`` over fleetenv's typed errors; never by
matching message text.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Backoff", "Deadline", "RetryPolicy", "is_retryable"]

T = TypeVar("T")

#: Called before each pause: (attempt number that failed, 1-based; delay in s; error).
RetryListener = Callable[[int, float, Exception], None]
#: Turns the last error into the one to raise when the budget or attempts run out.
GiveUp = Callable[[Exception, int], Exception]


def is_retryable(exc: BaseException) -> bool:
    """The default predicate: fleetenv errors say themselves (``err.retryable``)."""
    return bool(getattr(exc, "retryable", False))


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with "equal jitter": delay n is uniform in [c/2, c],
    where c = min(cap, base * 2**n).

    The jitter spreads a burst of clients that failed together (a rate limit hits every
    worker at once) instead of having them retry in lockstep; the floor of c/2 keeps a
    real pause, which a server that just said 429 needs.
    """

    base: float = 0.5
    cap: float = 10.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        ceiling = min(self.cap, self.base * (2 ** min(attempt, 30)))
        return self.rng.uniform(ceiling / 2, ceiling)


class Deadline:
    """A point in monotonic time that several steps share.

    Passing one object down (instead of a timeout per step) is what keeps the total
    of a provisioning with retries, polls and readiness checks inside its budget.
    """

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._end = None if seconds is None else time.monotonic() + seconds

    def __repr__(self) -> str:
        remaining = self.remaining()
        left = "none" if remaining is None else f"{remaining:.1f} s left"
        return f"Deadline({left})"

    def remaining(self) -> float | None:
        """Seconds left (never negative), or ``None`` for no deadline."""
        if self._end is None:
            return None
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        remaining = self.remaining()
        return remaining is not None and remaining <= 0.0

    def cap(self, seconds: float) -> float:
        """``seconds`` shortened to what is left of the deadline."""
        remaining = self.remaining()
        return seconds if remaining is None else min(seconds, remaining)

    def extend(self, seconds: float, *, limit: Deadline | None = None) -> None:
        """Move the end ``seconds`` later, never past ``limit``'s end: for time spent
        waiting in a queue that should not count against this budget."""
        if self._end is None or seconds <= 0:
            return
        end = self._end + seconds
        if limit is not None and limit._end is not None:
            end = max(self._end, min(end, limit._end))
        self._end = end


#: The least time worth starting another attempt with: a shorter one only fails with
#: "deadline exceeded", which would hide the real answer (connection refused, a 503).
MIN_ATTEMPT_S = 0.05


@dataclass(frozen=True)
class RetryPolicy:
    """Retry what is worth retrying, with jittered backoff, until the budget is spent.

    ``budget_s`` bounds the whole operation, attempts and pauses together (``None``: only
    ``max_attempts`` bounds it). A retry is skipped when its pause would not end before
    the budget does, with at least ``MIN_ATTEMPT_S`` left for the attempt: waiting just to
    fail helps nobody.
    """

    base_s: float = 1.0
    cap_s: float = 20.0
    budget_s: float | None = 600.0
    max_attempts: int | None = None
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    queue_budget_s: float | None = None
    """How long the operation may wait in a shared queue (MCP session setups queue for a
    process-wide slot) without that wait counting against ``budget_s``. ``None``: time
    queued counts against ``budget_s`` like any other."""

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {self.base_s}, {self.cap_s}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    @property
    def backoff(self) -> Backoff:
        return Backoff(base=self.base_s, cap=self.cap_s, rng=self.rng)

    def with_budget(self, budget_s: float | None, *,
                    max_attempts: int | None = None) -> RetryPolicy:
        """The same pacing for an operation with another budget (e.g. a delete)."""
        return RetryPolicy(base_s=self.base_s, cap_s=self.cap_s, budget_s=budget_s,
                           max_attempts=max_attempts, rng=self.rng)

    def deadline(self) -> Deadline:
        """A fresh deadline for one operation under this policy."""
        return Deadline(self.budget_s)

    def next_delay(self, failures: int, deadline: Deadline) -> float | None:
        """The pause before the next attempt after ``failures`` failed attempts, or
        ``None`` when the attempts or the budget are used up."""
        if self.max_attempts is not None and failures >= self.max_attempts:
            return None
        delay = self.backoff.delay(failures - 1)
        remaining = deadline.remaining()
        if remaining is not None and remaining <= delay + MIN_ATTEMPT_S:
            return None
        return delay

    def call(
        self,
        fn: Callable[[], T],
        *,
        retryable: Callable[[Exception], bool] = is_retryable,
        deadline: Deadline | None = None,
        on_retry: RetryListener | None = None,
        give_up: GiveUp | None = None,
    ) -> T:
        """Run ``fn`` (blocking) until it succeeds, fails for good, or the budget ends.

        A non-retryable error is raised at once, as itself. When retries run out,
        ``give_up(last_error, attempts)`` (if given) builds the error to raise, chained
        to the last one; otherwise the last error is raised.
        """
        deadline = deadline or self.deadline()
        failures = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                failures += 1
                delay = self._pause_or_raise(exc, failures, deadline, retryable, on_retry,
                                             give_up)
            time.sleep(delay)  # a retry pause inside the budget, not a readiness wait

    async def acall(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        retryable: Callable[[Exception], bool] = is_retryable,
        deadline: Deadline | None = None,
        on_retry: RetryListener | None = None,
        give_up: GiveUp | None = None,
    ) -> T:
        """The coroutine twin of :meth:`call` (pauses with ``anyio.sleep``)."""
        import anyio

        deadline = deadline or self.deadline()
        failures = 0
        while True:
            try:
                return await fn()
            except Exception as exc:
                failures += 1
                delay = self._pause_or_raise(exc, failures, deadline, retryable, on_retry,
                                             give_up)
            await anyio.sleep(delay)

    def _pause_or_raise(self, exc: Exception, failures: int, deadline: Deadline,
                        retryable: Callable[[Exception], bool],
                        on_retry: RetryListener | None, give_up: GiveUp | None) -> float:
        """After a failed attempt: the pause before the next one, or raise (called inside
        the ``except`` block, so a bare ``raise`` re-raises the attempt's own error)."""
        worth_it = retryable(exc)
        delay = self.next_delay(failures, deadline) if worth_it else None
        if delay is None:
            if give_up is None or not worth_it:
                raise exc
            raise give_up(exc, failures) from exc
        if on_retry is not None:
            on_retry(failures, delay, exc)
        return delay
