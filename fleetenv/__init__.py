"""fleetenv: blocking reset/step/close episodes on Fleet environments.

The public API is re-exported here. Heavy modules (mcp, fleet-python, httpx) are imported
only when a name that needs them is first used, so ``import fleetenv`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fleetenv._version import __version__
from fleetenv.core.errors import (
    ConfigurationError,
    ConnectError,
    DeadlineExceeded,
    EpisodeStateError,
    FleetEnvError,
    InstanceGoneError,
    InvalidActionError,
    LoopThreadError,
    PermanentProvisioningError,
    ProvisioningError,
    ToolArgumentsError,
    ToolCallError,
    ToolCallMayHaveRunError,
    ToolError,
    ToolNotFoundError,
    TransientProvisioningError,
    VerifierError,
)

# name -> module that defines it; imported on first attribute access.
_LAZY: dict[str, str] = {
    "FleetEnv": "fleetenv.env.episode",
    "Observation": "fleetenv.env.observation",
    "ToolCall": "fleetenv.env.actions",
    "FinalAnswer": "fleetenv.env.actions",
    "Done": "fleetenv.env.actions",
    "Task": "fleetenv.core.tasks",
    "load_tasks": "fleetenv.core.task_files",
    "FleetConfig": "fleetenv.core.config",
    "resolve_config": "fleetenv.core.config",
    "EventBus": "fleetenv.core.event_bus",
    "JsonlSink": "fleetenv.core.event_sinks",
    "Grade": "fleetenv.fleet.verifier",
    "Tool": "fleetenv.mcp.tools",
    "ToolResult": "fleetenv.mcp.results",
    "LocalFleet": "fleetenv.local",
}

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.config import FleetConfig, resolve_config
    from fleetenv.core.event_bus import EventBus
    from fleetenv.core.event_sinks import JsonlSink
    from fleetenv.core.task_files import load_tasks
    from fleetenv.core.tasks import Task
    from fleetenv.env.actions import Done, FinalAnswer, ToolCall
    from fleetenv.env.episode import FleetEnv
    from fleetenv.env.observation import Observation
    from fleetenv.fleet.verifier import Grade
    from fleetenv.local import LocalFleet
    from fleetenv.mcp.results import ToolResult
    from fleetenv.mcp.tools import Tool


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'fleetenv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ConfigurationError",
    "ConnectError",
    "DeadlineExceeded",
    "Done",
    "EpisodeStateError",
    "EventBus",
    "FinalAnswer",
    "FleetConfig",
    "FleetEnv",
    "FleetEnvError",
    "Grade",
    "InstanceGoneError",
    "InvalidActionError",
    "JsonlSink",
    "LocalFleet",
    "LoopThreadError",
    "Observation",
    "PermanentProvisioningError",
    "ProvisioningError",
    "Task",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallError",
    "ToolCallMayHaveRunError",
    "ToolError",
    "ToolNotFoundError",
    "ToolResult",
    "TransientProvisioningError",
    "VerifierError",
    "__version__",
    "load_tasks",
    "resolve_config",
]
