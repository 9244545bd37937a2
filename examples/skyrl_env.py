"""Fleet tasks as SkyRL-gym environments: ``skyrl_gym.make("fleetenv", ...)``, driven the
way SkyRL's generator drives envs (sync ``init`` / ``step`` / ``close`` from a thread
pool, one env per trajectory, several at once).

Runs on the embedded local Fleet when FLEET_API_KEY is not set (no account needed):

    pip install 'fleetenv[skyrl]'
    python examples/skyrl_env.py

The "model" replays each task's reference solution, written the way Qwen / Hermes models
write tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, every call
of a turn in one text. In training, SkyRL's inference engine writes these texts and the
generator appends the observations to the chat; the env side is exactly this.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import skyrl_gym

import fleetenv.adapters.skyrl  # noqa: F401  (registers "fleetenv" with skyrl_gym)
from fleetenv import Task, bundled_tasks_path, load_tasks
from fleetenv.adapters.skyrl import dataset_row

TASK_KEYS = ["shop-count-shipped", "helpdesk-assign-api-ticket", "shop-refund-returned-order",
             "helpdesk-busiest-agent"]
ENV_CONFIG = {"tool_call_format": "hermes"}  # SkyRL: the `skyrl_gym.fleetenv` config section


def model_turns(task: Task) -> list[str]:
    """What a model that knows the solution writes: all calls in one turn, then an answer."""
    solution = task.reference_solution or []
    calls = [{"name": c.name, "arguments": c.arguments or {}} for c in solution]
    turns = ["Let me do it.\n" + "\n".join(f"<tool_call>{json.dumps(c)}</tool_call>"
                                           for c in calls)]
    if calls[-1]["name"] != "submit_final_answer":
        turns.append("Done: the task is complete.")
    return turns


def trajectory(task: Task) -> float:
    """SkyRL's agent loop, env side: make, init, step until done, close."""
    row = dataset_row(task)  # {"prompt", "env_class": "fleetenv", "task_key", ...}
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    env = skyrl_gym.make(row["env_class"], env_config=ENV_CONFIG,
                         extras={**extras, "max_turns": 8})
    try:
        chat, _ = env.init(row["prompt"])  # system (tools) + user (task prompt)
        reward = 0.0
        for text in model_turns(task):
            out = env.step(text)  # observations: one "tool" message per call
            chat += [{"role": "assistant", "content": text}, *out["observations"]]
            reward = out["reward"]
            if out["done"]:
                break
        print(f"{task.key}: turns={env.get_metrics()['turns']} "
              f"stop_reason={out['metadata']['stop_reason']} reward={reward}")
        return reward
    finally:
        env.close()


def main() -> int:
    tasks = {t.key: t for t in load_tasks(bundled_tasks_path())}
    with ThreadPoolExecutor(max_workers=len(TASK_KEYS)) as pool:  # SkyRL's max_env_workers
        rewards = list(pool.map(trajectory, [tasks[k] for k in TASK_KEYS]))
    mean = sum(rewards) / len(rewards)
    print(f"skyrl: {len(rewards)} trajectories, mean reward {mean:.2f}")
    return 0 if mean == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
