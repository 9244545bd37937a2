"""``FleetEnv``: one Fleet task as a blocking ``reset / step / close`` environment.

Lifecycle::

    with FleetEnv(task) as env:                  # nothing remote happens yet
        obs, info = env.reset()                  # provision, open MCP, list tools
        while True:
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break                            # reward is the grade (or None: unknown)
    # close(): grade an abandoned episode, close MCP sessions, delete the instance

Who owns what: the :class:`~fleetenv.Session` owns settings, caps, retries and the
event bus; :class:`~fleetenv.env.instance.InstanceLease` owns this env's instance;
:class:`~fleetenv.env.toolbox.Toolbox` owns its MCP sessions and the tools it offers;
:class:`~fleetenv.env.state.EpisodeState` owns the counters and outcome of the current
episode; :func:`~fleetenv.env.grading.grade_once` runs the verifier once. This class
routes actions between them, and that is all.

Rules this object keeps, each one a bug the previous Fleet client had:

- The verifier runs exactly once per episode: when it ends, or at ``close()`` for an
  episode the caller abandoned; its grade is kept even if the caller is cancelled.
- The reward is a float when graded and ``None`` with a reason when the grade is unknown
  (no verifier, verifier error, instance gone); a failure is never a 0.0.
- ``terminated`` means the agent finished (final answer / done); ``truncated`` means the
  episode was cut (step limit, episode deadline, instance expired).
  ``info["stop_reason"]`` says which (a :class:`~fleetenv.StopReason`).
- Unknown tools, malformed arguments, tool errors and tool timeouts are observations the
  agent sees (``obs.is_error``), and the episode goes on. A call that may have run is
  never replayed.
- Every started rollout emits exactly one ``RolloutCompleted`` with one reason.

The logic is written once as plans (see ``driver.py``); ``reset``/``step``/``close`` drive
them from the calling thread, ``reset_async``/``step_async``/``close_async`` from any
asyncio loop without blocking it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetenv.core.config import FleetConfig, finite_reward
from fleetenv.core.errors import (
    ConfigurationError,
    DeadlineExceeded,
    EpisodeStateError,
    FleetEnvError,
    ToolArgumentsError,
    ToolNotFoundError,
)
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import (
    RolloutCompleted,
    RolloutRef,
    RolloutStarted,
    ServerLog,
    ToolCallFailed,
    ToolCallFinished,
    ToolErrorReported,
    ToolProgress,
    ToolsChanged,
    TurnParseFailed,
    TurnWithoutToolCall,
    VerificationFinished,
    VerifierFailed,
)
from fleetenv.core.tasks import Task
from fleetenv.core.vocabulary import GradeReason, Modality, StopReason
from fleetenv.env.actions import (
    SUBMIT_FINAL_ANSWER,
    Done,
    FinalAnswer,
    ListTools,
    ToolCall,
    parse_action,
)
from fleetenv.env.argument_hints import session_type_error, task_type_error
from fleetenv.env.driver import Blocking, Plan, run_async, run_sync
from fleetenv.env.grading import PARTIAL_REWARD_KEY, grade_once
from fleetenv.env.instance import InstanceLease
from fleetenv.env.observation import Observation
from fleetenv.env.state import EpisodeState, EpisodeStats
from fleetenv.env.tool_call_parsing import render_tools
from fleetenv.env.toolbox import Toolbox
from fleetenv.env.turns import Turn, check_format, check_no_tool_call, is_turn, read_turn
from fleetenv.env.unclosed import watch, weak_callback
from fleetenv.fleet.registry import install_signal_handlers
from fleetenv.fleet.session import Session, default_session
from fleetenv.mcp.arguments import check_mode
from fleetenv.mcp.error_rules import ToolErrorRule, decide, resolve_rule
from fleetenv.mcp.notifications import ServerLogMessage, ToolProgressUpdate, ToolsListChanged

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.verifier import Grade
    from fleetenv.mcp.results import ToolResult
    from fleetenv.mcp.tools import Tool

__all__ = ["FleetEnv", "StepResult"]

StepResult = tuple[Observation, "float | None", bool, bool, dict[str, Any]]
"""``(observation, reward, terminated, truncated, info)``, as in Gymnasium."""

#: How much longer than ``timeouts.verify`` ``close()``/``reset()`` wait for a grade
#: in flight (the verification itself is bounded by ``timeouts.verify``).
_GRADE_WAIT_SLACK_S = 10.0


class FleetEnv:
    """One Fleet task, played as episodes of ``reset`` / ``step`` on a live instance.

    ``task`` is a :class:`fleetenv.Task` or a dict in any task format in circulation.
    ``session`` is the :class:`fleetenv.Session` to run on; without one, the default
    session (``FLEET_API_KEY`` or, without a key, the embedded local Fleet). Passing
    ``config=`` or ``api_key=``/``base_url=`` instead gives the env a private session
    with those settings, closed with the env.

    ``check_arguments`` (``"strict"``, ``"lenient"``, ``"off"``) says how a call's
    arguments are checked against the tool's input schema before sending
    (:mod:`fleetenv.mcp.arguments`); ``tool_error_rule`` (``"fleet"``, ``"protocol"`` or a
    callable ``(ToolResult) -> str | None``) decides which results are tool errors
    (:mod:`fleetenv.mcp.error_rules`). Unset, both come from the config's fields of the
    same names (defaults ``"strict"`` and ``"fleet"``).

    ``partial_reward`` (default: the task's ``metadata["partial_reward"]``, else off)
    pays a verifier score of 0.0 as the partial score its output gives, if any
    (:class:`~fleetenv.Grade`, docs/grading.md).

    ``context_tools=True`` offers the agent the context tools (``check_context``,
    ``manage_context``, ``search_history``, ``search_tool_output``,
    ``view_tool_output``), answered locally, and truncates long tool text at
    ``max_text_chars`` keeping the rest for them; after ``manage_context``,
    ``info["history"]`` is the trimmed history to continue with. ``meta_tools=True``
    offers ``search_tools``, ``get_tool_schema`` and ``list_service_tools`` instead of
    the tool list (for envs with very many tools). See docs/context-tools.md.

    ``step()`` also takes the model's whole turn (its text, an OpenAI assistant message,
    or a list of tool calls) as one step. ``tool_call_format`` (default ``"auto"``) says
    how text is read (:func:`~fleetenv.env.tool_call_parsing.parse_tool_calls`);
    ``no_tool_call`` what a turn without tool calls does: ``"final_answer"`` (default:
    its text ends the episode as the answer, as Tinker, verifiers and OpenAI agent loops
    end on a reply without calls) or ``"noop"`` (the turn counts, nothing runs);
    ``failed_parse_reward`` the reward of a step whose turn could not be read (default
    ``None``: the usual 0.0). See docs/episodes.md.

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
        max_steps: int | None = None,
        ttl_seconds: int | None = None,
        episode_deadline_s: float | None = None,
        events: EventBus | None = None,
        max_text_chars: int = 16_000,
        run_tag: str | None = None,
        check_arguments: str | None = None,
        tool_error_rule: str | ToolErrorRule | None = None,
        partial_reward: bool | None = None,
        context_tools: bool = False,
        meta_tools: bool = False,
        tool_call_format: str = "auto",
        no_tool_call: str = "final_answer",
        failed_parse_reward: float | None = None,
    ) -> None:
        self.task = _as_task(task)
        install_signal_handlers()  # here: reset() may run in a worker thread
        self.session, self._owns_session = _pick_session(session, config, api_key, base_url)
        self.config: FleetConfig = self.session.config
        modality = self.task.modality
        self.max_steps = max_steps or self.config.max_steps
        self.ttl_seconds = ttl_seconds or self.config.ttl_for(modality)
        self.episode_deadline_s = (episode_deadline_s
                                   or self.config.episode_deadline_for(modality))
        self.max_text_chars = max_text_chars
        #: Replace a 0.0 score by the verifier's partial score (see ``Grade``); default:
        #: the task's ``metadata["partial_reward"]``, else off.
        self.partial_reward = (bool(self.task.metadata.get(PARTIAL_REWARD_KEY, False))
                               if partial_reward is None else partial_reward)
        self.events = events if events is not None else self.session.events

        self._ref = RolloutRef(task_key=self.task.key, env_key=self.task.env_spec)
        self._lease = InstanceLease(self.session, self.task, ttl_seconds=self.ttl_seconds,
                                    run_tag=run_tag, emit=weak_callback(self._emit),
                                    on_instance=weak_callback(self._on_instance))
        self._state = EpisodeState()
        self.check_arguments = check_mode(
            check_arguments if check_arguments is not None else self.config.check_arguments)
        self._tool_error_rule = resolve_rule(
            tool_error_rule if tool_error_rule is not None else self.config.tool_error_rule)
        self.context_tools = _flag(context_tools, "context_tools")
        self.meta_tools = _flag(meta_tools, "meta_tools")
        self._toolbox = Toolbox(self.task, self.config, max_text_chars=max_text_chars,
                                check_arguments=self.check_arguments,
                                context_tools=self.context_tools, meta_tools=self.meta_tools)
        self.tool_call_format = check_format(tool_call_format)
        self.no_tool_call = check_no_tool_call(no_tool_call)
        self.failed_parse_reward = _reward_value(failed_parse_reward)
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

    # The counters one at a time, as 0.1 and the OpenEnv drop-in read them.
    @property
    def turns(self) -> int:
        return self._state.step

    @property
    def tool_calls(self) -> int:
        return self._state.tool_calls

    @property
    def tool_errors(self) -> int:
        return len(self._state.tool_error_messages)

    @property
    def tool_error_messages(self) -> list[str]:
        return list(self._state.tool_error_messages)

    @property
    def timings(self) -> dict[str, float]:
        return dict(self._state.timings)

    # ------------------------------------------------------------------ blocking API

    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
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
        tools = self.openai_tools
        if not tools:
            raise EpisodeStateError("tools_prompt() has no tools to render yet",
                                    hint="call reset() first: it lists the tools",
                                    task=self.task.key)
        chosen = format or (self.tool_call_format if self.tool_call_format != "auto"
                            else "hermes")
        return render_tools(tools, chosen)

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
            run_sync(self._close_plan(grade, _stop_reason(reason), _messages(conversation)))

    def __enter__(self) -> FleetEnv:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        # On Ctrl-C / SystemExit the caller wants out: delete at once, do not grade.
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        self.close(grade=not interrupted)

    # ------------------------------------------------------------------ async twins

    async def reset_async(self, *, seed: int | None = None,
                          options: Mapping[str, Any] | None = None
                          ) -> tuple[Observation, dict[str, Any]]:
        with self.events.scope(self.rollout_id):
            return await run_async(self._reset_plan(seed, dict(options or {})))

    async def step_async(self, action: object) -> StepResult:
        with self.events.scope(self.rollout_id):
            return await run_async(self._step_plan(action))

    async def close_async(self, *, grade: bool = True,
                          reason: StopReason | str | None = None,
                          conversation: list[Any] | None = None) -> None:
        with self.events.scope(self.rollout_id):
            await run_async(self._close_plan(grade, _stop_reason(reason),
                                             _messages(conversation)))

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
                    ) -> Plan[tuple[Observation, dict[str, Any]]]:
        self._check_not_closed()
        if self._state.active and not self._state.completed:
            yield from self._finish_plan(StopReason.ABANDONED)
        if self._episodes:  # the first episode keeps the id `rollout_id` showed before reset
            self._ref = RolloutRef(task_key=self.task.key, env_key=self.task.env_spec,
                                   instance_id=self.instance_id)
        self._state = state = EpisodeState(self.episode_deadline_s, active=True)
        self._episodes += 1
        self._emit(RolloutStarted, modality=self.task.modality)
        info: dict[str, Any] = {"task_key": self.task.key, "rollout_id": self.rollout_id}
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
            if self._toolbox.is_open and self._toolbox.instance_id != self.instance_id:
                # The instance was replaced: its sessions (and its lease's) are gone.
                yield from self._toolbox.close_plan()
            if not self._toolbox.is_open:
                instance = self._lease.require()
                yield from self._toolbox.open_plan(
                    instance.root_url, instance_id=instance.instance_id,
                    headers=self._lease.mcp_headers(),
                    retry=self._lease.mcp_setup_retry(state.deadline),
                    browser_mcp=self._lease.browser_mcp())
            else:  # the sessions stay open across episodes; their tools may have changed
                yield from self._toolbox.refresh_plan(self.instance_id)
            self._report_notifications()
            content: list[dict[str, Any]] = []
            if self.task.modality is not Modality.TOOL_USE:
                content, screenshot_error = yield from self._toolbox.screenshot_plan()
                if screenshot_error:
                    info["screenshot_error"] = screenshot_error
        except Exception as exc:
            self._complete(StopReason.INIT_ERROR, error=exc)
            raise
        info.update(instance_id=self.instance_id, root_url=self.root_url,
                    modality=self.task.modality,
                    tools=[t["function"]["name"] for t in self._toolbox.openai_tools])
        observation = Observation(
            task_key=self.task.key, prompt=self.task.prompt, modality=self.task.modality,
            step=0, tools=self.openai_tools, content=content,
        )
        return observation, info

    # ------------------------------------------------------------------ step

    def _step_plan(self, action: object) -> Plan[StepResult]:
        self._check_not_closed()
        state = self._state
        if not state.active:
            raise EpisodeStateError("step() before reset()", hint="call reset() first",
                                    task=self.task.key)
        if state.stop_reason is not None:
            raise EpisodeStateError(
                f"the episode is over ({state.stop_reason})",
                hint="call reset() to start a new episode", task=self.task.key)
        turn: Turn | None = None
        if is_turn(action):
            turn = read_turn(action, format=self.tool_call_format,
                             no_tool_call=self.no_tool_call)
            actions = turn.actions
        else:
            actions = parse_action(action)
        started = time.monotonic()
        state.step += 1
        info: dict[str, Any] = {"step": state.step}
        observation = self._observation([], tool_name=None)
        per_call: list[Observation] = []
        for item in actions:
            if isinstance(item, ListTools):
                observation = self._observation(
                    [{"type": "text", "text": self._toolbox.listing()}], tool_name=None)
            elif isinstance(item, FinalAnswer):
                state.final_answer = item.answer
                info["submitted_answer"] = item.answer
                state.stop(StopReason.AGENT_DONE)
                self._call_finished(SUBMIT_FINAL_ANSWER, "local", 0.0)
                observation = self._observation(
                    [{"type": "text", "text": "Answer recorded. The episode is over."}],
                    tool_name=SUBMIT_FINAL_ANSWER, call_id=item.id)
                if turn is None or not turn.no_tool_call:  # a call the model made
                    per_call.append(observation)
            elif isinstance(item, Done):
                state.stop(StopReason.AGENT_DONE)
            elif isinstance(item, ToolCall):
                if self.context_tools:
                    state.record_call(item, self.task.prompt)
                observation = yield from self._tool_plan(item, info)
                per_call.append(observation)
                if self.context_tools:
                    history = state.record_observation(observation)
                    if history is not None:  # manage_context: the caller adopts this
                        info["history"] = history
            if state.done:
                break
        if turn is not None:
            observation = self._turn_observation(turn, per_call, info)
        if not state.done and (yield from self._toolbox.refresh_plan(self.instance_id)):
            # A server changed its tools during this step: the agent sees the new list now.
            observation = dataclasses.replace(observation, tools=self.openai_tools)
            info["tools_changed"] = True
        self._report_notifications()
        state.timings["steps_s"] += time.monotonic() - started
        if state.step >= self.max_steps:
            state.stop(StopReason.MAX_STEPS)
        if state.deadline.expired():
            state.stop(StopReason.TIME_LIMIT)
        reward: float | None = 0.0
        if turn is not None and turn.parse_error is not None and (
                self.failed_parse_reward is not None):
            reward = self.failed_parse_reward
        if state.stop_reason is not None:
            grade = yield from self._finish_plan(state.stop_reason)
            reward = grade.reward
            info.update(state.grade_info())
        reason = state.stop_reason
        info.update(stop_reason=reason, tool_calls=state.tool_calls,
                    tool_errors=len(state.tool_error_messages), instance_id=self.instance_id)
        terminated = reason is not None and reason.terminates
        truncated = reason is not None and reason.truncates
        return observation, reward, terminated, truncated, info

    def _turn_observation(self, turn: Turn, per_call: list[Observation],
                          info: dict[str, Any]) -> Observation:
        """One observation for a whole turn: every call's result, a parse error, or the
        note that the turn made no call (counted, and reported as an event)."""
        state = self._state
        info["turn_calls"] = len(per_call)
        notice: str | None = None
        parse_error: str | None = None
        if turn.parse_error is not None:
            exc = turn.parse_error
            parse_error = exc.message
            state.parse_errors += 1
            info["parse_error"] = parse_error
            self._emit(TurnParseFailed, step=state.step, format=exc.format or "unknown",
                       error=exc.message, offset=exc.offset)
            notice = (f"Error: your tool call could not be read: {exc.message}. "
                      f"{exc.hint or ''}".rstrip())
        elif turn.no_tool_call and state.done:  # the text was the final answer
            notice = "Answer recorded. The episode is over."
        elif turn.no_tool_call:
            state.noop_turns += 1
            info["no_tool_call"] = True
            self._emit(TurnWithoutToolCall, step=state.step, text=turn.text)
            notice = ("Your turn made no tool call. Call a tool to continue"
                      + (f", or {SUBMIT_FINAL_ANSWER} to finish."
                         if any(t["function"]["name"] == SUBMIT_FINAL_ANSWER
                                for t in self.openai_tools) else "."))
        content = ([{"type": "text", "text": notice}] if notice is not None
                   else [part for call in per_call for part in call.content])
        errors = [(call.tool_name, call.error) for call in per_call if call.error]
        error = (parse_error if parse_error is not None
                 else errors[0][1] if len(errors) == 1
                 else "\n".join(f"{name}: {message}" for name, message in errors) or None)
        last = per_call[-1] if per_call else None
        return Observation(
            task_key=self.task.key, prompt=self.task.prompt, modality=self.task.modality,
            step=state.step, tools=self.openai_tools, content=content,
            result=last.result if last else None, tool_name=last.tool_name if last else None,
            tool_call_id=last.tool_call_id if last else None, is_error=error is not None,
            error=error, turn=True, calls=tuple(per_call), parse_error=parse_error)

    def _tool_plan(self, call: ToolCall, info: dict[str, Any]) -> Plan[Observation]:
        """Run one tool call; every failure becomes an observation, never a crash.

        Arguments that do not fit are refused before anything is sent. Whether the
        result is an error is decided here and only here, by the env's tool-error rule.
        Every call emits exactly one ``ToolCallFinished``.
        """
        state = self._state
        name = call.name
        info["tool_name"] = name
        try:
            arguments = self._toolbox.check(call)
        except (ToolArgumentsError, ToolNotFoundError) as exc:
            self._call_finished(name, "bad_arguments", 0.0, exc, exc.message)
            if self._toolbox.is_local(name):  # shown to the agent, not a tool error
                return self._observation([{"type": "text", "text": f"Error: {exc.message}"}],
                                         tool_name=name, call_id=call.id, error=exc.message)
            state.tool_calls += 1  # refused, not sent: a call and a tool error all the same
            return self._tool_error(call, exc.message, info)
        if self._toolbox.is_local(name):
            return self._local_tool(call, arguments, info)
        timeout_s = state.deadline.cap(self.config.timeouts.call)
        if timeout_s <= 0:
            state.stop(StopReason.TIME_LIMIT)
            self._call_finished(name, "failed", 0.0, DeadlineExceeded("not sent"),
                                "the episode deadline passed before the call was sent",
                                sent=False)
            return self._observation([], tool_name=name, call_id=call.id)
        state.tool_calls += 1
        started = time.perf_counter()
        # Out until settled (its taint included), so a close() from another thread
        # meanwhile never hands the instance to a warm pool.
        with self._lease.call_out():
            try:
                result = yield from self._toolbox.call_plan(name, arguments, timeout_s)
            except DeadlineExceeded as exc:
                self._call_failed(name, time.perf_counter() - started, exc)
                if state.deadline.expired():
                    state.stop(StopReason.TIME_LIMIT)
                return self._tool_error(
                    call, f"{name} did not answer within {timeout_s:.0f} s; it may still have "
                    "run. Check the state before calling it again.", info)
            except FleetEnvError as exc:
                self._call_failed(name, time.perf_counter() - started, exc)
                if (yield Blocking(self._lease.is_gone)):
                    state.stop(StopReason.INSTANCE_EXPIRED)
                    info["instance_error"] = str(exc)
                    return self._tool_error(call, f"the instance is gone: {exc.message}", info)
                return self._tool_error(call, exc.message, info)
            except Exception as exc:  # not ours to handle; still one event for the call
                self._call_finished(name, "failed", time.perf_counter() - started, exc, str(exc))
                raise
        duration_s = time.perf_counter() - started
        try:
            error = decide(self._tool_error_rule, result, tool=name)
        except FleetEnvError as exc:  # the user's rule is broken: say so, do not guess
            self._call_finished(name, "failed", duration_s, exc, str(exc))
            raise
        if error is not None:
            state.record_tool_error(name, error)
            self._emit(ToolErrorReported, tool_name=name, step=state.step, error=error)
            info["tool_error"] = error
        self._call_finished(name, "ok" if error is None else "tool_error", duration_s,
                            error=error)
        content = (state.context.render(result, self.max_text_chars) if self.context_tools
                   else result.to_openai_content(self.max_text_chars))
        return self._observation(content, tool_name=name, call_id=call.id, result=result,
                                 error=error)

    def _local_tool(self, call: ToolCall, arguments: dict[str, Any],
                    info: dict[str, Any]) -> Observation:
        """A context tool or meta-tool: answered here, never sent, never a tool error."""
        state = self._state
        started = time.perf_counter()
        if self._toolbox.meta is not None and self._toolbox.meta.is_meta_tool(call.name):
            text = self._toolbox.meta.execute(call.name, arguments)
        else:
            reply = state.context.execute(call.name, arguments, state.history)
            if reply.history is not None:
                state.replace_history(reply.history)
            text = reply.text
        info["local_tool"] = call.name
        self._call_finished(call.name, "local", time.perf_counter() - started)
        return self._observation([{"type": "text", "text": text}], tool_name=call.name,
                                 call_id=call.id)

    def _call_failed(self, name: str, duration_s: float, exc: FleetEnvError) -> None:
        """The call got no answer (transport, protocol, timeout)."""
        self._emit(ToolCallFailed, tool_name=name, step=self._state.step,
                   error_type=type(exc).__name__, error=str(exc))
        self._call_finished(name, "failed", duration_s, exc, str(exc))

    def _call_finished(self, name: str, outcome: str, duration_s: float,
                       exc: BaseException | None = None, error: str | None = None, *,
                       sent: bool = True) -> None:
        if outcome == "failed":
            self._lease.tainted = True  # it may still run there: never reuse the instance
        if sent and outcome in ("ok", "tool_error", "failed"):  # not refused, not local
            self._state.tool_timings.append(
                {"tool": name, "seconds": round(duration_s, 6), "outcome": outcome})
        self._emit(ToolCallFinished, tool_name=name, step=self._state.step, outcome=outcome,
                   duration_s=duration_s, error_type=type(exc).__name__ if exc else None,
                   error=error)

    def _tool_error(self, call: ToolCall, message: str, info: dict[str, Any]) -> Observation:
        self._state.record_tool_error(call.name, message)
        info["tool_error"] = message
        return self._observation([{"type": "text", "text": f"Error: {message}"}],
                                 tool_name=call.name, call_id=call.id, error=message)

    def _observation(self, content: list[dict[str, Any]], *, tool_name: str | None,
                     call_id: str | None = None, result: ToolResult | None = None,
                     error: str | None = None) -> Observation:
        return Observation(
            task_key=self.task.key, prompt=self.task.prompt, modality=self.task.modality,
            step=self._state.step, tools=self.openai_tools, content=content, result=result,
            tool_name=tool_name, tool_call_id=call_id, is_error=error is not None,
            error=error,
        )

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
        self._state.conversation = _messages(messages)

    def _finish_plan(self, reason: StopReason) -> Plan[Grade]:
        """Grade once (cached), then report the completion once.

        The blocking grading call reports the verification and the completion itself
        (``_on_graded``), so a caller cancelled while the verifier runs (a step timeout)
        loses nothing but its own view: the grade lands on ``env.grade`` and ``close()``
        waits for it.
        """
        state = self._state
        grade: Grade = yield Blocking(self._grade, (state, reason))
        self._complete(reason, state=state)
        return grade

    def _grade(self, state: EpisodeState, reason: StopReason) -> Grade:
        grade, _settled = grade_once(
            self.session, self.task, self._lease.instance, state, self._lease.is_gone,
            partial_reward=self.partial_reward,
            wait_s=self.config.timeouts.verify + _GRADE_WAIT_SLACK_S,
            on_settled=lambda settled: self._on_graded(settled, state, reason))
        return grade

    def _on_graded(self, grade: Grade, state: EpisodeState, reason: StopReason) -> None:
        """Report a grade once, from whichever call settled it."""
        if grade.reason is not GradeReason.NO_VERIFIER:
            self._emit(VerificationFinished, outcome=str(grade.status),
                       duration_s=grade.seconds, reward=grade.reward,
                       reason=None if grade.reason is None else str(grade.reason),
                       attempts=grade.attempts, error_type=grade.error_type,
                       error=grade.error, execution_id=grade.execution_id)
            if not grade.graded:
                self._emit(VerifierFailed, error_type=str(grade.reason or "unknown"),
                           error=grade.error or "", steps=state.step)
        self._complete(reason, state=state)

    def _complete(self, reason: StopReason, *, error: BaseException | None = None,
                  state: EpisodeState | None = None) -> None:
        state = state or self._state
        if not state.claim_completion():
            return
        grade = state.grade
        self._emit(RolloutCompleted, reason=reason, grade_status=state.grade_status,
                   grade_reason=grade.reason if grade else None,
                   reward=grade.reward if grade else None, steps=state.step,
                   error=str(error) if error else None, duration_s=state.elapsed_s())

    # ------------------------------------------------------------------ close

    def _close_plan(self, grade: bool, reason: StopReason | None,
                    conversation: list[Any] | None = None) -> Plan[None]:
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
                    yield from self._finish_plan(
                        state.stop_reason or reason or StopReason.ABANDONED)
                else:
                    self._complete(state.stop_reason or reason or StopReason.INTERRUPTED)
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

    def _emit(self, event_type: type, **fields: Any) -> None:
        self.events.emit(self._ref.event(event_type, **fields))

    def _report_notifications(self) -> None:
        """Turn what the MCP servers said unasked since the last step into events (here,
        in the caller's thread: sinks never run on the loop thread)."""
        pending = self._toolbox.notifications
        while pending:
            note = pending.popleft()
            if isinstance(note, ToolsListChanged):
                self._emit(ToolsChanged, endpoint=note.endpoint,
                           tool_count=len(self._toolbox.tools))
            elif isinstance(note, ServerLogMessage):
                data = note.data if isinstance(note.data, str) else json.dumps(
                    note.data, default=str, ensure_ascii=False)
                self._emit(ServerLog, endpoint=note.endpoint, severity=note.level,
                           message=data, logger_name=note.logger)
            elif isinstance(note, ToolProgressUpdate):
                self._emit(ToolProgress, tool_name=note.tool, progress=note.progress,
                           total=note.total, message=note.message)


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
        return default_session(), False
    if config is not None:
        return Session(config), True
    return Session(api_key=api_key, base_url=base_url), True


