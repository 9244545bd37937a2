"""Everything one local Fleet server knows, in one place the routes share.

Only the server's event loop mutates this state; blocking work (SQLite, verifier
workers) runs in worker threads and hands results back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from fleetenv.local.config import HarnessFactory, LocalFleetConfig
from fleetenv.local.faults import FaultRegistry
from fleetenv.local.instances import Instance, InstanceStore
from fleetenv.local.mcp_host import ToolGate, inject_output
from fleetenv.local.traces import TraceStore
from fleetenv.local.worker_pool import WorkerPool

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec


class ToolCallLog:
    """Tool executions per client call id, to prove no logical call ran twice."""

    def __init__(self) -> None:
        self.by_call_id: dict[str, dict[str, Any]] = {}

    def record(self, instance: Instance, tool: str, call_id: str | None) -> None:
        instance.tool_counts[tool] += 1
        if call_id is not None:
            entry = self.by_call_id.setdefault(
                call_id, {"count": 0, "instance": instance.instance_id, "tool": tool}
            )
            entry["count"] += 1


class LocalFleetState:
    def __init__(self, config: LocalFleetConfig, apps: dict[str, AppSpec], workdir: Path,
                 harness: HarnessFactory | None = None) -> None:
        self.config = config
        self.apps = apps
        self.harness = harness  # runs harness jobs (fleetenv.local.jobs); None: refused
        self.workdir = workdir
        self.base_url = ""
        self.faults = FaultRegistry()
        self.tool_calls = ToolCallLog()
        self.bundles: dict[str, bytes] = {}
        self.traces = TraceStore()  # trace jobs and sessions (fleetenv.local.traces)
        self.store = InstanceStore(
            apps=apps,
            workdir=workdir,
            host=config.host,
            default_ttl_seconds=config.default_ttl_seconds,
            instance_limit=config.instance_limit,
        )
        self.pool = WorkerPool(config.verifier_workers, workdir / "verifier-workers.log",
                               runner_token=config.runner_token,
                               max_size=config.verifier_workers_max)
        #: The threads that block on the pool, one per worker it may have: apart from
        #: anyio's shared ones, which tool calls and verifiers' own queries need.
        self.pool_threads = anyio.CapacityLimiter(self.pool.max_size)
        self.task_group: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drained = False

    def gate_for(self, instance: Instance) -> ToolGate:
        """The hook every tool call of ``instance`` passes: faults first, then counting."""

        async def gate(tool: str, call_id: str | None) -> Any:
            fault = self.faults.take(
                ("tool_hang", "tool_delay", "tool_error", "tool_output"),
                instance=instance.instance_id,
                tool=tool,
            )
            if fault is not None and fault.kind == "tool_output":
                self.tool_calls.record(instance, tool, call_id)
                return inject_output(fault.payload or "huge", fault.size or 1_000_000)
            if fault is not None:
                if fault.kind == "tool_delay":
                    await anyio.sleep(fault.seconds or 0.0)
                elif fault.kind == "tool_hang":
                    if not await self.faults.hang(fault):
                        raise ToolError("the local Fleet is shutting down")
                else:
                    raise ToolError(
                        fault.message or f"injected tool failure (local Fleet {fault.id})"
                    )
            self.tool_calls.record(instance, tool, call_id)
            return None

        return gate

    async def drain(self) -> None:
        """Release held requests and stop every instance (ends open MCP streams).

        Runs before uvicorn's graceful shutdown, which otherwise waits for hung requests
        and long-lived SSE streams until its timeout.
        """
        if self._drained:
            return
        self._drained = True
        self.faults.release_all(stopping=True)
        await self.store.stop_all()
