"""The original's telemetry names, fed from fleetenv's typed events.

``configure_fleet_telemetry()`` translates fleetenv's events (which carry their rollout's
identity) into the original's 15 named Logfire events, so dashboards keyed on
``fleet_rollout_completed`` keep working; :data:`NO_COUNTERPART` lists the names fleetenv
has no occurrence for, by design (docs/porting.md#telemetry).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import (
    Event,
    InstanceDeleted,
    InstanceDeleteFailed,
    InstanceProvisioned,
    ProvisioningFailed,
    ProvisioningRetry,
    ResetFailed,
    RolloutCompleted,
    RolloutStarted,
    ServerLog,
    ToolCallFailed,
    ToolCallFinished,
    ToolErrorReported,
    ToolProgress,
    ToolsChanged,
    VerificationFinished,
    VerifierFailed,
)

__all__ = [
    "EVENT_NAMES",
    "NO_COUNTERPART",
    "TelemetryHandler",
    "attach",
    "clear_task_context",
    "configure_fleet_telemetry",
    "emit_legacy",
    "set_task_context",
    "to_legacy",
]

logger = logging.getLogger("fleetenv.openenv.telemetry")

TelemetryHandler = Callable[[str, Mapping[str, Any]], None]
"""``handler(name, attributes)``: receives every translated record."""

#: The original's event names, each with the fleetenv event kind it is made from.
EVENT_NAMES: dict[str, str] = {
    "fleet_rollout_started": RolloutStarted.kind,
    "fleet_rollout_completed": RolloutCompleted.kind,
    "fleet_provisioning_completed": InstanceProvisioned.kind,
    "fleet_make_retry": ProvisioningRetry.kind,
    "fleet_make_failed": ProvisioningFailed.kind,
    "fleet_env_reset_failed": ResetFailed.kind,
    "fleet_screenshot_failed": "(reset info 'screenshot_error', emitted by the drop-in)",
    "fleet_tool_call_failed": ToolCallFailed.kind,
    "fleet_mcp_tool_error": ToolErrorReported.kind,
    "fleet_verifier_failed": VerifierFailed.kind,
}

#: The original's names that fleetenv has no occurrence for, and why (by design).
NO_COUNTERPART: dict[str, str] = {
    "fleet_list_tools_partial": "an expected endpoint that fails is an error naming it, "
                                "never a shorter tool list",
    "fleet_list_tools_retry": "listing is part of opening the MCP session, retried inside "
                              "the session-setup budget; a failure ends reset() "
                              "(fleet_rollout_completed, failure_reason=init_error)",
    "fleet_list_tools_exhausted": "as fleet_list_tools_retry",
    "fleet_call_tool_retry": "a tool call that may have run is never retried",
    "fleet_call_tool_exhausted": "as fleet_call_tool_retry",
}

#: fleetenv events the original had no name for, under the names they get here.
_EXTRA_NAMES: dict[str, str] = {
    ToolCallFinished.kind: "fleet_tool_call_finished",
    VerificationFinished.kind: "fleet_verification_finished",
    InstanceDeleted.kind: "fleet_instance_deleted",
    InstanceDeleteFailed.kind: "fleet_instance_delete_failed",
    ToolProgress.kind: "fleet_tool_progress",
    ServerLog.kind: "fleet_server_log",
    ToolsChanged.kind: "fleet_tools_changed",
}

_NAME_OF_KIND = {kind: name for name, kind in EVENT_NAMES.items()} | _EXTRA_NAMES


class _Telemetry:
    """What ``configure_fleet_telemetry`` set up (process-wide, as in the original)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enabled = False
        self.environment = "training_rollouts"
        self.service_name = "openenv-fleet"
        self.handler: TelemetryHandler | None = None
        self.buses: weakref.WeakSet[EventBus] = weakref.WeakSet()
        #: rollout_id -> modality (only RolloutStarted says it); dropped at completion.
        self.modalities: dict[str, str] = {}


_STATE = _Telemetry()


def configure_fleet_telemetry(token: str | None = None,
                              environment: str = "training_rollouts",
                              service_name: str = "openenv-fleet", *,
                              handler: TelemetryHandler | None = None,
                              events: EventBus | None = None, **kwargs: Any) -> None:
    """Turn on the original's telemetry names for every drop-in env of this process.

    ``handler(name, attributes)`` receives each record (e.g. a metrics exporter); the
    ``fleetenv.openenv.telemetry`` logger always does. ``events`` attaches the mapping to
    one more event bus (a ``fleetenv.Session``'s ``events``) for plain ``FleetEnv``\\ s.
    ``token`` (a Logfire write token) configures Logfire, as the original did, and hands
    it this logger's records; it needs ``pip install logfire``. ``kwargs`` go to
    ``logfire.configure``.
    """
    if token:
        _configure_logfire(token, environment, service_name, kwargs)
    elif kwargs:
        raise ConfigurationError(
            f"configure_fleet_telemetry() got Logfire options {sorted(kwargs)} without a "
            "token", hint="pass token=... (a Logfire write token), or drop the options")
    with _STATE.lock:
        _STATE.enabled = True
        _STATE.environment = environment
        _STATE.service_name = service_name
        _STATE.handler = handler
    if events is not None:
        attach(events)


