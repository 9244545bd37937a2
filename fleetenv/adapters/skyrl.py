"""A Fleet task as a SkyRL-gym text environment: ``skyrl_gym.make("fleetenv", ...)``.

Importing this module registers the id ``"fleetenv"``. SkyRL's generator makes one env
per trajectory and calls the *blocking* ``init`` / ``step`` / ``close`` from its thread
pool, many at once: every env shares fleetenv's one loop thread and its session's caps,
and nothing here starts an event loop. ``env_config`` holds defaults, a row's ``extras``
override them (:data:`OPTIONS`). docs/skyrl.md has the options, the chat it returns and
what SkyRL cannot do with Fleet.
"""

from __future__ import annotations

import difflib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import (
        BaseTextEnv,
        BaseTextEnvStepOutput,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fleetenv.adapters.skyrl needs skyrl-gym: pip install 'fleetenv[skyrl]'"
    ) from exc

from fleetenv.core.config import finite_reward
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.task_files import bundled_tasks_path, load_tasks
from fleetenv.core.tasks import Task
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.env.options import OPTION_NAMES, EpisodeOptions
from fleetenv.env.tool_call_parsing import PROMPT_FORMATS
from fleetenv.fleet.session import Session

__all__ = ["ENV_ID", "OPTIONS", "FleetTextEnv", "dataset_row", "register", "resolve_task",
           "shared_session"]

#: The id ``skyrl_gym.make`` knows this adapter by (the dataset's ``env_class``).
ENV_ID = "fleetenv"

#: Options read from ``env_config`` (defaults) and ``extras`` (per row), and what they do.
OPTIONS: dict[str, str] = {
    "task": "a fleetenv.Task, a task dict, or a task key (see tasks_file)",
    "task_key": "a task key, looked up in tasks_file (default: the bundled sample tasks)",
    "tasks_file": "the task file (JSON, JSONL) task keys are looked up in",
    "max_turns": "turns before the episode is cut and graded (SkyRL's generator sets it)",
    "tool_call_format": "how the model's text is read: auto, hermes, llama3, mistral, openai",
    "tools_prompt_format": "how the tools are written into the system message "
                           "(default: tool_call_format, hermes for auto)",
    "system_prompt": "text put before the tools in the system message",
    "observation_role": "the role of tool-result messages: tool (default) or user",
    "no_tool_call": "a turn without tool calls: final_answer (default) or noop",
    "failed_parse_reward": "the reward of a turn whose tool calls could not be read",
    "unknown_reward": "the reward of an episode whose grade is unknown (default 0.0)",
    "ttl_seconds": "the instance's time to live",
    "episode_deadline_s": "the episode's wall-clock limit",
    "max_text_chars": "tool output longer than this is cut (default 16000)",
    "partial_reward": "pay the verifier's partial score for a 0.0 (default: the task's)",
    "context_tools": "offer the context tools (check_context, manage_context, ...)",
    "meta_tools": "offer search_tools / get_tool_schema instead of the tool list",
    "check_arguments": "strict, lenient or off: tool arguments against their schema",
    "run_tag": "a tag on the instances, to find them in Fleet",
    "base_url": "the Fleet API to use (default: FLEET_BASE_URL)",
    "config": "a fleetenv.FleetConfig (Python only; its repr hides the key)",
    "session": "a fleetenv.Session to share (Python only)",
    "settings": "FleetConfig fields for a session shared by every env with the same "
                "settings (e.g. max_live_instances: 32)",
}

#: Options that pick the session; those named in ``OPTION_NAMES`` are episode options.
_SESSION_OPTIONS = ("base_url", "config", "session")
_OBSERVATION_ROLES = ("tool", "user")
_SECRET_KEYS = ("api_key", "FLEET_API_KEY", "token")

# Task files by resolved path, read once per process however many envs start at once.
_task_files: dict[tuple[str, int], dict[str, Task]] = {}
_task_files_lock = threading.Lock()


