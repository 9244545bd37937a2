"""Typed lifecycle records of rollouts: what happened, to which rollout, when
(docs/events.md lists them).

Each carries its identity from a ``RolloutRef`` passed by hand rather than a ContextVar,
so events from worker threads and other tasks keep their labels. Free text goes through
``redact()`` and is capped when the event is built, so no sink ever sees a credential or
a megabyte of stack trace. Delivery (sinks, accounting) is ``fleetenv.core.event_bus``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from fleetenv.core.redaction import redact
from fleetenv.core.types import GradeStatus, StrEnum

__all__ = [
    "Event",
    "EventKind",
    "InstanceDeleteFailed",
    "InstanceDeleted",
    "InstanceProvisioned",
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


class EventKind(StrEnum):
    """The ``kind`` of every event type (its name in logs and JSONL files); each event
    class has the member named like it (``ToolCallFailed.kind`` is ``TOOL_CALL_FAILED``)."""

    ROLLOUT_STARTED = "rollout_started"
    ROLLOUT_COMPLETED = "rollout_completed"
    INSTANCE_PROVISIONED = "instance_provisioned"
    PROVISIONING_RETRY = "provisioning_retry"
    PROVISIONING_FAILED = "provisioning_failed"
    RESET_FAILED = "reset_failed"
    TOOL_CALL_FAILED = "tool_call_failed"
    TOOL_ERROR_REPORTED = "tool_error_reported"
    VERIFIER_FAILED = "verifier_failed"
    INSTANCE_DELETED = "instance_deleted"
    INSTANCE_DELETE_FAILED = "instance_delete_failed"
    TOOL_CALL_FINISHED = "tool_call_finished"
    VERIFICATION_FINISHED = "verification_finished"
    TOOL_PROGRESS = "tool_progress"
    SERVER_LOG = "server_log"
    TOOLS_CHANGED = "tools_changed"
    TURN_PARSE_FAILED = "turn_parse_failed"
    TURN_WITHOUT_TOOL_CALL = "turn_without_tool_call"


#: Longest free-text value an event keeps; the rest is replaced by a marker.
MAX_TEXT = 2000

_KINDS: dict[str, type[Event]] = {}

E = TypeVar("E", bound="Event")


def new_rollout_id() -> str:
    """A fresh, unique rollout id (32 hex characters)."""
    return uuid.uuid4().hex


def _clean_text(value: str) -> str:
    text = redact(value)
    if len(text) > MAX_TEXT:
        cut = len(text) - MAX_TEXT
        text = f"{text[:MAX_TEXT]}... [{cut} more characters]"
    return text


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of all events. ``kind`` names the event type in logs and JSONL."""

    kind: ClassVar[str] = "event"
    level: ClassVar[int] = logging.INFO  # the lowest level an event of this type is logged at

    rollout_id: str
    task_key: str | None = None
    env_key: str | None = None
    instance_id: str | None = None
    #: Seconds since the epoch (``time.time()``) when the event was built.
    timestamp: float = field(default_factory=time.time)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Its kind is the EventKind named like the class: ToolCallFailed, "tool_call_failed".
        cls.kind = EventKind[re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).upper()]
        _KINDS[cls.kind] = cls

    def __post_init__(self) -> None:
        if not isinstance(self.rollout_id, str) or not self.rollout_id:
            raise ValueError(f"{type(self).__name__} needs a non-empty rollout_id")
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, str):
                object.__setattr__(self, item.name, _clean_text(value))

    @property
    def log_level(self) -> int:
        """The ``logging`` level this event is logged at."""
        return self.level

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``kind`` first."""
        data: dict[str, Any] = {"kind": self.kind}
        for item in dataclasses.fields(self):
            data[item.name] = getattr(self, item.name)
        return data

    def to_json(self) -> str:
        """One line of JSON (no newline)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False,
                          separators=(",", ":"))

    def summary(self) -> str:
        """``kind key=value ...`` for log lines (fields that are set, timestamp omitted)."""
        parts = [self.kind]
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is None or item.name == "timestamp":
                continue
            if isinstance(value, float):
                value = f"{value:.3f}".rstrip("0").rstrip(".")
            elif isinstance(value, str) and (" " in value or not value):
                value = json.dumps(value, ensure_ascii=False)
            parts.append(f"{item.name}={value}")
        return " ".join(parts)


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from ``to_dict()`` output (e.g. a JSONL line read back).

    Unknown fields are ignored so files written by newer versions still load.
    """
    kind = data.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(sorted(_KINDS))}")
    names = {item.name for item in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in data.items() if name in names})


@dataclass(frozen=True)
class RolloutRef:
    """The identity of one rollout, handed to whoever emits events for it.

    ``ref.event(ToolCallFailed, tool_name=..., ...)`` fills in the four ids.
    """

    rollout_id: str = field(default_factory=new_rollout_id)
    task_key: str | None = None
    env_key: str | None = None
    instance_id: str | None = None

    def with_instance(self, instance_id: str | None) -> RolloutRef:
        return dataclasses.replace(self, instance_id=instance_id)

    def event(self, event_type: type[E], **fields: Any) -> E:
        return event_type(rollout_id=self.rollout_id, task_key=self.task_key,
                          env_key=self.env_key, instance_id=self.instance_id, **fields)


@dataclass(frozen=True, kw_only=True)
class RolloutStarted(Event):
    """Emitted before provisioning, so rollouts that fail to start are still counted."""

    modality: str | None = None


@dataclass(frozen=True, kw_only=True)
class RolloutCompleted(Event):
    """Exactly one per started rollout, whatever way it ended.

    ``reason`` is the :class:`~fleetenv.StopReason` (e.g. ``"agent_done"``,
    ``"max_steps"``, ``"init_error"``). ``reward`` is ``None`` when the grade is unknown,
    never a stand-in ``0.0``; ``grade_status`` is a :class:`~fleetenv.GradeStatus`
    (``"graded"``, ``"unknown"``, ``"not_graded"``) and ``grade_reason`` says why an
    unknown grade is unknown (e.g. ``"no_verifier"``, ``"verifier_error"``).
    """

    reason: str
    grade_status: str = GradeStatus.NOT_GRADED
    grade_reason: str | None = None
    reward: float | None = None
    steps: int = 0
    error: str | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reward is not None:
            if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)):
                raise TypeError(f"reward must be a float or None, got {self.reward!r}")
            if not math.isfinite(self.reward):
                raise ValueError(f"reward must be finite, got {self.reward!r}")
            object.__setattr__(self, "reward", float(self.reward))

    @property
    def log_level(self) -> int:
        return logging.WARNING if self.error else logging.INFO


@dataclass(frozen=True, kw_only=True)
class InstanceProvisioned(Event):
    seconds: float
    attempts: int = 1


@dataclass(frozen=True, kw_only=True)
class ProvisioningRetry(Event):
    """A transient provisioning failure; another attempt follows after ``delay_s``."""

    level: ClassVar[int] = logging.WARNING

    attempt: int
    delay_s: float
    error_type: str
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ProvisioningFailed(Event):
    level: ClassVar[int] = logging.ERROR

    attempts: int
    error_type: str
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ResetFailed(Event):
    level: ClassVar[int] = logging.WARNING

    error_type: str
    error: str = ""
    timeout_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ToolCallFailed(Event):
    """The call failed in transport or protocol (the tool gave no answer)."""

    level: ClassVar[int] = logging.ERROR

    tool_name: str
    step: int
    error_type: str
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolErrorReported(Event):
    """The tool ran and answered with an error; normal agent life, so INFO."""

    tool_name: str
    step: int
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class VerifierFailed(Event):
    """The verifier could not produce a grade; the rollout's reward is unknown."""

    level: ClassVar[int] = logging.ERROR

    error_type: str
    error: str = ""
    steps: int = 0


