"""One episode by hand: reset, a few tool calls, the reward.

Runs on the embedded local Fleet when FLEET_API_KEY is not set (no account needed):

    python examples/quickstart.py

The task is one of the bundled helpdesk tasks: assign ticket #1124 to the technical lead
and raise its priority. We play the agent ourselves with three ``ToolCall``s, then say
``Done()``; the task's verifier grades the final database state into the reward.
"""

from __future__ import annotations

import sys

from fleetenv import Done, FleetEnv, ToolCall, bundled_tasks_path, load_tasks

TASK_KEY = "helpdesk-assign-api-ticket"


def main() -> int:
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.key == TASK_KEY)
    print(f"task {task.key}: {task.prompt}\n")

    # `with` deletes the instance however the block ends (error, Ctrl-C included).
    with FleetEnv(task) as env:
        obs, info = env.reset()  # provision an instance, open MCP, list the tools
        print("tools:", ", ".join(tool["function"]["name"] for tool in obs.tools))

        obs, reward, terminated, truncated, info = env.step(
            ToolCall("get_ticket", {"ticket_id": 1124}))
        print("get_ticket ->", " ".join(obs.text.split())[:100], "...")

        obs, *_ = env.step(ToolCall("list_agents", {"team": "technical"}))
        print("list_agents ->", " ".join(obs.text.split())[:100], "...")

        obs, *_ = env.step(ToolCall("update_ticket", {
            "ticket_id": 1124, "assignee_email": "daniel.kim@helpdesk.example",
            "priority": "high"}))
        print(f"update_ticket -> error={obs.is_error}")

        # Done() ends the episode; the verifier runs once and its grade is the reward.
        obs, reward, terminated, truncated, info = env.step(Done())
        print(f"\nterminated={terminated} truncated={truncated} "
              f"stop_reason={info['stop_reason']} reward={reward}")
        if reward is None:  # unknown, never a false 0.0: the reason says why
            print("grade unknown:", env.grade.reason if env.grade else "no grade")
    return 0 if reward == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
