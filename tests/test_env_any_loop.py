"""FleetEnv's async twins from a trio event loop (asyncio is covered in test_env_episode).

The blocking half of an episode (provisioning, the manager API) runs in fleetenv's
worker pool and the MCP half on fleetenv's loop; the caller's loop only waits, so a
trio program (or anyio on trio) runs episodes without blocking, as an asyncio one does.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from _support.waiting import wait_for

import fleetenv
from fleetenv import FleetEnv, Task, ToolCall, bundled_tasks_path
from fleetenv.local import LocalFleet

pytest.importorskip("trio", reason="trio is in the test extra: pip install -e '.[test]'")

pytestmark = pytest.mark.timeout(120)

TASK = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use")


async def _episode(fleet: LocalFleet, task: Task, ticks: list[int]) -> Any:
    async with FleetEnv(task, api_key=fleet.token, base_url=fleet.base_url) as env:
        await env.reset_async()
        reward = None
        for call in task.reference_solution:
            _, reward, terminated, _, _ = await env.step_async(
                ToolCall(call.name, call.arguments))
            if terminated:
                return reward, len(ticks)
        _, reward, *_ = await env.step_async({"done": True})
        return reward, len(ticks)


def test_two_episodes_at_once_on_trio_keep_the_loop_free(local_fleet: LocalFleet) -> None:
    ticks: list[int] = []
    rewards: list[Any] = []

    async def main() -> None:
        async def ticker() -> None:
            while True:
                ticks.append(1)
                await anyio.sleep(0.01)

        async def one() -> None:
            rewards.append(await _episode(local_fleet, TASK, ticks))

        async with anyio.create_task_group() as outer:
            outer.start_soon(ticker)
            async with anyio.create_task_group() as episodes:
                episodes.start_soon(one)
                episodes.start_soon(one)
            outer.cancel_scope.cancel()

    anyio.run(main, backend="trio")
    assert [reward for reward, _ in rewards] == [1.0, 1.0]
    # The trio loop kept running while the episodes worked: the ticker ticked meanwhile.
    assert max(seen for _, seen in rewards) > 3


def test_cancelling_a_trio_task_mid_reset_leaves_no_instance(local_fleet: LocalFleet) -> None:
    def running() -> set[str]:
        return {i["instance_id"] for i in local_fleet.instances(status="running")}

    before = running()

    async def main() -> None:
        env = FleetEnv(TASK, api_key=local_fleet.token, base_url=local_fleet.base_url)
        with anyio.move_on_after(0.05):  # cancelled while provisioning
            await env.reset_async()
        await env.close_async(grade=False)

    anyio.run(main, backend="trio")
    # A provisioning call already under way finishes in its worker thread; whatever it
    # created must still be deleted, not left running until its TTL.
    wait_for(lambda: not (running() - before), timeout=30,
             what="the instance of the cancelled reset to be deleted")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_close_cut_short_by_a_timeout_still_deletes_the_instance(
        local_fleet: LocalFleet, local_faults: Any, backend: str) -> None:
    # A trainer bounds its cleanup: `with move_on_after(...)` / `asyncio.wait_for`
    # around close_async(). Cut while the verifier grades, the close's own cleanup
    # (MCP sessions, the instance) must still run, and Python must not report a plan
    # "generator ignored GeneratorExit" (pytest turns that into an error here).
    def running() -> set[str]:
        return {i["instance_id"] for i in local_fleet.instances(status="running")}

    before = running()
    instance: list[str | None] = []

    async def main() -> None:
        env = FleetEnv(TASK, api_key=local_fleet.token, base_url=local_fleet.base_url)
        await env.reset_async()
        instance.append(env.instance_id)
        local_faults.add("verifier_delay", seconds=5, times=1)
        with anyio.move_on_after(0.5) as scope:  # cut while grading
            await env.close_async()
        assert scope.cancelled_caught

    anyio.run(main, backend=backend)
    assert instance[0] is not None
    wait_for(lambda: not (running() - before), timeout=30,
             what="the instance of the cut-short close to be deleted")
