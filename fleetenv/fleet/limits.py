"""Caps on instances: per session (creating at once, live), and Fleet's own per-key limit.

Fleet creates slowly and teams have instance limits, so unbounded parallel rollouts turn
into queues of timeouts and 403s. Two kinds of limit apply, with different owners:

* :class:`Gate` — a cap a :class:`~fleetenv.Session` chose (``max_creating_instances``,
  ``max_live_instances``). Each session has its own gates: two sessions with different
  settings in one process each get what they asked for.
* :class:`KeyLimiter` — Fleet's rate limits are per API key, not per session. When Fleet
  answers a create with "slow down" (429, instance limit), every session of this process
  that uses the same key holds its creates until the pause is over, instead of each one
  discovering the limit on its own. One limiter per (base URL, key), process-wide.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetenv.core.errors import DeadlineExceeded
from fleetenv.core.retry import Deadline

__all__ = ["Gate", "KeyLimiter", "key_limiter"]

#: Longest single wait before re-checking a condition, so a lost notify cannot hang us.
_WAIT_SLICE_S = 1.0


class Gate:
    """A counting semaphore with a name, a deadline-bounded acquire and a clear error."""

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"{name} must be at least 1, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._in_use = 0
        self._cond = threading.Condition()

    def __repr__(self) -> str:
        return f"Gate({self.name}: {self.in_use}/{self.capacity})"

    @property
    def in_use(self) -> int:
        with self._cond:
            return self._in_use

    def acquire(self, deadline: Deadline, **context: Any) -> None:
        with self._cond:
            while self._in_use >= self.capacity:
                remaining = deadline.remaining()
                if remaining is not None and remaining <= 0:
                    raise DeadlineExceeded(
                        f"waited too long for a free slot under {self.name}={self.capacity}",
                        hint=f"raise {self.name} or the provisioning budget, or run fewer "
                        "episodes at once",
                        **context,
                    )
                self._cond.wait(timeout=_WAIT_SLICE_S if remaining is None
                                else min(remaining, _WAIT_SLICE_S))
            self._in_use += 1

    def release(self) -> None:
        with self._cond:
            if self._in_use > 0:
                self._in_use -= 1
            self._cond.notify()

    @contextmanager
    def slot(self, deadline: Deadline, **context: Any) -> Iterator[None]:
        self.acquire(deadline, **context)
        try:
            yield
        finally:
            self.release()


class KeyLimiter:
    """The pause Fleet asked of one API key, shared by every session using that key."""

    def __init__(self) -> None:
        self._resume_at = 0.0
        self._cond = threading.Condition()

    def __repr__(self) -> str:
        return f"KeyLimiter(paused {self.paused_for():.1f} s)"

    def paused_for(self) -> float:
        """Seconds until creates may go again (0 when not paused)."""
        with self._cond:
            return max(0.0, self._resume_at - time.monotonic())

    def pause(self, seconds: float) -> None:
        """Hold creates under this key for ``seconds`` (a longer pause wins)."""
        with self._cond:
            self._resume_at = max(self._resume_at, time.monotonic() + seconds)

    def wait(self, deadline: Deadline, **context: Any) -> float:
        """Block until the key may create again; returns the seconds waited.

        Raises ``DeadlineExceeded`` (retryable) if the pause outlasts ``deadline``.
        """
        started = time.monotonic()
        waited = False
        with self._cond:
            while True:
                left = self._resume_at - time.monotonic()
                if left <= 0:
                    return time.monotonic() - started if waited else 0.0
                remaining = deadline.remaining()
                if remaining is not None and remaining < left:
                    raise DeadlineExceeded(
                        f"Fleet asked this API key to pause creates for {left:.0f} s more, "
                        "past the provisioning budget",
                        hint="raise the provisioning budget or create fewer instances at "
                        "once", retryable=True, **context)
                waited = True
                self._cond.wait(timeout=min(left, _WAIT_SLICE_S))


_limiters: dict[tuple[str, str], KeyLimiter] = {}
_limiters_lock = threading.Lock()


def key_limiter(base_url: str, api_key: str) -> KeyLimiter:
    """The process-wide limiter for one API key on one Fleet (the key is hashed)."""
    ident = (base_url.rstrip("/"), hashlib.sha256(api_key.encode()).hexdigest())
    with _limiters_lock:
        limiter = _limiters.get(ident)
        if limiter is None:
            limiter = _limiters[ident] = KeyLimiter()
        return limiter
