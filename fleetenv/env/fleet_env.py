"""``FleetEnv``: one Fleet task as a blocking ``reset / step / close`` environment.

This class routes between its owners: the :class:`~fleetenv.Session` (settings, caps,
retries, events), :class:`~fleetenv.EpisodeOptions`, ``InstanceLease`` (the instance),
``Toolbox`` (MCP), ``StepActions`` (a step's actions), ``EpisodeState`` and ``Grader``
(one grade, one end report). Its rules (one verifier run per episode, ``None`` never 0.0
for an unknown grade, errors as observations, no replayed calls, one ``RolloutCompleted``
per rollout) are those of docs/episodes.md. The logic is written once as plans
(:mod:`fleetenv.runtime.plans`), driven by ``reset``/``step``/``close`` and their
``_async`` twins.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import ConfigurationError, EpisodeStateError, FleetEnvError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event, RolloutRef, RolloutStarted
from fleetenv.core.tasks import Task
from fleetenv.core.types import Modality, Observation, ResetInfo, StepInfo, StepResult, StopReason
from fleetenv.env.actions import parse_action
from fleetenv.env.argument_hints import session_type_error, task_type_error
from fleetenv.env.calls import StepActions
from fleetenv.env.grading import Grader
from fleetenv.env.instance import InstanceLease
from fleetenv.env.options import EpisodeOptions, ResolvedOptions
from fleetenv.env.state import EpisodeState, EpisodeStats, check_conversation
from fleetenv.env.toolbox import Toolbox
from fleetenv.env.turns import Turn, is_turn, read_turn
from fleetenv.env.unclosed import watch, weak_callback
from fleetenv.fleet.registry import install_signal_handlers
from fleetenv.fleet.session import Session
from fleetenv.mcp.error_rules import ToolErrorRule
from fleetenv.runtime.plans import Blocking, Plan, run_async, run_sync

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.types import Grade
    from fleetenv.mcp.tools import Tool

__all__ = ["FleetEnv"]


class FleetEnv:
    """One Fleet task, played as episodes of ``reset`` / ``step`` on a live instance.

    ``task`` is a :class:`fleetenv.Task` or a dict in any task format in circulation.
    ``session`` is the :class:`fleetenv.Session` to run on; without one, the default
    session (``FLEET_API_KEY`` or, without a key, the embedded local Fleet). Passing
    ``config=`` or ``api_key=``/``base_url=`` instead gives the env a private session
    with those settings, closed with the env.

    How its episodes are played (step limit, deadlines, tool checks, how a model's turn
    is read) is an :class:`~fleetenv.EpisodeOptions`: ``options=``, or its fields as
    keyword arguments (``FleetEnv(task, max_steps=10, context_tools=True)``), which
    override ``options``' values; a keyword left ``None`` keeps them. ``env.options``
    holds them with every default filled in.

    Not thread-safe for concurrent ``step`` calls (an episode is one agent), but
    ``close()`` may be called from any thread.
    """

    def __init__(
        self,
        task: Task | Mapping[str, Any],
        *,
        session: Session | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        config: FleetConfig | None = None,
        events: EventBus | None = None,
        options: EpisodeOptions | None = None,
        max_steps: int | None = None,
        ttl_seconds: int | None = None,
        episode_deadline_s: float | None = None,
        max_text_chars: int | None = None,
        run_tag: str | None = None,
        check_arguments: str | None = None,
        tool_error_rule: str | ToolErrorRule | None = None,
        partial_reward: bool | None = None,
        context_tools: bool | None = None,
        meta_tools: bool | None = None,
        tool_call_format: str | None = None,
        no_tool_call: str | None = None,
        failed_parse_reward: float | None = None,
        tool_endpoints: str | None = None,
    ) -> None:
        self.task = _as_task(task)
        given = EpisodeOptions.of(  # checked before a private session exists
            options, max_steps=max_steps, ttl_seconds=ttl_seconds,
            episode_deadline_s=episode_deadline_s, max_text_chars=max_text_chars,
            run_tag=run_tag, check_arguments=check_arguments, tool_error_rule=tool_error_rule,
            partial_reward=partial_reward, context_tools=context_tools, meta_tools=meta_tools,
            tool_call_format=tool_call_format, no_tool_call=no_tool_call,
            failed_parse_reward=failed_parse_reward, tool_endpoints=tool_endpoints)
        install_signal_handlers()  # here: reset() may run in a worker thread
        self.session, self._owns_session = _pick_session(session, config, api_key, base_url)
        self.config: FleetConfig = self.session.config
        #: The episode options, every default filled in.
        self.options: ResolvedOptions = given.resolved(self.config, self.task)
        self.events = events if events is not None else self.session.events

        self._ref = RolloutRef(task_key=self.task.key, env_key=self.task.env_spec)
        emit = weak_callback(self._emit)  # weak: the env must stay collectable (unclosed.py)
        self._lease = InstanceLease(self.session, self.task,
                                    ttl_seconds=self.options.ttl_seconds,
                                    run_tag=self.options.run_tag, emit=emit,
                                    on_instance=weak_callback(self._on_instance))
        self._state = EpisodeState()
        self._toolbox = Toolbox(self.task, self.config, self.options)
        self._actions = StepActions(self.task, self.config, self.options, self._toolbox,
                                    self._lease, emit)
        self._grader = Grader(self.session, self.task, self._lease, self.options, emit)
        self._closed = False
        self._close_lock = threading.Lock()
        self._episodes = 0
        self._pid = os.getpid()
        # Collected without close(): warn and delete the instance (fleetenv.env.unclosed).
        self._unclosed = watch(self, task_key=self.task.key, lease=self._lease,
                               toolbox=self._toolbox, session=self.session,
                               owns_session=self._owns_session)

    def __repr__(self) -> str:
        where = self.instance_id or "no instance"
        state = "closed" if self._closed else f"step {self._state.step}"
        return f"<FleetEnv task={self.task.key!r} env={self.task.env_spec!r} {where} {state}>"

    # ------------------------------------------------------------------ public views

    @property
    def instance_id(self) -> str | None:
        return self._lease.instance_id

    @property
    def last_instance_id(self) -> str | None:
        """The id of the most recent instance, kept after ``close()`` deleted it."""
        return self._lease.last_instance_id

    @property
    def root_url(self) -> str | None:
        instance = self._lease.instance
        return instance.root_url if instance else None

    @property
    def region(self) -> str | None:
        """The region Fleet reports for the instance (fleet-python's ``env.region``)."""
        instance = self._lease.instance
        return instance.env.region if instance else None

    @property
    def rollout_id(self) -> str:
        return self._ref.rollout_id

    @property
    def tools(self) -> list[Tool]:
        """The episode's MCP tools (modality-filtered), as typed ``Tool`` objects."""
        return list(self._toolbox.tools)

    @property
    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools the agent may call, in OpenAI function format."""
        return list(self._toolbox.openai_tools)

    @property
    def done(self) -> bool:
        return self._state.done

    @property
    def stop_reason(self) -> StopReason | None:
        return self._state.stop_reason

    @property
    def final_answer(self) -> str | None:
        """The answer submitted in this episode (``submit_final_answer``), if any."""
        return self._state.final_answer

    @property
    def grade(self) -> Grade | None:
        """The verification outcome once the episode ended (else ``None``)."""
        return self._state.grade

    @property
    def reward(self) -> float | None:
        """The graded reward, or ``None`` (not graded yet, or the grade is unknown)."""
        grade = self._state.grade
        return grade.reward if grade else None

    @property
    def stats(self) -> EpisodeStats:
        """The current episode's counters and timings."""
        return self._state.stats()

    # ------------------------------------------------------------------ blocking API

    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None) -> tuple[Observation, ResetInfo]:
        """Start an episode: provision (first time) or restore the seed state, open the
        MCP endpoints and list tools. Returns the first observation and info.

        ``options={"fresh_instance": True}`` replaces the instance instead of resetting it.
        """
        with self.events.scope(self.rollout_id):
            return run_sync(self._reset_plan(seed, dict(options or {})))

    def step(self, action: object) -> StepResult:
        """Take one action: a ``ToolCall``, an OpenAI tool-call dict, OpenEnv's
        ``{"tool", "params", "done"}``, ``FinalAnswer(...)`` or ``Done()``; or one whole
        assistant turn: the model's text, an OpenAI assistant message, or a list of
        tool calls, run in order as one step (one observation, one tool message per
        call). A turn whose calls cannot be read is a parse-error observation."""
        with self.events.scope(self.rollout_id):
            return run_sync(self._step_plan(action))

    def tools_prompt(self, format: str | None = None) -> str:
        """The episode's tools rendered for a chat template: ``"hermes"`` (the
        ``<tools>`` system-prompt block of Hermes/Qwen), ``"openai"`` (the JSON list),
        ``"llama3"`` or ``"mistral"``. Default: ``tool_call_format``, or ``"hermes"``
        when that is ``"auto"``. The tools are known after ``reset()``."""
        default = self.options.tool_call_format
        return self._toolbox.prompt(format or (default if default != "auto" else "hermes"))

    def close(self, *, grade: bool = True, reason: StopReason | str | None = None,
              conversation: list[Any] | None = None) -> None:
        """Grade an unfinished episode (unless ``grade=False``), close MCP sessions and
        delete the instance. Idempotent; safe from any thread.

        ``reason`` is the stop reason recorded for an episode that had not ended
        (default ``"abandoned"`` when graded, ``"interrupted"`` when not). A grade still
        being computed (the last step timed out under the verifier) is waited for, at
        most ``timeouts.verify`` + 10 s, then recorded as unknown
        (``grading_timeout``). ``conversation`` sets :attr:`conversation` for an episode
        not graded yet.
        """
        with self.events.scope(self.rollout_id):
            run_sync(self._close_plan(grade, reason, conversation))

    def __enter__(self) -> FleetEnv:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        # On Ctrl-C / SystemExit the caller wants out: delete at once, do not grade.
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        self.close(grade=not interrupted)

    # ------------------------------------------------------------------ async twins

    async def reset_async(self, *, seed: int | None = None,
                          options: Mapping[str, Any] | None = None
                          ) -> tuple[Observation, ResetInfo]:
        with self.events.scope(self.rollout_id):
            return await run_async(self._reset_plan(seed, dict(options or {})))

    async def step_async(self, action: object) -> StepResult:
        with self.events.scope(self.rollout_id):
            return await run_async(self._step_plan(action))

    async def close_async(self, *, grade: bool = True,
                          reason: StopReason | str | None = None,
                          conversation: list[Any] | None = None) -> None:
        with self.events.scope(self.rollout_id):
            await run_async(self._close_plan(grade, reason, conversation))

    async def __aenter__(self) -> FleetEnv:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        await self.close_async(grade=not interrupted)

    # ------------------------------------------------------------------ database access

    def describe_db(self, name: str = "current") -> dict[str, Any]:
        """Tables and columns of the instance's SQLite database."""
        self._check_not_forked()
        return self._lease.manager().describe_db(name)

    def query_db(self, sql: str, args: list[Any] | None = None, *, name: str = "current",
                 read_only: bool = True) -> dict[str, Any]:
        """Run SQL against the instance's database (read-only unless asked)."""
        self._check_not_forked()
        return self._lease.manager().query_db(sql, args, name=name, read_only=read_only)

    # ------------------------------------------------------------------ reset

    def _reset_plan(self, seed: int | None, options: dict[str, Any]
                    ) -> Plan[tuple[Observation, ResetInfo]]:
        self._check_not_closed()
        if self._state.active and not self._state.completed:
            yield from self._grader.finish_plan(self._state, StopReason.ABANDONED)
        if self._episodes:  # the first episode keeps the id `rollout_id` showed before reset
            self._ref = RolloutRef(task_key=self.task.key, env_key=self.task.env_spec,
                                   instance_id=self.instance_id)
        self._state = state = EpisodeState(self.options.episode_deadline_s, active=True)
        self._episodes += 1
        self._emit(RolloutStarted, modality=self.task.modality)
        info: ResetInfo = {"task_key": self.task.key, "rollout_id": self.rollout_id}
        try:
            started = time.monotonic()
            if self._lease.instance is not None and options.get("fresh_instance"):
                yield Blocking(self._lease.drop, ("replaced",))
            if self._lease.instance is None:
                yield Blocking(self._lease.provision)
            elif not (yield Blocking(self._lease.reset, (seed,))):
                info["reset"] = "instance_replaced"
                yield Blocking(self._lease.provision)
            state.timings["provision_s"] = time.monotonic() - started
            yield from self._toolbox.attach_plan(self._lease, state.deadline)
            self._toolbox.report_notifications(self._emit)
            content: list[dict[str, Any]] = []
            if self.task.modality is not Modality.TOOL_USE:
                content, screenshot_error = yield from self._toolbox.screenshot_plan()
                if screenshot_error:
                    info["screenshot_error"] = screenshot_error
        except Exception as exc:
            self._grader.complete(state, StopReason.INIT_ERROR, error=exc)
            raise
        info.update({"instance_id": self.instance_id, "root_url": self.root_url,
                     "modality": self.task.modality,
                     "tools": [t["function"]["name"] for t in self._toolbox.openai_tools]})
        return self._actions.observation(state, content, tool_name=None), info

    # ------------------------------------------------------------------ step

    def _step_plan(self, action: object) -> Plan[StepResult]:
        self._check_not_closed()
        state = self._state
        state.require_running(self.task.key)
        turn: Turn | None = None
        if is_turn(action):
            turn = read_turn(action, format=self.options.tool_call_format,
                             no_tool_call=self.options.no_tool_call)
            actions = turn.actions
        else:
            actions = parse_action(action)
        started = time.monotonic()
        state.step += 1
        info: StepInfo = {"step": state.step}
        observation = yield from self._actions.run_plan(state, actions, turn, info)
        if not state.done and (yield from self._toolbox.refresh_plan(self.instance_id)):
            # A server changed its tools during this step: the agent sees the new list now.
            observation = dataclasses.replace(observation, tools=self.openai_tools)
            info["tools_changed"] = True
        self._toolbox.report_notifications(self._emit)
        state.end_step(started, self.options.max_steps)
        reward: float | None = 0.0
        if turn is not None and turn.parse_error is not None and (
                self.options.failed_parse_reward is not None):
            reward = self.options.failed_parse_reward
        if state.stop_reason is not None:
            grade = yield from self._grader.finish_plan(state, state.stop_reason)
            reward = grade.reward
        info.update(state.outcome_info(self.instance_id))
        reason = state.stop_reason
        terminated = reason is not None and reason.terminates
        truncated = reason is not None and reason.truncates
        return StepResult(observation, reward, terminated, truncated, info)

    # ------------------------------------------------------------------ finishing

    @property
    def conversation(self) -> list[Any] | None:
        """The chat messages of this episode, for verifiers that take ``conversation``
        (LLM judges). Set it (a list of message dicts) before the episode ends, or pass
        ``close(conversation=...)``; ``reset()`` clears it. Sent only to verifiers whose
        function has a ``conversation`` parameter, or whose task declares
        ``metadata["verifier_conversation"] = true``."""
        conversation = self._state.conversation
        return None if conversation is None else list(conversation)

    @conversation.setter
    def conversation(self, messages: list[Any] | None) -> None:
        self._state.conversation = check_conversation(messages)

    # ------------------------------------------------------------------ close

    def _close_plan(self, grade: bool, reason: StopReason | str | None,
                    conversation: list[Any] | None) -> Plan[None]:
        stop, conversation = _stop_reason(reason), check_conversation(conversation)
        if os.getpid() != self._pid:
            # A forked child's copy: the instance, the MCP sessions and the episode are
            # the parent's. Closing here must neither grade nor delete anything.
            return
        with self._close_lock:  # close() may come from any thread, and only once
            if self._closed:
                return
            self._closed = True
        self._unclosed.detach()
        state = self._state
        if conversation is not None and state.grade is None:
            state.conversation = conversation
        try:
            if state.active and not state.completed:
                if grade and (state.grading is not None or self._lease.instance is not None):
                    # An unfinished episode is graded; a grade in flight (the final
                    # step timed out under the verifier) is waited for, within a bound.
                    yield from self._grader.finish_plan(
                        state, state.stop_reason or stop or StopReason.ABANDONED)
                else:
                    self._grader.complete(
                        state, state.stop_reason or stop or StopReason.INTERRUPTED)
        finally:
            try:
                yield from self._toolbox.close_plan()
            finally:
                self._lease.keep_if_clean(grade)  # a warm pool may keep a clean one
                yield Blocking(self._lease.close)
                if self._owns_session:
                    yield Blocking(self._lease.call_when_idle, (self.session.close,))

    # ------------------------------------------------------------------ helpers

    def _on_instance(self, instance_id: str) -> None:
        self._ref = self._ref.with_instance(instance_id)

    def _check_not_closed(self) -> None:
        self._check_not_forked()
        if self._closed:
            raise EpisodeStateError("the environment is closed",
                                    hint="create a new FleetEnv", task=self.task.key)

    def _check_not_forked(self) -> None:
        if os.getpid() != self._pid:
            raise FleetEnvError(
                "this FleetEnv was created before os.fork(); a forked child cannot use it "
                "(its instance, MCP sessions and episode belong to the parent process)",
                hint="create a new fleetenv.Session and FleetEnv in the child",
                task=self.task.key)

    def _emit(self, event_type: type[Event], **fields: Any) -> None:
        if self.events.wants(event_type):  # else nobody would see it: not built
            self.events.emit(self._ref.event(event_type, **fields))


