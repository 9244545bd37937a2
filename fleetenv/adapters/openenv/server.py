"""Fleet tasks as an OpenEnv *server* environment: any OpenEnv client can play them.

openenv-core's server (``create_fastapi_app``) hosts one :class:`FleetOpenEnvEnvironment`
per WebSocket session, each driving one :class:`fleetenv.FleetEnv` (its own instance,
deleted when the session closes); all sessions share one :class:`fleetenv.Session`, so
its caps hold across them. Every request passes the access guard
(:mod:`fleetenv.adapters.openenv.access`). docs/openenv-server.md has the actions, the
observations and how to run it (``fleetenv serve openenv``, :class:`OpenEnvServer`,
:func:`create_fleet_app`).

Importing this module imports ``openenv-core`` (``pip install 'fleetenv[openenv]'``),
which takes a few seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

try:
    from openenv.core.env_server.http_server import (
        create_fastapi_app,
    )
    from openenv.core.env_server.interfaces import (
        Environment,
    )
    from openenv.core.env_server.mcp_types import (
        CallToolObservation,
        ListToolsObservation,
        Tool,
    )
    from openenv.core.env_server.types import (
        Action,
        ConcurrencyConfig,
        EnvironmentMetadata,
        Observation,
        State,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fleetenv.adapters.openenv.server needs openenv-core: "
        "pip install 'fleetenv[openenv]'"
    ) from exc

from fleetenv.adapters.openenv.access import AccessGuard, AccessRules
from fleetenv.core.config import finite_reward
from fleetenv.core.errors import ConfigurationError, EpisodeStateError
from fleetenv.core.tasks import Task, select_tasks
from fleetenv.core.types import ToolCall
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.env.options import EpisodeOptions
from fleetenv.fleet.session import Session

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI

    from fleetenv.core.types import Observation as FleetEnvObservation

__all__ = [
    "FleetCallToolObservation",
    "FleetOpenEnvEnvironment",
    "FleetServerAction",
    "FleetServerObservation",
    "FleetServerSettings",
    "FleetServerState",
    "OpenEnvServer",
    "create_fleet_app",
]

_log = logging.getLogger("fleetenv.openenv.server")

#: Reset arguments this environment reads (anything else is a typo worth reporting).
_RESET_KEYS = frozenset({"seed", "episode_id", "task", "task_key", "options"})

#: ``info`` keys left out of observations: the tools travel in ``openai_tools``.
_INFO_DROPPED = frozenset({"tools"})


# ---------------------------------------------------------------------- wire types


class FleetServerAction(Action):  # type: ignore[misc]  # untyped base (Any)
    """One action: a tool call, a list-tools request, or a whole model turn.

    ``type`` may be left out: ``tool_name`` means ``call_tool``, ``text`` / ``message``
    mean ``turn``. ``arguments`` may also be the raw JSON text a model wrote.
    """

    type: Literal["call_tool", "list_tools", "turn"] = "call_tool"
    tool_name: str | None = Field(default=None, description="tool to call (call_tool)")
    arguments: dict[str, Any] | str = Field(default_factory=dict,
                                            description="the tool's arguments (call_tool)")
    text: str | None = Field(default=None, description="the model's raw turn (turn)")
    message: dict[str, Any] | None = Field(
        default=None, description="an OpenAI assistant message (turn)")

    @model_validator(mode="before")
    @classmethod
    def _infer_type(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "type" not in data:
            data = dict(data)
            if data.get("tool_name") is not None:
                data["type"] = "call_tool"
            elif data.get("text") is not None or data.get("message") is not None:
                data["type"] = "turn"
        return data

    @model_validator(mode="after")
    def _check_fields(self) -> FleetServerAction:
        # PydanticCustomError, not ValueError: openenv-core 0.3 sends ``errors()`` to the
        # client as JSON, and a ValueError in their ``ctx`` cannot be serialised (the
        # session would die with "Unable to serialize unknown type").
        if self.type == "call_tool" and not self.tool_name:
            raise PydanticCustomError(
                "fleet_action", "a call_tool action needs tool_name (and arguments); send "
                "type=turn with text for a model turn, or type=list_tools for the tools")
        if self.type == "turn" and (self.text is None) == (self.message is None):
            raise PydanticCustomError(
                "fleet_action", "a turn action needs exactly one of text (the raw "
                "completion) or message (an OpenAI assistant message)")
        return self


class FleetServerObservation(Observation):  # type: ignore[misc]  # untyped base (Any)
    """What the agent sees after ``reset`` or a turn.

    ``text`` is the prompt after ``reset`` and the tool results after a step;
    ``messages`` are the chat messages to append (a ``user`` prompt, then one ``tool``
    message per call); ``openai_tools`` lists the tools at ``reset``.
    """

    task_key: str = ""
    prompt: str = ""
    step: int = 0
    text: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    openai_tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_calls: list[dict[str, Any]] = Field(
        default_factory=list,
        description="per tool call of the step: name, tool_call_id, text, is_error")
    is_error: bool = False
    parse_error: str | None = None
    stop_reason: str | None = None
    #: What a client needs (stop reason, grade status, tool errors): openenv-core's wire
    #: format drops ``metadata``, which holds the same dict for in-process users.
    info: dict[str, Any] = Field(default_factory=dict)


class FleetCallToolObservation(CallToolObservation):  # type: ignore[misc]  # untyped base (Any)
    """OpenEnv's ``CallToolObservation`` (``tool_name``, ``result``: the tool's text)
    with fleetenv's step details. A tool error is a result the agent reads
    (``is_error``), not an OpenEnv transport error, so the episode goes on."""

    task_key: str = ""
    step: int = 0
    text: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    is_error: bool = False
    stop_reason: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)


class FleetServerState(State):  # type: ignore[misc]  # untyped base (Any)
    """OpenEnv's ``episode_id`` / ``step_count`` plus the task and how the episode ended."""

    task_key: str | None = None
    env_key: str | None = None
    instance_id: str | None = None
    done: bool = False
    reward: float | None = None
    stop_reason: str | None = None


