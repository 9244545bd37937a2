"""Latency of one trivial MCP tool call: fleetenv's blocking API vs the raw async floor.

Starts an MCP server with an ``echo`` tool in a separate process, then measures, in
interleaved rounds (so machine noise hits every variant alike), the median latency of:

  (a) ``MCPConnection.call_tool`` (blocking, through the fleetenv loop thread),
  (b) ``await ClientSession.call_tool`` on one persistent session in a plain asyncio
      program (the floor),
  (c) a new session per call (connect + initialize + call + close), what the previous
      Fleet client did.

Also reports the import cost of ``fleetenv``. The last line printed is one JSON object.

    python tests/benchmarks/bench_mcp_call.py [--rounds 200] [--calls 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests/_support

from _support.mcp_servers import ServerProcess
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from fleetenv import runtime
from fleetenv.mcp import MCPConnection


def fleetenv_round(connection: MCPConnection, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        connection.call_tool("echo", {"text": str(i)})
        samples.append(time.perf_counter() - started)
    return samples


async def raw_round(session: ClientSession, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        await session.call_tool("echo", {"text": str(i)})
        samples.append(time.perf_counter() - started)
    return samples


async def session_per_call_round(url: str, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.call_tool("echo", {"text": str(i)})
        samples.append(time.perf_counter() - started)
    return samples


class RawSession:
    """One persistent raw session on a plain asyncio loop driven from this thread.

    The session is entered and exited by one owner task (anyio cancel scopes must be left
    by the task that entered them); rounds are separate tasks that only await calls.
    """

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.url = url
        self.ready: asyncio.Future[ClientSession] = self.loop.create_future()
        self.stop: asyncio.Future[None] = self.loop.create_future()
        self.owner: asyncio.Task[None] | None = None

    async def _own(self) -> None:
        async with (
            streamable_http_client(self.url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.list_tools()
            self.ready.set_result(session)
            await self.stop

    def open(self) -> ClientSession:
        self.owner = self.loop.create_task(self._own())
        return self.loop.run_until_complete(self.ready)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.stop.set_result(None)
        if self.owner is not None:
            self.loop.run_until_complete(self.owner)
        self.loop.close()


def import_cost() -> tuple[float, float]:
    """(cumulative import time of fleetenv in ms from -X importtime, wall ms of the import)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import fleetenv"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    cumulative_us = 0
    for line in proc.stderr.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) == 3 and parts[2] == "fleetenv":
            cumulative_us = int(parts[1])
    walls = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import fleetenv"], check=True, timeout=60)
        with_import = time.perf_counter() - started
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
        walls.append(with_import - (time.perf_counter() - started))
    return cumulative_us / 1000, statistics.median(walls) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=5, help="calls per round for (a), (b)")
    parser.add_argument(
        "--fresh-every", type=int, default=4, help="one (c) call every N rounds (it is slow)"
    )
    options = parser.parse_args()

    fleet_samples: list[float] = []
    raw_samples: list[float] = []
    fresh_samples: list[float] = []
    with ServerProcess("echo") as server:
        connection = MCPConnection(server.url).open()
        raw = RawSession(server.url)
        session = raw.open()
        try:
            fleetenv_round(connection, 50)  # warm both paths up
            raw.run(raw_round(session, 50))
            raw.run(session_per_call_round(server.url, 2))
            # Short alternating rounds: slow drifts of machine load (other processes on a
            # shared box) hit both variants alike instead of whichever ran at the time.
            for index in range(options.rounds):
                if index % 2 == 0:
                    fleet_samples += fleetenv_round(connection, options.calls)
                    raw_samples += raw.run(raw_round(session, options.calls))
                else:
                    raw_samples += raw.run(raw_round(session, options.calls))
                    fleet_samples += fleetenv_round(connection, options.calls)
                if index % options.fresh_every == 0:
                    fresh_samples += raw.run(session_per_call_round(server.url, 1))
        finally:
            connection.close()
            raw.close()
            runtime.shutdown()

    fleet_ms = statistics.median(fleet_samples) * 1000
    raw_ms = statistics.median(raw_samples) * 1000
    fresh_ms = statistics.median(fresh_samples) * 1000
    importtime_ms, import_wall_ms = import_cost()

    print(f"{'variant':<44} {'median ms':>10} {'n':>6}")
    print(f"{'(a) fleetenv MCPConnection.call_tool':<44} {fleet_ms:>10.3f} {len(fleet_samples):>6}")
    print(f"{'(b) raw async ClientSession.call_tool':<44} {raw_ms:>10.3f} {len(raw_samples):>6}")
    print(f"{'(c) new session per call':<44} {fresh_ms:>10.3f} {len(fresh_samples):>6}")
    print(f"ratio (a)/(b): {fleet_ms / raw_ms:.3f}   speedup (c)/(a): {fresh_ms / fleet_ms:.1f}x")
    print(
        f"import fleetenv: {importtime_ms:.1f} ms cumulative (-X importtime), "
        f"~{import_wall_ms:.1f} ms wall over a bare interpreter"
    )
    print(
        json.dumps(
            {
                "fleetenv_ms": round(fleet_ms, 3),
                "raw_async_ms": round(raw_ms, 3),
                "session_per_call_ms": round(fresh_ms, 3),
                "ratio_vs_raw_async": round(fleet_ms / raw_ms, 3),
                "speedup_vs_session_per_call": round(fresh_ms / fleet_ms, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
