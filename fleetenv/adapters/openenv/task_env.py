"""``FleetTaskEnv``: OpenEnv's ``envs.fleet_env.FleetTaskEnv``, as SkyRL and Tinker use it.

The original's constructor, methods, attributes, observation dicts and ``info`` keys
(docs/porting.md) over a :class:`fleetenv.FleetEnv`, whose rules hold: ``reward`` is
``None`` (not 0.0) when the grade is unknown, and the typed tool result is in
``info["typed_result"]`` next to the original's rendering (``rendering.py``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from os import PathLike
from typing import TYPE_CHECKING, Any

from fleetenv.adapters.openenv import telemetry
from fleetenv.adapters.openenv.clients import DatabaseMethods
from fleetenv.adapters.openenv.compat import DropInConfigurationError, env_aliases
from fleetenv.adapters.openenv.rendering import legacy_value
from fleetenv.core.config import resolve_config
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task, select_tasks
from fleetenv.core.types import ListTools, Observation
from fleetenv.env.actions import SUBMIT_FINAL_ANSWER
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.env.options import EpisodeOptions

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.adapters.openenv.types import FleetObservation, FleetState, StepResult

__all__ = ["FleetTaskEnv", "make_fleet_task_env"]

StepTuple = tuple[dict[str, Any], "float | None", bool, dict[str, Any]]

#: What the original answered for ``submit_final_answer`` (a local tool).
_SUBMITTED = {"status": "submitted", "message": "Answer recorded. Ending session."}
#: The keys of the original's action dict; a dict of only these that names no tool and is
#: not done is the original's no-op step.
_FLEET_ACTION_KEYS = frozenset({"tool", "params", "done"})


@dataclass(frozen=True)
class InstanceUrls:
    """``urls`` of the original's fleet-python handle: ``root`` ends with ``/``."""

    root: str


@dataclass(frozen=True)
class FleetEnvHandleView:
    """Read-only stand-in for the original's ``_orch._fleet_env`` (fleet-python env)."""

    instance_id: str
    urls: InstanceUrls
    region: str | None = None


@dataclass(frozen=True)
class OrchestratorView:
    """Read-only stand-in for the original's ``_orch`` (``None`` without an instance)."""

    _fleet_env: FleetEnvHandleView


