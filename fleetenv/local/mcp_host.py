"""The MCP side of one instance: two streamable-HTTP servers and their session managers.

Every instance gets its own pair of ``MCPServer`` objects (app tools at ``{root}mcp``, the
``computer`` tool at ``{root}api/v1/mcp``). That gives isolation by construction: a tool
can only reach the database factory it was registered with, and stopping an instance
ends exactly its sessions. What registering a tool derives from its signature (argument
model, JSON schemas: tens of ms of pydantic work per tool) is built once per server
process and shared (`ToolTemplates`); each instance's tools still have their own
functions.

Mounting does not run a sub-app's lifespan, so the session managers are run here, by
one task per instance in the server's task group, until the instance stops.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.server import MCPServer
from mcp.server.mcpserver.tools.base import Tool as RegisteredTool
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from fleetenv.local.wire import bearer_ok, header

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec, DbFactory
    from fleetenv.local.faults import Fault, FaultRegistry

CALL_ID_META_KEY = "fleetenv/call_id"

#: After an ``mcp_restart`` fault, how each kind of server answers a session id it no
#: longer knows: (status, content type, body). ``python`` is this host's own session
#: manager (mcp's Python server: 404, JSON-RPC -32600 "Session not found").
RESTART_ANSWERS: dict[str, tuple[int, str, bytes] | None] = {
    "python": None,
    # the TypeScript SDK's StreamableHTTPServerTransport
    "typescript": (404, "application/json", b'{"jsonrpc":"2.0","error":{"code":-32001,'
                   b'"message":"Session not found"},"id":null}'),
    # @modelcontextprotocol/server-everything 2026.8.31 (its express route, no JSON-RPC id)
    "everything": (400, "application/json; charset=utf-8", b'{"jsonrpc":"2.0","error":'
                   b'{"code":-32000,"message":"Bad Request: No valid session ID provided"}}'),
    # a gateway in front of an instance that went away
    "gateway": (410, "text/plain; charset=utf-8", b"Gone"),
}
_UNAUTHORIZED_BODY = (
    b'{"detail":"this instance\'s MCP endpoints require \'Authorization: Bearer <API key>\'"}'
)

#: ``(tool_name, call_id)``, awaited before every tool call: applies faults (it may sleep,
#: hang or raise ToolError) and counts the call; it may return a function that rewrites
#: the tool's result (``tool_output`` faults).
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


#: Tools registered before, by everything their registration derives from except the
#: function itself (`_template_key`): a later instance's tool copies one, with its own
#: function. One per server process, shared by every instance (`InstanceStore`).
ToolTemplates = dict[tuple[Any, ...], RegisteredTool]


def _template_key(fn: Callable[..., Any], options: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """What a registered tool is built from: the function's code, names, docstring and
    signature (annotations and defaults), and the ``add_tool`` options. None for what is
    not a plain function (built every time)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    try:
        signature = str(inspect.signature(fn))
    except (TypeError, ValueError):
        return None
    names = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
             getattr(fn, "__name__", None), getattr(fn, "__doc__", None))
    return (code, *names, signature, *(repr(option) for option in options))


