"""``run_episode`` and ``run_episode_async``: one rollout of a policy on a task, start to
finish, as a result record.

Both drive ONE plan (:func:`episode_plan`, a generator of `fleetenv.runtime.plans`
operations that yields from FleetEnv's own reset, step and close plans), so the sync and
the async episode cannot drift. The policy's turn is one more operation:

* a sync policy (a model client that blocks on HTTP, a function) is ``Blocking``: run in
  the caller's thread by ``run_episode``, on the runtime's pool by ``run_episode_async``;
* an async policy (a coroutine function of the context, or an object whose ``act`` is
  one) is ``Await``: awaited where ``run_episode_async`` runs (the caller's loop, to
  which its client is bound); ``run_episode`` refuses it;
* a built-in scripted policy only looks up its next call, so it is called inline.

Neither raises for a broken episode: a provisioning failure, a policy that raises, or an
instance that died becomes a :class:`RolloutResult` with ``error`` set, so a batch of
rollouts survives any one of them. Only Ctrl-C / cancellation propagate, after the
instance is deleted.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import RolloutCancelled
from fleetenv.core.event_bus import EventBus
from fleetenv.core.redaction import redact
from fleetenv.core.tasks import Task
from fleetenv.core.types import Action, Observation, RolloutResult, StopReason
from fleetenv.env.argument_hints import task_type_error
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
from fleetenv.runtime.plans import Await, Blocking, Plan, run_async, run_sync

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.env.options import EpisodeOptions
    from fleetenv.fleet.session import Session

__all__ = ["CancelToken", "Episode", "RolloutCancelled", "episode_plan", "is_async_policy",
           "run_episode", "run_episode_async", "runs_on_loop"]

T = TypeVar("T")


class CancelToken:
    """Shared by a runner and its episodes: once set, episodes stop at the next turn and
    the environments they registered are closed at once (which also fails any tool call
    in flight), so Ctrl-C never waits for a slow tool or model."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._envs: set[FleetEnv] = set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def register(self, env: FleetEnv) -> bool:
        """Register ``env``; ``False`` (and ``env`` left alone) once the token is set.
        A ``cancel()`` racing with this sees the env (and closes it) or has already set
        the token (and it is refused)."""
        with self._lock:
            if self._event.is_set():
                return False
            self._envs.add(env)
            return True

    def unregister(self, env: FleetEnv) -> None:
        with self._lock:
            self._envs.discard(env)

    def cancel(self) -> None:
        self._event.set()
        with self._lock:
            envs = list(self._envs)
        for env in envs:
            try:
                env.close(grade=False)
            except Exception:  # closing the rest matters more than this one error
                continue


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


def run_episode(
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
    """Play one episode of ``policy`` on ``task`` and return its result record.

    Runs on ``session`` (default: the default session; ``config=`` instead: a private
    session with those settings). ``options`` are the episode's
    :class:`~fleetenv.EpisodeOptions`; ``max_steps`` and ``run_tag`` override theirs.
    Never raises for a broken episode; see the module docstring. Each policy reply is
    ONE step (``env.step`` gets the reply's actions as one turn), so a reply with N tool
    calls counts once toward ``max_steps``. ``run_episode_async`` is the awaitable twin.
    """
    return run_sync(episode_plan(
        task, policy, session=session, config=config, sample=sample, events=events,
        options=options, max_steps=max_steps, system_prompt=system_prompt, cancel=cancel,
        run_tag=run_tag), finish_here=True)


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
    :func:`~fleetenv.run_episode` (same arguments, same result record), from any
    asyncio or trio loop. ``policy`` may also be async (see the module docstring).
    Cancelling the awaiting task closes the env (ungraded) and re-raises."""
    return await run_async(episode_plan(
        task, policy, session=session, config=config, sample=sample, events=events,
        options=options, max_steps=max_steps, system_prompt=system_prompt, cancel=cancel,
        run_tag=run_tag), finish_here=True)


def episode_plan(task: Task, policy: Policy | Any, *, sample: int = 0,
                 system_prompt: str | None = None, cancel: CancelToken | None = None,
                 **env_options: Any) -> Plan[RolloutResult]:
    """The one episode loop; ``env_options`` are FleetEnv's (session, config, events,
    options, max_steps, run_tag)."""
    episode = Episode(task, sample, system_prompt)
    env: FleetEnv | None = None
    try:
        agent = as_policy(policy)
        describe = getattr(policy, "describe", None)
        episode.result.policy = str(describe()) if callable(describe) else type(agent).__name__
        env = episode.make_env(**env_options)
        if cancel is not None and not cancel.register(env):
            raise RolloutCancelled("the run was cancelled")
        observation, _ = yield from _scoped(env, env._reset_plan(None, {}))
        episode.messages.extend(observation.to_messages())
        while not env.done:
            if cancel is not None and cancel.is_set():
                raise RolloutCancelled("the run was cancelled")
            asked = time.monotonic()
            reply = yield from _act(agent, episode.context(env))
            episode.policy_s += time.monotonic() - asked
            actions = episode.record_reply(env, reply)
            observation, *_ = yield from _scoped(env, env._step_plan(actions))
            episode.record_observation(observation, reply)
        episode.result.stop_reason = env.stop_reason
    except RolloutCancelled as exc:
        episode.failed(exc, StopReason.CANCELLED)
    except Exception as exc:
        episode.failed(exc, StopReason.ERROR)
    finally:
        if env is not None:
            try:
                yield from _scoped(env, env._close_plan(**episode.close_arguments()))
            finally:
                if cancel is not None:
                    cancel.unregister(env)
    return episode.finish(env)


def _act(agent: Policy, context: PolicyContext) -> Plan[Reply]:
    """The policy's next reply, as the operation its kind needs (module docstring)."""
    act: Any = agent.fn if isinstance(agent, CallablePolicy) else agent.act
    if inspect.iscoroutinefunction(act):
        value = yield Await(act, (context,), hint="use run_episode_async, or "
                            "Runner(mode='asyncio') (the default mode='auto' picks it)")
    elif isinstance(agent, ScriptedPolicy):
        value = agent.act(context)
    else:
        value = yield Blocking(agent.act, (context,))
    return to_reply(value, context.task)


