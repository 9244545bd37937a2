"""``run_episode_async``: `run_episode` for async callers, and async policies.

The same episode as :func:`~fleetenv.rollouts.rollout.run_episode` (same result record,
events, one step per policy reply), driven through ``FleetEnv.reset_async`` /
``step_async`` / ``close_async``. Awaited from the caller's asyncio or trio loop, the MCP
work runs on fleetenv's loop and the caller's loop stays free; awaited ON fleetenv's loop
(the Runner's asyncio mode) the whole episode is one coroutine there, with no thread of
its own.

Policies:

* an *async* policy (a coroutine function of the context, or an object whose ``act`` is
  a coroutine function) is awaited where the episode runs;
* a built-in scripted policy (``"reference"``, ``ScriptedPolicy``) only looks up its next
  call, so it is called inline;
* any other sync policy (a model client that blocks on HTTP, a function) runs on the
  runtime's pool, so it never blocks a loop.
"""

from __future__ import annotations

import inspect
import time
from typing import TYPE_CHECKING, Any

import anyio

from fleetenv import runtime
from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import RolloutCancelled
from fleetenv.core.event_bus import EventBus
from fleetenv.core.tasks import Task
from fleetenv.core.types import RolloutResult, StopReason
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.rollouts.policy import (
    CallablePolicy,
    Policy,
    PolicyContext,
    Reply,
    ScriptedPolicy,
    to_reply,
)
from fleetenv.rollouts.policy_spec import PolicySpec, as_policy, parse_policy_spec
from fleetenv.rollouts.rollout import CancelToken, Episode

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.env.options import EpisodeOptions
    from fleetenv.fleet.session import Session

__all__ = ["is_async_policy", "run_episode_async", "runs_on_loop"]

def is_async_policy(policy: object) -> bool:
    """A coroutine function of the context, or an object whose ``act`` is one."""
    if inspect.iscoroutinefunction(policy):
        return True
    act = getattr(policy, "act", None)
    return act is not None and inspect.iscoroutinefunction(act)


def runs_on_loop(policy: object) -> bool:
    """Whether a policy costs the loop nothing: async, or a built-in scripted policy.
    This is the Runner's ``mode="auto"`` rule for picking the asyncio mode."""
    if isinstance(policy, str):
        policy = parse_policy_spec(policy)
    if isinstance(policy, PolicySpec):
        return policy.kind in ("reference", "scripted")
    return is_async_policy(policy) or isinstance(policy, ScriptedPolicy)


class _Actor:
    """One way to ask the policy for its next reply, chosen once per episode."""

    def __init__(self, policy: object) -> None:
        self.inline = False
        self.fn: Any
        if is_async_policy(policy):
            self.fn = (policy if inspect.iscoroutinefunction(policy)
                       else getattr(policy, "act"))  # noqa: B009 - policy is an object
            self.is_async = True
            self.label = _describe(policy, "CallablePolicy" if inspect.isfunction(policy)
                                   else type(policy).__name__)
            return
        agent: Policy = as_policy(policy)  # type: ignore[arg-type]
        self.label = _describe(policy, type(agent).__name__)
        built = agent.fn if isinstance(agent, CallablePolicy) else agent
        if is_async_policy(built):  # e.g. a PolicySpec("import") of an async function
            self.fn = built if inspect.iscoroutinefunction(built) else agent.act
            self.is_async = True
            return
        self.is_async = False
        self.inline = isinstance(agent, ScriptedPolicy)
        self.fn = agent.act

    async def act(self, context: PolicyContext) -> Reply:
        if self.is_async:
            value = await self.fn(context)
        elif self.inline:
            value = self.fn(context)
        else:  # in the caller's context (a trace span), one copy per call
            value = await runtime.current().run_blocking(self.fn, context)
        if inspect.isawaitable(value):  # a sync callable that returned a coroutine
            value = await value
        return to_reply(value, context.task)


def _describe(policy: object, fallback: str) -> str:
    describe = getattr(policy, "describe", None)
    return str(describe()) if callable(describe) else fallback


async def run_episode_async(
    task: Task,
    policy: Policy | Any,
    *,
    session: Session | None = None,
    config: FleetConfig | None = None,
    sample: int = 0,
    events: EventBus | None = None,
    options: EpisodeOptions | None = None,
    max_steps: int | None = None,
    system_prompt: str | None = None,
    cancel: CancelToken | None = None,
    run_tag: str | None = None,
) -> RolloutResult:
    """Await one episode of ``policy`` on ``task``; the awaitable twin of
    :func:`~fleetenv.run_episode` (same arguments, same result record).

    ``policy`` may also be async (see the module docstring); a sync one runs on the
    runtime's pool. Never raises for a broken
    episode; cancelling the awaiting task closes the env (ungraded) and re-raises.
    """
    episode = Episode(task, sample, system_prompt)
    env: FleetEnv | None = None
    try:
        actor = _Actor(policy)
        episode.result.policy = actor.label
        env = episode.make_env(session=session, config=config, events=events,
                               options=options, max_steps=max_steps, run_tag=run_tag)
        if cancel is not None and not cancel.try_register(env):
            raise RolloutCancelled("the run was cancelled")
        observation, _ = await env.reset_async()
        episode.messages.extend(observation.to_messages())
        while not env.done:
            if cancel is not None and cancel.is_set():
                raise RolloutCancelled("the run was cancelled")
            asked = time.monotonic()
            reply = await actor.act(episode.context(env))
            episode.policy_s += time.monotonic() - asked
            observation, *_ = await env.step_async(episode.record_reply(env, reply))
            episode.record_observation(observation, reply)
        episode.result.stop_reason = env.stop_reason
    except RolloutCancelled as exc:
        episode.failed(exc, StopReason.CANCELLED)
    except Exception as exc:
        episode.failed(exc, StopReason.ERROR)
    finally:
        if env is not None:
            try:
                arguments = episode.close_arguments()
                if episode.result.stop_reason is None:  # the awaiting task was cancelled
                    arguments.update(grade=False, reason=StopReason.INTERRUPTED)
                # Shielded: a cancelled caller (asyncio or trio) still deletes the instance.
                with anyio.CancelScope(shield=True):
                    await env.close_async(**arguments)
            finally:
                if cancel is not None:
                    cancel.unregister(env)
    return episode.finish(env)
