"""Waiting in tests for something another thread or process does, with a deadline.

Background loops, servers and forked children finish on their own schedule, so a test
polls instead of sleeping a fixed time: short pauses that grow keep fast cases fast
without busy-looping, and the deadline turns a hang into a failure that says what never
happened instead of a pytest-timeout traceback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_FIRST_PAUSE_S = 0.005
_MAX_PAUSE_S = 0.1


def poll_until(predicate: Callable[[], T], timeout: float) -> T:
    """Call ``predicate`` until it returns something truthy or ``timeout`` seconds pass.

    Returns the last value either way; for waits where running out of time is not itself
    a failure (the caller goes on and its own assertions decide).
    """
    deadline = time.monotonic() + timeout
    pause = _FIRST_PAUSE_S
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(pause)
        pause = min(pause * 2, _MAX_PAUSE_S)


def wait_for(predicate: Callable[[], T], timeout: float = 5.0, what: str = "the condition") -> T:
    """Like :func:`poll_until`, but fail the test naming ``what`` if time runs out."""
    value = poll_until(predicate, timeout)
    if not value:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return value


def wait_child(pid: int, timeout: float) -> int:
    """Reap the forked child ``pid`` and return its exit code.

    A child that has not exited by ``timeout`` is killed and reaped, so a hung fork test
    neither leaks a process nor blocks the run, and the test fails.
    """
    exit_code: int | None = None

    def reaped() -> bool:
        nonlocal exit_code
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            exit_code = os.waitstatus_to_exitcode(status)
        return bool(done)

    if not poll_until(reaped, timeout):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("forked child hung")
    assert exit_code is not None
    return exit_code
