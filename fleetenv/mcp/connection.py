"""`MCPConnection`: one persistent streamable-HTTP MCP session, usable from any thread.

The session is owned by ONE long-lived task on the fleetenv loop: that task enters the
transport and ``ClientSession`` contexts, runs ``initialize`` and ``tools/list``, hands the
session out, waits for a stop signal and exits the contexts itself. anyio requires a
cancel scope to be exited by the task that entered it, so no other arrangement is safe.
Every operation (list, call) is then a short task that awaits the shared session; any
number of threads may call at once (JSON-RPC ids multiplex them on one session).

Failure policy, decided here once:

* Connecting (TCP refused, HTTP error, handshake error, timeout) raises `ConnectError`
  naming the endpoint. Nothing that can have an effect was sent.
* A call that got no answer in time raises `DeadlineExceeded`; the session survives.
* A session that is lost (server restarted, connection dropped, owner task died) is
  replaced by a new one before the next operation is sent. Listing tools is read-only,
  so it reconnects and retries (bounded). A tool call that may have reached the server
  is never replayed: it raises `ToolCallMayHaveRunError`. The single exception is a
  call the server rejected with HTTP 404 "session not found", which the server decides
  before dispatching anything; that call is sent once more on a fresh session.
* A JSON-RPC error the server answered for a call becomes an error `ToolResult`, so the
  agent can see it, like any other tool error.

``mcp`` and ``httpx2`` are imported on first use, never at ``import fleetenv``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import random
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetenv import runtime
from fleetenv.core.errors import (
    ConnectError,
    DeadlineExceeded,
    FleetEnvError,
    ToolCallError,
    ToolCallMayHaveRunError,
)
from fleetenv.mcp import http
from fleetenv.mcp.results import ToolResult
from fleetenv.mcp.tools import Tool

if TYPE_CHECKING:
    import anyio
    from mcp import ClientSession

__all__ = ["CALL_ID_META_KEY", "MAX_MESSAGE_BYTES", "MCPConnection"]

#: Largest MCP message (one SSE event) accepted. mcp's default of 1 MiB turns an ordinary
#: large tool output (a log dump, a big query) into a failed call; 64 MiB accepts those
#: and still refuses a runaway one with a clear error. Rendering truncates what the agent
#: sees; the full text stays on the ToolResult.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

logger = logging.getLogger("fleetenv.mcp")

# Every tools/call carries a fresh id under this `_meta` key, so a server (our local one in
# particular) can prove that no logical call was executed twice.
CALL_ID_META_KEY = "fleetenv/call_id"

# JSON-RPC error codes the MCP client uses for transport conditions (mcp_types.jsonrpc).
_CONNECTION_CLOSED = -32000
_REQUEST_TIMEOUT = -32001
_INVALID_REQUEST = -32600
_INTERNAL_ERROR = -32603
# Messages the client gives an HTTP 404 on a request that carried a session id.
_SESSION_GONE_MESSAGES = frozenset({"Session not found", "Session terminated"})
# The client's stand-in for a non-JSON HTTP error response (e.g. a 502 from a gateway).
_HTTP_ERROR_MESSAGE = "Server returned an error response"

_MAX_LIST_PAGES = 1000
# Extra time the blocking API grants the loop beyond the in-loop timeouts (a backstop only).
_BACKSTOP_S = 10.0

# Connections with a live session in the current runtime; touched on the loop thread only.
_open: set[MCPConnection] = set()


class _NeverSent(Exception):
    """Internal: the request provably did not reach the tool, so it may be sent again."""


@dataclass(eq=False)
class _Live:
    """One established session and the signals of its owner task."""

    session: ClientSession
    stop: anyio.Event
    dead: anyio.Event
    raw_tools: list[Any]
    lost: bool = False
    error: BaseException | None = field(default=None, repr=False)

    @property
    def usable(self) -> bool:
        return not self.lost and not self.dead.is_set()


class MCPConnection:
    """A persistent session to one MCP endpoint (streamable HTTP).

    Blocking methods (`open`, `list_tools`, `call_tool`, `close`) may be called from any
    thread except the fleetenv loop thread; ``a``-prefixed coroutines are for code already
    running on the loop. The session opens on first use if `open` was not called. Use it
    as a context manager, or call `close`; open sessions are also closed at exit.

    ``headers`` (e.g. authorization) are sent with every request and never shown in
    reprs, logs or errors. ``connect_timeout`` bounds opening a session (TCP, handshake,
    first listing); ``call_timeout`` is the default bound of one request.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
        call_timeout: float = 60.0,
        list_attempts: int = 3,
        close_timeout: float = 5.0,
    ) -> None:
        self.url = url
        self._headers = dict(headers) if headers else None
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.list_attempts = max(1, list_attempts)
        self.close_timeout = close_timeout
        self._live: _Live | None = None
        self._lock: anyio.Lock | None = None
        self._generation: int | None = None
        self._closed = False
        self._tools: list[Tool] | None = None

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        elif self._live is None:
            state = "not open"
        else:
            state = "open" if self._live.usable else "lost"
        return f"MCPConnection({self.url!r}, {state})"

    # ------------------------------------------------------------------ blocking API

    def open(self) -> MCPConnection:
        """Open the session now (otherwise the first operation opens it)."""
        runtime.call(
            self.aopen, timeout=self.connect_timeout + _BACKSTOP_S, name=f"open {self.url}"
        )
        return self

    def list_tools(self, *, refresh: bool = False) -> list[Tool]:
        """The endpoint's tools (all pages). Cached from the open; ``refresh`` asks again."""
        bound = self.list_attempts * (self.connect_timeout + self.call_timeout) + _BACKSTOP_S
        return runtime.call(
            functools.partial(self.alist_tools, refresh=refresh),
            timeout=bound,
            name=f"list tools at {self.url}",
        )

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Call a tool and wait for its result (see the module docstring for failures)."""
        return runtime.call(
            functools.partial(self.acall_tool, name, arguments, timeout=timeout, meta=meta),
            timeout=self._call_bound(timeout),
            name=f"call {name} at {self.url}",
        )

    def call_tool_future(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future[ToolResult]:
        """Start a call and return its future at once; ``future.cancel()`` cancels the call."""
        return runtime.submit(
            functools.partial(self.acall_tool, name, arguments, timeout=timeout, meta=meta),
            name=f"call {name} at {self.url}",
        )

    def close(self) -> None:
        """Terminate the session (HTTP DELETE) and stop its owner task. Idempotent.

        In a forked child, closing a connection opened by the parent does nothing.
        """
        if self._closed or self._live is None:
            self._closed = True
            return
        if self._generation != runtime.generation():
            self._closed = True
            return
        runtime.call(self.aclose, timeout=self.close_timeout + _BACKSTOP_S, name="close")

    def __enter__(self) -> MCPConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ coroutine API

    async def aopen(self) -> None:
        """Open the session (on the loop). No-op when it is already open."""
        await self._ensure_live()

    async def alist_tools(self, *, refresh: bool = False) -> list[Tool]:
        """Coroutine twin of `list_tools`: reconnects (bounded) if the session was lost."""
        import anyio

        last_error: Exception | None = None
        live: _Live | None = None
        for attempt in range(self.list_attempts):
            if attempt:
                await anyio.sleep(_backoff(attempt))
            try:
                live, fresh = await self._ensure_live_fresh()
                if fresh or (not refresh and self._tools is not None):
                    assert self._tools is not None
                    return list(self._tools)
                raw = await _list_all(live.session)
            except ConnectError as exc:
                last_error = exc
                continue
            except Exception as exc:
                if live is None or not _session_lost(exc):
                    raise
                self._mark_lost(live, exc)
                last_error = exc
                continue
            self._tools = [Tool.from_mcp(tool, self.url) for tool in raw]
            return list(self._tools)
        raise ConnectError(
            f"listing tools failed after {self.list_attempts} attempts: {last_error}",
            endpoint=self.url,
            hint="check that the environment instance is still running",
        ) from last_error

    async def acall_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Coroutine twin of `call_tool`."""
        call_meta = {CALL_ID_META_KEY: uuid.uuid4().hex, **(meta or {})}
        args = dict(arguments) if arguments is not None else {}
        live = await self._ensure_live()  # a new session here is safe: nothing was sent yet
        try:
            return await self._send_call(live, name, args, timeout, call_meta)
        except _NeverSent as first:
            # The server answered HTTP 404 "session not found" (it restarted or expired the
            # session). Its session manager checks the session id before any request
            # reaches a handler, so the tool did not run: one send on a fresh session is
            # safe. The same call id goes along, so a server can still spot duplicates.
            self._mark_lost(live, first)
            live = await self._ensure_live()
            try:
                return await self._send_call(live, name, args, timeout, call_meta)
            except _NeverSent as second:
                self._mark_lost(live, second)
                raise ToolCallError(
                    f"tool call was rejected twice before it ran ({second})",
                    tool=name,
                    endpoint=self.url,
                    hint="the environment keeps dropping sessions; check that it is healthy",
                ) from second

    async def aclose(self) -> None:
        """Coroutine twin of `close`."""
        import anyio

        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        live, self._live = self._live, None
        if live is None or self._generation != runtime.generation():
            return
        live.stop.set()
        with anyio.move_on_after(self.close_timeout + 1.0):
            await live.dead.wait()

    # ------------------------------------------------------------------ internals

    def _call_bound(self, timeout: float | None) -> float:
        per_call = self.call_timeout if timeout is None else timeout
        # a lost session is replaced first (connect) and a 404'd call is sent twice
        return self.connect_timeout * 2 + per_call * 2 + _BACKSTOP_S

    def _check_usable(self) -> None:
        if self._generation is not None:
            runtime.check_generation(self._generation, f"MCP connection to {self.url}")
        if self._closed:
            raise FleetEnvError(
                "this MCP connection is closed",
                endpoint=self.url,
                hint="open a new MCPConnection",
            )

    async def _ensure_live(self) -> _Live:
        live, _ = await self._ensure_live_fresh()
        return live

    async def _ensure_live_fresh(self) -> tuple[_Live, bool]:
        """The current usable session (opening or replacing it if needed), and if it is new."""
        import anyio

        self._check_usable()
        live = self._live
        if live is not None and live.usable:
            return live, False
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            self._check_usable()
            live = self._live
            if live is not None and live.usable:
                return live, False
            if live is not None:
                live.stop.set()  # the old owner unwinds on its own, bounded by close_timeout
            self._live = None
            live = await runtime.start_service(self._own, name=f"mcp-session {self.url}")
            if self._closed:  # closed while we were connecting
                live.stop.set()
                self._check_usable()
            if self._generation is None:
                self._generation = runtime.generation()
            self._live = live
            self._tools = [Tool.from_mcp(tool, self.url) for tool in live.raw_tools]
            _open.add(self)
            runtime.add_shutdown_hook(_close_all_at_shutdown)
            return live, True

    def _mark_lost(self, live: _Live, reason: BaseException) -> None:
        if not live.lost:
            logger.info("MCP session lost at %s (%s); the next use reconnects", self.url, reason)
        live.lost = True

    async def _own(self, *, task_status: Any) -> None:
        """The owner task: enter the contexts, hand the session out, exit them on stop."""
        import anyio

        await _load_dependencies()
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        statuses: list[int] = []
        dead = anyio.Event()
        live: _Live | None = None
        try:
            # The timeout scope is outermost and disarmed once connected: a scope that
            # ends while task groups entered inside it are still open breaks anyio.
            with anyio.fail_after(self.connect_timeout) as scope:
                async with AsyncExitStack() as stack:
                    client = await http.connection_client(
                        headers=self._headers,
                        connect_timeout=self.connect_timeout,
                        read_timeout=max(300.0, self.call_timeout + 30.0),
                        on_response=statuses,
                    )
                    stack.push_async_callback(client.aclose)
                    read, write = await stack.enter_async_context(
                        streamable_http_client(self.url, http_client=client,
                                               max_sse_event_size=MAX_MESSAGE_BYTES)
                    )
                    session = await stack.enter_async_context(
                        ClientSession(read, write, read_timeout_seconds=self.call_timeout)
                    )
                    await session.initialize()
                    raw_tools = await _list_all(session)
                    scope.deadline = math.inf
                    live = _Live(
                        session=session, stop=anyio.Event(), dead=dead, raw_tools=raw_tools
                    )
                    task_status.started(live)
                    await live.stop.wait()
                    scope.deadline = anyio.current_time() + self.close_timeout
        except Exception as exc:
            if live is None:
                raise _connect_error(exc, self.url, statuses, self.connect_timeout) from exc
            live.error = exc
            live.lost = True
            logger.debug("MCP session owner for %s ended with %r", self.url, exc)
        finally:
            dead.set()

    async def _send_call(
        self,
        live: _Live,
        name: str,
        arguments: dict[str, Any],
        timeout: float | None,
        meta: dict[str, Any],
    ) -> ToolResult:
        import anyio
        from mcp import MCPError

        effective = self.call_timeout if timeout is None else timeout
        try:
            result = await live.session.call_tool(
                name, arguments, read_timeout_seconds=effective, meta=meta
            )
        except MCPError as exc:
            return self._call_failed(live, name, exc, effective)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            # The session's write stream was already closed: the request never left.
            raise _NeverSent(repr(exc)) from exc
        except RuntimeError as exc:
            text = str(exc)
            if "structured content" in text or "Invalid schema for tool" in text:
                # The tool ran, but its output does not match its declared output schema.
                return ToolResult.error(f"tool {name!r} returned invalid output: {text}")
            raise
        return ToolResult.from_mcp(result)

    def _call_failed(self, live: _Live, name: str, exc: Any, timeout: float) -> ToolResult:
        code, message = exc.code, exc.message
        if code == _REQUEST_TIMEOUT:
            raise DeadlineExceeded(
                f"tool call got no answer within {timeout:g} s",
                tool=name,
                endpoint=self.url,
                hint="the tool may still have run: check the environment state before "
                "calling it again, or pass a larger timeout",
            ) from exc
        if code == _INVALID_REQUEST and message in _SESSION_GONE_MESSAGES:
            raise _NeverSent(message) from exc
        http_failure = code == _INTERNAL_ERROR and message == _HTTP_ERROR_MESSAGE
        if code == _CONNECTION_CLOSED or http_failure:
            if code == _CONNECTION_CLOSED:
                self._mark_lost(live, exc)
            raise ToolCallMayHaveRunError(
                f"tool call failed after it may have reached the server ({message})",
                tool=name,
                endpoint=self.url,
            ) from exc
        return ToolResult.error(f"MCP error {code} from the server: {message}")


