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
from fleetenv.core.events import (
    Event,
    EventKind,
    InstanceDeleted,
    InstanceDeleteFailed,
    InstanceProvisioned,
    ProvisioningFailed,
    ProvisioningRetry,
    ResetFailed,
    RolloutCompleted,
    RolloutRef,
    RolloutStarted,
    ServerLog,
    ToolCallFailed,
    ToolCallFinished,
    ToolErrorReported,
    ToolProgress,
    ToolsChanged,
    TurnParseFailed,
    TurnWithoutToolCall,
    VerificationFinished,
    VerifierFailed,
    event_from_dict,
)
from fleetenv.core.rollout_accounting import AccountingReport

__all__ = [
    "AccountingReport",
    "Event",
    "EventBus",
    "EventKind",
    "EventSink",
    "InstanceDeleteFailed",
    "InstanceDeleted",
    "InstanceProvisioned",
    "JsonlSink",
    "LoggingSink",
    "ProvisioningFailed",
    "ProvisioningRetry",
    "ResetFailed",
    "RolloutCompleted",
    "RolloutRef",
    "RolloutStarted",
    "ServerLog",
    "ToolCallFailed",
    "ToolCallFinished",
    "ToolErrorReported",
    "ToolProgress",
    "ToolsChanged",
    "TurnParseFailed",
    "TurnWithoutToolCall",
    "VerificationFinished",
    "VerifierFailed",
    "event_from_dict",
]