def _scoped(env: FleetEnv, plan: Plan[T]) -> Plan[T]:
    """``plan`` in the env's event scope, as ``env.reset()`` and the others run theirs."""
    with env.events.scope(env.rollout_id):
        return (yield from plan)


class Episode:
    """The bookkeeping of one rollout (the transcript, the result record, the policy's
    time)."""

    def __init__(self, task: Task, sample: int, system_prompt: str | None) -> None:
        if isinstance(task, Mapping):  # a task dict, as FleetEnv and Runner take it
            task = Task.model_validate(task)
        elif not isinstance(task, Task):  # before any instance exists: raised, not recorded
            raise task_type_error(task, where="run_episode")
        self.task = task
        self.started = time.monotonic()
        self.result = RolloutResult(task_key=task.key, env_key=task.env_spec, sample=sample)
        self.messages: list[dict[str, Any]] = []
        if system_prompt:
            self.messages.append({"role": "system", "content": system_prompt})
        self.policy_s = 0.0
        self.turn = 0

    def make_env(self, **options: Any) -> FleetEnv:
        env = FleetEnv(self.task, **options)
        self.result.rollout_id = env.rollout_id
        return env

    def context(self, env: FleetEnv) -> PolicyContext:
        if not self.result.tools:  # what the agent was offered, kept in the result
            self.result.tools = list(env.openai_tools)
        return PolicyContext(task=self.task, messages=list(self.messages),
                             tools=env.openai_tools, turn=self.turn,
                             instance_id=env.instance_id, root_url=env.root_url)

    def record_reply(self, env: FleetEnv, reply: Reply) -> Action | list[Action]:
        """Record the reply; return what ``env.step`` gets for it: its actions as ONE
        turn (a lone action as itself, which is the same step)."""
        self.turn += 1
        self.messages.append(reply.message)
        if reply.meta:
            self.result.turn_meta.append(dict(reply.meta))
        env.conversation = self.messages  # what a judge verifier grades, if the task has one
        actions = list(reply.actions)
        return actions[0] if len(actions) == 1 else actions

    def record_observation(self, observation: Observation, reply: Reply) -> None:
        """Append the tool messages answering the reply's tool calls (one per call)."""
        answered = {c.get("id") for c in reply.message.get("tool_calls") or []}
        for call in observation.calls if observation.turn else (observation,):
            if call.tool_call_id is not None and call.tool_call_id in answered:
                self.messages.extend(call.to_messages())

    def failed(self, exc: Exception, reason: StopReason) -> None:
        self.result.stop_reason = reason
        message = exc.message if isinstance(exc, RolloutCancelled) else redact(str(exc))[:2000]
        self.result.error = {"type": type(exc).__name__, "message": message}

    def close_arguments(self) -> dict[str, Any]:
        """A failed rollout is not graded (its reward would mean nothing), nor is one
        interrupted (Ctrl-C, a cancelled task: no stop reason yet)."""
        if self.result.stop_reason is None:
            return {"grade": False, "reason": StopReason.INTERRUPTED,
                    "conversation": self.messages}
        return {"grade": self.result.error is None, "reason": self.result.stop_reason,
                "conversation": self.messages}

    def finish(self, env: FleetEnv | None) -> RolloutResult:
        result = self.result
        if env is not None:
            _fill_from_env(result, env)
        result.timings.update(policy_s=self.policy_s,
                              total_s=time.monotonic() - self.started)
        result.transcript = self.messages
        return result


def _fill_from_env(result: RolloutResult, env: FleetEnv) -> None:
    grade = env.grade
    if grade is not None and result.error is None:
        result.reward = grade.reward
        result.grade_status = grade.status
        result.grade_reason = grade.reason
        result.verifier_stdout = grade.stdout
        result.verifier_error = grade.error
        result.verifier_execution_id = grade.execution_id
        result.verifier_score = grade.score
        result.partial_reward = grade.partial
        result.app_scores = {name: app.score for name, app in grade.apps.items()}
    stats = env.stats
    result.turns = stats.turns
    result.tool_calls = stats.tool_calls
    result.tool_errors = stats.tool_errors
    result.tool_error_messages = list(stats.tool_error_messages)
    result.tool_timings = list(stats.tool_timings)  # the snapshot's own copies
    result.instance_id = result.instance_id or env.last_instance_id
    result.final_answer = env.final_answer
    result.timings.update(stats.timings)
