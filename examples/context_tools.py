"""Context tools: an agent that reads a long tool output through them and trims its own
history.

Runs on the embedded local Fleet when FLEET_API_KEY is not set (no account needed):

    python examples/context_tools.py

With ``FleetEnv(..., context_tools=True)`` the agent is also offered ``check_context``,
``manage_context``, ``search_history``, ``search_tool_output`` and ``view_tool_output``.
fleetenv answers them itself (nothing is sent to the environment). A tool output longer
than ``max_text_chars`` is cut for the agent, with a note pointing at the two output
tools, which reach the whole text. After ``manage_context`` the trimmed conversation is
in ``info["history"]``: the loop continues with it.

We play the agent ourselves: list every unassigned open ticket (too long to show
whole), find the total in the full output, trim the history, answer.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fleetenv import FleetEnv, ToolCall, bundled_tasks_path, load_tasks

TASK_KEY = "helpdesk-count-unassigned-open"


def main() -> int:
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.key == TASK_KEY)
    print(f"task {task.key}: {task.prompt}\n")

    with FleetEnv(task, context_tools=True, max_text_chars=1500) as env:
        obs, info = env.reset()
        messages: list[dict[str, Any]] = obs.to_messages()  # our chat history

        def act(call: ToolCall) -> tuple[str, dict[str, Any]]:
            """One assistant tool call and its answer, appended to ``messages``."""
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [call.to_openai()]})
            obs, _reward, _terminated, _truncated, info = env.step(call)
            messages.extend(obs.to_messages())
            return obs.text, info

        text, _ = act(ToolCall("search_tickets",
                               {"status": "open", "unassigned": True, "limit": 50}))
        print("search_tickets ->", text.splitlines()[-1])  # the truncation note

        text, _ = act(ToolCall("search_tool_output", {"pattern": '"total"'}))
        total_line = json.loads(text)["matches"][0]["content"]
        answer = total_line.split(":")[1].strip(" ,")
        print("search_tool_output ->", total_line.strip())

        text, _ = act(ToolCall("view_tool_output", {"page": 1, "page_size": 4}))
        print("view_tool_output ->", json.dumps(json.loads(text)["content"])[:70], "...")

        text, info = act(ToolCall("manage_context", {"keep_recent_turns": 1}))
        messages = info["history"]  # adopt the trimmed conversation
        print("manage_context ->", text, f"(now {len(messages)} messages)")

        text, _ = act(ToolCall("check_context", {}))
        print("check_context ->", text)

        _, reward, terminated, _, info = env.step(
            ToolCall("submit_final_answer", {"answer": answer}))
        print(f"\nanswer={answer} reward={reward} tool_calls={env.stats.tool_calls} "
              f"tool_errors={env.stats.tool_errors}")
        return 0 if terminated and reward == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