class InstanceMCPServer(MCPServer):
    """An ``MCPServer`` whose every tool call passes through the host's gate first.

    ``templates``: tools registered by other instances' servers, shared (`ToolTemplates`).
    """

    def __init__(self, name: str, gate: ToolGate,
                 templates: ToolTemplates | None = None) -> None:
        with root_logger_untouched():
            super().__init__(name, version="local", log_level="WARNING")
        self._gate = gate
        self._tool_names: frozenset[str] | None = None
        self._templates: ToolTemplates = {} if templates is None else templates

    def add_tool(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: Any = None,
        icons: Any = None,
        meta: dict[str, Any] | None = None,
        structured_output: bool | None = None,
    ) -> None:
        """``MCPServer.add_tool``, copying the tool an earlier instance registered from the
        same definition (`_template_key`) with this instance's ``fn``, instead of
        building its argument model and schemas again."""
        key = _template_key(fn, (name, title, description, annotations, icons, meta,
                                 structured_output))
        template = self._templates.get(key) if key is not None else None
        # mcp 2.3's ToolManager adds only by building; its table is the one place to put
        # a built tool.
        tools: dict[str, RegisteredTool] = self._tool_manager._tools
        if template is not None and template.name not in tools:
            tools[template.name] = template.model_copy(update={"fn": fn})
            return
        before = set(tools)
        super().add_tool(fn, name=name, title=title, description=description,
                         annotations=annotations, icons=icons, meta=meta,
                         structured_output=structured_output)
        added = [tool for tool_name, tool in tools.items() if tool_name not in before]
        if key is not None and added:
            self._templates[key] = added[0]

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
        templates: ToolTemplates | None = None,
    ) -> None:
        self.tools = InstanceMCPServer(f"{app.key}", gate, templates)
        app.register_tools(self.tools, db_factory)
        self.computer = InstanceMCPServer(f"{app.key}-computer", gate, templates)
        app.register_computer(self.computer, db_factory)
        # streamable_http_app() is what creates each server's session manager; the
        # Starlette wrapper itself is not used (we dispatch to the manager directly).
        self.tools.streamable_http_app(host=host)
        self.computer.streamable_http_app(host=host)
        self._stop = anyio.Event()
        self._done = anyio.Event()
        # set by an mcp_restart fault: how to answer session ids forgotten by the restart
        self._forgotten_answer: tuple[int, str, bytes] | None = None

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

    # ------------------------------------------------------------------ before the manager

    async def intercept(
        self,
        *,
        faults: FaultRegistry,
        instance_id: str,
        endpoint: str,
        required_token: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> bool:
        """Check the MCP credentials (when required) and apply the MCP faults before the
        session manager sees the request. True when the request was answered here."""
        if required_token is not None and not bearer_ok(scope, required_token):
            await _answer(send, 401, "application/json", _UNAUTHORIZED_BODY,
                          extra=[(b"www-authenticate", b"Bearer")])
            return True
        target = {"instance": instance_id, "route": scope["path"]}
        session_id = header(scope, b"mcp-session-id")
        if session_id is None:  # a new session: the handshake's first request
            return await self._new_session_faults(faults, target, send)
        restart = faults.take("mcp_restart", **target)
        if restart is not None:
            await self.restart(restart.payload or "python")
        answer = self._forgotten_answer
        if answer is not None and not self._knows(endpoint, session_id):
            await _answer(send, *answer)
            return True
        return False

    async def restart(self, payload: str) -> int:
        """Forget every session of both endpoints, as a restarted server would, and from
        now on answer a forgotten session id as the server kind ``payload`` does."""
        self._forgotten_answer = RESTART_ANSWERS[payload]
        forgotten = 0
        for endpoint in ("mcp", "api/v1/mcp"):
            sessions: dict[str, Any] = getattr(self.manager_for(endpoint), "_server_instances", {})
            for session_id in list(sessions):
                forgotten += await self.forget_session(endpoint, session_id)
        return forgotten

    def _knows(self, endpoint: str, session_id: str) -> bool:
        return session_id in getattr(self.manager_for(endpoint), "_server_instances", {})

    async def _new_session_faults(
        self, faults: FaultRegistry, target: dict[str, str], send: Send
    ) -> bool:
        """``mcp_starting``: 503 until ``seconds`` after the fault was added (a server
        still starting behind its gateway). ``mcp_handshake_delay``: each handshake
        waits ``seconds`` (a slow or busy server); the fault records the peak."""
        starting = faults.take("mcp_starting", **target)
        if starting is not None:
            if time.monotonic() < starting.added_at + (starting.seconds or 0.0):
                await _answer(send, 503, "application/json",
                              b'{"detail":"MCP server is starting (local Fleet fault)"}',
                              extra=[(b"retry-after", b"1")])
                return True
            faults.remove(starting.id)  # its window is over
        delay = faults.take("mcp_handshake_delay", **target)
        if delay is not None:
            await _held(delay)
        return False


async def _held(fault: Fault) -> None:
    fault.active += 1
    fault.peak = max(fault.peak or 0, fault.active)
    try:
        await anyio.sleep(fault.seconds or 0.0)
    finally:
        fault.active -= 1


async def _answer(
    send: Send, status: int, content_type: str, body: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type.encode("latin-1")),
               (b"content-length", str(len(body)).encode("ascii")), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