# ---------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class FleetServerSettings:
    """What every session of one server shares.

    ``tasks`` maps task keys to tasks; ``default_task`` is the key a ``reset`` without
    ``task`` plays (default: the only task, if there is one). ``session`` is the
    :class:`fleetenv.Session` all episodes run on (its caps hold across sessions).
    ``options`` are the :class:`fleetenv.EpisodeOptions` of every episode
    (``max_steps``, ``tool_call_format``, ``no_tool_call``, ...).
    """

    tasks: Mapping[str, Task]
    session: Session
    default_task: str | None = None
    options: EpisodeOptions = dataclasses.field(default_factory=EpisodeOptions)
    #: What an unknown grade pays; ``None`` sends ``null`` (never a silent 0.0).
    unknown_reward: float | None = None

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigurationError("the OpenEnv server has no tasks to serve",
                                     hint="pass tasks (a task file, or the bundled tasks)")
        if self.default_task is not None:
            select_tasks(list(self.tasks.values()), [self.default_task])  # clear error
        if self.unknown_reward is not None:
            finite_reward(self.unknown_reward, field="unknown_reward",
                          hint="e.g. unknown_reward=0.0, or None to send null")

    @classmethod
    def build(cls, tasks: Sequence[Task] | Mapping[str, Task], *,
              session: Session | None = None, default_task: str | None = None,
              unknown_reward: float | None = None, options: EpisodeOptions | None = None,
              **episode_options: Any) -> FleetServerSettings:
        by_key = dict(tasks) if isinstance(tasks, Mapping) else {t.key: t for t in tasks}
        return cls(tasks=by_key, session=session if session is not None else Session(),
                   default_task=default_task,
                   options=EpisodeOptions.of(options, **episode_options),
                   unknown_reward=unknown_reward)

    def pick(self, key: str | None) -> Task:
        """The task a reset plays: ``key``, else the default, else the only task."""
        chosen = key if key is not None else self.default_task
        if chosen is None:
            if len(self.tasks) == 1:
                return next(iter(self.tasks.values()))
            some = ", ".join(sorted(self.tasks)[:5])
            raise ConfigurationError(
                f"reset() needs a task: this server has {len(self.tasks)} tasks and no "
                "default", hint=f'reset with task="<key>" (e.g. {some}), or start the '
                "server with --task KEY")
        return select_tasks(list(self.tasks.values()), [chosen])[0]


