"""A drop-in for OpenEnv's ``envs.fleet_env`` package, as SkyRL and Tinker import it.

Porting is one changed import line::

    from fleetenv.adapters.openenv import FleetTaskEnv, configure_fleet_telemetry
    # was: from envs.fleet_env import FleetTaskEnv, configure_fleet_telemetry

- ``FleetTaskEnv`` / ``make_fleet_task_env``: the task env (``task_env.py``), and
  ``SUBMIT_FINAL_ANSWER_TOOL``, the local tool it offers when the task wants an answer.
- ``FleetEnvClient`` / ``FleetMCPTools``: the orchestrator and tool handles
  (``clients.py``).
- ``configure_fleet_telemetry`` (+ ``set_task_context`` / ``clear_task_context``): the
  original's event names, fed from fleetenv's events (``telemetry.py``).
- ``ContextManager`` (+ ``CONTEXT_TOOLS``, ``CONTEXT_TOOL_NAMES``), ``create_trace_job``,
  ``upload_trace``, ``TaskEvaluator``, ``evaluate_task``: the original's signatures on
  fleetenv's context tools, trace upload and evaluator (``platform.py``).
- OpenEnv types (``FleetObservation``, ``FleetAction``, ``FleetState``, ``StepResult``,
  ``ListToolsAction``, ``CallToolAction``): OpenEnv's own classes when ``openenv-core``
  is installed; resolved on first use, since importing ``openenv`` takes seconds.

``docs/porting.md`` maps the original's API line by line.

The OpenEnv *server* (Fleet tasks for any OpenEnv client; ``fleetenv serve openenv``) is
``fleetenv.adapters.openenv.server``; ``FleetOpenEnvEnvironment``,
``FleetServerSettings`` and ``OpenEnvServer`` are also resolved here on first use.
"""

from __future__ import annotations

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

_LAZY_TYPES = frozenset({"CallToolAction", "FleetAction", "FleetObservation", "FleetState",
                         "ListToolsAction", "StepResult"})


_LAZY_SERVER = frozenset({"FleetOpenEnvEnvironment", "FleetServerSettings", "OpenEnvServer"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_TYPES:
        from fleetenv.adapters.openenv import types

        return getattr(types, name)
    if name in _LAZY_SERVER:
        from fleetenv.adapters.openenv import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
