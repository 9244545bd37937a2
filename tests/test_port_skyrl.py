"""SkyRL's Fleet task env, ported by changing one import line, on the local Fleet.

The class below is written the way SkyRL's ``skyrl_gym/envs/fleet_task/env.py`` is
(research note ``openenv-fleet-env.md`` §12.1): a ``BaseTextEnv`` that loads the task
from a tasks file, builds a new OpenEnv ``FleetTaskEnv`` in every ``init_async``, parses
``<tool_call>{...}</tool_call>`` out of the model's text, ends on ``<done>``, sets
``conversation_messages`` before each step, wraps its async methods in ``asyncio.run``
for the sync API, and reads the private attributes it always read (``_done``,
``_orch._fleet_env``, ``_last_verifier_execution_id``). Only the import is fleetenv's.
The generator part is SkyRL's thread-pool path: many threads calling the sync
``init`` / ``step`` / ``close`` at once (and, in the second test, its preferred async
path under per-step ``asyncio.wait_for``). Both must reach reward 1.0 on every task with
the reference solutions.

``skyrl_gym`` itself is not a dependency: ``BaseTextEnv`` and ``BaseTextEnvStepOutput``
below have the shape of the real ones (skyrl-gym 0.4).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

import pytest

from fleetenv import bundled_tasks_path

# ---------------------------------------------------------------- the ported import line
from fleetenv.adapters.openenv import (  # was: from envs.fleet_env import ...
    ContextManager,
    configure_fleet_telemetry,
)
from fleetenv.adapters.openenv import FleetTaskEnv as OpenEnvFleetTaskEnv
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(240)


# ---------------------------------------------------------------- skyrl_gym's shapes

class BaseTextEnvStepOutput(TypedDict):
    observations: list[dict[str, Any]]
    reward: float
    done: bool
    metadata: dict[str, Any]


class BaseTextEnv:
    def __init__(self) -> None:
        self.turns = 0
        self.max_turns = 1


# ---------------------------------------------------------------- SkyRL's wrapper (user code)

MAX_TOOL_OUTPUT_CHARS = 16000
_TASK_CACHE: dict[str, dict[str, dict[str, Any]]] = {}
_TOOL_CALL_RE = re.compile(r"<(tool_call|function_call)>\s*(\{.*?\})\s*</\1>", re.DOTALL)


def load_tasks_from_json(tasks_file: str) -> dict[str, dict[str, Any]]:
    """Tasks by key, cached per file (a JSON array or ``{"tasks": [...]}``)."""
    if tasks_file not in _TASK_CACHE:
        with open(tasks_file) as f:
            data = json.load(f)
        tasks = data["tasks"] if isinstance(data, dict) else data
        _TASK_CACHE[tasks_file] = {t.get("key") or t.get("task_key"): t for t in tasks}
    return _TASK_CACHE[tasks_file]


def _normalize_task_config(task: dict[str, Any]) -> dict[str, Any]:
    """key -> task_key, env_id -> env_key, version -> env_version (data_id is not mapped,
    exactly as in SkyRL)."""
    config = dict(task)
    if "key" in config and "task_key" not in config:
        config["task_key"] = config.pop("key")
    if "env_id" in config and "env_key" not in config:
        config["env_key"] = config.pop("env_id")
    if "version" in config and "env_version" not in config:
        config["env_version"] = config.pop("version")
    config.pop("data_id", None)
    config.pop("data_version", None)
    return config


def parse_tool_call(text: str) -> dict[str, Any] | None:
    match = _TOOL_CALL_RE.search(text)
    if not match:
        return None
    try:
        call = json.loads(match.group(2))
    except json.JSONDecodeError:
        return None
    name = call.get("name") or call.get("tool")
    if not name:
        return None
    return {"name": name, "arguments": call.get("arguments") or call.get("params") or {}}


class FleetTaskEnv(BaseTextEnv):
    """SkyRL-gym env for Fleet tasks, on top of OpenEnv's FleetTaskEnv."""

    def __init__(self, env_config: dict[str, Any], extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        self.task_key = extras["task_key"]
        tasks_file = env_config.get("tasks_file") or extras.get("tasks_file")
        tasks = load_tasks_from_json(tasks_file)
        if self.task_key not in tasks:
            raise ValueError(f"Task {self.task_key} not found in {tasks_file}")
        self.task_config = tasks[self.task_key]
        self.api_key = env_config.get("api_key") or os.environ.get("FLEET_API_KEY")
        if os.environ.get("LOGFIRE_TOKEN"):
            configure_fleet_telemetry(token=os.environ["LOGFIRE_TOKEN"])
        self.ttl_seconds = env_config.get("ttl_seconds", 900)
        self.partial_reward = env_config.get("partial_reward", False)
        self.enable_context_tools = env_config.get("enable_context_tools", False)
        self.max_turns = extras.get("max_turns", 50)
        self.max_output_chars = extras.get("max_output_chars", MAX_TOOL_OUTPUT_CHARS)
        self.context_manager = ContextManager() if self.enable_context_tools else None
        self.openenv_task_env: Any = None
        self.chat_history: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.tool_calls = 0
        self.tool_errors = 0
        self.tool_error_messages: list[str] = []
        self.done_reason: str | None = None
        self.final_reward: float | None = None
        self.instance_id: str | None = None
        self.portal_url: str | None = None

    # -- init
    def init(self, prompt: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return asyncio.run(self.init_async(prompt))

    async def init_async(self, prompt: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if self.openenv_task_env is not None:
            await self.openenv_task_env.close_async()
        self.openenv_task_env = OpenEnvFleetTaskEnv(
            task_config=_normalize_task_config(self.task_config),
            api_key=self.api_key,
            ttl_seconds=self.ttl_seconds,
            max_steps=self.max_turns,
            partial_reward=self.partial_reward,
        )
        obs = await self.openenv_task_env.reset_async()
        self.tools = obs.get("tools") or []
        if not self.tools:
            raise RuntimeError(f"Task {self.task_key}: no tools found in observation")
        orch = self.openenv_task_env._orch
        if orch is not None:
            self.instance_id = orch._fleet_env.instance_id
            self.portal_url = orch._fleet_env.urls.root
        system = ("You are a helpful agent. Call tools as <tool_call>{\"name\": ..., "
                  "\"arguments\": {...}}</tool_call>. Say <done> when finished.\n\n"
                  f"Tools:\n{json.dumps(self.tools, indent=1)}")
        user: Any = self.task_config.get("prompt", "")
        if obs.get("initial_screenshot"):
            user = [{"type": "text", "text": user}, *obs["initial_screenshot"]]
        self.chat_history = [{"role": "system", "content": system},
                             {"role": "user", "content": user}]
        self.turns = 0
        return self.chat_history, {"task_key": self.task_key, "tools": self.tools,
                                   "modality": obs.get("modality")}

    # -- step
    def step(self, action: str) -> BaseTextEnvStepOutput:
        return asyncio.run(self.step_async(action))

    async def step_async(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.chat_history.append({"role": "assistant", "content": action})
        agent_done = action.rstrip().endswith("<done>")
        tool_call = parse_tool_call(action)
        max_turns_reached = self.turns >= self.max_turns
        openenv_action = {
            "tool": tool_call["name"] if tool_call else None,
            "params": tool_call["arguments"] if tool_call else {},
            "done": agent_done or max_turns_reached,
        }
        if tool_call:
            self.tool_calls += 1
        self.openenv_task_env.conversation_messages = self.chat_history
        obs, reward, done, info = await self.openenv_task_env.step_async(openenv_action)
        result = obs.get("observation")
        error = info.get("tool_error")
        if error is None and isinstance(result, dict) and result.get("error"):
            error = result["error"]
        if error is None and isinstance(result, str) and result.lower().startswith("error:"):
            error = result
        if error:
            self.tool_errors += 1
            self.tool_error_messages.append(str(error))
            content: Any = f"Error: {error}"
        elif tool_call and isinstance(result, list) and any(
                isinstance(p, dict) and p.get("type") == "image_url" for p in result):
            content = result
        elif tool_call:
            text = result if isinstance(result, str) else json.dumps(result)
            content = "Tool result:\n" + text[: self.max_output_chars]
        else:
            content = "No tool call found. Use <tool_call>{...}</tool_call>, or say <done>."
        if done:
            self.done_reason = info.get("done_reason") or (
                "agent_done" if agent_done else "max_turns")
            observations: list[dict[str, Any]] = []
        else:
            observations = [{"role": "user", "content": content}]
            self.chat_history.extend(observations)
        return BaseTextEnvStepOutput(
            observations=observations, reward=(reward or 0.0) if done else 0.0, done=done,
            metadata={"task_key": self.task_key, "turn": self.turns, "tool_error": error,
                      "done_reason": self.done_reason})

    # -- close
    def close(self) -> None:
        if self.openenv_task_env is not None:
            self.openenv_task_env.close()
            self.final_reward = self.openenv_task_env.final_reward

    async def close_async(self) -> None:
        if self.openenv_task_env is not None:
            await self.openenv_task_env.close_async()
            self.final_reward = self.openenv_task_env.final_reward

    def get_metrics(self) -> dict[str, Any]:
        env = self.openenv_task_env
        metrics: dict[str, Any] = {
            "task_key": self.task_key, "env_key": self.task_config.get("env_id"),
            "turns": self.turns, "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors, "chat_history": self.chat_history,
        }
        if env is not None:
            metrics["final_reward"] = env.final_reward
            metrics["verifier_stdout"] = env.verifier_stdout
            metrics["verifier_error"] = env.verifier_error
            metrics["tool_error_messages"] = env.tool_errors_list
            metrics["verifier_execution_id"] = env._last_verifier_execution_id
            metrics["finalized"] = env._done
        return metrics


# ---------------------------------------------------------------- the scripted "model"

TASKS_FILE = str(bundled_tasks_path())
TOOL_USE = [t for t in load_tasks_from_json(TASKS_FILE).values()
            if t["task_modality"] == "tool_use"]


def scripted_turns(task: dict[str, Any]) -> list[str]:
    """What a model that knows the reference solution would write, turn by turn: one
    thinking turn without a tool call, one tool call per turn, then ``<done>``."""
    turns = ["Let me look at what I can do first."]
    for call in task["metadata"]["reference_solution"]:
        body = json.dumps({"name": call["name"], "arguments": call["arguments"]})
        turns.append(f"Next step.\n<tool_call>{body}</tool_call>")
    if task["metadata"]["reference_solution"][-1]["name"] != "submit_final_answer":
        turns.append("Everything is in place. <done>")
    return turns


@pytest.fixture
def fleet_env_vars(local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a SkyRL user exports; the wrapper reads nothing else."""
    monkeypatch.setenv("FLEET_API_KEY", local_fleet.token)
    monkeypatch.setenv("FLEET_BASE_URL", local_fleet.base_url)
    monkeypatch.delenv("LOGFIRE_TOKEN", raising=False)


def run_trajectory_sync(task: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
    """SkyRL generator, thread-pool path: sync init / step / close in a worker thread;
    the env is closed before ``get_metrics`` so ``final_reward`` exists."""
    env = FleetTaskEnv({"tasks_file": TASKS_FILE, "ttl_seconds": 600},
                       extras={"task_key": task["key"], "max_turns": 20})
    rewards: list[float] = []
    try:
        env.init([])
        for text in scripted_turns(task):
            out = env.step(text)
            rewards.append(out["reward"])
            assert out["metadata"]["tool_error"] is None, out["metadata"]
            if out["done"]:
                break
    finally:
        env.close()
    return env.get_metrics() | {"done_reason": env.done_reason,
                                "instance_id": env.instance_id,
                                "portal_url": env.portal_url}, rewards


def check(task: dict[str, Any], metrics: dict[str, Any], rewards: list[float]) -> None:
    solution = task["metadata"]["reference_solution"]
    assert metrics["final_reward"] == 1.0, (task["key"], metrics.get("verifier_stdout"))
    assert rewards[-1] == 1.0 and set(rewards[:-1]) <= {0.0}
    assert metrics["done_reason"] == "agent_done" and metrics["finalized"]
    assert metrics["tool_calls"] == len(solution) and metrics["tool_errors"] == 0
    assert metrics["tool_error_messages"] == [] and metrics["verifier_execution_id"]
    assert metrics["instance_id"] and metrics["portal_url"].endswith("/")


def test_skyrl_thread_pool_generator_runs_unchanged(fleet_env_vars: None) -> None:
    tasks = TOOL_USE[:8]
    with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
        outcomes = list(pool.map(run_trajectory_sync, tasks))
    for task, (metrics, rewards) in zip(tasks, outcomes, strict=True):
        check(task, metrics, rewards)
    assert len({m["instance_id"] for m, _ in outcomes}) == len(tasks)  # one each


def test_skyrl_async_generator_runs_unchanged(fleet_env_vars: None) -> None:
    """SkyRL's preferred path: ``init_async`` / ``step_async`` / ``close_async``, each
    step under the trajectory timeout."""

    async def trajectory(task: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
        env = FleetTaskEnv({"tasks_file": TASKS_FILE, "ttl_seconds": 600},
                           extras={"task_key": task["key"], "max_turns": 20})
        rewards: list[float] = []
        try:
            await asyncio.wait_for(env.init_async([]), 90)
            for text in scripted_turns(task):
                out = await asyncio.wait_for(env.step_async(text), 120)
                rewards.append(out["reward"])
                if out["done"]:
                    break
        finally:
            await env.close_async()
        return env.get_metrics() | {"done_reason": env.done_reason,
                                    "instance_id": env.instance_id,
                                    "portal_url": env.portal_url}, rewards

    async def generate() -> list[tuple[dict[str, Any], list[float]]]:
        return list(await asyncio.gather(*(trajectory(t) for t in TOOL_USE[8:14])))

    for task, (metrics, rewards) in zip(TOOL_USE[8:14], asyncio.run(generate()), strict=True):
        check(task, metrics, rewards)
