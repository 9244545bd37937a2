"""A policy is any plain function of the conversation so far: no model needed to try one.

    python examples/custom_policy.py

``busiest_agent_policy(context)`` answers the bundled task "which active agent has the
most open or pending tickets?" the way an agent would: on its first turn it calls the
``list_agents`` tool; on the next it reads that tool's result from the conversation
(``context.messages``, OpenAI chat format) and submits the answer. A function may return
a ``ToolCall``, a ``FinalAnswer``, ``Done()``, a list of them, an OpenAI tool-call dict or
a whole OpenAI assistant message: whatever is easiest for the policy at hand.

``run_episode`` plays it start to finish and returns a result record; it never raises for
a broken episode (the error is in ``result.error``). For many episodes in parallel, hand
the same function to ``Runner.run`` (see examples/tinker_style_loop.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fleetenv import (
    FinalAnswer,
    PolicyContext,
    ToolCall,
    bundled_tasks_path,
    load_tasks,
    run_episode,
)

TASK_KEY = "helpdesk-busiest-agent"


def busiest_agent_policy(context: PolicyContext) -> Any:
    if context.turn == 0:
        return ToolCall("list_agents", {})
    # The last message is the tool's answer: {"role": "tool", "content": [{"type": "text",
    # "text": "<JSON>"}], ...}.
    last = context.messages[-1]
    text = "".join(part["text"] for part in last["content"] if part["type"] == "text")
    agents = json.loads(text)["agents"]
    busiest = max((a for a in agents if a["active"]), key=lambda a: a["open_tickets"])
    return FinalAnswer(busiest["email"])


def main() -> int:
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.key == TASK_KEY)
    print(f"task {task.key}: {task.prompt}\n")
    result = run_episode(task, busiest_agent_policy)
    print(f"final answer: {result.final_answer}")
    print(f"reward={result.reward} ({result.grade_status}) stop_reason={result.stop_reason} "
          f"turns={result.turns} tool_calls={result.tool_calls} "
          f"total={result.timings['total_s']:.2f}s")
    if result.error:
        print(f"error: {result.error['type']}: {result.error['message']}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
