"""Delivering events to sinks, with accounting, without letting a sink hurt an episode
(docs/events.md, "Sinks").

``emit`` never raises because of a sink (``KeyboardInterrupt`` and other
``BaseException``s are not caught) and runs the sinks in the calling thread: emit from
the caller's thread, not fleetenv's event-loop thread, where a slow sink would stall
every episode's MCP traffic.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator

from fleetenv.core.event_sinks import EventSink, LoggingSink
from fleetenv.core.events import Event
from fleetenv.core.rollout_accounting import AccountingReport, RolloutAccounting

__all__ = ["EventBus"]

logger = logging.getLogger(__name__)


class EventBus:
    """Sends each event to every sink, after the rollout accounting has seen it.

    ``sinks=None`` means one ``LoggingSink``; pass ``[]`` for none. Thread-safe.
    """

    def __init__(self, sinks: Iterable[EventSink] | None = None, *,
                 accounting: RolloutAccounting | None = None) -> None:
        self.accounting = accounting or RolloutAccounting()
        self._sinks: tuple[EventSink, ...] = (
            (LoggingSink(),) if sinks is None else tuple(sinks))
        self._lock = threading.Lock()
        self._failures: dict[int, int] = {}

    @property
    def sinks(self) -> tuple[EventSink, ...]:
        return self._sinks

    def add_sink(self, sink: EventSink) -> None:
        with self._lock:
            self._sinks = (*self._sinks, sink)

    def remove_sink(self, sink: EventSink) -> None:
        with self._lock:
            self._sinks = tuple(s for s in self._sinks if s != sink)

    def emit(self, event: Event) -> None:
        """Account for ``event`` and deliver it (a rule-breaking duplicate is dropped).

        Raises only in ``strict`` accounting mode, on a broken exactly-once rule.
        """
        if not self.accounting.observe(event):
            return
        for sink in self._sinks:  # a snapshot: the tuple is replaced, never changed
            try:
                sink(event)
            except Exception:
                self._sink_failed(sink, event)

    def wants(self, event_type: type[Event]) -> bool:
        """Whether an event of ``event_type`` would reach anyone: the accounting's books, or
        a sink that has no ``wants`` method or whose ``wants(event_type)`` is true (a
        `LoggingSink` whose logger is off for it is not). Emitters skip building an event
        nobody would see: it costs a redaction per field."""
        if self.accounting.keeps(event_type):
            return True
        for sink in self._sinks:
            wants = getattr(sink, "wants", None)
            if wants is None or wants(event_type):
                return True
        return False

    def scope(self, rollout_id: str) -> contextlib.AbstractContextManager[None]:
        """Work done for rollout ``rollout_id`` (one ``reset``/``step``/``close``).

        A sink with a ``scope(rollout_id)`` method (a context manager) is entered here,
        in the caller's context, around the whole call. Why: work fleetenv hands to its
        loop thread runs in a copy of the caller's context variables, so a tracing sink
        that makes the rollout's span current in its scope gets the spans of libraries
        underneath (mcp's own) nested under the rollout rather than in separate traces.
        A sink's scope that fails to enter is counted like any sink failure.
        """
        scoped = [sink for sink in self._sinks if hasattr(sink, "scope")]
        if not scoped:  # the usual case, on every step: nothing to enter
            return contextlib.nullcontext()
        return self._scoped(scoped, rollout_id)

    @contextlib.contextmanager
    def _scoped(self, sinks: list[EventSink], rollout_id: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for sink in sinks:
                try:
                    scope = sink.scope(rollout_id)  # type: ignore[attr-defined]  # optional method
                    stack.enter_context(scope)
                except Exception:
                    self._sink_failed(sink, None)
            yield

    def _sink_failed(self, sink: EventSink, event: Event | None) -> None:
        with self._lock:
            count = self._failures.get(id(sink), 0) + 1
            self._failures[id(sink)] = count
        if count == 1:
            logger.warning("event sink %r failed on %s; it stays attached, and its "
                           "further failures are counted, not logged", sink,
                           f"a {event.kind} event" if event else "entering its scope",
                           exc_info=True)

    def sink_failures(self, sink: EventSink) -> int:
        """How many events ``sink`` failed to take."""
        with self._lock:
            return self._failures.get(id(sink), 0)

    def report(self) -> AccountingReport:
        """The rollout accounting so far (started / completed / by reason / violations)."""
        return self.accounting.report()
