"""The live progress display of ``fleetenv run`` and ``fleetenv demo`` (docs/cli.md,
"Progress and Ctrl-C"): drawn with ``rich`` on stderr, only when stderr is a terminal;
without ``rich`` installed, fleetenv's one-line
:class:`~fleetenv.rollouts.progress.Progress` is drawn instead.

Updated from the main thread only (the CLI writes results there), so no locking here.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

from fleetenv.rollouts.progress import Progress


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # replaced or closed stream
        return False


class RunDisplay:
    """``started()`` when an episode is handed out, ``finished(result)`` when it ends,
    ``close()`` at the end (also on Ctrl-C, before the one-line message)."""

    def __init__(self, total: int, *, done: int = 0, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self.total = total
        self.done = done
        self.failed = 0
        self.passed = 0
        self.graded = 0
        self.submitted = 0  # handed to the runner by this process
        self._started = time.monotonic()
        self._finished_here = 0  # the rate counts this process's episodes, not resumed ones
        self._rich: Any = None
        self._task_id: Any = None
        self._fallback: Progress | None = None
        if not self.enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )
        except ImportError:  # rich is optional at runtime: draw the plain one-liner
            self._fallback = Progress(total=total, enabled=True, stream=self.stream)
            return
        self._rich = RichProgress(
            TextColumn("episodes"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(),
            console=Console(file=self.stream, force_terminal=True), transient=False,
            refresh_per_second=4)
        self._task_id = self._rich.add_task("run", total=total, completed=done,
                                            stats=self._stats())
        self._rich.start()

    def _stats(self) -> str:
        passed = f"pass {self.passed / self.graded:.0%}" if self.graded else "pass -"
        minutes = (time.monotonic() - self._started) / 60
        rate = f"{self._finished_here / minutes:.1f}/min" if self._finished_here else "-/min"
        return f"failed {self.failed} | {passed} | {rate} |"

    def started(self) -> None:
        self.submitted += 1
        if self._fallback is not None:
            self._fallback.started()

    def finished(self, *, failed: bool, reward: float | None) -> None:
        self.done += 1
        self._finished_here += 1
        self.failed += int(failed)
        if reward is not None:
            self.graded += 1
            self.passed += int(reward >= 1.0)
        if self._fallback is not None:
            self._fallback.finished(failed=failed, reward=reward)
        elif self._rich is not None:
            self._rich.update(self._task_id, completed=self.done, stats=self._stats())

    def close(self) -> None:
        """Draw the last frame and release the terminal (idempotent)."""
        rich, self._rich = self._rich, None
        if rich is not None:
            rich.stop()
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None

    def __enter__(self) -> RunDisplay:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