def _configure_logfire(token: str, environment: str, service_name: str,
                       options: dict[str, Any]) -> None:
    try:
        import logfire
    except ImportError:
        raise ConfigurationError(
            "configure_fleet_telemetry(token=...) sends to Logfire, which is not installed",
            hint="pip install logfire, or call configure_fleet_telemetry(handler=...) and "
                 "send the records where you like") from None
    logfire.configure(token=token, environment=environment, service_name=service_name,
                      **options)
    logger.addHandler(logfire.LogfireLoggingHandler())


def reset_telemetry() -> None:
    """Turn the mapping off again (tests, notebooks). Buses stay attached, silent."""
    with _STATE.lock:
        _STATE.enabled = False
        _STATE.handler = None
        _STATE.modalities.clear()


def set_task_context(*, env_key: str | None = None, env_version: str | None = None,
                     task_key: str | None = None, modality: str | None = None) -> None:
    """Accepted for compatibility; does nothing. fleetenv events carry the task's
    identity themselves, so there is no ambient context to set (or to leak between
    asyncio tasks, as the original's ContextVar did)."""


def clear_task_context() -> None:
    """Accepted for compatibility; does nothing (see ``set_task_context``)."""


def attach(bus: EventBus) -> None:
    """Translate ``bus``'s events while the telemetry is configured (once per bus)."""
    with _STATE.lock:
        if bus in _STATE.buses:
            return
        _STATE.buses.add(bus)
    bus.add_sink(_sink)


def _sink(event: Event) -> None:
    if not _STATE.enabled:
        return
    record = to_legacy(event)
    if record is not None:
        _deliver(*record)


def emit_legacy(name: str, level: int, attributes: Mapping[str, Any]) -> None:
    """Send one record the drop-in makes itself (e.g. ``fleet_screenshot_failed``).
    Like the event bus's sinks, a failing handler is logged, never raised into the
    episode."""
    if not _STATE.enabled:
        return
    try:
        _deliver(name, level, dict(attributes))
    except Exception:
        logger.warning("the telemetry handler failed on %s", name, exc_info=True)


def _deliver(name: str, level: int, attributes: dict[str, Any]) -> None:
    attributes.setdefault("service_name", _STATE.service_name)
    attributes.setdefault("environment", _STATE.environment)
    logger.log(level, name, extra={"fleet_event": name, "fleet_attributes": attributes})
    handler = _STATE.handler
    if handler is not None:
        handler(name, attributes)


def base_attributes(task_key: str | None, env_spec: str | None,
                    modality: str | None) -> dict[str, Any]:
    """The original's base attributes: ``env_key``, ``env_version``, ``task_key``,
    ``modality`` (unknown ones left out, as the original did)."""
    env_key, _, env_version = (env_spec or "").partition(":")
    attrs: dict[str, Any] = {"env_key": env_key or None, "env_version": env_version or None,
                             "task_key": task_key, "modality": modality}
    return {key: value for key, value in attrs.items() if value}


def to_legacy(event: Event) -> tuple[str, int, dict[str, Any]] | None:
    """``(name, logging level, attributes)`` of ``event`` under the original's names, or
    ``None`` for an event kind the mapping does not know."""
    name = _NAME_OF_KIND.get(event.kind)
    if name is None:
        return None
    if isinstance(event, RolloutStarted) and event.modality:
        _STATE.modalities[event.rollout_id] = event.modality
    modality = _STATE.modalities.get(event.rollout_id)
    if isinstance(event, RolloutCompleted):
        _STATE.modalities.pop(event.rollout_id, None)
    attrs = base_attributes(event.task_key, event.env_key, modality)
    attrs.update(rollout_id=event.rollout_id, instance_id=event.instance_id)
    attrs.update(_fields(event))
    return name, event.log_level, attrs


def _fields(event: Event) -> dict[str, Any]:
    if isinstance(event, RolloutCompleted):
        failure = "init_error" if event.reason == "init_error" else event.grade_reason
        return {"step_count": event.steps, "reward": event.reward,
                "verifier_success": event.grade_status == "graded",
                "failure_reason": failure, "stop_reason": event.reason,
                "grade_status": event.grade_status, "error_message": event.error,
                "duration_s": event.duration_s}
    if isinstance(event, InstanceProvisioned):
        return {"provisioning_time_s": event.seconds, "attempts": event.attempts}
    if isinstance(event, ProvisioningRetry):
        return {"attempt": event.attempt, "error_type": event.error_type,
                "error_message": event.error, "retry_delay_s": event.delay_s}
    if isinstance(event, ProvisioningFailed):
        return {"attempt": event.attempts, "error_type": event.error_type,
                "error_message": event.error}
    if isinstance(event, ResetFailed):
        return {"timeout_s": event.timeout_s, "error_type": event.error_type,
                "error_message": event.error[:200]}
    if isinstance(event, ToolCallFailed):
        return {"step_count": event.step, "tool_name": event.tool_name,
                "error_type": event.error_type, "error_message": event.error}
    if isinstance(event, ToolErrorReported):
        return {"step_count": event.step, "tool_name": event.tool_name,
                "error_message": event.error[:500]}
    if isinstance(event, VerifierFailed):
        return {"step_count": event.steps, "error_type": event.error_type,
                "error_message": event.error}
    data = event.to_dict()
    for key in ("kind", "rollout_id", "task_key", "env_key", "instance_id", "timestamp"):
        data.pop(key, None)
    return data