_dependencies_loaded = False


class _QuietEndedSessions(logging.Filter):
    """Drops mcp's warning when the DELETE that ends a session answers 404 or 410.

    That answer means the server already ended the session (the instance was deleted or
    expired, or the server forgot it): the outcome the DELETE asked for. Closing the
    sessions of a finished episode hits it routinely; other failures still warn.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not message.startswith(("Session termination failed: 404",
                                       "Session termination failed: 410"))


def _import_dependencies() -> None:
    global _dependencies_loaded
    import httpx2  # noqa: F401
    import jsonschema.validators  # noqa: F401 - mcp imports it lazily to check tool output
    import mcp.client.streamable_http
    import mcp.types
    import referencing.exceptions  # noqa: F401 - likewise

    transport_logger = logging.getLogger(mcp.client.streamable_http.__name__)
    if not any(isinstance(f, _QuietEndedSessions) for f in transport_logger.filters):
        transport_logger.addFilter(_QuietEndedSessions())
    _dependencies_loaded = True


_loading: Any = None  # the asyncio future of the import in progress (loop thread only)


async def _load_dependencies() -> None:
    """Import mcp, httpx2 and what mcp imports lazily (about half a second of CPU) in a
    short-lived thread: an import on the loop thread would stall every other session.
    Concurrent first connections share that one import."""
    import asyncio

    global _loading
    if _dependencies_loaded:
        return
    if _loading is None or _loading.get_loop() is not asyncio.get_running_loop():
        _loading = asyncio.ensure_future(
            runtime.in_short_thread(_import_dependencies, name="fleetenv-import"))
    await asyncio.shield(_loading)


def _backoff(attempt: int) -> float:
    """Jittered exponential backoff: ~0.1 s, ~0.2 s, ~0.4 s ... capped at 2 s."""
    return min(2.0, 0.1 * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


async def _list_all(session: ClientSession) -> list[Any]:
    """All tools, following ``nextCursor`` (ClientSession.list_tools returns one page)."""
    from mcp.types import PaginatedRequestParams

    tools: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(_MAX_LIST_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor or cursor in seen:
            return tools
        seen.add(cursor)
    return tools


def _session_lost(exc: BaseException) -> bool:
    """Does ``exc`` say the session is gone (so a read-only request may be retried)?"""
    import anyio
    from mcp import MCPError

    leaf = runtime.unwrap_group(exc)
    if isinstance(leaf, MCPError):
        if leaf.code == _CONNECTION_CLOSED:
            return True
        return leaf.code == _INVALID_REQUEST and leaf.message in _SESSION_GONE_MESSAGES
    return isinstance(leaf, (anyio.ClosedResourceError, anyio.BrokenResourceError))


def _connect_error(
    exc: BaseException, url: str, statuses: list[int], timeout: float
) -> BaseException:
    """Turn a failure to open a session into a `ConnectError` naming the endpoint."""
    import anyio
    import httpx2
    from mcp import MCPError

    leaf = runtime.unwrap_group(exc)
    status = statuses[0] if statuses else None
    if isinstance(leaf, TimeoutError):
        return ConnectError(
            f"no MCP session within {timeout:g} s",
            endpoint=url,
            hint="the environment may still be starting or overloaded; retry later or "
            "raise connect_timeout",
        )
    if status in (404, 405):
        return ConnectError(
            f"no MCP server at this URL (HTTP {status})",
            endpoint=url,
            http_status=status,
            hint="check the URL path (e.g. '/mcp' vs '/api/v1/mcp')",
        )
    if status in (401, 403):
        return ConnectError(
            f"the MCP server refused the credentials (HTTP {status})",
            endpoint=url,
            http_status=status,
            hint="check the API key or token configured for this endpoint",
        )
    if isinstance(leaf, httpx2.HTTPError | OSError):
        return ConnectError(
            f"cannot connect to the MCP server: {type(leaf).__name__}: {leaf}",
            endpoint=url,
            hint="check that the environment instance is running and the URL is right",
        )
    if isinstance(leaf, MCPError):
        return ConnectError(
            f"the MCP handshake failed: error {leaf.code}: {leaf.message}",
            endpoint=url,
            http_status=status,
            hint="check that the URL is an MCP streamable-HTTP endpoint",
        )
    if isinstance(leaf, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        return ConnectError(
            f"the MCP connection closed during the handshake ({type(leaf).__name__})",
            endpoint=url,
            http_status=status,
            hint="check that the environment instance is running",
        )
    return leaf  # not a connection problem: a bug, let it surface as itself


# ---------------------------------------------------------------------- shutdown


def _close_all_at_shutdown() -> None:
    """Shutdown hook: close every open session of this runtime (and with it its pool)."""
    current = runtime.generation()
    if not any(c._generation == current for c in list(_open)):
        return  # nothing of this process to close; do not start a loop just for that
    runtime.call(_aclose_all, timeout=_BACKSTOP_S * 2, name="close MCP sessions")


async def _aclose_all() -> None:
    import anyio

    async with anyio.create_task_group() as group:
        for connection in list(_open):
            group.start_soon(_aclose_quietly, connection)


async def _aclose_quietly(connection: MCPConnection) -> None:
    try:
        await connection.aclose()
    except Exception as exc:
        logger.warning("closing %r at shutdown failed: %s", connection, exc)