# ---------------------------------------------------------------------- environment


class FleetOpenEnvEnvironment(Environment):  # type: ignore[misc]  # untyped base (Any)
    """One OpenEnv session: episodes of Fleet tasks on one :class:`fleetenv.FleetEnv`.

    Cheap to construct (nothing remote happens until ``reset``): OpenEnv's stateless
    HTTP routes build one per request for ``/state`` and ``/metadata``.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, settings: FleetServerSettings) -> None:
        super().__init__()
        self.settings = settings
        #: The FleetEnv of the current task (``None`` before the first reset).
        self.fleet_env: FleetEnv | None = None
        self._episode_id: str | None = None
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ OpenEnv API

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> FleetServerObservation:
        """Start an episode of ``task`` (a key), provisioning its instance if needed."""
        with _readable_errors("reset"):
            return self._reset(seed, episode_id, **kwargs)

    def step(self, action: FleetServerAction, timeout_s: float | None = None,
             **kwargs: Any) -> Observation:
        """Run a tool call or a whole turn; list the tools for ``list_tools``."""
        with _readable_errors("step"):
            return self._step(action)

    def _reset(self, seed: int | None, episode_id: str | None,
               **kwargs: Any) -> FleetServerObservation:
        unknown = sorted(set(kwargs) - _RESET_KEYS)
        if unknown:
            raise ConfigurationError(
                f"reset() got unknown argument(s) {', '.join(map(repr, unknown))}",
                hint="reset accepts task (a task key), seed, episode_id and options")
        key = kwargs.get("task", kwargs.get("task_key"))
        if key is not None and not isinstance(key, str):
            raise ConfigurationError(f"reset(task=...) must be a task key, not "
                                     f"{type(key).__name__}", hint='e.g. task="my-task"')
        options = kwargs.get("options") or {}
        if not isinstance(options, Mapping):
            raise ConfigurationError("reset(options=...) must be an object",
                                     hint='e.g. options={"fresh_instance": true}')
        task = self.settings.pick(key)
        with self._lock:
            if self._closed:
                raise EpisodeStateError("this OpenEnv session is closed",
                                        hint="open a new session (a new client)")
            previous, env = None, self.fleet_env
            if env is not None and env.task.key != task.key:
                previous, env = env, None
            if env is None:
                env = FleetEnv(task, session=self.settings.session,
                               options=self.settings.options)
                self.fleet_env = env
        if previous is not None:
            previous.close(grade=False)
        self._episode_id = episode_id or str(uuid.uuid4())
        observation, info = env.reset(seed=seed, options=options)
        return FleetServerObservation(
            task_key=task.key, prompt=observation.prompt, step=0, text=observation.prompt,
            messages=observation.to_messages(), openai_tools=list(observation.tools),
            info=_json_safe(info), metadata=_json_safe(info), done=False, reward=None)

    def _step(self, action: FleetServerAction) -> Observation:
        env = self._episode_env()
        if action.type == "list_tools":
            return ListToolsObservation(tools=_openenv_tools(env.openai_tools),
                                        done=env.done, reward=None)
        sent: object = action.text if action.text is not None else action.message
        if action.type == "call_tool":
            assert action.tool_name is not None  # checked by FleetServerAction
            sent = ToolCall(action.tool_name, action.arguments)
        observation, reward, terminated, truncated, step_info = env.step(sent)
        done = terminated or truncated
        reward, info = self._reward(reward, done, step_info)
        shared = {"task_key": env.task.key, "step": observation.step, "text": observation.text,
                  "messages": observation.to_messages(), "is_error": observation.is_error,
                  "stop_reason": info.get("stop_reason"), "info": info, "metadata": info,
                  "done": done, "reward": reward}
        if action.type == "call_tool":
            return FleetCallToolObservation(tool_name=action.tool_name,
                                            result=observation.text, **shared)
        return FleetServerObservation(prompt=observation.prompt,
                                      tool_calls=_tool_calls(observation),
                                      parse_error=observation.parse_error, **shared)

    @property
    def state(self) -> FleetServerState:
        env = self.fleet_env
        if env is None:
            return FleetServerState(episode_id=self._episode_id, step_count=0)
        stop = env.stop_reason
        reward = env.reward if env.done else None
        return FleetServerState(
            episode_id=self._episode_id, step_count=env.stats.turns, task_key=env.task.key,
            env_key=env.task.env_spec, instance_id=env.instance_id, done=env.done,
            reward=reward, stop_reason=str(stop.value) if stop is not None else None)

    def get_metadata(self) -> EnvironmentMetadata:
        keys = sorted(self.settings.tasks)
        shown = ", ".join(keys[:10]) + (", ..." if len(keys) > 10 else "")
        from fleetenv._version import __version__

        return EnvironmentMetadata(
            name="fleetenv",
            description=(f"Fleet tasks through fleetenv ({len(keys)} task(s): {shown}). "
                         "reset(task=KEY); step a call_tool, list_tools or turn action."),
            version=__version__, documentation_url=None)

    def close(self) -> None:
        """Delete this session's instance (an unfinished episode is not graded)."""
        with self._lock:
            self._closed = True
            env, self.fleet_env = self.fleet_env, None
        if env is not None:
            env.close(grade=False)

    # ------------------------------------------------------------------ helpers

    def _episode_env(self) -> FleetEnv:
        env = self.fleet_env
        if env is None:
            raise EpisodeStateError("no episode yet: send reset first",
                                    hint='reset(task="<key>") provisions the task\'s '
                                         "instance and lists its tools")
        return env

    def _reward(self, reward: float | None, done: bool, info: Mapping[str, Any]
                ) -> tuple[float | None, dict[str, Any]]:
        safe = _json_safe(info)
        if done:
            safe["reward_unknown"] = reward is None
            if reward is None:
                reward = self.settings.unknown_reward
        return reward, safe


