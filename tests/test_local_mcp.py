"""A raw ``mcp`` client against fleetenv.local's per-instance MCP endpoints."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from _support.fixtures_local import open_mcp
from mcp import MCPError

from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(20)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def notes_env(notes_client: Any) -> Iterator[Any]:
    env = notes_client.make("notes")
    yield env
    env.close()


def test_tools_and_computer_endpoints(notes_fleet: LocalFleet, notes_env: Any) -> None:
    root = notes_env.urls.root

    async def main() -> None:
        async with open_mcp(f"{root}mcp") as session:
            names = [tool.name for tool in (await session.list_tools()).tools]
            assert names == ["list_notes", "add_note"]
            added = await session.call_tool("add_note", {"title": "from mcp"},
                                            meta={"fleetenv/call_id": "call-add-1"})
            assert added.is_error is False and added.structured_content == {"result": 3}
            listed = await session.call_tool("list_notes", {})
            titles = [n["title"] for n in listed.structured_content["result"]]
            assert titles == ["groceries", "todo", "from mcp"]
            unknown = await session.call_tool("no_such_tool", {})
            assert unknown.is_error
        async with open_mcp(f"{root}api/v1/mcp/") as computer:  # trailing slash served too
            assert [t.name for t in (await computer.list_tools()).tools] == ["computer"]
            shot = await computer.call_tool("computer", {"action": "screenshot"})
            image = shot.content[0]
            assert image.type == "image" and image.mime_type == "image/png"
            assert base64.b64decode(image.data).startswith(PNG_SIGNATURE)

    anyio.run(main)
    # the tool wrote to the instance's database, visible through the manager API
    notes_env.resources()
    assert notes_env.db().query("SELECT title FROM notes WHERE id = 3").rows == [["from mcp"]]
    counts = notes_fleet.tool_call_counts(notes_env.instance_id)
    assert counts == {"add_note": 1, "list_notes": 1, "computer": 1}
    assert notes_fleet.tool_calls_by_call_id()["call-add-1"] == {
        "count": 1, "instance": notes_env.instance_id, "tool": "add_note"}


def test_instances_are_isolated(notes_client: Any) -> None:
    first, second = notes_client.make("notes"), notes_client.make("notes")
    try:
        async def main() -> None:
            async with open_mcp(f"{first.urls.root}mcp") as session:
                await session.call_tool("add_note", {"title": "only in first"})
            async with open_mcp(f"{second.urls.root}mcp") as session:
                listed = await session.call_tool("list_notes", {})
                assert len(listed.structured_content["result"]) == 2

        anyio.run(main)
        first.reset()
        first.resources()
        assert first.db().query("SELECT COUNT(*) FROM notes").rows == [[2]]
    finally:
        first.close()
        second.close()


def test_instances_share_tool_definitions_not_databases(notes_fleet: LocalFleet,
                                                         notes_client: Any) -> None:
    """What registering a tool derives from its signature (argument model, schemas) is
    built for the first instance and reused by the next; each instance's tool is still
    its own function, reaching its own database."""
    first, second = notes_client.make("notes"), notes_client.make("notes")
    try:
        store = notes_fleet._server.state.store  # in-process: the servers are inspectable
        registered = [store.get(env.instance_id).mcp.tools._tool_manager.get_tool("add_note")
                      for env in (first, second)]
        assert registered[0].fn_metadata is registered[1].fn_metadata
        assert registered[0].parameters is registered[1].parameters
        assert registered[0].fn is not registered[1].fn

        async def main() -> None:
            async with open_mcp(f"{second.urls.root}mcp") as session:
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert tools["add_note"].input_schema == registered[0].parameters
                added = await session.call_tool("add_note", {"title": "only in second"})
                assert added.structured_content == {"result": 3}
            async with open_mcp(f"{first.urls.root}mcp") as session:
                listed = await session.call_tool("list_notes", {})
                assert len(listed.structured_content["result"]) == 2

        anyio.run(main)
    finally:
        first.close()
        second.close()


def test_shared_tool_definitions_keep_each_apps_own_text(local_fleet: LocalFleet,
                                                         fleet_client: Any) -> None:
    """Two apps register their ``computer`` tool from the same code with different
    descriptions: each lists its own."""
    from fleetenv.local.apps import APPS

    if not {"helpdesk", "shop"} <= set(APPS):
        pytest.skip("needs the bundled helpdesk and shop apps")
    envs = [fleet_client.make("helpdesk"), fleet_client.make("shop")]
    try:
        async def description(root: str) -> str:
            async with open_mcp(f"{root}api/v1/mcp") as session:
                (tool,) = (await session.list_tools()).tools
                return tool.description or ""

        async def main() -> list[str]:
            return [await description(env.urls.root) for env in envs]

        helpdesk, shop = anyio.run(main)
        assert helpdesk != shop
        assert APPS["helpdesk"].name in helpdesk and APPS["shop"].name in shop
    finally:
        for env in envs:
            env.close()


def test_stopped_instance_fails_fast_for_mcp(notes_client: Any) -> None:
    env = notes_client.make("notes")
    root = env.urls.root

    async def main() -> None:
        async with open_mcp(f"{root}mcp") as session:
            env.close()
            started = time.monotonic()
            with pytest.raises(MCPError):
                await session.call_tool("list_notes", {})
            # A hang bound, not a speed claim: the 410 comes back in milliseconds; 2 s is
            # far short of the session's 10 s read timeout a hanging call would wait out.
            assert time.monotonic() - started < 2

    anyio.run(main)
    response = httpx.post(f"{root}mcp", json={}, timeout=5)
    assert response.status_code == 410


def test_session_loss_fault(notes_fleet: LocalFleet, notes_faults: Any, notes_env: Any) -> None:
    async def main() -> None:
        async with open_mcp(f"{notes_env.urls.root}mcp") as session:
            await anyio.to_thread.run_sync(lambda: notes_faults.add(
                "session_loss", instance=notes_env.instance_id, route="*/mcp", times=1))
            with pytest.raises(MCPError, match="Session not found"):
                await session.call_tool("list_notes", {})
        async with open_mcp(f"{notes_env.urls.root}mcp") as session:  # a new session works
            assert not (await session.call_tool("list_notes", {})).is_error

    anyio.run(main)
    assert notes_fleet.tool_call_counts(notes_env.instance_id) == {"list_notes": 1}


def test_tool_delay_error_and_hang_faults(
    notes_fleet: LocalFleet, notes_faults: Any, notes_env: Any
) -> None:
    iid = notes_env.instance_id
    notes_faults.add("tool_delay", instance=iid, tool="list_notes", seconds=0.4, times=1)
    notes_faults.add("tool_error", instance=iid, tool="add_note", message="disk full", times=1)
    hang_id = notes_faults.add("tool_hang", instance=iid, tool="list_notes")

    async def main() -> None:
        async with open_mcp(f"{notes_env.urls.root}mcp") as session:
            started = time.monotonic()
            delayed = await session.call_tool("list_notes", {})  # the delay fires first
            assert not delayed.is_error and time.monotonic() - started >= 0.4
            failed = await session.call_tool("add_note", {"title": "x"})
            assert failed.is_error and "disk full" in failed.content[0].text
            with pytest.raises(MCPError) as timed_out:  # now it hangs until cleared
                await session.call_tool("list_notes", {}, read_timeout_seconds=0.5)
            assert timed_out.value.error.code == -32001

            async def clear_soon() -> None:
                await anyio.sleep(0.3)
                await anyio.to_thread.run_sync(notes_faults.clear, hang_id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(clear_soon)
                released = await session.call_tool("list_notes", {})
            assert not released.is_error

    anyio.run(main)
    # the errored add_note and the timed-out (cancelled, never released) call did not run
    assert notes_fleet.tool_call_counts(iid) == {"list_notes": 2}
