"""A Fleet task as a ``gymnasium.Env``: text observations, a text action, a float reward.

Importing this module registers ``fleetenv/Fleet-v0`` (Gymnasium 1.x has no plugin entry
points). One action is one model turn: its tool calls run in order and count once toward
``max_steps``; text holding no tool call is an error observation, not an exception.
``info`` keeps only what repeats when an episode is replayed; an unknown grade pays
``unknown_reward``. docs/gymnasium.md has the spaces, the action forms and the reasons.
"""

from __future__ import annotations

import dataclasses
import json
import string
from collections.abc import Mapping
from typing import Any

try:
    import gymnasium
    from gymnasium import spaces
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fleetenv.adapters.gymnasium needs gymnasium: pip install 'fleetenv[gymnasium]'"
    ) from exc

from fleetenv.core.config import finite_reward
from fleetenv.core.errors import (
    EpisodeStateError,
    InvalidActionError,
    ToolCallParseError,
)
from fleetenv.core.tasks import Task
from fleetenv.core.types import Observation
from fleetenv.env.actions import parse_action
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.env.tool_call_parsing import split_tool_calls

__all__ = ["ENV_ID", "FleetGymEnv", "UnicodeText", "register"]

#: The id ``gymnasium.make`` knows this adapter by.
ENV_ID = "fleetenv/Fleet-v0"

#: Characters ``sample()`` draws from: printable ASCII (what a model's JSON is made of).
SAMPLE_CHARSET = string.printable

#: ``info`` keys of ``FleetEnv`` that depend only on what the agent did, so they repeat
#: exactly when an episode is replayed (``check_env`` demands an identical ``info``, and
#: trainers store it). Ids, timings and stdout stay in ``raw_info``.
_STABLE_INFO_KEYS = frozenset({
    "task_key", "modality", "tools", "step", "tool_name", "tool_error",
    "submitted_answer", "stop_reason", "tool_calls", "tool_errors", "tools_changed",
    "reward_status", "reward_reason", "verifier_score", "partial_reward", "app_scores",
    "final_answer", "reset",
})