# ---------------------------------------------------------------------- app & server


def create_fleet_app(settings: FleetServerSettings, *, max_sessions: int | None = None,
                     session_timeout_s: float | None = None,
                     allowed_origins: Iterable[str] = (),
                     token: str | None = None) -> FastAPI:
    """openenv-core's FastAPI app serving ``settings``' tasks.

    ``max_sessions`` (default: the session's ``max_live_instances``) caps concurrent
    OpenEnv sessions; ``session_timeout_s`` closes (and deletes the instance of) a
    session idle that long. Every request passes :class:`~fleetenv.adapters.openenv.
    access.AccessGuard`: a ``Host`` naming the server, no foreign ``Origin`` (besides
    ``allowed_origins``), and ``token`` as HTTP Basic auth when one is given.
    """
    rules = AccessRules.build(allowed_origins, token)  # bad input fails here, not per request
    limit = max_sessions or settings.session.config.max_live_instances
    factory = functools.partial(FleetOpenEnvEnvironment, settings)
    app: FastAPI = create_fastapi_app(
        factory, FleetServerAction, FleetServerObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=limit,
                                             session_timeout=session_timeout_s))
    app.add_middleware(_QuietWebSocketClose)
    app.add_middleware(AccessGuard, rules=rules)  # added last: runs first
    return app


