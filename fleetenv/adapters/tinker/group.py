"""``FleetEnvGroupBuilder``: one Fleet task, ``group_size`` episodes, for Tinker.

Why it holds only plain values: the cookbook pickles group builders to rollout workers,
so the tokenizer, renderer, FleetEnvs and session are made in ``make_envs()``, where the
episodes run; the API key is never a field (``FLEET_API_KEY`` there). Provisioning
happens in ``Env.initial_observation``: the cookbook starts a group's members at once, the
shared session's caps bound them, and a member never started costs nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fleetenv import runtime
from fleetenv.adapters.tinker import _cookbook as cb
from fleetenv.adapters.tinker.env import DEFAULT_SYSTEM_PROMPT, FleetTinkerEnv
from fleetenv.adapters.tinker.metrics import ToolCallTap
from fleetenv.core.config import finite_reward
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.tasks import Task
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.env.options import EpisodeOptions
from fleetenv.fleet.session import Session

__all__ = ["FleetEnvGroupBuilder", "session_for"]

logger = logging.getLogger(__name__)



def session_for(base_url: str | None = None,
                settings: Mapping[str, Any] | None = None) -> Session:
    """The process's shared session (:meth:`fleetenv.Session.shared`) for ``base_url``
    and FleetConfig ``settings``, so the caps hold across every group that asks with
    them; its API key comes from ``FLEET_API_KEY`` (none: the embedded local Fleet)."""
    return Session.shared(base_url=base_url, **dict(settings or {}))


class FleetEnvGroupBuilder(cb.EnvGroupBuilderBase):
    """A Tinker ``EnvGroupBuilder``: ``group_size`` episodes of one Fleet ``task``.

    ``model_name`` names the tokenizer (a Hugging Face model id, a local directory, or a
    name registered with ``tinker_cookbook.tokenizer_utils.register_tokenizer``);
    ``renderer_name`` the cookbook renderer (default: the one the cookbook recommends
    for the model). ``env_options`` is the :class:`fleetenv.EpisodeOptions` of every
    episode (or a mapping of its fields: ``max_steps``, ``episode_deadline_s``,
    ``partial_reward``, ``no_tool_call``, ...).
    ``base_url`` / ``fleet_settings`` pick the session (:func:`session_for`).

    Rewards: the episode's grade; ``unknown_reward`` when the grade is unknown;
    ``failed_parse_reward`` for a turn that cannot be read (see
    :class:`~fleetenv.adapters.tinker.FleetTinkerEnv`). ``cleanup()`` closes whatever
    is still open, at most ``cleanup_timeout_s``, and never raises.
    """

    def __init__(self, task: Task | Mapping[str, Any], *, group_size: int, model_name: str,
                 renderer_name: str | None = None,
                 system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 failed_parse_reward: float = -1.0,
                 terminate_on_parse_error: bool = True,
                 unknown_reward: float = 0.0,
                 max_trajectory_tokens: int | None = None,
                 env_options: EpisodeOptions | Mapping[str, Any] | None = None,
                 base_url: str | None = None,
                 fleet_settings: Mapping[str, Any] | None = None,
                 cleanup_timeout_s: float = 60.0,
                 tags: Sequence[str] = ()) -> None:
        self.task = task if isinstance(task, Task) else Task.model_validate(dict(task))
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
            raise ConfigurationError(f"group_size must be a positive int, got {group_size!r}",
                                     hint="e.g. group_size=8 (episodes per task)",
                                     field="group_size")
        if not isinstance(model_name, str) or not model_name:
            raise ConfigurationError("model_name must name the tokenizer",
                                     hint='e.g. model_name="Qwen/Qwen3-8B"',
                                     field="model_name")
        options = EpisodeOptions.of(env_options)
        if options.failed_parse_reward is not None:  # this adapter pays it, not FleetEnv
            raise ConfigurationError(
                "failed_parse_reward is a setting of the builder, not of env_options",
                hint="pass FleetEnvGroupBuilder(failed_parse_reward=...)", field="env_options")
        self.group_size = group_size
        self.model_name = model_name
        self.renderer_name = renderer_name
        self.system_prompt = system_prompt
        self.failed_parse_reward = finite_reward(
            failed_parse_reward, field="failed_parse_reward",
            hint="e.g. failed_parse_reward=-1.0 (the cookbook's default)")
        self.terminate_on_parse_error = bool(terminate_on_parse_error)
        self.unknown_reward = finite_reward(unknown_reward, field="unknown_reward",
                                            hint="e.g. unknown_reward=0.0 (the default)")
        self.max_trajectory_tokens = max_trajectory_tokens
        self.env_options = options
        self.base_url = base_url
        self.fleet_settings = dict(fleet_settings or {})
        self.cleanup_timeout_s = float(cleanup_timeout_s)
        self.tags = list(tags)
        self._envs: list[FleetEnv] = []
        self._renderer: Any = None

    def __repr__(self) -> str:
        return (f"<FleetEnvGroupBuilder task={self.task.key!r} group_size={self.group_size}"
                f" model={self.model_name!r}>")

    # Pickled without the live parts: a copy sent to a worker makes its own.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_envs": [], "_renderer": None}

    # ---------------------------------------------------------------- EnvGroupBuilder

    def renderer(self) -> Any:
        """The cookbook renderer for ``model_name`` (made once per builder copy)."""
        if self._renderer is None:
            tokenizer = cb.tokenizer_utils.get_tokenizer(self.model_name)
            name = (self.renderer_name
                    or cb.model_info.get_recommended_renderer_name(self.model_name))
            self._renderer = cb.renderers.get_renderer(name, tokenizer,
                                                       model_name=self.model_name)
        return self._renderer

    async def make_envs(self) -> Sequence[FleetTinkerEnv]:
        renderer = self.renderer()
        session = session_for(self.base_url, self.fleet_settings)
        tap = ToolCallTap.on(session.events)
        envs: list[FleetTinkerEnv] = []
        for _ in range(self.group_size):
            fleet_env = FleetEnv(self.task, session=session, options=self.env_options)
            self._envs.append(fleet_env)
            envs.append(FleetTinkerEnv(
                fleet_env, renderer, system_prompt=self.system_prompt,
                failed_parse_reward=self.failed_parse_reward,
                terminate_on_parse_error=self.terminate_on_parse_error,
                unknown_reward=self.unknown_reward,
                max_trajectory_tokens=self.max_trajectory_tokens, tap=tap))
        return envs

    async def cleanup(self) -> None:
        """Close every episode this builder made that is still open: ungraded (an
        episode still running when its group is cleaned up failed), all at once.
        Idempotent; never raises (cancellation still propagates).

        Returns within ``cleanup_timeout_s``. The closes run on the runtime's pool
        (``FleetEnv.close``, itself bounded by fleetenv's timeouts) rather than as
        ``close_async`` on the trainer's loop: a close cut off at the bound must go on
        and delete the instance, and a cancelled ``close_async`` would stop half-way.
        """
        envs, self._envs = self._envs, []
        if not envs:
            return
        loop = asyncio.get_running_loop()
        pool = runtime.current()
        closing = [asyncio.wrap_future(
            pool.submit_blocking(functools.partial(env.close, grade=False)), loop=loop)
            for env in envs]
        done, pending = await asyncio.wait(closing, timeout=self.cleanup_timeout_s)
        if pending:
            late = [env for env, task in zip(envs, closing, strict=True) if task in pending]
            logger.warning(
                "cleanup of %s: closing %d episode(s) took over %.0f s; it goes on in the "
                "background, and instances %s are deleted by the session at exit at the "
                "latest", self.task.key, len(late), self.cleanup_timeout_s,
                ", ".join(env.last_instance_id or "?" for env in late))
        for env, task in zip(envs, closing, strict=True):
            if task in done and task.exception() is not None:
                logger.warning("cleanup of %s: closing instance %s failed: %s",
                               self.task.key, env.last_instance_id, task.exception())

    def logging_tags(self) -> list[str]:
        return ["fleet", self.task.env_key, *self.tags]
