"""``FleetEnv``: one Fleet task as a blocking ``reset / step / close`` environment.

Lifecycle::

    with FleetEnv(task) as env:                  # nothing remote happens yet
        obs, info = env.reset()                  # provision, open MCP, list tools
        while True:
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break                            # reward is the grade (or None: unknown)
    # close(): grade an abandoned episode, close MCP sessions, delete the instance

Rules this object keeps, each one a bug the previous Fleet client had:

- The verifier runs exactly once per episode: when it ends, or at ``close()`` for an
  episode the caller abandoned. The grade is stored *by the blocking call that computes
  it*, so cancelling the caller cannot lose it, and every later look returns the same.
- The reward is a float when graded and ``None`` with a reason when the grade is unknown
  (no verifier, verifier error, instance gone); a failure is never a 0.0.
- ``terminated`` means the agent finished (final answer / done); ``truncated`` means the
  episode was cut (step limit, episode deadline, instance expired). ``info["stop_reason"]``
  says which.
- Unknown tools, malformed arguments, tool errors and tool timeouts are observations the
  agent sees (``obs.is_error``), and the episode goes on. A call that may have run is
  never replayed.
- Every started rollout emits exactly one ``RolloutCompleted`` with one reason.

The logic is written once as plans (see ``driver.py``); ``reset``/``step``/``close`` drive
them from the calling thread, ``reset_async``/``step_async``/``close_async`` from any
asyncio loop without blocking it.
"""

from __future__ import annotations

import difflib
import functools
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.errors import (
    ConfigurationError,
    DeadlineExceeded,
    EpisodeStateError,
    FleetEnvError,
    InstanceGoneError,
    ToolArgumentsError,
    ToolCallMayHaveRunError,
    ToolNotFoundError,
)
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import (
    InstanceDeleted,
    InstanceDeleteFailed,
    InstanceProvisioned,
    ProvisioningFailed,
    ProvisioningRetry,
    ResetFailed,
    RolloutCompleted,
    RolloutRef,
    RolloutStarted,
    ToolCallFailed,
    ToolErrorReported,
    VerifierFailed,
)
from fleetenv.core.retry import Deadline
from fleetenv.core.tasks import Task
from fleetenv.env.actions import (
    SUBMIT_FINAL_ANSWER,
    SUBMIT_FINAL_ANSWER_TOOL,
    Done,
    FinalAnswer,
    ListTools,
    ToolCall,
    parse_action,
)
from fleetenv.env.driver import Blocking, OnLoop, Plan, run_async, run_sync
from fleetenv.env.observation import Observation

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.backend import Backend
    from fleetenv.fleet.provisioning import Instance
    from fleetenv.fleet.verifier import Grade
    from fleetenv.mcp.results import ToolResult
    from fleetenv.mcp.router import ToolRouter
    from fleetenv.mcp.tools import Tool

StepResult = tuple[Observation, "float | None", bool, bool, dict[str, Any]]

#: Stop reasons. "agent_done" terminates; the others truncate.
TERMINATING = frozenset({"agent_done"})
TRUNCATING = frozenset({"max_steps", "time_limit", "instance_expired"})

_COMPUTER_TOOL = "computer"
_BACKSTOP_S = 15.0  # extra slack for the loop-side watchdog beyond the tool's own timeout
_default_bus: EventBus | None = None
_default_bus_lock = threading.Lock()


def default_event_bus() -> EventBus:
    """The process-wide event bus episodes use unless given one (logging sink)."""
    global _default_bus
    with _default_bus_lock:
        if _default_bus is None:
            _default_bus = EventBus()
        return _default_bus


