"""Ctrl-C in a CLI command: one line, exit status 130, no traceback.

Why a handler and not only ``except KeyboardInterrupt``: the cleanup that follows Ctrl-C
closes environments under calls in flight, and the episodes torn down that way log what
they saw (a closed MCP stream, a provisioning attempt cut short). Those are consequences
of the interrupt, not faults, and printed they bury the one line that matters. The
handler turns logging off *before* the cleanup starts (``--debug`` keeps it), then raises
``KeyboardInterrupt`` where the main thread is, as Python would.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class RunInterrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` that carries the one line to print (what was stopped,
    what was deleted, where the partial results are)."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


@contextmanager
def quiet_interrupts(*, debug: bool) -> Iterator[None]:
    """While the body runs, Ctrl-C silences logging (unless ``debug``) and raises
    ``KeyboardInterrupt``. Logging is turned back on when the body is left. Does nothing
    outside the main thread (where signal handlers cannot be installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if not debug:
            logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if not debug:
            logging.disable(logging.NOTSET)
