"""One Fleet episode as a tinker-cookbook ``Env``: tokens in, tokens out.

As in the cookbook's own tool-use envs, the *renderer* does both ends of the model's
format: it writes the tools into the prompt and parses the calls out of the sampled
tokens, so prompt and parse always agree (Qwen, Kimi, GPT-OSS, DeepSeek...). The parsed
calls go to ``FleetEnv.step_async`` as one turn, never parsed a second time. What each kind
of turn does (a cut turn, a parse error, no tool call) and pays: docs/tinker.md. An
episode that ends closes its FleetEnv at once, so a group's instances are released as
each member finishes, not when the slowest does.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from fleetenv import runtime
from fleetenv.adapters.tinker import _cookbook as cb
from fleetenv.adapters.tinker.metrics import (
    ToolCallTap,
    episode_logs,
    episode_metrics,
    tinker_stop_reason,
    turn_metrics,
)
from fleetenv.core.errors import EpisodeStateError
from fleetenv.core.types import Done, FinalAnswer, StopReason
from fleetenv.env.turns import text_of

if TYPE_CHECKING:
    from fleetenv.core.types import Observation
    from fleetenv.env.fleet_env import FleetEnv

__all__ = ["DEFAULT_SYSTEM_PROMPT", "FleetTinkerEnv"]

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent working in an application through its tools. Call the tools to "
    "do the task; when it is done, reply with a short final answer and no tool call.")


class FleetTinkerEnv(cb.EnvBase):
    """A single-use Tinker ``Env`` playing one episode of a :class:`fleetenv.FleetEnv`.

    Built by :class:`~fleetenv.adapters.tinker.FleetEnvGroupBuilder`; the FleetEnv it
    wraps is ``self.fleet_env`` (its ``grade``, ``stats``, ``final_answer``).
    """

    def __init__(self, fleet_env: FleetEnv, renderer: Any, *,
                 system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 failed_parse_reward: float = -1.0,
                 terminate_on_parse_error: bool = True,
                 unknown_reward: float = 0.0,
                 max_trajectory_tokens: int | None = None,
                 tap: ToolCallTap | None = None) -> None:
        self.fleet_env = fleet_env
        self.renderer = renderer
        self.system_prompt = system_prompt
        self.failed_parse_reward = failed_parse_reward
        self.terminate_on_parse_error = terminate_on_parse_error
        self.unknown_reward = unknown_reward
        self.max_trajectory_tokens = max_trajectory_tokens
        self._tap = tap
        self._lock = cb.tokenizer_lock(renderer.tokenizer)
        self._stop_condition = renderer.get_stop_sequences()
        #: The conversation so far, as the renderer's messages.
        self.messages: list[Any] = []
        #: Why the episode ended, in the cookbook's words (``None`` while it runs).
        self.stop_reason: str | None = None

    # ---------------------------------------------------------------- the Env API

    async def initial_observation(self) -> tuple[Any, Any]:
        """Provision (or reset) the instance, list the tools, and render the prompt."""
        env = self.fleet_env
        if self._tap is not None:
            self._tap.watch(env.rollout_id)
        await env.reset_async()
        tools = [_tool_spec(tool) for tool in env.openai_tools]
        try:
            prefix = self.renderer.create_conversation_prefix_with_tools(
                tools, self.system_prompt)
        except NotImplementedError:
            raise cb.renderers.RendererError(
                f"renderer {type(self.renderer).__name__} cannot render tools, and a Fleet "
                "task is played through tools; use a renderer with tool calling (e.g. "
                "qwen3, qwen3_instruct, kimi_k2, gpt_oss_*, deepseekv3)") from None
        self.messages = [*prefix, {"role": "user", "content": env.task.prompt}]
        return await self._render(), self._stop_condition

    async def step(self, action: list[int], *, extra: Any = None) -> Any:
        """Play one model turn (the sampled tokens) and return the next prompt."""
        if self.stop_reason is not None:
            raise EpisodeStateError(
                f"step() after the episode ended ({self.stop_reason})",
                hint="a Tinker Env is single-use: make new ones with the group builder",
                task=self.fleet_env.task.key)
        sampler_stop = (extra or {}).get("stop_reason", "stop")
        message, termination = await self._in_thread(self.renderer.parse_response, action)
        if sampler_stop == "length":
            # Cut mid-turn: run nothing from it, grade what the agent did so far.
            return await self._end(StopReason.ABANDONED, "max_tokens", grade=True,
                                   turn={"max_tokens_reached": 1.0})
        if not termination.is_clean:
            return await self._end(StopReason.INTERRUPTED, "parse_error", grade=False,
                                   turn={"parse_error": 1.0}, reward=self.failed_parse_reward)
        self.messages.append(message)
        unparsed = message.get("unparsed_tool_calls") or []
        turn: object
        if unparsed:
            # fleetenv reads the broken call itself: a parse-error turn, an event, a count.
            turn = "\n".join(call.raw_text for call in unparsed)
        else:
            turn = _fleet_turn(message, self.fleet_env.options.no_tool_call)
        started = time.monotonic()
        observation, reward, terminated, truncated, info = (
            await self.fleet_env.step_async(turn))
        metrics: dict[str, float | int] = {"fleet/turn_s": time.monotonic() - started}
        if self._tap is not None:
            metrics.update(turn_metrics(self._tap.take(self.fleet_env.rollout_id)))
        parse_error = observation.parse_error is not None
        if parse_error:
            metrics["parse_error"] = 1.0
        if terminated or truncated or self.fleet_env.done:
            reason: StopReason | str = (info.get("stop_reason") or self.fleet_env.stop_reason
                                        or StopReason.AGENT_DONE)
            return await self._finished(reward, tinker_stop_reason(reason), metrics)
        if parse_error and self.terminate_on_parse_error:
            return await self._end(StopReason.INTERRUPTED, "parse_error", grade=False,
                                   turn=metrics, reward=self.failed_parse_reward)
        self.messages.extend(_reply_messages(observation))
        next_observation = await self._render()
        if (self.max_trajectory_tokens is not None
                and next_observation.length > self.max_trajectory_tokens):
            metrics["context_overflow"] = 1.0
            return await self._end(StopReason.ABANDONED, "context_overflow", grade=True,
                                   turn=metrics)
        step_reward = self.failed_parse_reward if parse_error else 0.0
        return cb.rl_types.StepResult(
            reward=step_reward, episode_done=False, next_observation=next_observation,
            next_stop_condition=self._stop_condition, metrics=metrics)

    # ---------------------------------------------------------------- ending

    async def _end(self, fleet_reason: StopReason, reason: str, *, grade: bool,
                   turn: dict[str, float | int], reward: float | None = None) -> Any:
        """End an episode fleetenv thinks is still running: grade it (or not) on close."""
        await self._close(grade=grade, reason=fleet_reason)
        if reward is None:
            return self._result(self.fleet_env.reward, reason, turn, fleet_reason)
        return self._result(reward, reason, turn, fleet_reason, paid=True)

    async def _finished(self, reward: float | None, reason: str,
                        turn: dict[str, float | int]) -> Any:
        """fleetenv ended the episode (and graded it) in this step."""
        await self._close(grade=True, reason=None)
        return self._result(reward, reason, turn, None)

    def _result(self, reward: float | None, reason: str, turn: dict[str, float | int],
                fleet_reason: StopReason | None, *, paid: bool = False) -> Any:
        self.stop_reason = reason
        unknown = reward is None and not paid
        env = self.fleet_env
        metrics = {**turn, **episode_metrics(env.stats, env.grade, reward_unknown=unknown),
                   f"stop/{reason}": 1.0}
        value = self.unknown_reward if reward is None else float(reward)
        return cb.rl_types.StepResult(
            reward=value, episode_done=True, next_observation=cb.tinker.ModelInput.empty(),
            next_stop_condition=self._stop_condition, metrics=metrics,
            logs=episode_logs(env, fleet_reason))

    async def _close(self, *, grade: bool, reason: StopReason | None) -> None:
        """Release the instance now (grading first if asked). fleetenv bounds a close
        itself (the verifier's timeout, MCP and deletion deadlines), so no timeout is
        added here: cutting ``close_async`` off would stop it half-way. A close that
        fails is logged; the session deletes the instance at exit at the latest."""
        env = self.fleet_env
        if self._tap is not None:
            self._tap.forget(env.rollout_id)
        try:
            await env.close_async(grade=grade, reason=reason)
        except Exception as exc:  # the episode's result stands
            logger.warning("closing the episode of %s (instance %s) failed: %s",
                           env.task.key, env.last_instance_id, exc)

    # ---------------------------------------------------------------- rendering

    async def _render(self) -> Any:
        """The conversation as the next prompt, rendered off the event loop (tokenizing
        is CPU work), as the cookbook's ``EnvFromMessageEnv`` does."""
        return await self._in_thread(self.renderer.build_generation_prompt,
                                     list(self.messages))

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await runtime.current().run_blocking(cb.guarded, self._lock, fn, *args)


def _tool_spec(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool as the cookbook's ``ToolSpec``."""
    function = tool.get("function", tool)
    return {"name": function["name"], "description": function.get("description") or "",
            "parameters": function.get("parameters") or {"type": "object",
                                                           "properties": {}}}


def _fleet_turn(message: Any, no_tool_call: str) -> object:
    """The renderer's parsed assistant message as one fleetenv turn."""
    calls = message.get("tool_calls") or []
    if calls:
        return {"role": "assistant", "content": text_of(message["content"]),
                "tool_calls": [
                    {"type": "function", "id": call.id,
                     "function": {"name": call.function.name,
                                  "arguments": call.function.arguments}}
                    if call.id else
                    {"type": "function", "function": {"name": call.function.name,
                                                      "arguments": call.function.arguments}}
                    for call in calls]}
    if no_tool_call == "noop":
        return []
    text = text_of(message["content"]).strip()
    return [FinalAnswer(text)] if text else [Done()]


def _reply_messages(observation: Observation) -> list[dict[str, Any]]:
    """fleetenv's turn observation as the renderer's messages: one ``tool`` message per
    call (text only: these renderers are text renderers), or a ``user`` message saying
    why nothing ran (a parse error, a turn without a call)."""
    messages: list[dict[str, Any]] = []
    for call in observation.calls:
        text = call.text or "(empty)"
        message: dict[str, Any] = {"role": "tool", "content": text}
        if call.tool_call_id:
            message["tool_call_id"] = call.tool_call_id
        if call.tool_name:
            message["name"] = call.tool_name
        messages.append(message)
    if not observation.calls and observation.content:
        messages.append({"role": "user", "content": observation.text})
    return messages

