"""Lifecycle events of rollouts, and where they go.

Every episode reports to its session's :class:`EventBus` (``session.events``): typed,
frozen records that carry the rollout's ids explicitly. Sinks: stdlib ``logging`` (the
default), a :class:`JsonlSink` file, or any callable::

    import fleetenv
    from fleetenv.events import EventBus, JsonlSink, RolloutCompleted

    completed = []
    bus = EventBus([JsonlSink("events.jsonl"), completed.append])
    session = fleetenv.Session(events=bus)

The bus keeps the books: every started rollout completes exactly once, with one reason
(``bus.report()``).
"""

from fleetenv.core.event_bus import EventBus
from fleetenv.core.event_sinks import EventSink, JsonlSink, LoggingSink
from fleetenv.core.events import *  # noqa: F403  # every event type: core.events' __all__
from fleetenv.core.events import __all__ as _EVENT_NAMES
from fleetenv.core.rollout_accounting import AccountingReport

__all__ = ["AccountingReport", "EventBus", "EventSink", "JsonlSink", "LoggingSink",
           *_EVENT_NAMES]
