"""A ``browser_use`` episode: an instance plus a browser lease, driven by screenshots.

Runs on the embedded local Fleet when FLEET_API_KEY is not set (no account needed):

    python examples/browser_use.py

``reset()`` creates the instance, then a browser lease allowed to reach the instance's
host, navigates it to the app's web UI and waits (polling) for a real screenshot. The
agent sees only the ``computer`` tool, served by the lease's MCP endpoint. We replay the
task's reference clicks, then ``Done()``; leaving the ``with`` block deletes the lease
and the instance, however the block ends.
"""

from __future__ import annotations

import sys

from fleetenv import Done, FleetEnv, ToolCall, bundled_tasks_path, load_tasks


def main() -> int:
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.modality == "browser_use")
    print(f"task {task.key}: {task.prompt}\n")

    with FleetEnv(task) as env:
        obs, info = env.reset()  # instance + browser lease, on the app's start page
        screenshot = next(part for part in obs.content if part["type"] == "image_url")
        print("tools:", ", ".join(info["tools"]),
              f"| first screenshot: {len(screenshot['image_url']['url'])} chars of data URL")

        for call in task.metadata["reference_solution"]:
            obs, *_ = env.step(ToolCall(call["name"], call["arguments"]))
            args = {k: v for k, v in call["arguments"].items() if k != "action"}
            print(f"computer {call['arguments']['action']} {args or ''}"
                  f" -> error={obs.is_error}")

        obs, reward, _terminated, _truncated, info = env.step(Done())
        print(f"\nbrowser_use stop_reason={info['stop_reason']} reward={reward}")
    return 0 if reward == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