def _reward_value(value: object) -> float | None:
    """``failed_parse_reward``: ``None`` or a finite number, checked where it is given."""
    if value is None:
        return None
    return finite_reward(value, field="failed_parse_reward",
                         hint="e.g. failed_parse_reward=-1.0, or None for the usual 0.0")


def _flag(value: object, name: str) -> bool:
    """An on/off option, refused unless it is a bool (``"false"`` is not false)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"FleetEnv({name}=...) must be True or False, got "
                                 f"{value!r:.60}", hint=f"pass {name}=True to enable it")
    return value


def _messages(messages: object) -> list[Any] | None:
    """A conversation as a list of messages (``None``: none), checked where it is given."""
    if messages is None:
        return None
    if isinstance(messages, str | bytes) or not isinstance(messages, list | tuple):
        raise ConfigurationError(
            f"conversation must be a list of chat messages, got a {type(messages).__name__}",
            hint='pass e.g. [{"role": "user", "content": "..."}, ...] (the chat history)')
    return list(messages)


def _stop_reason(reason: StopReason | str | None) -> StopReason | None:
    if reason is None or isinstance(reason, StopReason):
        return reason
    try:
        return StopReason(reason)
    except ValueError:
        raise ConfigurationError(
            f"unknown stop reason {reason!r}",
            hint=f"use one of {', '.join(StopReason.values())}") from None
