"""Process-wide caps on instances being created at once and on live instances.

Fleet processes creates slowly (one report: 96 concurrent ``make()`` calls served at about
one per 10 s) and teams have instance limits, so unbounded parallel rollouts turn into
queues of timeouts and 403s. The caps live here, shared by every episode and runner of the
process, whatever thread or executor worker they run on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fleetenv.core.errors import DeadlineExceeded
from fleetenv.core.retry import Deadline


class Gate:
    """A counting semaphore whose capacity can be changed while in use.

    ``threading.BoundedSemaphore`` cannot be resized; configuration may arrive after
    the first episode already started (a runner with ``max_live=...``).
    """

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self._capacity = capacity
        self._in_use = 0
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_use(self) -> int:
        with self._cond:
            return self._in_use

    def set_capacity(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"{self.name} must be at least 1, got {capacity}")
        with self._cond:
            self._capacity = capacity
            self._cond.notify_all()

    def acquire(self, deadline: Deadline, **context: str | None) -> None:
        with self._cond:
            while self._in_use >= self._capacity:
                remaining = deadline.remaining()
                if remaining is not None and remaining <= 0:
                    raise DeadlineExceeded(
                        f"waited too long for a free slot under {self.name}="
                        f"{self._capacity}",
                        hint=f"raise {self.name} or the provisioning budget, or run fewer "
                        "episodes at once",
                        **context,
                    )
                # Bounded waits even without a deadline, so a lost notify cannot hang us.
                self._cond.wait(timeout=1.0 if remaining is None else min(remaining, 1.0))
            self._in_use += 1

    def release(self) -> None:
        with self._cond:
            if self._in_use > 0:
                self._in_use -= 1
            self._cond.notify()

    @contextmanager
    def slot(self, deadline: Deadline, **context: str | None) -> Iterator[None]:
        self.acquire(deadline, **context)
        try:
            yield
        finally:
            self.release()


#: Instances in the middle of ``make()`` + readiness, process-wide.
CREATING = Gate("max_creating", 16)
#: Instances created and not yet deleted, process-wide.
LIVE = Gate("max_live", 64)


def configure(*, max_creating: int | None = None, max_live: int | None = None) -> None:
    """Set the process-wide caps (the last call wins)."""
    if max_creating is not None:
        CREATING.set_capacity(max_creating)
    if max_live is not None:
        LIVE.set_capacity(max_live)
