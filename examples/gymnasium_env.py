"""A Fleet task through Gymnasium's own API: ``gymnasium.make``, text actions, float reward.

Runs on the embedded local Fleet when FLEET_API_KEY is not set (no account needed):

    pip install 'fleetenv[gymnasium]'
    python examples/gymnasium_env.py

The "agent" here replays the task's reference solution, written the way a model writes
tool calls: OpenAI tool-call JSON. A real agent would send ``obs["messages"]`` and
``obs["tools"]`` to its model and step with the tool calls it answers with.
"""

from __future__ import annotations

import json
import sys

import gymnasium

import fleetenv.adapters.gymnasium  # noqa: F401  (registers "fleetenv/Fleet-v0")
from fleetenv import bundled_tasks_path, load_tasks

TASK_KEY = "helpdesk-assign-api-ticket"


def main() -> int:
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.key == TASK_KEY)
    env = gymnasium.make("fleetenv/Fleet-v0", task=task)
    try:
        obs, info = env.reset(seed=0)
        messages = json.loads(obs["messages"])  # the chat so far: the user prompt
        tools = json.loads(obs["tools"])        # OpenAI function format
        print(f"task {task.key}: {len(tools)} tools")

        reward, terminated, truncated = 0.0, False, False
        for call in task.reference_solution or []:
            action = json.dumps({"type": "function", "function": {
                "name": call.name, "arguments": json.dumps(call.arguments or {})}})
            obs, reward, terminated, truncated, info = env.step(action)
            messages += json.loads(obs["messages"])  # tool messages answering the call
            print(f"{call.name} -> {' '.join(obs['text'].split())[:70]}")
        if not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step('{"done": true}')
        print(f"terminated={terminated} stop_reason={info['stop_reason']} "
              f"reward={reward} unknown={info['reward_unknown']}")
    finally:
        env.close()
    return 0 if reward == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
