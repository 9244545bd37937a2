"""The async MCP API awaited from the caller's own event loop, whichever it is.

A trainer, a notebook or a test runner awaits ``MCPConnection.a*`` / ``ToolRouter.a*``
on ITS loop: plain ``asyncio.run``, a loop already running in another thread (what
pytest-asyncio and Jupyter give), or trio through anyio. The work runs on the fleetenv
loop; the caller's loop stays free, cancelling the awaiting task cancels the work, and
timeouts mean what they say.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from _support.fixtures_mcp import RunningMCPServer

from fleetenv import runtime
from fleetenv.core.errors import DeadlineExceeded
from fleetenv.mcp import Endpoint, MCPConnection, ToolRouter

pytestmark = pytest.mark.timeout(60)

HAVE_TRIO = importlib.util.find_spec("trio") is not None
BACKENDS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param("trio", id="trio", marks=pytest.mark.skipif(
        not HAVE_TRIO, reason="trio is not installed (pip install 'fleetenv[test]' adds it)")),
]


def run_on(backend: str, main: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``main`` on a fresh event loop of ``backend`` in this thread."""
    return anyio.run(main, backend=backend)


async def fleetenv_task_names() -> set[str]:
    return {task.get_name() for task in asyncio.all_tasks()}


async def wait_until(condition: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    """Poll ``condition`` on the caller's loop, with backoff, within ``limit_s``."""
    delay, deadline = 0.005, time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.2)


# ---------------------------------------------------------------------- the whole API


async def use_connection_and_router(url: str) -> tuple[list[str], list[str]]:
    connection = MCPConnection(url)
    await connection.aopen()
    names = [tool.name for tool in await connection.alist_tools(refresh=True)]
    assert (await connection.acall_tool("echo", {"text": "conn"})).texts == ["conn"]
    await connection.aclose()
    router = ToolRouter([Endpoint(url)])
    await router.aopen()
    routed = [tool.name for tool in await router.alist_tools()]
    assert (await router.acall("echo", {"text": "router"})).texts == ["router"]
    await router.aclose()
    return names, routed


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_coroutine_works_on_the_callers_loop(
    backend: str, mcp_server: RunningMCPServer
) -> None:
    names, routed = run_on(backend, lambda: use_connection_and_router(mcp_server.url))
    assert "echo" in names and names == routed


def test_from_a_loop_already_running_in_another_thread(mcp_server: RunningMCPServer) -> None:
    """What pytest-asyncio, Jupyter and async trainers give: a loop that runs elsewhere."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        names, _ = pool.submit(
            asyncio.run, use_connection_and_router(mcp_server.url)).result(timeout=30)
    assert "echo" in names


def test_a_connection_opened_on_one_loop_is_used_from_another(
    mcp_server: RunningMCPServer,
) -> None:
    """The session belongs to the fleetenv loop, so any caller loop may use it: opened
    in one asyncio.run, called from a second one and from the blocking API."""
    connection = MCPConnection(mcp_server.url)
    asyncio.run(connection.aopen())
    try:
        result = asyncio.run(connection.acall_tool("echo", {"text": "second loop"}))
        assert result.texts == ["second loop"]
        assert connection.call_tool("echo", {"text": "blocking"}).texts == ["blocking"]
    finally:
        connection.close()


# ---------------------------------------------------------------------- never blocking


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_calls_leave_the_callers_loop_free(
    backend: str, mcp_server: RunningMCPServer
) -> None:
    """Eight 0.3 s calls at once, and a ticker on the same loop keeps ticking meanwhile."""

    async def main() -> tuple[int, list[list[str]]]:
        ticks: list[float] = []
        results: list[list[str]] = []
        calls_done = anyio.Event()

        async def ticker() -> None:
            while not calls_done.is_set():
                ticks.append(time.monotonic())
                await anyio.sleep(0.01)

        async def one(connection: MCPConnection) -> None:
            results.append((await connection.acall_tool("sleepy", {"seconds": 0.3})).texts)

        connection = MCPConnection(mcp_server.url)
        await connection.aopen()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(ticker)
                started = time.monotonic()
                async with anyio.create_task_group() as calls:
                    for _ in range(8):
                        calls.start_soon(one, connection)
                ended = time.monotonic()
                calls_done.set()
        finally:
            await connection.aclose()
        return sum(1 for tick in ticks if started < tick < ended), results

    ticks_during_calls, results = run_on(backend, main)
    assert len(results) == 8 and all(texts for texts in results)
    assert ticks_during_calls >= 2, "the caller's loop ran other tasks during the calls"


# ---------------------------------------------------------------------- cancel, timeouts


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelling_the_awaiting_task_cancels_the_call_on_the_fleetenv_loop(
    backend: str, mcp_server: RunningMCPServer
) -> None:
    async def main() -> None:
        connection = MCPConnection(mcp_server.url)
        await connection.aopen()
        before = len(mcp_server.log.call_ids("sleepy"))
        try:
            with anyio.move_on_after(30) as outer:
                async with anyio.create_task_group() as group:
                    group.start_soon(connection.acall_tool, "sleepy", {"seconds": 30})
                    await wait_until(lambda: len(mcp_server.log.call_ids("sleepy")) > before,
                                     "the server to start the call")
                    group.cancel_scope.cancel()
            assert not outer.cancelled_caught, "the cancelled call returned at once"
            await wait_until(lambda: "MCPConnection.acall_tool" not in runtime.current().call(
                fleetenv_task_names), "the loop-side call to end")
            result = await connection.acall_tool("echo", {"text": "still usable"})
            assert result.texts == ["still usable"]
        finally:
            await connection.aclose()

    run_on(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_timeout_raises_deadline_exceeded_and_a_fast_call_does_not(
    backend: str, mcp_server: RunningMCPServer
) -> None:
    async def main() -> None:
        connection = MCPConnection(mcp_server.url)
        try:
            fast = await connection.acall_tool("echo", {"text": "fast"}, timeout_s=10)
            assert fast.texts == ["fast"]
            with pytest.raises(DeadlineExceeded, match=r"no answer within 0\.3 s"):
                await connection.acall_tool("sleepy", {"seconds": 5}, timeout_s=0.3)
            after = await connection.acall_tool("echo", {"text": "after"}, timeout_s=10)
            assert after.texts == ["after"]
        finally:
            await connection.aclose()

    run_on(backend, main)


def test_runtime_call_async_works_under_trio() -> None:
    if not HAVE_TRIO:
        pytest.skip("trio is not installed (pip install 'fleetenv[test]' adds it)")

    async def double(value: int) -> int:
        await anyio.sleep(0)
        return value * 2

    async def main() -> int:
        with pytest.raises(DeadlineExceeded):
            await runtime.current().call_async(anyio.sleep, 5, timeout=0.1)
        return await runtime.current().call_async(double, 21)

    assert run_on("trio", main) == 42