class FleetTextEnv(BaseTextEnv):  # type: ignore[misc]  # untyped base (Any)
    """One Fleet task as a SkyRL ``BaseTextEnv`` (docs/skyrl.md).

    ``env_config`` and ``extras`` are what ``skyrl_gym.make`` passes; both may be plain
    dicts or OmegaConf configs. The :class:`fleetenv.FleetEnv` it drives is
    :attr:`fleet_env` (grade, stats, database access).
    """

    def __init__(self, env_config: Mapping[str, Any] | None = None,
                 extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        options = _options(env_config, extras)
        self.task = resolve_task(options.get("task", options.get("task_key")),
                                 tasks_file=options.get("tasks_file"))
        self.unknown_reward = finite_reward(
            options.get("unknown_reward", 0.0), field="unknown_reward",
            hint="e.g. unknown_reward: 0.0 (the default) in env_config")
        self.observation_role = _choice(options.get("observation_role", "tool"),
                                        _OBSERVATION_ROLES, "observation_role")
        self.system_prompt = _text(options.get("system_prompt", ""), "system_prompt")
        prompt_format = options.get("tools_prompt_format")
        self.tools_prompt_format: str | None = (
            None if prompt_format is None
            else _choice(prompt_format, PROMPT_FORMATS, "tools_prompt_format"))
        max_turns = options.get("max_turns")
        fleet_options = {k: options[k] for k in _SESSION_OPTIONS if k in options}
        episode = EpisodeOptions.of({k: options[k] for k in OPTION_NAMES if k in options},
                                    max_steps=_positive(max_turns, "max_turns"))
        if "settings" in options:
            if {"session", "config"} & set(fleet_options):
                raise ConfigurationError(
                    "pass settings, config or session, not several", field="settings",
                    hint="settings builds the shared session; config/session replace it")
            fleet_options["session"] = shared_session(options["settings"])
        #: The ``FleetEnv`` this adapter drives.
        self.fleet_env = FleetEnv(self.task, options=episode, **fleet_options)
        self.max_turns = self.fleet_env.options.max_steps
        #: The chat so far: the prompt ``init`` returned, the model's turns, the results.
        self.chat_history: list[dict[str, Any]] = []
        self.reward_unknown: bool | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<FleetTextEnv {self.fleet_env!r}>"

    # ------------------------------------------------------------------ SkyRL's API

    def init(self, prompt: Sequence[Mapping[str, Any]] | None = None
             ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Provision and start the episode; return the chat to start from and metadata
        (task key, instance id, tool names)."""
        try:
            observation, info = self.fleet_env.reset()
            tools = self.fleet_env.tools_prompt(self.tools_prompt_format)
        except Exception:
            self._abandon()  # SkyRL does not close an env whose init raised
            raise
        self.turns = 0
        self.reward_unknown = None
        self.chat_history = _first_chat(prompt, self.system_prompt, tools,
                                        observation.to_messages())
        metadata = {"task_key": self.task.key, "instance_id": info.get("instance_id"),
                    "modality": str(self.task.modality), "tools": list(info.get("tools", []))}
        return [dict(m) for m in self.chat_history], metadata

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Play one model turn (the raw text); return its results as chat messages."""
        self.turns += 1
        self.chat_history.append({"role": "assistant", "content": action})
        # Verifiers that read the conversation (LLM judges, "tell the customer" checks)
        # grade the chat as the model saw it, up to this turn.
        self.fleet_env.conversation = self.chat_history
        try:
            observation, reward, terminated, truncated, info = self.fleet_env.step(action)
        except Exception:
            self._abandon()  # SkyRL does not close an env whose step raised
            raise
        done = bool(terminated or truncated)
        metadata: dict[str, Any] = {
            "turn": self.turns, "stop_reason": _plain(info.get("stop_reason")),
            "tool_calls": info.get("turn_calls", 0), "tool_error": observation.error,
            "parse_error": info.get("parse_error"),
            "no_tool_call": bool(info.get("no_tool_call", False)),
        }
        if done:
            metadata["reward_status"] = _plain(info.get("reward_status"))
            metadata["reward_reason"] = _plain(info.get("reward_reason"))
            self.reward_unknown = reward is None
            metadata["reward_unknown"] = self.reward_unknown
            if reward is None:
                reward = self.unknown_reward
        messages = [] if done else self._render(observation.to_messages())
        self.chat_history.extend(messages)
        return BaseTextEnvStepOutput(observations=messages, reward=float(reward or 0.0),
                                     done=done, metadata=metadata, postprocessed_action=None)

    def close(self) -> None:
        """Grade an unfinished episode, close the MCP sessions, delete the instance.
        Idempotent; bounded by fleetenv's verifier and deletion timeouts."""
        if self._closed:
            return
        self._closed = True
        self.fleet_env.close()

    def get_metrics(self) -> dict[str, Any]:
        """This episode's numbers (SkyRL averages them over episodes)."""
        stats = self.fleet_env.stats
        grade = self.fleet_env.grade
        metrics: dict[str, Any] = {
            "turns": stats.turns, "tool_calls": stats.tool_calls,
            "tool_errors": stats.tool_errors, "parse_errors": stats.parse_errors,
            "noop_turns": stats.noop_turns,
            "provision_s": stats.timings.get("provision_s", 0.0),
            "verify_s": stats.timings.get("verify_s", 0.0),
        }
        if grade is not None:
            metrics["reward_unknown"] = grade.reward is None
            metrics["stop_reason"] = _plain(self.fleet_env.stop_reason)
        return metrics

    # ------------------------------------------------------------------ helpers

    def _render(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Chat messages as chat templates take them: text content as one string (most
        templates concatenate ``content``), images kept as parts."""
        rendered: list[dict[str, Any]] = []
        for message in messages:
            role = message["role"]
            if role == "tool" and self.observation_role == "user":
                role = "user"
            out = {**message, "role": role, "content": _content(message.get("content"))}
            if role != "tool":
                out.pop("tool_call_id", None)
            rendered.append(out)
        return rendered

    def _abandon(self) -> None:
        """Delete the instance without grading (the caller is leaving with an error)."""
        if not self._closed:
            self._closed = True
            self.fleet_env.close(grade=False)


def resolve_task(task: object, *, tasks_file: str | os.PathLike[str] | None = None) -> Task:
    """A task from what a dataset row holds: a :class:`fleetenv.Task`, a task dict, or a
    task key looked up in ``tasks_file`` (default: the local Fleet's bundled tasks)."""
    if isinstance(task, Task):
        return task
    if isinstance(task, Mapping):
        return Task.model_validate(_plain_value(task))
    if not isinstance(task, str) or not task:
        raise ConfigurationError(
            "the fleetenv SkyRL env needs a task, got "
            + ("none" if task is None else f"a {type(task).__name__}"),
            field="task", hint='put "task_key" (and "tasks_file" in env_config) in the '
                               "dataset row's extras, or a task dict as \"task\"")
    tasks = _tasks_by_key(tasks_file)
    found = tasks.get(task)
    if found is None:
        close = difflib.get_close_matches(task, list(tasks), n=3)
        source = os.fspath(tasks_file) if tasks_file else "the bundled sample tasks"
        raise ConfigurationError(
            f"no task {task!r} in {source}", field="task_key", task=task,
            hint=(f"did you mean {', '.join(map(repr, close))}?" if close
                  else "set tasks_file in env_config to the file that holds it"))
    return found


def shared_session(settings: Mapping[str, Any]) -> Session:
    """The process's shared session (:meth:`fleetenv.Session.shared`) for these
    ``FleetConfig`` fields (``FLEET_API_KEY`` and ``FLEET_BASE_URL`` still come from the
    environment), so its caps (``max_live_instances``, ``max_creating_instances``) hold
    across all of SkyRL's env threads. Sessions still open at interpreter exit delete
    their instances then."""
    if not isinstance(settings, Mapping):
        raise ConfigurationError(
            f"settings must be a mapping of FleetConfig fields, got a "
            f"{type(settings).__name__}", field="settings",
            hint="e.g. settings: {max_live_instances: 32}")
    plain = _plain_value(settings)
    for name in plain:
        if name in _SECRET_KEYS or name == "base_url":
            raise ConfigurationError(
                f"settings does not take {name!r}", field=f"settings.{name}",
                hint="export FLEET_API_KEY / FLEET_BASE_URL, or use the base_url option")
    return Session.shared(**plain)


def dataset_row(task: Task, *, prompt: bool = True) -> dict[str, Any]:
    """One row of a SkyRL dataset for ``task``: ``prompt`` (the user message, unless
    ``prompt=False``), ``env_class`` and ``task_key`` (``tasks_file`` goes in
    ``env_config``), and the ``reward_spec`` SkyRL's dataset format asks for."""
    messages = [{"role": "user", "content": task.prompt}] if prompt else []
    return {"prompt": messages, "env_class": ENV_ID, "task_key": task.key,
            "reward_spec": {"method": "fleet_verifier"}}


def register() -> None:
    """Register :data:`ENV_ID` with ``skyrl_gym`` (done on import; safe to call again)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:FleetTextEnv")


# ---------------------------------------------------------------------- module helpers

def _options(env_config: Mapping[str, Any] | None,
             extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """``env_config`` defaults overridden by the known keys of ``extras``."""
    config = _mapping(env_config, "env_config")
    row = _mapping(extras, "extras")
    for name in (*config, *row):
        if name in _SECRET_KEYS:
            raise ConfigurationError(
                f"the fleetenv SkyRL env does not take {name!r} in its config",
                field=name, hint="export FLEET_API_KEY instead: skyrl_gym keeps env_config "
                                 "and extras in env.spec, whose repr would show the key")
    unknown = sorted(set(config) - set(OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"unknown fleetenv SkyRL option(s) in env_config: {', '.join(unknown)}",
            field=unknown[0], hint=f"known options: {', '.join(OPTIONS)}")
    # A typo in env_config is refused; extras also hold the row's other columns (reward_spec).
    return {**config, **{k: v for k, v in row.items() if k in OPTIONS}}


def _mapping(value: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{name} must be a mapping, got a {type(value).__name__}",
                                 field=name, hint=f"pass {name}={{...}}")
    return {str(k): _plain_value(v) for k, v in value.items()}


def _plain_value(value: Any) -> Any:
    """OmegaConf ``DictConfig`` / ``ListConfig`` (what SkyRL's Hydra config holds) as
    plain dicts and lists; anything else as it is."""
    if isinstance(value, Task | str | bytes):
        return value
    if isinstance(value, Mapping) and type(value) is not dict:
        return {str(k): _plain_value(v) for k, v in value.items()}
    if isinstance(value, dict):
        return {k: _plain_value(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, tuple):
        return [_plain_value(v) for v in value]
    return value


def _tasks_by_key(tasks_file: str | os.PathLike[str] | None) -> dict[str, Task]:
    """The tasks of a file by key, read once (many envs start at once, in threads)."""
    path = bundled_tasks_path() if tasks_file is None else Path(tasks_file).expanduser()
    try:
        resolved = path.resolve()
        stamp = (str(resolved), resolved.stat().st_mtime_ns)
    except OSError:
        stamp = (str(path), -1)  # load_tasks says what is wrong with it
    with _task_files_lock:
        cached = _task_files.get(stamp)
        if cached is None:
            cached = {task.key: task for task in load_tasks(path)}
            _task_files[stamp] = cached
    return cached


def _first_chat(prompt: Sequence[Mapping[str, Any]] | None, system_prompt: str,
                tools: str, reset_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dataset's prompt, with the tools in the system message and the task prompt
    (and initial screenshot) as the user message when the dataset has none."""
    if prompt is not None and (isinstance(prompt, str | bytes)
                               or not isinstance(prompt, Sequence)):
        raise ConfigurationError(
            f"init() needs the prompt as a list of chat messages, got a "
            f"{type(prompt).__name__}", field="prompt",
            hint='e.g. [{"role": "user", "content": "..."}] (the dataset\'s prompt column)')
    messages = [dict(_plain_value(m)) for m in (prompt or [])]
    system_text = "\n\n".join(p for p in (system_prompt, tools) if p)
    if messages and messages[0].get("role") == "system":
        existing = _content(messages[0].get("content"))
        messages[0]["content"] = (f"{existing}\n\n{system_text}" if isinstance(existing, str)
                                  and existing else system_text)
    else:
        messages.insert(0, {"role": "system", "content": system_text})
    if not any(m.get("role") == "user" for m in messages):
        messages.extend({**m, "content": _content(m.get("content"))} for m in reset_messages)
    return messages


def _content(content: Any) -> Any:
    """Text-only content parts as one string; content with images left as parts."""
    if isinstance(content, list) and all(
            isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    return content


def _plain(value: Any) -> Any:
    """A ``StrEnum`` (stop reason, grade status) as a plain ``str``."""
    return None if value is None else str(value)


def _positive(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a whole number >= 1, got {value!r:.40}",
                                 field=name, hint=f"e.g. {name}: 10")
    return value


def _choice(value: object, allowed: tuple[str, ...], name: str) -> str:
    if isinstance(value, str) and value in allowed:
        return value
    raise ConfigurationError(f"{name} must be one of {', '.join(allowed)}, got {value!r:.40}",
                             field=name, hint=f"e.g. {name}: {allowed[0]}")


def _text(value: object, name: str) -> str:
    if isinstance(value, str):
        return value
    raise ConfigurationError(f"{name} must be text, got a {type(value).__name__}",
                             field=name, hint=f'e.g. {name}: "You are a helpful agent."')


register()
