"""Retry timing: jittered exponential backoff inside a total budget.

Plain computation, no I/O and no sleeping, so every layer that retries (provisioning,
MCP listing, policies calling a model server) shares one definition of "how long to
wait" and tests can check the schedule without waiting for it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field


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
