"""A drop-in for OpenEnv's ``envs.fleet_env.FleetTaskEnv``, as SkyRL and Tinker use it.

Swap the import and existing integrations keep working::

    from fleetenv.adapters.openenv import FleetTaskEnv   # was: from envs.fleet_env import ...

    env = FleetTaskEnv(task_config, api_key=..., ttl_seconds=..., max_steps=max_turns)
    obs = env.reset()                                  # or: await env.reset_async()
    obs, reward, done, info = env.step({"tool": "search", "params": {...}, "done": False})
    env.close()
    env.final_reward, env.verifier_stdout, env.tool_errors_list   # read after close

Underneath is a :class:`fleetenv.FleetEnv`, so the old client's bugs are gone: no
``asyncio.run`` per call, no session per tool call, no silent reward loss at close, and
``reward`` is ``None`` (not 0.0) when the grade is unknown.

Observation dicts keep the old keys: ``prompt``, ``observation``, ``step``, ``task_key``,
``modality``, ``tools`` (OpenAI format) and, after reset of a computer/browser task,
``initial_screenshot`` (a list of ``image_url`` parts). ``observation`` is the tool's text
exactly as returned (a ``"null"`` stays ``"null"``), a list of chat content parts when the
result has images, or ``{"error": message}`` for a failed call.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any

from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task, select_tasks
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.env.observation import Observation


class FleetTaskEnv:
    """OpenEnv-compatible wrapper: ``reset() -> obs``, ``step(action) -> (obs, reward,
    done, info)``, ``close()``, and the ``*_async`` twins."""

    def __init__(
        self,
        task_config: Mapping[str, Any] | Task,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        ttl_seconds: int | None = None,
        max_steps: int = 50,
        request_timeout_s: float | None = None,
        **fleet_env_kwargs: Any,
    ) -> None:
        task = task_config if isinstance(task_config, Task) else Task.model_validate(
            dict(task_config))
        config_kwargs: dict[str, Any] = {}
        if request_timeout_s is not None:
            from fleetenv.core.config import resolve_config

            fleet_env_kwargs["config"] = resolve_config(
                api_key=api_key, base_url=base_url, tool_timeout_s=request_timeout_s)
        else:
            config_kwargs = {"api_key": api_key, "base_url": base_url}
        self.task_config = task.to_fleet_dict()
        self._env = FleetEnv(task, ttl_seconds=ttl_seconds, max_steps=max_steps,
                             **config_kwargs, **fleet_env_kwargs)
        self.final_reward: float | None = None

    # ------------------------------------------------------------------ factories

    @classmethod
    def from_json_file(cls, path: str | PathLike[str], task_key: str | None = None,
                       **kwargs: Any) -> FleetTaskEnv:
        """The task ``task_key`` (or the only task) of a task file, as an env."""
        tasks = load_tasks(path)
        if task_key is None:
            if len(tasks) != 1:
                from fleetenv.core.errors import ConfigurationError

                raise ConfigurationError(
                    f"{path} holds {len(tasks)} tasks; say which one",
                    hint="pass task_key=...")
            return cls(tasks[0], **kwargs)
        (task,) = select_tasks(tasks, [task_key])
        return cls(task, **kwargs)

    # ------------------------------------------------------------------ what SkyRL reads

    @property
    def env(self) -> FleetEnv:
        """The underlying :class:`fleetenv.FleetEnv`."""
        return self._env

    @property
    def _done(self) -> bool:
        return self._env.done

    @property
    def instance_id(self) -> str | None:
        return self._env.instance_id

    # The task, as the original exposed it.
    @property
    def task_key(self) -> str:
        return self._env.task.key

    @property
    def prompt(self) -> str:
        return self._env.task.prompt

    @property
    def modality(self) -> str:
        return str(self._env.task.modality)

    @property
    def env_key(self) -> str:
        return self._env.task.env_key

    @property
    def env_version(self) -> str | None:
        return self._env.task.env_version

    @property
    def root_url(self) -> str | None:
        return self._env.root_url

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self._env.openai_tools

    @property
    def verifier_stdout(self) -> str | None:
        grade = self._env.grade
        return grade.stdout if grade else None

    @property
    def verifier_error(self) -> str | None:
        grade = self._env.grade
        return grade.error if grade else None

    @property
    def tool_errors_list(self) -> list[str]:
        return list(self._env.stats.tool_error_messages)

    @property
    def last_verifier_execution_id(self) -> str | None:
        grade = self._env.grade
        return grade.execution_id if grade else None

    _last_verifier_execution_id = last_verifier_execution_id

    # ------------------------------------------------------------------ episode

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Start an episode; the previous episode's ``final_reward`` is cleared first."""
        self.final_reward = None
        observation, _ = self._env.reset(seed=seed)
        return self._reset_obs(observation)

    async def reset_async(self, seed: int | None = None) -> dict[str, Any]:
        self.final_reward = None
        observation, _ = await self._env.reset_async(seed=seed)
        return self._reset_obs(observation)

    def step(self, action: Mapping[str, Any]) -> tuple[dict[str, Any], float | None, bool,
                                                       dict[str, Any]]:
        return self._step_result(*self._env.step(action))

    async def step_async(self, action: Mapping[str, Any]) -> tuple[dict[str, Any],
                                                                   float | None, bool,
                                                                   dict[str, Any]]:
        return self._step_result(*await self._env.step_async(action))

    def close(self) -> None:
        self._env.close()
        self.final_reward = self._env.reward

    async def close_async(self) -> None:
        await self._env.close_async()
        self.final_reward = self._env.reward

    def __enter__(self) -> FleetTaskEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> FleetTaskEnv:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close_async()

    # ------------------------------------------------------------------ rendering

    def _base_obs(self, observation: Observation) -> dict[str, Any]:
        return {"prompt": observation.prompt, "step": observation.step,
                "task_key": observation.task_key, "modality": observation.modality,
                "tools": observation.tools}

    def _reset_obs(self, observation: Observation) -> dict[str, Any]:
        obs = self._base_obs(observation)
        obs["observation"] = {}
        images = [p for p in observation.content if p.get("type") == "image_url"]
        if images:
            obs["initial_screenshot"] = images
        return obs

    def _step_result(self, observation: Observation, reward: float | None,
                     terminated: bool, truncated: bool,
                     info: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool,
                                                    dict[str, Any]]:
        obs = self._base_obs(observation)
        obs["observation"] = _observation_value(observation)
        done = terminated or truncated
        info = dict(info)
        info["done_reason"] = {"agent_done": "agent_done", "max_steps": "max_steps"}.get(
            info.get("stop_reason") or "", info.get("stop_reason")) if done else None
        if "tool_result" not in info:
            info["tool_result"] = obs["observation"]
        if done:
            info["reward_computed"] = True
            self.final_reward = reward
        return obs, reward, done, info


def _observation_value(observation: Observation) -> Any:
    if observation.is_error:
        return {"error": observation.error}
    parts = observation.content
    if not parts:
        return {}
    if any(p.get("type") == "image_url" for p in parts):
        return parts
    texts = [p["text"] for p in parts if p.get("type") == "text"]
    return texts[0] if len(texts) == 1 else texts


def make_fleet_task_env(task_config: Mapping[str, Any] | Task, api_key: str | None = None,
                        **kwargs: Any) -> FleetTaskEnv:
    """OpenEnv's factory name for :class:`FleetTaskEnv`."""
    return FleetTaskEnv(task_config, api_key=api_key, **kwargs)
