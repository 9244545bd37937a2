"""fleetenv: blocking reset/step/close episodes on Fleet environments.

The public API is what ``__all__`` lists, plus the public modules ``fleetenv.errors``,
``fleetenv.events``, ``fleetenv.mcp``, ``fleetenv.local`` and ``fleetenv.adapters``.
Names are imported on first use, so ``import fleetenv`` stays cheap (no mcp, httpx or
fleet-python until an episode needs them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fleetenv._version import __version__
from fleetenv.core.errors import FleetEnvError
from fleetenv.fleet import backend as _backend

# name -> module that defines it; imported on first attribute access.
_LAZY: dict[str, str] = {
    # sessions and settings
    "Session": "fleetenv.fleet.session",
    "FleetConfig": "fleetenv.core.config",
    "Timeouts": "fleetenv.core.config",
    "resolve_config": "fleetenv.core.config",
    # tasks
    "Task": "fleetenv.core.tasks",
    "load_tasks": "fleetenv.core.task_files",
    "bundled_tasks_path": "fleetenv.core.task_files",
    "select_tasks": "fleetenv.core.tasks",
    # episodes
    "FleetEnv": "fleetenv.env.fleet_env",
    "EpisodeOptions": "fleetenv.env.options",
    "parse_tool_calls": "fleetenv.env.tool_call_parsing",
    "Tool": "fleetenv.mcp.tools",
    "ToolResult": "fleetenv.core.tool_results",
    # the episode contract (one module: fleetenv.core.types)
    "ToolCall": "fleetenv.core.types",
    "FinalAnswer": "fleetenv.core.types",
    "Done": "fleetenv.core.types",
    "Observation": "fleetenv.core.types",
    "StepResult": "fleetenv.core.types",
    "StepInfo": "fleetenv.core.types",
    "ResetInfo": "fleetenv.core.types",
    "Grade": "fleetenv.core.types",
    "RolloutResult": "fleetenv.core.types",
    "Modality": "fleetenv.core.types",
    "StopReason": "fleetenv.core.types",
    "GradeStatus": "fleetenv.core.types",
    "GradeReason": "fleetenv.core.types",
    # evaluating tasks with Fleet's harness jobs
    "Evaluator": "fleetenv.fleet.evaluator",
    "EvaluationResult": "fleetenv.fleet.evaluator",
    "evaluate_task": "fleetenv.fleet.evaluator",
    "evaluate_task_async": "fleetenv.fleet.evaluator",
    # rollouts, for trainers
    "Runner": "fleetenv.rollouts.runner",
    "run_episode": "fleetenv.rollouts.rollout",
    "run_episode_async": "fleetenv.rollouts.rollout",
    "RayRunner": "fleetenv.rollouts.ray_runner",
    "WarmPool": "fleetenv.fleet.warm_pool",
    "PolicyContext": "fleetenv.rollouts.policy",
    "Reply": "fleetenv.rollouts.policy",
    "PolicySpec": "fleetenv.rollouts.policy_spec",
    "summarize": "fleetenv.rollouts.metrics",
    "read_results": "fleetenv.rollouts.results",
    "ResultsWriter": "fleetenv.rollouts.results",
    # events
    "EventBus": "fleetenv.core.event_bus",
    "JsonlSink": "fleetenv.core.event_sinks",
    # the embedded Fleet
    "LocalFleet": "fleetenv.local",
}

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from fleetenv.core.config import FleetConfig, Timeouts, resolve_config
    from fleetenv.core.event_bus import EventBus
    from fleetenv.core.event_sinks import JsonlSink
    from fleetenv.core.task_files import bundled_tasks_path, load_tasks
    from fleetenv.core.tasks import Task, select_tasks
    from fleetenv.core.tool_results import ToolResult
    from fleetenv.core.types import (
        Done,
        FinalAnswer,
        Grade,
        GradeReason,
        GradeStatus,
        Modality,
        Observation,
        ResetInfo,
        RolloutResult,
        StepInfo,
        StepResult,
        StopReason,
        ToolCall,
    )
    from fleetenv.env.fleet_env import FleetEnv
    from fleetenv.env.options import EpisodeOptions
    from fleetenv.env.tool_call_parsing import parse_tool_calls
    from fleetenv.fleet.evaluator import (
        EvaluationResult,
        Evaluator,
        evaluate_task,
        evaluate_task_async,
    )
    from fleetenv.fleet.session import Session
    from fleetenv.fleet.warm_pool import WarmPool
    from fleetenv.local import LocalFleet
    from fleetenv.mcp.tools import Tool
    from fleetenv.rollouts.metrics import summarize
    from fleetenv.rollouts.policy import PolicyContext, Reply
    from fleetenv.rollouts.policy_spec import PolicySpec
    from fleetenv.rollouts.ray_runner import RayRunner
    from fleetenv.rollouts.results import ResultsWriter, read_results
    from fleetenv.rollouts.rollout import run_episode, run_episode_async
    from fleetenv.rollouts.runner import Runner


def _start_local_fleet() -> tuple[LocalFleet, Sequence[str]]:
    """The default backend without an API key: the embedded local Fleet, whose harness
    jobs run through fleetenv's own rollouts (the one place the stack and the local Fleet
    are wired together; ``fleetenv.fleet.backend`` starts it on first use)."""
    from fleetenv.local import LocalFleet
    from fleetenv.local.apps import APPS
    from fleetenv.rollouts.harness import ScriptedHarness

    return LocalFleet(harness=ScriptedHarness).start(), sorted(APPS)


_backend.use_local_fleet(_start_local_fleet)


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is not None:
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fleetenv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Done",
    "EpisodeOptions",
    "EvaluationResult",
    "Evaluator",
    "EventBus",
    "FinalAnswer",
    "FleetConfig",
    "FleetEnv",
    "FleetEnvError",
    "Grade",
    "GradeReason",
    "GradeStatus",
    "JsonlSink",
    "LocalFleet",
    "Modality",
    "Observation",
    "PolicyContext",
    "PolicySpec",
    "RayRunner",
    "Reply",
    "ResetInfo",
    "ResultsWriter",
    "RolloutResult",
    "Runner",
    "Session",
    "StepInfo",
    "StepResult",
    "StopReason",
    "Task",
    "Timeouts",
    "Tool",
    "ToolCall",
    "ToolResult",
    "WarmPool",
    "__version__",
    "bundled_tasks_path",
    "evaluate_task",
    "evaluate_task_async",
    "load_tasks",
    "parse_tool_calls",
    "read_results",
    "resolve_config",
    "run_episode",
    "run_episode_async",
    "select_tasks",
    "summarize",
]
