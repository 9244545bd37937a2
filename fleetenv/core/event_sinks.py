"""Where events go: stdlib ``logging`` (the default), a JSONL file, or any callable.

A sink is anything callable with one ``Event``; one with a ``wants(event_type)`` method
is sent only the types it wants (events nobody wants are not built). Sinks run
synchronously in the thread that emits, so they must be quick; the JSONL sink writes and
flushes one short line under a lock, so a crash loses at most the line being written.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.events import Event

__all__ = ["EVENTS_LOGGER", "EventSink", "JsonlSink", "LoggingSink"]

EVENTS_LOGGER = "fleetenv.events"

EventSink = Callable[[Event], None]


class LoggingSink:
    """Logs each event on ``fleetenv.events`` at the event's level.

    The message is ``event.summary()`` (greppable ``key=value`` pairs); the full record is
    attached as ``record.fleetenv_event`` for structured handlers.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(EVENTS_LOGGER)

    def wants(self, event_type: type[Event]) -> bool:
        """Whether events of ``event_type`` would be logged (at its lowest level)."""
        return self.logger.isEnabledFor(event_type.level)

    def __call__(self, event: Event) -> None:
        level = event.log_level
        if self.logger.isEnabledFor(level):
            self.logger.log(level, "%s", event.summary(),
                            extra={"fleetenv_event": event.to_dict()})

    def __repr__(self) -> str:
        return f"LoggingSink({self.logger.name!r})"


class JsonlSink:
    """Appends one JSON object per event to a file; safe to share between threads.

    The file is opened at construction, so a bad path fails before any rollout runs.
    One sink per process: lines from several processes appending to one file can
    interleave.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot open the events file: {exc.strerror}",
                                     file=os.fspath(path),
                                     hint="check that the directory exists and is "
                                          "writable") from None

    def __call__(self, event: Event) -> None:
        line = event.to_json() + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonlSink({os.fspath(self.path)!r})"