class FleetTaskEnv(DatabaseMethods):
    """OpenEnv-compatible wrapper: ``reset() -> obs``, ``step(action) -> (obs, reward,
    done, info)``, ``close()``, and the ``*_async`` twins.

    The arguments are the original's. ``api_key`` may be left out: then
    ``FLEET_API_KEY``, or without one the embedded local Fleet. ``request_timeout_s``
    bounds each tool call and database query (default: the original's
    ``FLEET_CALL_TOOL_DEADLINE_S`` when set, else the session's 60 s), ``reset_timeout_s``
    the instance reset (the session's 10 s, as in the original). A task config it cannot
    read is a ``ValueError`` (and a ``ConfigurationError``), as in the original.
    ``partial_reward=True`` replaces a 0.0 score by the verifier's partial score
    (accumulators, per-app results; see ``fleetenv.Grade``). A tool-use task is offered
    the tools of both MCP endpoints, as in the original (``tool_endpoints="union"``;
    ``"first"`` is ``FleetEnv``'s faster default).
    ``base_url`` and any other keyword (``session=``, ``episode_deadline_s=``, ...) go to
    :class:`fleetenv.FleetEnv`.

    Set ``conversation_messages`` (the chat so far) before a step, as SkyRL does, and
    verifiers that take a ``conversation`` receive it.
    """

    def __init__(
        self,
        task_config: Mapping[str, Any] | Task,
        api_key: str | None = None,
        ttl_seconds: int | None = None,
        max_steps: int = 50,
        request_timeout_s: float | None = None,
        reset_timeout_s: float | None = None,
        partial_reward: bool | None = None,
        *,
        base_url: str | None = None,
        **fleet_env_kwargs: Any,
    ) -> None:
        task = _as_task(task_config)
        deadline_s = env_aliases()  # and the browser-lease aliases, once
        if request_timeout_s is None and fleet_env_kwargs.get("session") is None:
            request_timeout_s = deadline_s  # the original's FLEET_CALL_TOOL_DEADLINE_S
        settings = _timeouts(request_timeout_s=request_timeout_s,
                             reset_timeout_s=reset_timeout_s)
        if settings:  # the env's timeouts differ from its session's: a config of its own
            if fleet_env_kwargs.get("session") is not None:
                raise ConfigurationError(
                    "request_timeout_s / reset_timeout_s are settings of the session you "
                    "passed", hint='set them on the session: Session(timeouts={"call": ..., '
                    '"reset": ...})')
            config = fleet_env_kwargs.get("config")
            if config is None:  # else FleetEnv refuses a config given with a key or URL
                config = resolve_config(api_key=api_key, base_url=base_url)
                api_key = base_url = None
            fleet_env_kwargs["config"] = config.replace(timeouts=settings)
        options = EpisodeOptions.of(fleet_env_kwargs.pop("options", None))
        if options.tool_endpoints is None and fleet_env_kwargs.get("tool_endpoints") is None:
            # The original listed the tools of both endpoints: so does its drop-in.
            fleet_env_kwargs["tool_endpoints"] = "union"
        self.task_config = task.to_fleet_dict()
        self._env = FleetEnv(task, options=options, ttl_seconds=ttl_seconds,
                             max_steps=max_steps, partial_reward=partial_reward,
                             api_key=api_key, base_url=base_url, **fleet_env_kwargs)
        #: The chat so far, for judge verifiers that take ``conversation`` (set by the
        #: caller before a step or close, as in the original).
        self.conversation_messages: list[Any] | None = None
        self.final_reward: float | None = None
        #: The last fleetenv observation (typed result included), for new code.
        self.last_observation: Observation | None = None
        self._closed = False
        telemetry.attach(self._env.events)

    def __repr__(self) -> str:
        return f"<FleetTaskEnv {self._env!r}>"

    # ------------------------------------------------------------------ factories

    @classmethod
    def from_json_file(cls, path: str | PathLike[str], task_key: str | None = None,
                       **kwargs: Any) -> FleetTaskEnv:
        """The task ``task_key`` (or the only task) of a task file, as an env."""
        tasks = load_tasks(path)
        if task_key is None:
            if len(tasks) != 1:
                raise ConfigurationError(
                    f"{path} holds {len(tasks)} tasks; say which one",
                    hint="pass task_key=..., or use from_json_file_all()")
            return cls(tasks[0], **kwargs)
        (task,) = select_tasks(tasks, [task_key])
        return cls(task, **kwargs)

    @classmethod
    def from_json_file_all(cls, path: str | PathLike[str], **kwargs: Any) -> list[FleetTaskEnv]:
        """One env per task of a task file, in file order (nothing is provisioned yet).
        Any task file format fleetenv reads works."""
        return [cls(task, **kwargs) for task in load_tasks(path)]

    # ------------------------------------------------------------------ the original's attributes
    # Read-only views of the FleetEnv's state (assigning to one raises).

    @property
    def env(self) -> FleetEnv:
        """The underlying :class:`fleetenv.FleetEnv`."""
        return self._env

    task = property(attrgetter("task_config"))
    partial_reward = property(attrgetter("_env.options.partial_reward"), doc=(
        "Whether a 0.0 score is replaced by the verifier's partial score (default: the "
        "task's ``metadata[\"partial_reward\"]``, else off, as in the original)."))
    ttl_seconds = property(attrgetter("_env.options.ttl_seconds"))
    max_steps = property(attrgetter("_env.options.max_steps"))
    request_timeout_s = property(attrgetter("_env.config.timeouts.call"))
    reset_timeout_s = property(attrgetter("_env.config.timeouts.reset"))
    task_key = property(attrgetter("_env.task.key"))
    prompt = property(attrgetter("_env.task.prompt"))
    env_key = property(attrgetter("_env.task.env_key"))
    env_version = property(attrgetter("_env.task.env_version"))
    instance_id = property(attrgetter("_env.instance_id"))
    root_url = property(attrgetter("_env.root_url"))
    region = property(attrgetter("_env.region"), doc=(
        "The region Fleet reports for the instance, as fleet-python's ``env.region``."))
    modality = property(lambda self: str(self._env.task.modality))
    tools = property(attrgetter("_env.openai_tools"))
    tool_errors_list = property(lambda self: list(self._env.stats.tool_error_messages))
    verifier_stdout = property(lambda self: getattr(self._env.grade, "stdout", None))
    verifier_error = property(lambda self: getattr(self._env.grade, "error", None))
    last_verifier_execution_id = property(
        lambda self: getattr(self._env.grade, "execution_id", None))

    @property
    def api_key(self) -> str | None:
        key = self._env.config.api_key
        return key.get_secret_value() if key is not None else None

    # The private state SkyRL and Tinker read directly: read-only views of the real one.

    @property
    def _done(self) -> bool:
        """True once the episode ended (the verifier ran or will not) or the env closed."""
        return self._closed or self._env.done

    @property
    def _orch(self) -> OrchestratorView | None:
        """``_orch._fleet_env.instance_id`` / ``.urls.root``; ``None`` without an instance
        (before ``reset`` and after ``close``, as in the original)."""
        instance_id, root = self._env.instance_id, self._env.root_url
        if instance_id is None or root is None:
            return None
        return OrchestratorView(FleetEnvHandleView(instance_id, InstanceUrls(root),
                                                   self._env.region))

    _last_verifier_execution_id = last_verifier_execution_id
    _step_count = property(attrgetter("_env.stats.turns"))
    _submitted_answer = property(attrgetter("_env.final_answer"))
    _tools = property(lambda self: self._env.openai_tools or None)

    # ------------------------------------------------------------------ episode

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Start an episode; the previous episode's ``final_reward`` is cleared first."""
        self.final_reward = None
        observation, info = self._env.reset(seed=seed)
        return self._reset_obs(observation, info)

    async def reset_async(self, seed: int | None = None) -> dict[str, Any]:
        self.final_reward = None
        observation, info = await self._env.reset_async(seed=seed)
        return self._reset_obs(observation, info)

    def step(self, action: object) -> StepTuple:
        """One action: ``{"tool", "params", "done"}`` (or any form ``FleetEnv`` takes).
        A dict that names no tool and is not done is a no-op step, as in the original:
        nothing runs, the step counts, ``observation`` is ``{}``."""
        noop, forwarded = _forwarded_action(action)
        self._forward_conversation()
        return self._step_result(*self._env.step(forwarded), noop=noop)

    async def step_async(self, action: object) -> StepTuple:
        noop, forwarded = _forwarded_action(action)
        self._forward_conversation()
        return self._step_result(*await self._env.step_async(forwarded), noop=noop)

    def close(self) -> None:
        """Grade an unfinished episode, delete the instance; ``final_reward`` is set."""
        self._forward_conversation()
        try:
            self._env.close()
        finally:
            self._closed = True
            self.final_reward = self._env.reward

    async def close_async(self) -> None:
        self._forward_conversation()
        try:
            await self._env.close_async()
        finally:
            self._closed = True
            self.final_reward = self._env.reward

    def __enter__(self) -> FleetTaskEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> FleetTaskEnv:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close_async()

    # ------------------------------------------------------------------ OpenEnv types

    def state(self) -> FleetState:
        """The episode as OpenEnv's ``State`` (``episode_id`` is the rollout id)."""
        from fleetenv.adapters.openenv.types import FleetState

        return FleetState(episode_id=self._env.rollout_id, step_count=self._env.stats.turns,
                          task_key=self.task_key, env_key=self._env.task.env_spec,
                          instance_id=self.instance_id, root_url=self.root_url,
                          done=self._done, final_reward=self.final_reward)

    def reset_result(self, seed: int | None = None) -> StepResult[FleetObservation]:
        """``reset()`` as OpenEnv's ``StepResult[FleetObservation]``."""
        return _as_step_result(self.reset(seed), None, False, {})

    def step_result(self, action: object) -> StepResult[FleetObservation]:
        """``step()`` as OpenEnv's ``StepResult[FleetObservation]`` (``info`` is the
        observation's ``metadata``)."""
        return _as_step_result(*self.step(action))

    async def reset_result_async(self, seed: int | None = None
                                 ) -> StepResult[FleetObservation]:
        return _as_step_result(await self.reset_async(seed), None, False, {})

    async def step_result_async(self, action: object) -> StepResult[FleetObservation]:
        return _as_step_result(*await self.step_async(action))

    # ------------------------------------------------------------------ internals

    def _database(self) -> FleetEnv:
        return self._env

    def _forward_conversation(self) -> None:
        if self.conversation_messages is not None:
            self._env.conversation = list(self.conversation_messages)

    def _base_obs(self, observation: Observation) -> dict[str, Any]:
        return {"prompt": observation.prompt, "step": observation.step,
                "task_key": observation.task_key, "modality": observation.modality,
                "tools": observation.tools}

    def _reset_obs(self, observation: Observation, info: Mapping[str, Any]) -> dict[str, Any]:
        self.last_observation = observation
        obs = self._base_obs(observation)
        obs["observation"] = {}
        images = [p for p in observation.content if p.get("type") == "image_url"]
        if images:
            obs["initial_screenshot"] = images
        if info.get("screenshot_error"):
            attrs = telemetry.base_attributes(self.task_key, self._env.task.env_spec,
                                              self.modality)
            telemetry.emit_legacy("fleet_screenshot_failed", logging.ERROR, {
                **attrs, "step_count": 0, "instance_id": self.instance_id,
                "error_message": str(info["screenshot_error"])})
        return obs

    def _step_result(self, observation: Observation, reward: float | None,
                     terminated: bool, truncated: bool, step_info: Mapping[str, Any], *,
                     noop: bool) -> StepTuple:
        self.last_observation = observation
        obs = self._base_obs(observation)
        if noop:
            value: Any = {}
        elif observation.tool_name == SUBMIT_FINAL_ANSWER and not observation.is_error:
            value = dict(_SUBMITTED)
        else:
            value = legacy_value(observation.content, observation.error)
        obs["observation"] = value
        done = terminated or truncated
        info = dict(step_info)
        if noop:
            info.pop("tool_name", None)
        elif observation.tool_name is not None:
            info.setdefault("tool_result", value)
        info["typed_result"] = observation.result
        reason = info.get("stop_reason")
        info["done_reason"] = str(reason) if done and reason is not None else None
        if done:
            info["reward_computed"] = True
            self.final_reward = reward
        return obs, reward, done, info


