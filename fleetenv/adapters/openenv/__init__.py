"""A drop-in for OpenEnv's ``envs.fleet_env`` package, as SkyRL and Tinker import it.

Porting is one changed import line (``from fleetenv.adapters.openenv import FleetTaskEnv``);
docs/porting.md maps the original's API line by line. The OpenEnv types load on first use
(importing ``openenv`` takes seconds), and so do the names of the OpenEnv *server*
(:mod:`fleetenv.adapters.openenv.server`, ``fleetenv serve openenv``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fleetenv.adapters.openenv.clients import FleetEnvClient, FleetMCPTools
from fleetenv.adapters.openenv.platform import (
    CONTEXT_TOOL_NAMES,
    CONTEXT_TOOLS,
    ContextManager,
    TaskEvaluator,
    create_trace_job,
    evaluate_task,
    upload_trace,
)
from fleetenv.adapters.openenv.task_env import FleetTaskEnv, make_fleet_task_env
from fleetenv.adapters.openenv.telemetry import (
    clear_task_context,
    configure_fleet_telemetry,
    set_task_context,
)
from fleetenv.env.actions import SUBMIT_FINAL_ANSWER_TOOL

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.adapters.openenv.types import (
        CallToolAction,
        FleetAction,
        FleetObservation,
        FleetState,
        ListToolsAction,
        StepResult,
    )

__all__ = [
    "CONTEXT_TOOLS",
    "CONTEXT_TOOL_NAMES",
    "SUBMIT_FINAL_ANSWER_TOOL",
    "CallToolAction",
    "ContextManager",
    "FleetAction",
    "FleetEnvClient",
    "FleetMCPTools",
    "FleetObservation",
    "FleetOpenEnvEnvironment",
    "FleetServerSettings",
    "FleetState",
    "FleetTaskEnv",
    "ListToolsAction",
    "OpenEnvServer",
    "StepResult",
    "TaskEvaluator",
    "clear_task_context",
    "configure_fleet_telemetry",
    "create_trace_job",
    "evaluate_task",
    "make_fleet_task_env",
    "set_task_context",
    "upload_trace",
]

#: Names resolved on first use, by the module that holds them (importing openenv is slow).
_LAZY = {**dict.fromkeys(("CallToolAction", "FleetAction", "FleetObservation", "FleetState",
                          "ListToolsAction", "StepResult"), "types"),
         **dict.fromkeys(("FleetOpenEnvEnvironment", "FleetServerSettings", "OpenEnvServer"),
                         "server")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
