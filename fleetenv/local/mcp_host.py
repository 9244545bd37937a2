"""The MCP side of one instance: two streamable-HTTP servers and their session managers.

Every instance gets its own pair of ``MCPServer`` objects (app tools at ``{root}mcp``, the
``computer`` tool at ``{root}api/v1/mcp``). That gives isolation by construction: a tool
can only reach the database factory it was registered with, and stopping an instance
ends exactly its sessions. A pair costs about 3 ms to build.

Mounting does not run a sub-app's lifespan, so the session managers are run here, by
one task per instance in the server's task group, until the instance stops.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.server import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec, DbFactory

CALL_ID_META_KEY = "fleetenv/call_id"

#: ``(tool_name, call_id) -> None``; may sleep, hang or raise ToolError (fault injection),
#: and records the execution when it returns.
#: Runs before every tool call: applies faults and counts the call. It may return a
#: function that rewrites the tool's result (``tool_output`` faults).
ToolGate = Callable[[str, str | None], Awaitable[Any]]


def inject_output(payload: str, size: int) -> Callable[[Any], Any]:
    """A rewrite that appends a ``tool_output`` fault's payload to a real tool result.

    Appending (instead of replacing) keeps the tool's structured content valid against its
    output schema, so what the client meets is exactly the oversized or binary part.
    """
    import base64

    from mcp.types import BlobResourceContents, EmbeddedResource, TextContent

    if payload == "huge":
        line = "0123456789abcdefghijklmnopqrstuvwxyz" * 2 + "\n"
        extra: list[Any] = [TextContent(type="text", text=(line * (size // len(line) + 1))[:size])]
    else:
        raw = (bytes((0xFF, 0xFE, 0xC3, 0x28, 0x80)) * (size // 5 + 1))[:size]
        blob = BlobResourceContents(uri="file:///dump.bin", mime_type="application/octet-stream",
                                    blob=base64.b64encode(raw).decode("ascii"))
        extra = [TextContent(type="text", text=raw[:200].decode("utf-8", errors="replace")),
                 EmbeddedResource(type="resource", resource=blob)]

    def rewrite(result: Any) -> Any:
        return result.model_copy(update={"content": [*result.content, *extra]})

    return rewrite


@contextlib.contextmanager
def root_logger_untouched() -> Iterator[None]:
    """Undo what ``MCPServer.__init__`` does to the root logger.

    It calls ``logging.basicConfig(level=..., handlers=[RichHandler])``, which on an
    unconfigured process installs a handler and sets the root level, and makes the
    caller's own later ``basicConfig`` a silent no-op. We hold logging's module lock (the
    one ``basicConfig`` takes) so no other thread's logging setup can interleave with the
    snapshot and the restore.
    """
    root = logging.getLogger()
    lock = getattr(logging, "_lock", None) or contextlib.nullcontext()
    with lock:
        level, handlers = root.level, list(root.handlers)
        try:
            yield
        finally:
            for handler in list(root.handlers):
                if handler not in handlers:
                    root.removeHandler(handler)
                    handler.close()
            root.setLevel(level)


class InstanceMCPServer(MCPServer):
    """An ``MCPServer`` whose every tool call passes through the host's gate first."""

    def __init__(self, name: str, gate: ToolGate) -> None:
        with root_logger_untouched():
            super().__init__(name, version="local", log_level="WARNING")
        self._gate = gate
        self._tool_names: frozenset[str] | None = None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> Any:
        call_id = None
        request_context = getattr(context, "_request_context", None)  # None outside a request
        params = getattr(request_context, "params", None) or {}
        meta = params.get("_meta") if hasattr(params, "get") else None
        if isinstance(meta, dict):
            value = meta.get(CALL_ID_META_KEY)
            call_id = str(value) if value is not None else None
        if self._tool_names is None:  # apps register every tool up front
            self._tool_names = frozenset(tool.name for tool in await self.list_tools())
        if name in self._tool_names:  # unknown names never execute, so never count
            rewrite = await self._gate(name, call_id)
            if rewrite is not None:
                return rewrite(await super().call_tool(name, arguments, context))
        return await super().call_tool(name, arguments, context)


class InstanceMCP:
    """The two MCP endpoints of one instance and the task that runs them."""

    def __init__(
        self,
        *,
        app: AppSpec,
        db_factory: DbFactory,
        gate: ToolGate,
        host: str,
    ) -> None:
        self.tools = InstanceMCPServer(f"{app.key}", gate)
        app.register_tools(self.tools, db_factory)
        self.computer = InstanceMCPServer(f"{app.key}-computer", gate)
        app.register_computer(self.computer, db_factory)
        # streamable_http_app() is what creates each server's session manager; the
        # Starlette wrapper itself is not used (we dispatch to the manager directly).
        self.tools.streamable_http_app(host=host)
        self.computer.streamable_http_app(host=host)
        self._stop = anyio.Event()
        self._done = anyio.Event()

    def manager_for(self, endpoint: str) -> StreamableHTTPSessionManager:
        return self.tools.session_manager if endpoint == "mcp" else self.computer.session_manager

    async def start(self, task_group: TaskGroup) -> None:
        await task_group.start(self._run)

    async def _run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with self.tools.session_manager.run(), self.computer.session_manager.run():
                task_status.started()
                await self._stop.wait()
        finally:
            self._done.set()

    async def stop(self) -> None:
        """End every session of this instance (open SSE streams close) and wait for it."""
        self._stop.set()
        with anyio.move_on_after(5):
            await self._done.wait()

    async def handle(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        await self.manager_for(endpoint).handle_request(scope, receive, send)

    async def forget_session(self, endpoint: str, session_id: str) -> bool:
        """Make the server forget one session, as a restarted server would.

        The client's next request on it gets 404 "Session not found". This reaches into
        the session manager's session table (private in mcp 2.3): there is no public way
        to drop a live session from the server side.
        """
        manager = self.manager_for(endpoint)
        sessions: dict[str, Any] = getattr(manager, "_server_instances", {})
        transport = sessions.pop(session_id, None)
        if transport is None:
            return False
        with anyio.CancelScope(shield=True):
            await transport.terminate()
        return True

