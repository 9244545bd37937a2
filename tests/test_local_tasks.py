"""Every bundled task, end to end against fleetenv.local, the way Fleet runs it.

Provisioning goes through the real fleet-python SDK, the reference solution is replayed
through a raw ``mcp`` streamable-HTTP client on the instance's own endpoint, and grading
goes through ``fleet.tasks.Task.verify_detailed`` (the control plane's verifier execute
route, with HTTP ``SQLiteResource``s and the server-side structured diff). Each instance
is graded once before any action (must score 0) and once after the replay (must score 1).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import fleet
import pytest
from _support.fixtures_local import open_mcp
from fleet.tasks import Task as FleetTask

from fleetenv import bundled_tasks_path
from fleetenv.local import LocalFleet

TASKS: list[dict[str, Any]] = json.loads(bundled_tasks_path().read_text())
WORKERS = 4
TOOL_TIMEOUT_SECONDS = 15.0


def score(response: Any) -> float:
    """The verifier's return value from a ``VerifiersExecuteResponse``."""
    assert response.success, f"verifier did not run: {response.error}\n{response.stdout}"
    result = response.result
    return float(result["score"] if isinstance(result, dict) else result)


def replay(url: str, calls: list[dict[str, Any]]) -> None:
    """Run tool calls in order through one raw MCP session on ``url``."""

    async def run() -> None:
        async with open_mcp(url, timeout=TOOL_TIMEOUT_SECONDS) as session:
            for call in calls:
                result = await session.call_tool(
                    call["name"], call["arguments"], read_timeout_seconds=TOOL_TIMEOUT_SECONDS
                )
                assert not result.is_error, f"{call} failed: {result.content[0].text}"

    anyio.run(run)


def run_task(client: Any, task: dict[str, Any]) -> tuple[str, float, float, str]:
    """Provision, grade idle, replay, grade again; return ``(key, idle, done, stdout)``."""
    env = client.make(f"{task['env_id']}:{task['version']}",
                      data_key=f"{task['data_id']}:{task['data_version']}")  # fmt: skip
    try:
        graded = FleetTask(
            key=task["key"], prompt=task["prompt"], env_id=task["env_id"],
            version=task["version"], data_id=task["data_id"],
            data_version=task["data_version"], verifier_func=task["verifier_func"],
        )  # fmt: skip
        idle = score(graded.verify_detailed(env, None))
        endpoint = "mcp" if task["task_modality"] == "tool_use" else "api/v1/mcp"
        steps = task["metadata"]["reference_solution"]
        answer = next(
            (s["arguments"]["answer"] for s in steps if s["name"] == "submit_final_answer"), None
        )
        replay(
            f"{env.urls.root}{endpoint}", [s for s in steps if s["name"] != "submit_final_answer"]
        )
        response = graded.verify_detailed(env, answer)
        return task["key"], idle, score(response), response.stdout or ""
    finally:
        env.close()


@pytest.mark.timeout(90)
def test_every_bundled_task_scores_zero_idle_and_one_after_its_reference_solution(
    local_fleet: LocalFleet,
) -> None:
    client = fleet.Fleet(api_key=local_fleet.token, base_url=local_fleet.base_url, max_retries=0)
    try:
        with ThreadPoolExecutor(WORKERS, thread_name_prefix="task") as pool:
            outcomes = list(pool.map(lambda task: run_task(client, task), TASKS))
    finally:
        client._httpx_client.close()
    assert len(outcomes) == len(TASKS) >= 20
    idle_passes = [key for key, idle, _, _ in outcomes if idle != 0.0]
    assert not idle_passes, f"tasks that pass without any action: {idle_passes}"
    failures = {key: out for key, _, done, out in outcomes if done != 1.0}
    assert not failures, f"reference solutions that fail on the HTTP path: {failures}"


#: The grading tasks (``fleetenv.local.apps.grading_tasks``) and a tool their reference
#: solution needs; without it, the solution is wrong.
GRADING_TASKS = {"helpdesk-judge-tell-customer": "update_ticket",
                 "helpdesk-partial-escalation": "set_tags",
                 "helpdesk-multi-app-billing-reply": "add_comment"}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("key", sorted(GRADING_TASKS))
def test_grading_tasks_fail_a_wrong_solution_with_partial_credit(
        local_fleet: LocalFleet, key: str) -> None:
    """Reference → 1.0 is the test above; here a solution missing one step scores 0.0,
    with the partial credit its verifier's output gives (0 < partial < 1)."""
    from fleetenv.fleet.verifier_output import parse_partial

    task = next(t for t in TASKS if t["key"] == key)
    client = fleet.Fleet(api_key=local_fleet.token, base_url=local_fleet.base_url,
                         max_retries=0)
    env = client.make(f"{task['env_id']}:{task['version']}",
                      data_key=f"{task['data_id']}:{task['data_version']}")
    try:
        graded = FleetTask(key=task["key"], prompt=task["prompt"], env_id=task["env_id"],
                           version=task["version"], verifier_func=task["verifier_func"])
        steps = [s for s in task["metadata"]["reference_solution"]
                 if s["name"] not in (GRADING_TASKS[key], "submit_final_answer")]
        replay(f"{env.urls.root}mcp", steps)
        response = graded.verify_detailed(env, "Ticket #1080 is resolved.")
        assert score(response) == 0.0
        partial = parse_partial(response.stdout).score
        assert partial is not None and 0.0 < partial < 1.0, response.stdout
    finally:
        env.close()
        client._httpx_client.close()


def test_the_judge_task_reads_the_conversation_it_is_given(local_fleet: LocalFleet) -> None:
    """The judge verifier takes ``conversation`` (JSON, as clients send it) and grades
    what the assistant said there, with a final answer that says nothing."""
    task = next(t for t in TASKS if t["key"] == "helpdesk-judge-tell-customer")
    client = fleet.Fleet(api_key=local_fleet.token, base_url=local_fleet.base_url,
                         max_retries=0)
    env = client.make(f"{task['env_id']}:{task['version']}",
                      data_key=f"{task['data_id']}:{task['data_version']}")
    try:
        graded = FleetTask(key=task["key"], prompt=task["prompt"], env_id=task["env_id"],
                           version=task["version"], verifier_func=task["verifier_func"])
        replay(f"{env.urls.root}mcp", [s for s in task["metadata"]["reference_solution"]
                                       if s["name"] != "submit_final_answer"])
        told = json.dumps([{"role": "assistant", "content": "Ticket #1080 is resolved."}])
        assert score(graded.verify_detailed(env, "Done.", conversation=told)) == 1.0
        silent = json.dumps([{"role": "assistant", "content": "Done."}])
        assert score(graded.verify_detailed(env, "Done.", conversation=silent)) == 0.0
    finally:
        env.close()
        client._httpx_client.close()
