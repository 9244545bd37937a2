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
_LAZY: dict[str, str] = {}

if TYPE_CHECKING:  # pragma: no cover
    pass


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
    "EpisodeStateError",
    "FleetEnvError",
    "InstanceGoneError",
    "InvalidActionError",
    "LoopThreadError",
    "PermanentProvisioningError",
    "ProvisioningError",
    "ToolArgumentsError",
    "ToolCallError",
    "ToolCallMayHaveRunError",
    "ToolError",
    "ToolNotFoundError",
    "TransientProvisioningError",
    "VerifierError",
    "__version__",
    *_LAZY,
]