def _as_task(task_config: object) -> Task:
    if isinstance(task_config, Task):
        return task_config
    if isinstance(task_config, Mapping):
        try:
            return Task.model_validate(dict(task_config))
        except ConfigurationError as exc:  # the original: ValueError("... missing env_key")
            context: dict[str, Any] = dict(exc.context)
            raise DropInConfigurationError(exc.message, hint=exc.hint, **context) from None
    hint = ("for a task file use FleetTaskEnv.from_json_file(path, task_key)"
            if isinstance(task_config, str | PathLike) else "pass the task's dict")
    raise ConfigurationError(f"FleetTaskEnv needs a task config dict, got a "
                             f"{type(task_config).__name__}", hint=hint)


def _forwarded_action(action: object) -> tuple[bool, object]:
    """(is it the original's no-op step, the action to hand to ``FleetEnv``)."""
    from pydantic import BaseModel

    if isinstance(action, BaseModel):
        action = _from_model(action)
    if (isinstance(action, Mapping) and set(action) <= _FLEET_ACTION_KEYS
            and not action.get("tool") and not action.get("done")):
        return True, ListTools()  # runs nothing; the step counts toward max_steps
    return False, action


def _from_model(action: Any) -> object:
    """OpenEnv action models (``types.py``) as the dicts ``FleetEnv`` reads."""
    from fleetenv.adapters.openenv.types import CallToolAction, FleetAction

    if isinstance(action, FleetAction):
        return {"tool": action.tool, "params": action.params, "done": action.done}
    if isinstance(action, CallToolAction):
        return {"type": "call_tool", "tool_name": action.tool_name,
                "arguments": action.parameters}
    return action


