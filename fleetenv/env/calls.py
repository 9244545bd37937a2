"""What the actions of one step do: tool calls, local tools, final answers, turns.

A tool call is checked first (unknown tool, arguments that do not fit: nothing is sent),
then sent once within the episode deadline; whether its result is an error is decided
here only, by the env's tool-error rule. Every failure is an observation, a call that may
have run is never replayed and taints its instance. Local tools are answered here; a
whole turn gets one observation. Each call emits one ``ToolCallFinished`` (docs/events.md).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import (
    DeadlineExceeded,
    FleetEnvError,
    ToolArgumentsError,
    ToolNotFoundError,
)
from fleetenv.core.events import (
    ToolCallFailed,
    ToolCallFinished,
    ToolErrorReported,
    TurnParseFailed,
    TurnWithoutToolCall,
)
from fleetenv.core.types import (
    Action,
    Done,
    FinalAnswer,
    ListTools,
    Observation,
    StepInfo,
    StopReason,
    ToolCall,
)
from fleetenv.env.actions import SUBMIT_FINAL_ANSWER
from fleetenv.mcp.error_rules import decide, resolve_rule
from fleetenv.runtime.plans import Blocking, Plan

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.config import FleetConfig
    from fleetenv.core.tasks import Task
    from fleetenv.core.tool_results import ToolResult
    from fleetenv.env.instance import InstanceLease
    from fleetenv.env.options import ResolvedOptions
    from fleetenv.env.state import EpisodeState
    from fleetenv.env.toolbox import Toolbox
    from fleetenv.env.turns import Turn

__all__ = ["StepActions"]

_ANSWERED = "Answer recorded. The episode is over."


class StepActions:
    """Runs the actions of one env's steps, against its toolbox and instance. The
    episode's state and the step's ``info`` are handed in with each step."""

    def __init__(self, task: Task, config: FleetConfig, options: ResolvedOptions,
                 toolbox: Toolbox, lease: InstanceLease,
                 emit: Callable[..., None]) -> None:
        self._task = task
        self._config = config
        self._options = options
        self._toolbox = toolbox
        self._lease = lease
        self._emit = emit
        self._rule = resolve_rule(options.tool_error_rule)

    def run_plan(self, state: EpisodeState, actions: Sequence[Action], turn: Turn | None,
                 info: StepInfo) -> Plan[Observation]:
        """Run ``actions`` in order, up to one that ends the episode; return the step's
        observation (for a whole turn, one observation of all its calls)."""
        observation = self.observation(state, [], tool_name=None)
        per_call: list[Observation] = []
        for item in actions:
            if isinstance(item, ListTools):
                observation = self.observation(state, _text(self._toolbox.listing()),
                                               tool_name=None)
            elif isinstance(item, FinalAnswer):
                state.final_answer = item.answer
                info["submitted_answer"] = item.answer
                state.stop(StopReason.AGENT_DONE)
                self._finished(state, SUBMIT_FINAL_ANSWER, "local", 0.0)
                observation = self.observation(state, _text(_ANSWERED),
                                               tool_name=SUBMIT_FINAL_ANSWER, call_id=item.id)
                if turn is None or not turn.no_tool_call:  # a call the model made
                    per_call.append(observation)
            elif isinstance(item, Done):
                state.stop(StopReason.AGENT_DONE)
            elif isinstance(item, ToolCall):
                observation = yield from self._recorded_plan(state, item, info)
                per_call.append(observation)
            if state.done:
                break
        if turn is not None:
            observation = self._turn_observation(state, turn, per_call, info)
        return observation

    def observation(self, state: EpisodeState, content: list[dict[str, Any]], *,
                    tool_name: str | None, call_id: str | None = None,
                    result: ToolResult | None = None,
                    error: str | None = None) -> Observation:
        """An observation of the episode at its current step."""
        task = self._task
        return Observation(
            task_key=task.key, prompt=task.prompt, modality=task.modality, step=state.step,
            tools=list(self._toolbox.openai_tools), content=content, result=result,
            tool_name=tool_name, tool_call_id=call_id, is_error=error is not None,
            error=error)

    # ------------------------------------------------------------------ one tool call

    def _recorded_plan(self, state: EpisodeState, call: ToolCall,
                       info: StepInfo) -> Plan[Observation]:
        """One tool call, kept in the context tools' history when they are on."""
        if not self._options.context_tools:
            return (yield from self._tool_plan(state, call, info))
        state.record_call(call, self._task.prompt)
        observation = yield from self._tool_plan(state, call, info)
        history = state.record_observation(observation)
        if history is not None:  # manage_context: the caller adopts this
            info["history"] = history
        return observation

    def _tool_plan(self, state: EpisodeState, call: ToolCall,
                   info: StepInfo) -> Plan[Observation]:
        """Run one tool call; every failure becomes an observation, never a crash."""
        name = call.name
        info["tool_name"] = name
        try:
            arguments = self._toolbox.check(call)
        except (ToolArgumentsError, ToolNotFoundError) as exc:
            self._finished(state, name, "bad_arguments", 0.0, exc, exc.message)
            if self._toolbox.is_local(name):  # shown to the agent, not a tool error
                return self.observation(state, _text(f"Error: {exc.message}"),
                                        tool_name=name, call_id=call.id, error=exc.message)
            state.tool_calls += 1  # refused, not sent: a call and a tool error all the same
            return self._tool_error(state, call, exc.message, info)
        if self._toolbox.is_local(name):
            return self._local_tool(state, call, arguments, info)
        timeout_s = state.deadline.cap(self._config.timeouts.call)
        if timeout_s <= 0:
            state.stop(StopReason.TIME_LIMIT)
            self._finished(state, name, "failed", 0.0, DeadlineExceeded("not sent"),
                           "the episode deadline passed before the call was sent",
                           sent=False)
            return self.observation(state, [], tool_name=name, call_id=call.id)
        state.tool_calls += 1
        started = time.perf_counter()
        # Out until settled (its taint included), so a close() from another thread
        # meanwhile never hands the instance to a warm pool.
        with self._lease.call_out():
            try:
                result = yield from self._toolbox.call_plan(name, arguments, timeout_s)
            except DeadlineExceeded as exc:
                self._failed(state, name, time.perf_counter() - started, exc)
                if state.deadline.expired():
                    state.stop(StopReason.TIME_LIMIT)
                return self._tool_error(
                    state, call, f"{name} did not answer within {timeout_s:.0f} s; it may "
                    "still have run. Check the state before calling it again.", info)
            except FleetEnvError as exc:
                self._failed(state, name, time.perf_counter() - started, exc)
                if (yield Blocking(self._lease.is_gone)):
                    state.stop(StopReason.INSTANCE_EXPIRED)
                    info["instance_error"] = str(exc)
                    return self._tool_error(state, call, f"the instance is gone: "
                                            f"{exc.message}", info)
                return self._tool_error(state, call, exc.message, info)
            except Exception as exc:  # not ours to handle; still one event for the call
                self._finished(state, name, "failed", time.perf_counter() - started, exc,
                               str(exc))
                raise
        duration_s = time.perf_counter() - started
        try:
            error = decide(self._rule, result, tool=name)
        except FleetEnvError as exc:  # the user's rule is broken: say so, do not guess
            self._finished(state, name, "failed", duration_s, exc, str(exc))
            raise
        if error is not None:
            state.record_tool_error(name, error)
            self._emit(ToolErrorReported, tool_name=name, step=state.step, error=error)
            info["tool_error"] = error
        self._finished(state, name, "ok" if error is None else "tool_error", duration_s,
                       error=error)
        chars = self._options.max_text_chars
        content = (state.context.render(result, chars) if self._options.context_tools
                   else result.to_openai_content(chars))
        return self.observation(state, content, tool_name=name, call_id=call.id,
                                result=result, error=error)

    def _local_tool(self, state: EpisodeState, call: ToolCall, arguments: dict[str, Any],
                    info: StepInfo) -> Observation:
        """A context tool or meta-tool: answered here, never sent, never a tool error."""
        started = time.perf_counter()
        meta = self._toolbox.meta
        if meta is not None and meta.is_meta_tool(call.name):
            text = meta.execute(call.name, arguments)
        else:
            reply = state.context.execute(call.name, arguments, state.history)
            if reply.history is not None:
                state.replace_history(reply.history)
            text = reply.text
        info["local_tool"] = call.name
        self._finished(state, call.name, "local", time.perf_counter() - started)
        return self.observation(state, _text(text), tool_name=call.name, call_id=call.id)

    def _failed(self, state: EpisodeState, name: str, duration_s: float,
                exc: FleetEnvError) -> None:
        """The call got no answer (transport, protocol, timeout)."""
        self._emit(ToolCallFailed, tool_name=name, step=state.step,
                   error_type=type(exc).__name__, error=str(exc))
        self._finished(state, name, "failed", duration_s, exc, str(exc))

    def _finished(self, state: EpisodeState, name: str, outcome: str, duration_s: float,
                  exc: BaseException | None = None, error: str | None = None, *,
                  sent: bool = True) -> None:
        if outcome == "failed":
            self._lease.tainted = True  # it may still run there: never reuse the instance
        if sent and outcome in ("ok", "tool_error", "failed"):  # not refused, not local
            state.tool_timings.append(
                {"tool": name, "seconds": round(duration_s, 6), "outcome": outcome})
        self._emit(ToolCallFinished, tool_name=name, step=state.step, outcome=outcome,
                   duration_s=duration_s, error_type=type(exc).__name__ if exc else None,
                   error=error)

    def _tool_error(self, state: EpisodeState, call: ToolCall, message: str,
                    info: StepInfo) -> Observation:
        state.record_tool_error(call.name, message)
        info["tool_error"] = message
        return self.observation(state, _text(f"Error: {message}"), tool_name=call.name,
                                call_id=call.id, error=message)

    # ------------------------------------------------------------------ a whole turn

    def _turn_observation(self, state: EpisodeState, turn: Turn,
                          per_call: list[Observation], info: StepInfo) -> Observation:
        """One observation for a whole turn: every call's result, a parse error, or the
        note that the turn made no call (counted, and reported as an event)."""
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
            notice = _ANSWERED
        elif turn.no_tool_call:
            state.noop_turns += 1
            info["no_tool_call"] = True
            self._emit(TurnWithoutToolCall, step=state.step, text=turn.text)
            offered = any(t["function"]["name"] == SUBMIT_FINAL_ANSWER
                          for t in self._toolbox.openai_tools)
            notice = ("Your turn made no tool call. Call a tool to continue"
                      + (f", or {SUBMIT_FINAL_ANSWER} to finish." if offered else "."))
        content = (_text(notice) if notice is not None
                   else [part for call in per_call for part in call.content])
        errors = [(call.tool_name, call.error) for call in per_call if call.error]
        error = (parse_error if parse_error is not None
                 else errors[0][1] if len(errors) == 1
                 else "\n".join(f"{name}: {message}" for name, message in errors) or None)
        last = per_call[-1] if per_call else None
        observation = self.observation(
            state, content, tool_name=last.tool_name if last else None,
            call_id=last.tool_call_id if last else None, result=last.result if last else None,
            error=error)
        return dataclasses.replace(observation, turn=True, calls=tuple(per_call),
                                   parse_error=parse_error)


def _text(text: str) -> list[dict[str, Any]]:
    """One text part of chat content."""
    return [{"type": "text", "text": text}]