@dataclass(frozen=True, kw_only=True)
class InstanceDeleted(Event):
    """``reason`` says who deleted it: ``"closed"``, ``"atexit"``, ``"signal"``, ``"sweep"``."""

    reason: str = "closed"


@dataclass(frozen=True, kw_only=True)
class InstanceDeleteFailed(Event):
    """The instance may still be running (until its TTL): a cost leak worth seeing."""

    level: ClassVar[int] = logging.ERROR

    error_type: str
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolCallFinished(Event):
    """Every tool call of an episode, whatever its outcome: the raw material of tool
    latency and tool-error-rate dashboards (by tool, env, task).

    ``outcome`` is ``"ok"``, ``"tool_error"`` (the tool answered with an error),
    ``"bad_arguments"`` (refused before sending: unknown tool, arguments that do not fit
    the schema), ``"failed"`` (no answer: transport, protocol, timeout) or ``"local"``
    (handled by fleetenv itself, never sent to MCP). ``error_type`` is the error's class
    name when there is one. DEBUG: one per call is too many for a default log.
    """

    level: ClassVar[int] = logging.DEBUG

    tool_name: str
    step: int
    outcome: str
    duration_s: float
    error_type: str | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class VerificationFinished(Event):
    """Every verifier run (after its retries): latency and failure reasons by env/task.

    ``outcome`` is a :class:`~fleetenv.GradeStatus` (``"graded"`` or ``"unknown"``),
    ``reason`` the :class:`~fleetenv.GradeReason` of an unknown grade,
    ``attempts`` how many runs it took. ``queue_s``: of ``duration_s``, how long the runs
    waited for a free verifier runner (``None`` when the runner does not say).
    """

    outcome: str
    duration_s: float
    queue_s: float | None = None
    reward: float | None = None
    reason: str | None = None
    attempts: int = 1
    error_type: str | None = None
    error: str | None = None
    execution_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolProgress(Event):
    """A ``notifications/progress`` a server sent while one of its tools ran."""

    level: ClassVar[int] = logging.DEBUG

    tool_name: str
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class ServerLog(Event):
    """A ``notifications/message`` (log line) from an MCP server; ``severity`` is the
    MCP level (``"debug"`` ... ``"emergency"``)."""

    level: ClassVar[int] = logging.DEBUG

    endpoint: str
    severity: str
    message: str
    logger_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolsChanged(Event):
    """A server said its tool list changed (``notifications/tools/list_changed``); the
    first observation the episode builds after it offers the new list."""

    endpoint: str
    tool_count: int | None = None


@dataclass(frozen=True, kw_only=True)
class TurnParseFailed(Event):
    """A turn's tool calls could not be read (``step()`` given the model's text); the
    agent got a parse-error observation and the turn counted. ``offset`` is where in the
    text the problem is, ``format`` the tool-call format that was read."""

    step: int
    format: str
    error: str = ""
    offset: int | None = None


@dataclass(frozen=True, kw_only=True)
class TurnWithoutToolCall(Event):
    """A turn made no tool call and the env is set to ``no_tool_call="noop"``: nothing
    ran, the agent was told to call a tool, and the turn counted toward ``max_steps``.
    Without this event such turns would be invisible in a trace (no call, no error)."""

    step: int
    text: str = ""
    """The turn's text (truncated like every event's free text)."""