def _as_step_result(obs: dict[str, Any], reward: float | None, done: bool,
                    info: dict[str, Any]) -> StepResult[FleetObservation]:
    from fleetenv.adapters.openenv.types import FleetObservation, StepResult

    observation = FleetObservation(**obs, done=done, reward=reward, metadata=info)
    return StepResult(observation=observation, reward=reward, done=done)


def _timeouts(**values: float | None) -> dict[str, Any]:
    """The given timeouts as `Timeouts` fields (``request_timeout_s`` bounds a tool call
    and a database query: ``call`` and ``read``); each must be a positive number of
    seconds."""
    names = {"request_timeout_s": ("call", "read"), "reset_timeout_s": ("reset",)}
    settings: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value <= 0):
            raise ConfigurationError(f"FleetTaskEnv({name}={value!r}): must be a positive "
                                     "number of seconds", hint=f"e.g. {name}=60")
        settings.update(dict.fromkeys(names[name], float(value)))
    return settings


def make_fleet_task_env(task_config: Mapping[str, Any] | Task, api_key: str | None = None,
                        **kwargs: Any) -> FleetTaskEnv:
    """OpenEnv's factory name for :class:`FleetTaskEnv`."""
    return FleetTaskEnv(task_config, api_key=api_key, **kwargs)
