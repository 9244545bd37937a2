"""A one-line progress bar for long rollout runs, with no dependency (docs/rollouts.md).

One stderr line, ``\\r``-redrawn at most about ten times a second, and nothing at all when
stderr is not a terminal: a log full of carriage-return frames helps nobody. Drawing must
never hurt a run: a closed or broken stream only turns the bar off. Updated from executor
callbacks on any thread, so it is thread-safe.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

__all__ = ["Progress", "format_duration"]

#: Minimum seconds between two redraws (about ten frames a second at most).
REDRAW_INTERVAL_S = 0.1


def format_duration(seconds: float) -> str:
    """``"42s"``, ``"3m05s"``, ``"2h03m"``: short enough for one terminal line."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # a replaced stderr without isatty, or a closed one
        return False


class Progress:
    """Counts rollouts and draws the line.

    ``enabled=None`` draws only when ``stream`` (default: ``sys.stderr``) is a TTY;
    ``True`` forces drawing (tests, or a terminal that does not report itself);
    ``False`` never draws. Counting works either way.
    """

    def __init__(self, *, total: int | None = None, enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self.total = total
        self.done = 0
        self.failed = 0
        self.passed = 0
        self.graded = 0
        self.running = 0
        self._lock = threading.RLock()  # re-entered by _write -> _raw_write
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._width = 0
        self._drawn = False

    def set_total(self, total: int | None) -> None:
        with self._lock:
            self.total = total

    def started(self) -> None:
        """A rollout was handed to the executor."""
        with self._lock:
            self.running += 1
        self.tick()

    def finished(self, *, failed: bool, reward: float | None) -> None:
        """A rollout ended: ``failed`` when it carries an error; ``reward`` if graded."""
        with self._lock:
            self.running = max(0, self.running - 1)
            self.done += 1
            if failed:
                self.failed += 1
            if reward is not None:
                self.graded += 1
                if reward >= 1.0:
                    self.passed += 1
        self.tick()

    def line(self) -> str:
        """The text of the bar as it would be drawn now."""
        with self._lock:
            done, failed, running = self.done, self.failed, self.running
            passed, graded, total = self.passed, self.graded, self.total
        elapsed = time.monotonic() - self._started
        count = f"{done}/{total}" if total is not None else f"{done}"
        parts = [f"rollouts {count}", f"failed {failed}", f"running {running}"]
        parts.append(f"pass {passed / graded:.0%}" if graded else "pass -")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if total is not None and done and done < total:
            parts.append(f"eta {format_duration(elapsed / done * (total - done))}")
        return " | ".join(parts)

    def tick(self, *, force: bool = False) -> None:
        """Redraw if enough time passed since the last frame (or ``force``)."""
        if not self.enabled:
            return
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_draw < REDRAW_INTERVAL_S:
                return
            self._last_draw = now
        self._write(self.line())

    def close(self) -> None:
        """Draw the final frame and end the line (only if a frame is on screen), so the
        next output starts on a clean line; a later update starts a new bar."""
        if not self.enabled or not self._drawn:
            return
        with self._lock:
            self._write(self.line())
            self._drawn = False
            self._width = 0
            self._raw_write("\n")

    def _write(self, text: str) -> None:
        with self._lock:
            pad = max(0, self._width - len(text))
            self._width = len(text)
            self._drawn = True
            self._raw_write("\r" + text + " " * pad)  # under the lock: frames never interleave

    def _raw_write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # a broken or closed stream turns the bar off, never the run
            self.enabled = False
