"""The drop-in's OpenEnv types: OpenEnv's own classes when ``openenv-core`` is installed.

A user of OpenEnv's generic APIs expects the objects an env hands back to *be* OpenEnv's
``Action`` / ``Observation`` / ``State`` / ``StepResult``; without the optional
``openenv-core``, look-alike stand-ins with the same fields take their place. Imported on
first use only: importing ``openenv.core`` pulls in gradio and takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "OPENENV_AVAILABLE",
    "Action",
    "CallToolAction",
    "FleetAction",
    "FleetObservation",
    "FleetState",
    "ListToolsAction",
    "Observation",
    "State",
    "StepResult",
]

ObsT = TypeVar("ObsT")


OPENENV_AVAILABLE = False
if not TYPE_CHECKING:  # mypy checks against the stand-ins (openenv-core is untyped)
    try:
        from openenv.core.client_types import StepResult
        from openenv.core.env_server.types import Action, Observation, State

        OPENENV_AVAILABLE = True
    except ImportError:
        pass

if TYPE_CHECKING or not OPENENV_AVAILABLE:

    class Action(BaseModel):
        """Stand-in for ``openenv.core.env_server.types.Action``."""

        model_config = ConfigDict(extra="forbid", validate_assignment=True,
                                  arbitrary_types_allowed=True)
        metadata: dict[str, Any] = Field(default_factory=dict)

    class Observation(BaseModel):
        """Stand-in for ``openenv.core.env_server.types.Observation``."""

        model_config = ConfigDict(extra="forbid", validate_assignment=True,
                                  arbitrary_types_allowed=True)
        done: bool = False
        reward: bool | int | float | None = None
        metadata: dict[str, Any] = Field(default_factory=dict)

    class State(BaseModel):
        """Stand-in for ``openenv.core.env_server.types.State``."""

        model_config = ConfigDict(extra="allow", validate_assignment=True,
                                  arbitrary_types_allowed=True)
        episode_id: str | None = None
        step_count: int = Field(default=0, ge=0)

    @dataclass
    class StepResult(Generic[ObsT]):
        """Stand-in for ``openenv.core.client_types.StepResult``."""

        observation: ObsT
        reward: float | None = None
        done: bool = False


class FleetAction(Action):
    """The drop-in's action: ``{"tool": name | None, "params": {...}, "done": bool}``."""

    tool: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    done: bool = False


class CallToolAction(Action):
    """Call one tool (the original's name and fields: ``tool_name``, ``parameters``)."""

    tool_name: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class ListToolsAction(Action):
    """The tools, in OpenAI function format. As in the original, this is what
    ``FleetMCPTools.list_tools()`` *returns*, not a request."""

    tools: list[dict[str, Any]] = Field(default_factory=list)


class FleetObservation(Observation):
    """The drop-in's observation dict as a typed OpenEnv observation (same keys)."""

    prompt: str = ""
    observation: Any = None
    step: int = 0
    task_key: str = ""
    modality: str = "tool_use"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    initial_screenshot: list[dict[str, Any]] | None = None


class FleetState(State):
    """Where an episode is: OpenEnv's ``episode_id`` / ``step_count`` plus the task and
    instance (``extra`` fields are allowed, as in OpenEnv's ``State``)."""

    task_key: str | None = None
    env_key: str | None = None
    instance_id: str | None = None
    root_url: str | None = None
    done: bool = False
    final_reward: float | None = None