class UnicodeText(spaces.Text):
    """A ``Text`` space whose members are any Unicode text up to ``max_length``.

    Tool output is arbitrary text (any language, JSON, code), which ``Text``'s fixed
    charset cannot describe without listing every code point. Membership therefore
    checks only the length; ``sample()`` still draws from ``charset`` (printable ASCII by
    default), which is all a random agent needs.
    """

    def __init__(self, max_length: int, *, min_length: int = 0,
                 charset: str = SAMPLE_CHARSET, seed: int | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


class FleetGymEnv(gymnasium.Env[dict[str, Any], str]):
    """One Fleet task as a Gymnasium environment (docs/gymnasium.md).

    ``task`` is a :class:`fleetenv.Task` or a task dict; ``options`` go to
    :class:`fleetenv.FleetEnv` (``session``, ``api_key``/``base_url``, ``config``,
    ``max_steps``, ...). With ``gymnasium.make``, pass ``config=fleetenv.resolve_config(
    ...)`` (or rely on ``FLEET_API_KEY``) rather than ``api_key=`` or a live ``session``:
    Gymnasium keeps the keyword arguments in ``env.spec`` (whose repr would show a bare
    key; the config's hides it) and deep-copies them to re-create the env
    (``check_env`` does), which a session cannot survive.

    ``unknown_reward`` is the float an episode whose grade is unknown pays (default
    ``0.0``): Gymnasium needs a float, and fleetenv never makes an unknown grade a silent
    0.0, so the step's ``info["reward_unknown"]`` is ``True`` and :attr:`unknown_rewards`
    counts such episodes. ``max_text_length`` bounds each observation text (images arrive as data
    URLs inside ``messages``); ``max_action_length`` bounds what ``action_space.sample()``
    draws (``step`` itself accepts any length).
    """

    #: No render modes: the observation already is the text a human would read.
    metadata = {"render_modes": []}

    def __init__(self, task: Task | Mapping[str, Any], *,
                 unknown_reward: float = 0.0, max_text_length: int = 1 << 24,
                 max_action_length: int = 1 << 12, **options: Any) -> None:
        self.unknown_reward = finite_reward(unknown_reward, field="unknown_reward",
                                            hint="e.g. unknown_reward=0.0 (the default)")
        #: The ``FleetEnv`` this adapter drives (grade, stats, tools, database access).
        self.fleet_env = FleetEnv(task, **options)
        self.observation_space = spaces.Dict({
            "prompt": UnicodeText(max_text_length),
            "tools": UnicodeText(max_text_length),
            "messages": UnicodeText(max_text_length),
            "text": UnicodeText(max_text_length),
        })
        self.action_space = UnicodeText(max_action_length, min_length=1)
        #: Episodes that ended with an unknown grade (paid ``unknown_reward``).
        self.unknown_rewards = 0
        #: Actions that held no tool call this env could read (all episodes).
        self.parse_errors = 0
        self._episode_parse_errors = 0
        #: The unfiltered ``info`` of the last ``reset``/``step`` (ids, timings, stdout).
        self.raw_info: dict[str, Any] = {}
        self._turn = 0

    def __repr__(self) -> str:
        return f"<FleetGymEnv {self.fleet_env!r}>"

    # ------------------------------------------------------------------ Gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, str], dict[str, Any]]:
        """Start an episode (``options`` go to ``FleetEnv.reset``, e.g.
        ``{"fresh_instance": True}``)."""
        super().reset(seed=seed)
        observation, info = self.fleet_env.reset(seed=seed, options=options)
        self._turn = 0
        self._episode_parse_errors = 0
        self.raw_info = dict(info)
        return _render(observation), _stable(info)

    def step(self, action: object
             ) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        """Run the action's tool calls in order; one observation answers all of them."""
        if self.fleet_env.stop_reason is not None:  # even for an unreadable action
            raise EpisodeStateError(f"the episode is over ({self.fleet_env.stop_reason})",
                                    hint="call reset() to start a new episode",
                                    task=self.fleet_env.task.key)
        self._turn += 1
        calls, problem = _read_action(action, self._turn, self.fleet_env.options.tool_call_format)
        if problem is not None:
            return self._parse_error(problem)
        # The whole action is one turn: every call runs, in order, and counts once
        # toward max_steps; the observation answers each call with its own message.
        observation, reward, terminated, truncated, info = self.fleet_env.step(calls)
        self.raw_info = dict(info)
        stable = _stable(info)
        stable["parse_error"] = None
        stable["parse_errors"] = self._episode_parse_errors
        if reward is None:  # only when the episode ended with an unknown grade
            self.unknown_rewards += 1
            stable["reward_unknown"] = True
            reward = self.unknown_reward
        elif terminated or truncated:
            stable["reward_unknown"] = False
        return _render(observation), float(reward), bool(terminated), bool(truncated), stable

    def close(self) -> None:
        """Grade an unfinished episode, delete the instance; idempotent."""
        self.fleet_env.close()
        super().close()

    # ------------------------------------------------------------------ helpers

    def _parse_error(self, problem: str
                     ) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        """An action with no readable tool call: the agent is told what to send."""
        self.parse_errors += 1
        self._episode_parse_errors += 1
        message = (f"Error: {problem}. Send one tool call as JSON, e.g. "
                   '{"name": "<tool>", "arguments": {...}}, or '
                   '{"name": "submit_final_answer", "arguments": {"answer": "..."}} '
                   "to finish.")
        self.raw_info = {"parse_error": problem, "turn": self._turn}
        user = [{"role": "user", "content": [{"type": "text", "text": message}]}]
        obs = _texts(self.fleet_env.task.prompt, self.fleet_env.openai_tools, user, message)
        info = {"parse_error": problem, "parse_errors": self._episode_parse_errors}
        return obs, 0.0, False, False, info


def _render(observation: Observation) -> dict[str, str]:
    return _texts(observation.prompt, observation.tools, observation.to_messages(),
                  observation.text)


def _texts(prompt: str, tools: list[dict[str, Any]], messages: list[dict[str, Any]],
           text: str) -> dict[str, str]:
    """The observation space's four texts (lists as JSON)."""
    return {"prompt": prompt, "tools": json.dumps(tools, ensure_ascii=False),
            "messages": json.dumps(messages, ensure_ascii=False), "text": text}


def _stable(info: Mapping[str, Any]) -> dict[str, Any]:
    """The replayable part of a ``FleetEnv`` info dict, as plain JSON-like values."""
    return {key: _plain(value) for key, value in info.items() if key in _STABLE_INFO_KEYS}


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return str(value)  # a StrEnum (stop reason, grade status) as a plain str
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _read_action(action: object, turn: int, format: str = "auto"
                 ) -> tuple[list[Any], str | None]:
    """The tool calls of one action, in order, or a description of what is wrong.

    Calls without an id get ``call_<turn>_<n>``, so a replayed episode produces the same
    ``tool_call_id``s (random ids would break Gymnasium's determinism check).
    """
    if isinstance(action, str | bytes):
        text = action.decode("utf-8", "replace") if isinstance(action, bytes) else action
        try:
            action = json.loads(text)
        except ValueError:  # JSONDecodeError, and RecursionError-free for flat input
            return _model_text(text, turn, format)
        except RecursionError:
            return [], "the action is JSON nested too deeply to read"
    items: list[Any]
    if isinstance(action, Mapping) and action.get("role") == "assistant":
        items = list(action.get("tool_calls") or [])
        if not items:
            return [], "the assistant message has no tool_calls"
    elif isinstance(action, list | tuple):
        items = list(action)
        if not items:
            return [], "the action is an empty list of tool calls"
    else:
        items = [action]
    calls: list[Any] = []
    for index, item in enumerate(items):
        if isinstance(item, Mapping) and "id" not in item and (
                "function" in item or "name" in item):
            item = {**item, "id": f"call_{turn}_{index}"}
        try:
            parse_action(item)  # checked before any call runs: all or nothing
        except InvalidActionError as exc:
            where = "the action" if len(items) == 1 else f"item {index} of the action"
            return [], f"{where} is no tool call ({exc.message})"
        calls.append(item)
    return calls, None


def _model_text(text: str, turn: int, format: str) -> tuple[list[Any], str | None]:
    """Tool calls in a model's own format (Hermes ``<tool_call>``, Mistral, Llama 3),
    re-numbered ``call_<turn>_<n>`` so a replayed episode repeats its ids. Text with no
    call stays a parse error here: a random string must not end a Gymnasium episode as
    a final answer."""
    try:
        found = split_tool_calls(text, format).calls
    except ToolCallParseError as exc:
        return [], f"the action's tool call could not be read ({exc.message})"
    if not found:
        return [], f"the action is neither JSON nor a tool call: {text[:80]!r}"
    return [dataclasses.replace(call, id=f"call_{turn}_{index}")
            for index, call in enumerate(found)], None


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (done on import; safe to call again)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:FleetGymEnv")


register()