class _QuietWebSocketClose:
    """Drop the ``WebSocketDisconnect`` openenv-core 0.3 raises when it closes a socket
    the client already closed (after ``close`` or a disconnect it has handled): the
    session is already torn down then, and the error would log a traceback per client.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "websocket":
            await self.app(scope, receive, send)
            return
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            return


class OpenEnvServer:
    """The app under uvicorn in a background thread: ``start()``, ``url``, ``stop()``.

    For tests and embedding; ``fleetenv serve openenv`` runs the same app in the
    foreground. ``port=0`` picks a free port (read it from ``url``, which never holds the
    token: clients connect to ``url_with_token(server.url, token)`` when there is one).
    """

    def __init__(self, settings: FleetServerSettings, *, host: str = "127.0.0.1",
                 port: int = 0, max_sessions: int | None = None,
                 session_timeout_s: float | None = None,
                 allowed_origins: Iterable[str] = (), token: str | None = None,
                 startup_timeout_s: float = 30.0) -> None:
        import uvicorn

        self.settings = settings
        app = create_fleet_app(settings, max_sessions=max_sessions,
                               session_timeout_s=session_timeout_s,
                               allowed_origins=allowed_origins, token=token)
        self._server = uvicorn.Server(uvicorn.Config(
            app, host=host, port=port, log_level="warning",
            timeout_graceful_shutdown=10))
        self._startup_timeout_s = startup_timeout_s
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.url = ""

    def start(self) -> OpenEnvServer:
        # A thread and loop of its own, not a service on fleetenv's loop: OpenEnv's
        # handlers call the environment's factory and sync close() on the serving loop,
        # which would block fleetenv's loop (LoopThreadError there).
        self._thread = threading.Thread(target=self._run, name="fleetenv-openenv-server",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        delay = 0.005
        while not self._server.started:
            if not self._thread.is_alive():
                raise ConfigurationError(
                    f"the OpenEnv server did not start: {self._error or 'it exited'}",
                    hint="is the port free? try port=0")
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigurationError(
                    f"the OpenEnv server did not start within {self._startup_timeout_s}s")
            time.sleep(delay)  # polling the started flag, with backoff
            delay = min(delay * 2, 0.1)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def _run(self) -> None:
        try:
            self._server.run()
        except Exception as exc:  # reported by start()
            self._error = exc

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C in the main thread interrupts)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving; open sessions are closed (their instances deleted)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> OpenEnvServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------- conversions


@contextmanager
def _readable_errors(where: str) -> Iterator[None]:
    """OpenEnv sends a client ``str(exc)`` only: make sure it says something.

    fleetenv's errors always do; an exception from elsewhere with an empty message (a
    bare ``TimeoutError()``) is re-raised as one naming its type, and logged with its
    traceback for the server's operator.
    """
    try:
        yield
    except Exception as exc:
        if str(exc).strip():
            raise
        _log.exception("%s failed", where)
        raise RuntimeError(f"{where} failed: {type(exc).__name__} (no message; the "
                           "server's log has the traceback)") from exc


def _openenv_tools(openai_tools: Sequence[Mapping[str, Any]]) -> list[Any]:
    tools = []
    for entry in openai_tools:
        function = entry.get("function", entry)
        tools.append(Tool(name=function.get("name", ""),
                          description=function.get("description") or "",
                          input_schema=function.get("parameters") or {}))
    return tools


def _tool_calls(observation: FleetEnvObservation) -> list[dict[str, Any]]:
    calls = observation.calls if observation.turn else (
        (observation,) if observation.tool_name else ())
    return [{"name": call.tool_name, "tool_call_id": call.tool_call_id, "text": call.text,
             "is_error": call.is_error} for call in calls]


def _json_safe(info: Mapping[str, Any]) -> dict[str, Any]:
    """``info`` as plain JSON (enums as values, anything odd as text), minus the tools."""
    kept = {key: value for key, value in info.items() if key not in _INFO_DROPPED}
    safe: dict[str, Any] = json.loads(json.dumps(kept, default=_plain, allow_nan=True))
    for key, value in list(safe.items()):
        if isinstance(value, float) and not math.isfinite(value):
            safe[key] = None
    return safe


def _plain(value: object) -> object:
    enum_value = getattr(value, "value", None)
    if isinstance(enum_value, (str, int, float)):
        return enum_value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)