def _as_task(task: object) -> Task:
    if isinstance(task, Task):
        return task
    if isinstance(task, Mapping):
        return Task.model_validate(dict(task))
    raise task_type_error(task)


def _pick_session(session: Session | None, config: FleetConfig | None,
                  api_key: str | None, base_url: str | None) -> tuple[Session, bool]:
    """The session to run on, and whether the env owns it (and so closes it)."""
    if session is not None:
        if not isinstance(session, Session):
            raise session_type_error(session)
        if config is not None or api_key is not None or base_url is not None:
            raise ConfigurationError("pass either session= or config=/api_key=/base_url=",
                                     hint="the session already holds the settings")
        return session, False
    if config is not None and (api_key is not None or base_url is not None):
        raise ConfigurationError("pass either config= or api_key=/base_url=, not both")
    if config is None and api_key is None and base_url is None:
        return Session.shared(), False
    if config is not None:
        return Session(config), True
    return Session(api_key=api_key, base_url=base_url), True


def _stop_reason(reason: StopReason | str | None) -> StopReason | None:
    if reason is None or isinstance(reason, StopReason):
        return reason
    try:
        return StopReason(reason)
    except ValueError:
        raise ConfigurationError(
            f"unknown stop reason {reason!r}",
            hint=f"use one of {', '.join(StopReason.values())}") from None