class FleetEnv:
    """One Fleet task, played as episodes of ``reset`` / ``step`` on a live instance.

    ``task`` is a :class:`fleetenv.Task` or a dict in any task format in circulation.
    Without ``api_key`` (or ``FLEET_API_KEY``) the embedded local Fleet is used.
    Not thread-safe for concurrent ``step`` calls (an episode is one agent), but
    ``close()`` may be called from any thread.
    """

    def __init__(
        self,
        task: Task | Mapping[str, Any],
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        config: FleetConfig | None = None,
        max_steps: int | None = None,
        ttl_seconds: int | None = None,
        episode_timeout_s: float | None = None,
        events: EventBus | None = None,
        max_text_chars: int = 16_000,
    ) -> None:
        self.task = task if isinstance(task, Task) else Task.model_validate(dict(task))
        if config is not None and (api_key is not None or base_url is not None):
            raise ConfigurationError("pass either config= or api_key=/base_url=, not both")
        self.config = config or resolve_config(api_key=api_key, base_url=base_url)
        self.max_steps = max_steps or self.config.max_steps
        self.ttl_seconds = ttl_seconds or self.config.ttl_for(self.task.modality)
        self.episode_timeout_s = episode_timeout_s or self.config.episode_deadline_for(
            self.task.modality)
        self.max_text_chars = max_text_chars
        self.events = events or default_event_bus()

        self._lock = threading.RLock()
        self._backend: Backend | None = None
        self._instance: Instance | None = None
        self._router: ToolRouter | None = None
        self._tools: list[Tool] = []
        self._openai_tools: list[dict[str, Any]] = []
        self._closed = False
        self._last_instance_id: str | None = None
        self._ref = RolloutRef(task_key=self.task.key, env_key=self.task.env_spec)
        self._new_episode_state()
        self._episode_active = False
        self._episodes = 0

    def _new_episode_state(self) -> None:
        self._step = 0
        self._tool_calls = 0
        self._tool_errors: list[str] = []
        self._stop_reason: str | None = None
        self._final_answer: str | None = None
        self._grade: Grade | None = None
        self._grade_lock = threading.Lock()
        self._completed = False
        self._deadline = Deadline(None)
        self._started_at = time.monotonic()
        self._timings: dict[str, float] = {"provision_s": 0.0, "steps_s": 0.0, "verify_s": 0.0}

    def __repr__(self) -> str:
        where = self._instance.instance_id if self._instance else "no instance"
        state = "closed" if self._closed else f"step {self._step}"
        return f"<FleetEnv task={self.task.key!r} env={self.task.env_spec!r} {where} {state}>"

    # ------------------------------------------------------------------ public views

    @property
    def instance_id(self) -> str | None:
        return self._instance.instance_id if self._instance else None

    @property
    def last_instance_id(self) -> str | None:
        """The id of the most recent instance, kept after ``close()`` deleted it."""
        return self._last_instance_id

    @property
    def final_answer(self) -> str | None:
        """The answer submitted in this episode (``submit_final_answer``), if any."""
        return self._final_answer

    @property
    def root_url(self) -> str | None:
        return self._instance.root_url if self._instance else None

    @property
    def rollout_id(self) -> str:
        return self._ref.rollout_id

    @property
    def tools(self) -> list[Tool]:
        """The episode's MCP tools (modality-filtered), as typed ``Tool`` objects."""
        return list(self._tools)

    @property
    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools the agent may call, in OpenAI function format."""
        return list(self._openai_tools)

    @property
    def turns(self) -> int:
        return self._step

    @property
    def tool_calls(self) -> int:
        return self._tool_calls

    @property
    def tool_errors(self) -> int:
        return len(self._tool_errors)

    @property
    def tool_error_messages(self) -> list[str]:
        return list(self._tool_errors)

    @property
    def done(self) -> bool:
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    @property
    def grade(self) -> Grade | None:
        """The verification outcome once the episode ended (else ``None``)."""
        return self._grade

    @property
    def reward(self) -> float | None:
        """The graded reward, or ``None`` (not graded yet, or the grade is unknown)."""
        return self._grade.reward if self._grade else None

    @property
    def verifier_stdout(self) -> str | None:
        return self._grade.stdout if self._grade else None

    @property
    def verifier_error(self) -> str | None:
        return self._grade.error if self._grade else None

    @property
    def verifier_execution_id(self) -> str | None:
        return self._grade.execution_id if self._grade else None

    @property
    def timings(self) -> dict[str, float]:
        return dict(self._timings)

    # ------------------------------------------------------------------ blocking API

    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start an episode: provision (first time) or restore the seed state, open the
        MCP endpoints and list tools. Returns the first observation and info.

        ``options={"fresh_instance": True}`` replaces the instance instead of resetting it.
        """
        return run_sync(self._reset_plan(seed, dict(options or {})))

    def step(self, action: object) -> StepResult:
        """Take one action: a ``ToolCall``, an OpenAI tool-call dict, OpenEnv's
        ``{"tool", "params", "done"}``, ``FinalAnswer(...)`` or ``Done()``."""
        return run_sync(self._step_plan(action))

    def close(self, *, grade: bool = True, reason: str | None = None) -> None:
        """Grade an unfinished episode (unless ``grade=False``), close MCP sessions and
        delete the instance. Idempotent; safe from any thread.

        ``reason`` is the stop reason recorded for an episode that had not ended
        (default ``"abandoned"`` when graded, ``"interrupted"`` when not).
        """
        run_sync(self._close_plan(grade, reason))

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
        return await run_async(self._reset_plan(seed, dict(options or {})))

    async def step_async(self, action: object) -> StepResult:
        return await run_async(self._step_plan(action))

    async def close_async(self, *, grade: bool = True, reason: str | None = None) -> None:
        await run_async(self._close_plan(grade, reason))

    async def __aenter__(self) -> FleetEnv:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        await self.close_async(grade=not interrupted)

    # ------------------------------------------------------------------ database access

    def describe_db(self, name: str = "current") -> dict[str, Any]:
        """Tables and columns of the instance's SQLite database."""
        return self._manager().describe_db(name)

    def query_db(self, sql: str, args: list[Any] | None = None, *, name: str = "current",
                 read_only: bool = True) -> dict[str, Any]:
        """Run SQL against the instance's database (read-only unless asked)."""
        return self._manager().query_db(sql, args, name=name, read_only=read_only)

    # ------------------------------------------------------------------ reset

    def _reset_plan(self, seed: int | None, options: dict[str, Any]
                    ) -> Plan[tuple[Observation, dict[str, Any]]]:
        self._check_not_closed()
        if self._episode_active and not self._completed:
            yield from self._finish_plan("abandoned")
        self._new_episode_state()
        if self._episodes:  # the first episode keeps the id `rollout_id` showed before reset
            self._ref = RolloutRef(task_key=self.task.key, env_key=self.task.env_spec,
                                   instance_id=self.instance_id)
        self._episode_active = True
        self._episodes += 1
        self._emit(RolloutStarted, modality=self.task.modality)
        self._deadline = Deadline(self.episode_timeout_s)
        info: dict[str, Any] = {"task_key": self.task.key, "rollout_id": self.rollout_id}
        try:
            started = time.monotonic()
            if self._instance is not None and options.get("fresh_instance"):
                yield Blocking(self._drop_instance, ("replaced",))
            if self._instance is None:
                yield Blocking(self._provision)
            elif not (yield Blocking(self._reset_instance, (seed,))):
                info["reset"] = "instance_replaced"
                yield Blocking(self._provision)
            self._timings["provision_s"] = time.monotonic() - started
            if self._router is None:
                yield from self._open_tools_plan()
            content = []
            if self.task.modality in ("computer_use", "browser_use"):
                content, screenshot_error = yield from self._screenshot_plan()
                if screenshot_error:
                    info["screenshot_error"] = screenshot_error
        except Exception as exc:
            self._complete("init_error", error=exc)
            raise
        info.update(instance_id=self.instance_id, root_url=self.root_url,
                    modality=self.task.modality, tools=[t["function"]["name"]
                                                        for t in self._openai_tools])
        observation = Observation(
            task_key=self.task.key, prompt=self.task.prompt, modality=self.task.modality,
            step=0, tools=self.openai_tools, content=content,
        )
        return observation, info

    def _provision(self) -> None:
        """Blocking: create the instance; stores it on ``self`` before returning, so an
        abandoned caller (cancelled task) still leaves it for ``close()`` to delete."""
        from fleetenv.fleet.backend import get_backend
        from fleetenv.fleet.provisioning import ProvisionRequest

        if self._backend is None:
            self._backend = get_backend(self.config)
        task = self.task
        request = ProvisionRequest(
            env_key=task.env_key, env_version=task.env_version, data_key=task.data_key,
            data_version=task.data_version, env_variables=dict(task.env_variables or {}),
            modality=task.modality, ttl_seconds=self.ttl_seconds, task_key=task.key,
            run_tag=self.config.run_tag,
        )

        def listener(kind: str, details: dict[str, Any]) -> None:
            if kind == "retry":
                self._emit(ProvisioningRetry, attempt=details["attempt"],
                           delay_s=details["delay_s"], error_type=details["error_type"],
                           error=details["error"])

        try:
            instance = self._backend.provisioner.provision(request, listener=listener)
        except Exception as exc:
            self._emit(ProvisioningFailed, attempts=0, error_type=type(exc).__name__,
                       error=str(exc))
            raise
        with self._lock:
            closed = self._closed
            self._instance = instance
        self._last_instance_id = instance.instance_id
        self._ref = self._ref.with_instance(instance.instance_id)
        self._emit(InstanceProvisioned, seconds=instance.provision_seconds,
                   attempts=instance.attempts)
        if closed:  # close() ran while we were provisioning: do not leak the new instance
            self._drop_instance("closed")
            raise EpisodeStateError("the environment was closed during reset()",
                                    task=self.task.key)

    def _reset_instance(self, seed: int | None) -> bool:
        """Blocking: restore the seed state. On failure the instance is replaced (the
        failure is reported as an event, never silently ignored)."""
        try:
            self._manager().reset(seed=seed, timeout=self.config.reset_timeout_s)
            return True
        except FleetEnvError as exc:
            self._emit(ResetFailed, error_type=type(exc).__name__, error=str(exc),
                       timeout_s=self.config.reset_timeout_s)
            self._drop_instance("reset_failed")
            return False

    def _open_tools_plan(self) -> Plan[None]:
        from fleetenv.mcp.router import ToolRouter, endpoints_for

        assert self._instance is not None
        browser_url = (self.task.metadata or {}).get("browser_mcp_url")
        if self.task.modality == "browser_use" and not browser_url:
            # fleet-python has no browser-lease API; without a lease URL the instance's
            # own computer endpoint serves the browser session.
            browser_url = f"{self._instance.root_url}api/v1/mcp"
        router = ToolRouter(
            endpoints_for(self._instance.root_url, self.task.modality, browser_url),
            connect_timeout=self.config.connect_timeout_s,
            call_timeout=self.config.tool_timeout_s,
        )
        self._router = router  # before opening: close() must find it if we are cancelled
        yield OnLoop(router.aopen, timeout=self._watchdog(self.config.connect_timeout_s * 3))
        self._set_tools(router.tools)

    def _set_tools(self, tools: list[Tool]) -> None:
        if self.task.modality == "tool_use":
            kept = [t for t in tools if t.name != _COMPUTER_TOOL]
        else:
            kept = [t for t in tools if t.name == _COMPUTER_TOOL]
            if not kept:
                raise ToolNotFoundError(
                    f"a {self.task.modality} task needs the {_COMPUTER_TOOL!r} tool, but the "
                    f"instance offers only {sorted(t.name for t in tools)}",
                    task=self.task.key, instance=self.instance_id,
                )
        if not kept:
            raise ToolNotFoundError("the instance offers no tools for this task",
                                    task=self.task.key, instance=self.instance_id)
        self._tools = kept
        self._openai_tools = [t.openai() for t in kept]
        if self.task.modality == "tool_use" and self.task.needs_final_answer:
            self._openai_tools.append(SUBMIT_FINAL_ANSWER_TOOL)

    def _screenshot_plan(self) -> Plan[tuple[list[dict[str, Any]], str | None]]:
        assert self._router is not None
        try:
            result: ToolResult = yield OnLoop(
                functools.partial(self._router.acall, _COMPUTER_TOOL, {"action": "screenshot"},
                                  timeout=self.config.tool_timeout_s),
                timeout=self._watchdog(self.config.tool_timeout_s))
        except FleetEnvError as exc:
            return [{"type": "text", "text": f"(initial screenshot failed: {exc})"}], str(exc)
        return result.to_openai_content(self.max_text_chars), result.error_message

    # ------------------------------------------------------------------ step

    def _step_plan(self, action: object) -> Plan[StepResult]:
        self._check_not_closed()
        if not self._episode_active:
            raise EpisodeStateError("step() before reset()", hint="call reset() first",
                                    task=self.task.key)
        if self._stop_reason is not None:
            raise EpisodeStateError(
                f"the episode is over ({self._stop_reason})",
                hint="call reset() to start a new episode", task=self.task.key)
        actions = parse_action(action)
        started = time.monotonic()
        self._step += 1
        info: dict[str, Any] = {"step": self._step}
        observation = self._observation([], tool_name=None)
        for item in actions:
            if isinstance(item, ListTools):
                observation = self._observation(
                    [{"type": "text", "text": "\n".join(
                        f"- {t['function']['name']}: {t['function'].get('description', '')}"
                        for t in self._openai_tools)}], tool_name=None)
            elif isinstance(item, FinalAnswer):
                self._final_answer = item.answer
                info["submitted_answer"] = item.answer
                self._stop_reason = "agent_done"
                observation = self._observation(
                    [{"type": "text", "text": "Answer recorded. The episode is over."}],
                    tool_name=SUBMIT_FINAL_ANSWER, call_id=item.id)
            elif isinstance(item, Done):
                self._stop_reason = "agent_done"
            elif isinstance(item, ToolCall):
                observation = yield from self._tool_plan(item, info)
            if self._stop_reason is not None:
                break
        self._timings["steps_s"] += time.monotonic() - started
        if self._stop_reason is None and self._step >= self.max_steps:
            self._stop_reason = "max_steps"
        if self._stop_reason is None and self._deadline.expired():
            self._stop_reason = "time_limit"
        reward: float | None = 0.0
        if self._stop_reason is not None:
            grade = yield from self._finish_plan(self._stop_reason)
            reward = grade.reward
            info.update(self._grade_info())
        terminated = self._stop_reason in TERMINATING
        truncated = self._stop_reason in TRUNCATING
        info.update(stop_reason=self._stop_reason, tool_calls=self._tool_calls,
                    tool_errors=len(self._tool_errors), instance_id=self.instance_id)
        return observation, reward, terminated, truncated, info

    def _tool_plan(self, call: ToolCall, info: dict[str, Any]) -> Plan[Observation]:
        """Run one tool call; every failure becomes an observation, never a crash."""
        assert self._router is not None
        name = call.name
        info["tool_name"] = name
        try:
            arguments = call.decoded_arguments()
            if name not in {t.name for t in self._tools}:
                raise self._unknown_tool(name)
        except (ToolArgumentsError, ToolNotFoundError) as exc:
            return self._tool_error(call, exc.message, info)
        timeout = self._deadline.cap(self.config.tool_timeout_s)
        if timeout <= 0:
            self._stop_reason = "time_limit"
            return self._observation([], tool_name=name, call_id=call.id)
        self._tool_calls += 1
        try:
            result: ToolResult = yield OnLoop(
                functools.partial(self._router.acall, name, arguments, timeout=timeout),
                timeout=self._watchdog(timeout))
        except DeadlineExceeded as exc:
            self._emit(ToolCallFailed, tool_name=name, step=self._step,
                       error_type=type(exc).__name__, error=str(exc))
            if self._deadline.expired():
                self._stop_reason = "time_limit"
            return self._tool_error(
                call, f"{name} did not answer within {timeout:.0f} s; it may still have run. "
                "Check the state before calling it again.", info)
        except (ToolCallMayHaveRunError, InstanceGoneError, FleetEnvError) as exc:
            self._emit(ToolCallFailed, tool_name=name, step=self._step,
                       error_type=type(exc).__name__, error=str(exc))
            if (yield Blocking(self._instance_gone)):
                self._stop_reason = "instance_expired"
                info["instance_error"] = str(exc)
                return self._tool_error(call, f"the instance is gone: {exc.message}", info)
            return self._tool_error(call, exc.message, info)
        if result.is_error:
            message = result.error_message or "the tool reported an error"
            self._tool_errors.append(f"{name}(): {message[:500]}")
            self._emit(ToolErrorReported, tool_name=name, step=self._step, error=message)
            info["tool_error"] = message
        content = result.to_openai_content(self.max_text_chars)
        return self._observation(content, tool_name=name, call_id=call.id, result=result,
                                 error=result.error_message if result.is_error else None)

    def _unknown_tool(self, name: str) -> ToolNotFoundError:
        names = [t["function"]["name"] for t in self._openai_tools]
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        suggestion = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return ToolNotFoundError(
            f"unknown tool {name!r}.{suggestion} Available: {', '.join(names)}",
            tool=name, task=self.task.key)

    def _tool_error(self, call: ToolCall, message: str, info: dict[str, Any]) -> Observation:
        self._tool_errors.append(f"{call.name}(): {message[:500]}")
        info["tool_error"] = message
        return self._observation([{"type": "text", "text": f"Error: {message}"}],
                                 tool_name=call.name, call_id=call.id, error=message)

    def _instance_gone(self) -> bool:
        """Blocking: ask the control plane whether our instance still runs."""
        if self._instance is None or self._backend is None:
            return True
        try:
            status = self._backend.client.sdk.instance(self._instance.instance_id).status
        except Exception:
            return False  # unknown: treat the failure as a tool error, not as expiry
        return status in ("stopped", "error", "terminated")

    def _observation(self, content: list[dict[str, Any]], *, tool_name: str | None,
                     call_id: str | None = None, result: ToolResult | None = None,
                     error: str | None = None) -> Observation:
        return Observation(
            task_key=self.task.key, prompt=self.task.prompt, modality=self.task.modality,
            step=self._step, tools=self.openai_tools, content=content, result=result,
            tool_name=tool_name, tool_call_id=call_id, is_error=error is not None, error=error,
        )

    # ------------------------------------------------------------------ finishing

    def _finish_plan(self, reason: str) -> Plan[Grade]:
        """Grade once (cached), then emit the completion once."""
        grade = yield Blocking(self._grade_once)
        self._complete(reason, grade=grade)
        return grade

    def _grade_once(self) -> Grade:
        """Blocking: run the verifier unless it already ran; store the grade on ``self``
        before returning, so a cancelled caller cannot lose it."""
        from fleetenv.fleet.verifier import Grade, verify

        with self._grade_lock:
            if self._grade is not None:
                return self._grade
            started = time.monotonic()
            if self._instance is None or self._instance.deleted:
                grade = Grade.unknown("instance_gone", "the instance was deleted before grading")
            else:
                task = self.task
                grade = verify(
                    env=self._instance.env, task_key=task.key, prompt=task.prompt,
                    env_key=task.env_key, env_version=task.env_version,
                    verifier_code=task.verifier, verifier_id=task.verifier_id,
                    final_answer=self._final_answer,
                )
            self._timings["verify_s"] = time.monotonic() - started
            self._grade = grade
        if grade.status != "graded" and grade.reason != "no_verifier":
            self._emit(VerifierFailed, error_type=grade.reason or "unknown",
                       error=grade.error or "", steps=self._step)
        return grade

    def _complete(self, reason: str, *, grade: Grade | None = None,
                  error: BaseException | None = None) -> None:
        with self._lock:
            if self._completed or not self._episode_active:
                return
            self._completed = True
        grade_status = "not_graded" if grade is None else (
            "graded" if grade.status == "graded" else grade.reason or "unknown")
        self._emit(RolloutCompleted, reason=reason, grade_status=grade_status,
                   reward=grade.reward if grade else None, steps=self._step,
                   error=str(error) if error else None,
                   duration_s=time.monotonic() - self._started_at)

    def _grade_info(self) -> dict[str, Any]:
        grade = self._grade
        if grade is None:
            return {}
        return {"reward_status": grade.status, "reward_reason": grade.reason,
                "verifier_stdout": grade.stdout, "verifier_error": grade.error,
                "verifier_execution_id": grade.execution_id,
                "final_answer": self._final_answer}

    # ------------------------------------------------------------------ close

    def _close_plan(self, grade: bool, reason: str | None) -> Plan[None]:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._episode_active and not self._completed:
                if grade and self._stop_reason is None and self._instance is not None:
                    yield from self._finish_plan(reason or "abandoned")
                else:
                    self._complete(self._stop_reason or reason or "interrupted",
                                   grade=self._grade)
        finally:
            router, self._router = self._router, None
            try:
                if router is not None:
                    yield OnLoop(router.aclose, timeout=self._watchdog(
                        self.config.connect_timeout_s))
            finally:
                yield Blocking(self._drop_instance, ("closed",))

    def _drop_instance(self, reason: str) -> None:
        """Blocking: delete the instance (idempotent) and report it."""
        with self._lock:
            instance, self._instance = self._instance, None
        if instance is None or self._backend is None:
            return
        try:
            self._backend.provisioner.delete(instance)
        except Exception as exc:
            self._emit(InstanceDeleteFailed, error_type=type(exc).__name__, error=str(exc))
            return
        self._emit(InstanceDeleted, reason=reason)

    # ------------------------------------------------------------------ helpers

    def _manager(self) -> Any:
        from fleetenv.fleet.manager import ManagerClient

        if self._instance is None:
            raise EpisodeStateError("no instance yet", hint="call reset() first",
                                    task=self.task.key)
        return ManagerClient(self._instance.manager_url, instance_id=self.instance_id,
                             timeout=self.config.tool_timeout_s)

    def _watchdog(self, seconds: float) -> float:
        """The loop-side bound for an operation whose own timeout is ``seconds``."""
        return seconds + _BACKSTOP_S

    def _check_not_closed(self) -> None:
        if self._closed:
            raise EpisodeStateError("the environment is closed",
                                    hint="create a new FleetEnv", task=self.task.key)

    def _emit(self, event_type: type, **fields: Any) -> None:
        self.events.emit(self._ref.event(event_type, **fields))
