"""`MCPConnection`: one persistent streamable-HTTP MCP session, usable from any thread.

The session is owned by ONE long-lived task on the fleetenv loop (`_own`): it enters the
transport and ``ClientSession`` contexts, hands the session out, waits for a stop signal
and exits the contexts itself, since anyio requires a cancel scope to be exited by the
task that entered it. Every operation is a short task on the shared session (JSON-RPC
ids multiplex concurrent callers) with one deadline, enforced here on the loop. What is
retried and what is never replayed: docs/mcp.md ("What is retried"); what each failure
means: `fleetenv.mcp.failures`.

``mcp`` and ``httpx2`` are imported on first use, never at ``import fleetenv``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fleetenv import runtime
from fleetenv.core.errors import FleetEnvError, ToolCallError
from fleetenv.core.retry import Deadline, RetryPolicy
from fleetenv.core.tool_results import ResourceBlock, ToolResult
from fleetenv.mcp import compat, failures, http, notifications, resources
from fleetenv.mcp.arguments import require_object
from fleetenv.mcp.http import CALL_ID_META_KEY
from fleetenv.mcp.notifications import NotificationCallback
from fleetenv.mcp.resources import Resource, ResourceTemplate
from fleetenv.mcp.tools import Tool
from fleetenv.runtime import on_fleetenv_loop

if TYPE_CHECKING:
    import anyio
    from mcp import ClientSession
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.types import RequestParamsMeta

__all__ = ["CALL_ID_META_KEY", "MAX_MESSAGE_BYTES", "MCPConnection"]

#: Largest MCP message (one SSE event, or one JSON reply) accepted. mcp's default of 1 MiB
#: turns an ordinary large tool output (a log dump, a big query) into a failed call; 64 MiB
#: accepts those and still refuses a runaway one with a clear error. Rendering truncates
#: what the agent sees; the full text stays on the ToolResult.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

logger = logging.getLogger("fleetenv.mcp")

_T = TypeVar("_T")

# Session setup retries when the caller gives no policy. A server that is still starting
# (its gateway answers 502/503, the port refuses) usually needs well under a second
# more: a first pause of 0.05-0.1 s catches that, doubling to at most 2 s. The budget is
# the connect timeout, so `connect_timeout_s` keeps meaning "how long opening may take,
# retries included"; three attempts keep a dead endpoint's error fast (about 0.3 s of
# pauses). The session layer, which knows an instance has just booted, passes its own.
_SETUP_RETRY_BASE_S = 0.1
_SETUP_RETRY_CAP_S = 2.0
_SETUP_ATTEMPTS = 3

# Connections with a live session in the current runtime; touched on the loop thread only.
_open: set[MCPConnection] = set()


@dataclass(eq=False)
class _Live:
    """One established session and the signals of its owner task."""

    session: ClientSession
    stop: anyio.Event
    dead: anyio.Event
    raw_tools: list[Any]  # as listed at setup; emptied once converted (not kept alive)
    lost: bool = False
    # what the HTTP layer saw: set when the server said it no longer knows the session
    watch: failures.SessionWatch = field(default_factory=failures.SessionWatch)

    @property
    def usable(self) -> bool:
        return not self.lost and not self.dead.is_set() and self.watch.gone is None


class MCPConnection:
    """A persistent session to one MCP endpoint (streamable HTTP).

    Blocking methods (`open`, `list_tools`, `call_tool`, `close`) may be called from any
    thread except the fleetenv loop thread; ``a``-prefixed coroutines may be awaited on
    any event loop (the caller's asyncio or trio loop, or the fleetenv loop): the work
    always runs on the fleetenv loop. The session opens on first use if `open` was not
    called. Use it
    as a context manager, or call `close`; open sessions are also closed at exit.

    ``headers`` (e.g. authorization) are sent with every request and never shown in
    reprs, logs or errors. ``connect_timeout_s`` bounds one attempt at opening a session
    (TCP, handshake, first listing); ``retry`` paces the attempts and bounds them all
    (default: up to 3 attempts within ``connect_timeout_s``). ``call_timeout_s`` is the
    default bound of one tool call, ``read_timeout_s`` of one listing or resource read;
    ``list_attempts`` how often listing is tried when the session is lost meanwhile;
    ``close_timeout_s`` bounds ending the session.

    ``on_notification`` receives what the server sends unasked (`fleetenv.mcp.
    notifications`): tool list changes, log messages, and the progress of calls made
    while it is set. It runs on the loop thread: keep it cheap, it must not block. A
    tool list change also bumps ``tools_version``, and the next `list_tools` lists again.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        call_timeout_s: float = 60.0,
        read_timeout_s: float = 60.0,
        list_attempts: int = 3,
        close_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
        on_notification: NotificationCallback | None = None,
    ) -> None:
        self.url = url
        self._headers = dict(headers) if headers else None
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self.read_timeout_s = read_timeout_s
        self.list_attempts = max(1, list_attempts)
        self.close_timeout_s = close_timeout_s
        self.retry = retry or RetryPolicy(
            base_s=_SETUP_RETRY_BASE_S,
            cap_s=_SETUP_RETRY_CAP_S,
            budget_s=connect_timeout_s,
            max_attempts=_SETUP_ATTEMPTS,
        )
        self._live: _Live | None = None
        self._lock: anyio.Lock | None = None
        self._generation: int | None = None
        self._closed = False
        self._tools: list[Tool] | None = None
        self.on_notification = on_notification
        #: +1 each time the server says its tools changed; `_listed_version` is the value
        #: the cached list was fetched at (a mismatch makes the next listing ask again).
        self.tools_version = 0
        self._listed_version = 0

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
        runtime.current().call(self.aopen, name=f"open {self.url}")
        return self

    def list_tools(self, *, refresh: bool = False) -> list[Tool]:
        """The endpoint's tools (all pages). Cached from the open; ``refresh`` asks again."""
        return runtime.current().call(functools.partial(self.alist_tools, refresh=refresh),
                                      name=f"list tools at {self.url}")

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Call a tool and wait for its result (failures: docs/mcp.md, "What is retried")."""
        return runtime.current().call(
            functools.partial(self.acall_tool, name, arguments, timeout_s=timeout_s, meta=meta),
            name=f"call {name} at {self.url}",
        )

    def call_tool_future(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future[ToolResult]:
        """Start a call and return its future at once; ``future.cancel()`` cancels the call."""
        return runtime.current().submit(
            functools.partial(self.acall_tool, name, arguments, timeout_s=timeout_s, meta=meta),
            name=f"call {name} at {self.url}",
        )

    def list_resources(self) -> list[Resource]:
        """The endpoint's resources (all pages; ``[]`` if it serves none)."""
        return runtime.current().call(self.alist_resources,
                                      name=f"list resources at {self.url}")

    def list_resource_templates(self) -> list[ResourceTemplate]:
        """The endpoint's resource templates (all pages; ``[]`` if it serves none)."""
        return runtime.current().call(self.alist_resource_templates,
                                      name=f"list resource templates at {self.url}")

    def read_resource(self, uri: str) -> tuple[ResourceBlock, ...]:
        """The contents of resource ``uri`` (one `ResourceBlock` per item the server sent).

        Raises `fleetenv.mcp.resources.ResourceError` when the server answers with an
        error (e.g. no such resource), `DeadlineExceeded` after ``read_timeout_s``.
        """
        return runtime.current().call(functools.partial(self.aread_resource, uri),
                                      name=f"read {uri} at {self.url}")

    def close(self) -> None:
        """Terminate the session (HTTP DELETE) and stop its owner task. Idempotent.

        In a forked child, closing a connection opened by the parent does nothing.
        """
        if (self._closed or self._live is None
                or self._generation != runtime.current().generation):
            self._closed = True
            return
        runtime.current().call(self.aclose, name="close")

    def __enter__(self) -> MCPConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ coroutine API

    @on_fleetenv_loop
    async def aopen(self) -> None:
        """Open the session (on the loop). No-op when it is already open."""
        await self._ensure_live()

    @on_fleetenv_loop
    async def alist_tools(self, *, refresh: bool = False) -> list[Tool]:
        """Coroutine twin of `list_tools`: reconnects (bounded) if the session was lost."""

        async def listing(live: _Live, fresh: bool) -> list[Tool]:
            changed = self._listed_version != self.tools_version  # list_changed came
            if not changed and (fresh or (not refresh and self._tools is not None)):
                assert self._tools is not None
                return list(self._tools)
            version = self.tools_version
            raw = await resources.list_pages(live.session.list_tools, "tools")
            self._tools = [Tool.from_mcp(tool, self.url) for tool in raw]
            self._listed_version = version
            return list(self._tools)

        return await self._aread_only("listing tools", listing, functools.partial(
            failures.listing_failed, what="listing tools", endpoint=self.url,
            timeout_s=self.read_timeout_s))

    @on_fleetenv_loop
    async def acall_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Coroutine twin of `call_tool`. Never retried, except as described below."""
        call_meta = {CALL_ID_META_KEY: uuid.uuid4().hex, **(meta or {})}
        args = require_object(name, arguments)  # never a list of pairs made into a dict
        live, _ = await self._ensure_live()  # a new session here is safe: nothing was sent yet
        try:
            return await self._send_call(live, name, args, timeout_s, call_meta)
        except failures.NeverSent as first:
            # Turned away before it ran (failures.session_gone_answer): one send on a fresh
            # session is safe. The same call id goes along, so a server can spot duplicates.
            self._mark_lost(live, first)
            live, _ = await self._ensure_live()
            try:
                return await self._send_call(live, name, args, timeout_s, call_meta)
            except failures.NeverSent as second:
                self._mark_lost(live, second)
                raise ToolCallError(
                    f"tool call was rejected twice before it ran ({second})",
                    tool=name,
                    endpoint=self.url,
                    hint="the environment keeps dropping sessions; check that it is healthy",
                ) from second

    @on_fleetenv_loop
    async def aclose(self) -> None:
        """Coroutine twin of `close`."""
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        live, self._live = self._live, None
        if live is None or self._generation != runtime.current().generation:
            return
        live.stop.set()
        await live.dead.wait()  # the owner's unwinding is bounded by close_timeout_s

    @on_fleetenv_loop
    async def alist_resources(self) -> list[Resource]:
        """Coroutine twin of `list_resources` (reconnects, bounded, if the session was lost)."""
        doing = "listing resources"
        return await self._aread_only(
            doing, lambda live, _: resources.list_all_resources(live.session, self.url),
            functools.partial(self._resource_failed, doing=doing, listing=True))

    @on_fleetenv_loop
    async def alist_resource_templates(self) -> list[ResourceTemplate]:
        """Coroutine twin of `list_resource_templates`."""
        doing = "listing resource templates"
        return await self._aread_only(
            doing, lambda live, _: resources.list_all_resource_templates(live.session, self.url),
            functools.partial(self._resource_failed, doing=doing, listing=True))

    @on_fleetenv_loop
    async def aread_resource(self, uri: str) -> tuple[ResourceBlock, ...]:
        """Coroutine twin of `read_resource`."""
        if not isinstance(uri, str) or not uri:
            raise TypeError(f"read_resource needs a resource URI string, got {uri!r}; "
                            "list_resources() shows the URIs this endpoint serves")
        doing = f"reading {uri}"
        return await self._aread_only(
            doing, lambda live, _: resources.read_contents(live.session, uri),
            functools.partial(self._resource_failed, doing=doing, uri=uri))

    # ------------------------------------------------------------------ session ownership

    def _check_usable(self) -> None:
        if self._generation is not None:
            runtime.current().check_generation(self._generation, f"MCP connection to {self.url}")
        if self._closed:
            raise FleetEnvError(
                "this MCP connection is closed",
                endpoint=self.url,
                hint="open a new MCPConnection",
            )

    async def _ensure_live(self) -> tuple[_Live, bool]:
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
                live.stop.set()  # the old owner unwinds on its own, bounded by close_timeout_s
            self._live = None
            live = await self._start_session()
            if self._closed:  # closed while we were connecting
                live.stop.set()
                self._check_usable()
            if self._generation is None:
                self._generation = runtime.current().generation
            self._live = live
            self._tools = [Tool.from_mcp(tool, self.url) for tool in live.raw_tools]
            live.raw_tools = []
            _open.add(self)
            runtime.add_shutdown_hook(_close_all_at_shutdown)
            return live, True

    async def _start_session(self) -> _Live:
        """Start an owner task and get its session, retrying under `retry` what a
        starting server explains (see `failures.connect_error`)."""
        deadline = self.retry.deadline()
        # Setups queue for a process-wide slot (http.handshake_slot). The queue never
        # counts against an attempt's connect timeout; with a queue budget (an episode's
        # open) it does not count against the whole budget either, only against its own.
        queue = (Deadline(self.retry.queue_budget_s)
                 if self.retry.queue_budget_s is not None else None)
        cut_short = False  # the last attempt had less than a connect timeout left
        earlier: Exception | None = None  # the failure before the last one

        async def attempt() -> _Live:
            nonlocal cut_short
            self._check_usable()  # closed during a pause: stop here
            queued_from = time.monotonic()
            async with http.handshake_slot(self.url, queue or deadline):
                if queue is not None:
                    deadline.extend(time.monotonic() - queued_from, limit=queue)
                self._check_usable()
                timeout_s = deadline.cap(self.connect_timeout_s)
                cut_short = timeout_s < self.connect_timeout_s
                live: _Live = await runtime.current().start_service(
                    self._own, timeout_s, name=f"mcp-session {self.url}"
                )
            return live

        def retrying(failed: int, delay_s: float, exc: Exception) -> None:
            nonlocal earlier
            earlier = exc
            logger.info("opening an MCP session at %s failed (%s); attempt %d in %.2f s",
                        self.url, exc, failed + 1, delay_s)

        def give_up(last: Exception, attempts: int) -> Exception:
            # A last attempt that the budget cut short and that got no answer says nothing
            # about the server; the failure before it does (a 503 while it starts, say).
            unanswered = not (isinstance(last, FleetEnvError)
                              and last.context.get("http_status"))
            shown = earlier if cut_short and unanswered and earlier is not None else last
            return failures.gave_up("opening the MCP session", shown, attempts,
                                    endpoint=self.url)

        return await self.retry.acall(
            attempt, deadline=deadline, on_retry=retrying, give_up=give_up)

    async def _own(self, timeout_s: float, *, task_status: Any) -> None:
        """The owner task: enter the contexts, hand the session out, exit them on stop."""
        import anyio

        await _load_dependencies()
        from mcp import ClientSession

        statuses: list[int] = []
        watch = failures.SessionWatch()
        dead = anyio.Event()
        live: _Live | None = None
        try:
            # The timeout scope is outermost and disarmed once connected: a scope that
            # ends while task groups entered inside it are still open breaks anyio.
            with anyio.fail_after(timeout_s) as scope:
                async with AsyncExitStack() as stack:
                    # The HTTP read timeout is the transport's bound on a silent stream
                    # (the session's GET stream), set above every deadline of a request
                    # so that it never cuts one short: not a second timer of a call.
                    client = await http.connection_client(
                        headers=self._headers,
                        connect_timeout_s=timeout_s,
                        read_timeout_s=max(300.0, self.call_timeout_s, self.read_timeout_s),
                        on_response=statuses,
                        watch=watch,
                        max_reply_bytes=_reply_limit(),
                    )
                    stack.push_async_callback(client.aclose)
                    read, write = await stack.enter_async_context(
                        compat.streamable_http_client(self.url, http_client=client,
                                                      max_message_bytes=MAX_MESSAGE_BYTES)
                    )
                    session = await stack.enter_async_context(
                        ClientSession(read, write, message_handler=self._on_message)
                    )
                    await session.initialize()
                    raw_tools = await resources.list_pages(session.list_tools, "tools")
                    scope.deadline = math.inf
                    live = _Live(
                        session=session, stop=anyio.Event(), dead=dead, raw_tools=raw_tools,
                        watch=watch,
                    )
                    del raw_tools  # held by `live` until converted, not by this frame
                    task_status.started(live)
                    await live.stop.wait()
                    scope.deadline = anyio.current_time() + self.close_timeout_s
        except Exception as exc:
            if live is None:
                raise failures.connect_error(
                    exc, endpoint=self.url, statuses=statuses, timeout_s=timeout_s
                ) from exc
            live.lost = True
            logger.debug("MCP session owner for %s ended with %r", self.url, exc)
        finally:
            dead.set()

    def _mark_lost(self, live: _Live, reason: BaseException | str) -> None:
        if not live.lost:
            logger.info("MCP session lost at %s (%s); the next use reconnects", self.url, reason)
        live.lost = True

    # ------------------------------------------------------------------ one call

    async def _send_call(
        self,
        live: _Live,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float | None,
        meta: dict[str, Any],
    ) -> ToolResult:
        import anyio

        effective = self.call_timeout_s if timeout_s is None else timeout_s
        # A progress token only when someone listens: it costs the server a notification
        # per step, and the plain call stays the fast path.
        on_progress = (None if self.on_notification is None else
                       notifications.progress_relay(self.on_notification, self.url, name))
        try:
            # The call's one deadline: cancelling the request at it tells the server
            # (notifications/cancelled), and the session survives.
            with anyio.fail_after(effective):
                result = await live.session.call_tool(
                    name,
                    arguments,
                    progress_callback=cast("ProgressFnT | None", on_progress),
                    meta=cast("RequestParamsMeta", meta),  # an open map: any JSON keys
                )
        except Exception as exc:
            turned_away = live.watch.turned_away(meta.get(CALL_ID_META_KEY))
            if turned_away is not None:
                # The server refused this very request because it no longer knows the
                # session (status and body, see failures.session_gone_answer): not run.
                self._mark_lost(live, turned_away)
                raise failures.NeverSent(turned_away) from exc
            if failures.session_lost(exc) or live.watch.gone is not None:
                self._mark_lost(live, live.watch.gone or exc)
            return failures.call_failed(exc, tool=name, endpoint=self.url, timeout_s=effective)
        return ToolResult.from_mcp(result)

    # ------------------------------------------------------------------ resources, notifications

    async def _aread_only(
        self,
        doing: str,
        request: Callable[[_Live, bool], Awaitable[_T]],
        failed: Callable[[Exception], _T],
    ) -> _T:
        """Run a read-only ``request`` (given the session and whether it is new), bounded by
        ``read_timeout_s``; ``failed`` answers or raises for an error other than a lost session.

        A lost session is replaced and the request repeated (bounded, paced as setup),
        since reading twice has no effect.
        """
        import anyio

        async def attempt() -> _T:
            live, fresh = await self._ensure_live()
            try:
                with anyio.fail_after(self.read_timeout_s):
                    return await request(live, fresh)
            except Exception as exc:
                if failures.session_lost(exc) or live.watch.gone is not None:
                    self._mark_lost(live, live.watch.gone or exc)  # the next attempt reconnects
                    raise failures.SessionGone(live.watch.gone or repr(exc)) from exc
                return failed(exc)

        # Each attempt is bounded by the setup budget and read_timeout_s, so only the
        # number of attempts needs a limit. Setup failures are not retried here again:
        # the setup policy already did.
        policy = self.retry.with_budget(None, max_attempts=self.list_attempts)
        return await policy.acall(
            attempt,
            retryable=lambda exc: isinstance(exc, failures.SessionGone),
            give_up=lambda last, attempts: failures.gave_up(doing, last, attempts,
                                                            endpoint=self.url),
        )

    def _resource_failed(self, exc: Exception, doing: str, *, uri: str | None = None,
                         listing: bool = False) -> Any:
        """A listing's ``[]`` when the server does not implement the method at all; else
        the error of a resource request (`resources.request_failed`)."""
        if listing and resources.is_not_implemented(exc):
            return []
        resources.request_failed(exc, doing=doing, endpoint=self.url,
                                 timeout_s=self.read_timeout_s, uri=uri)

    async def _on_message(self, message: Any) -> None:
        """The session's ``message_handler``: server notifications (and transport
        exceptions, which the session's own requests report; ignored here)."""
        if isinstance(message, Exception):
            logger.debug("MCP transport at %s reported %r", self.url, message)
            return
        notification = notifications.from_server(message, self.url)
        if notification is None:
            return
        if isinstance(notification, notifications.ToolsListChanged):
            self.tools_version += 1  # the cached list is stale from now on
        if self.on_notification is not None:
            notifications.deliver(self.on_notification, notification)


def _reply_limit() -> int:
    """The cap of one JSON reply: the SSE message limit of the installed mcp (never none)."""
    limit = compat.effective_message_limit(MAX_MESSAGE_BYTES)
    return MAX_MESSAGE_BYTES if limit is None else limit


# ---------------------------------------------------------------------- dependencies

_dependencies_loaded = False
_loading: Any = None  # the asyncio future of the import in progress (loop thread only)


def _import_dependencies() -> None:
    global _dependencies_loaded
    compat.features()  # which mcp 2.x (a clear error on 1.x), detected here, off the loop
    import httpx2  # noqa: F401  # imported here, off the loop, like the rest
    import mcp.client.streamable_http
    import mcp.types

    # mcp imports these lazily to check tool output; load them here, off the loop.
    importlib.import_module("jsonschema.validators")
    importlib.import_module("referencing.exceptions")
    failures.QuietEndedSessions.install(logging.getLogger(mcp.client.streamable_http.__name__))
    _dependencies_loaded = True


async def _load_dependencies() -> None:
    """Import mcp, httpx2 and what mcp imports lazily (about half a second of CPU) on
    the runtime's pool: an import on the loop thread would stall every other session.
    Concurrent first connections share that one import."""
    import asyncio

    global _loading
    if _dependencies_loaded:
        return
    if _loading is None or _loading.get_loop() is not asyncio.get_running_loop():
        _loading = asyncio.ensure_future(runtime.current().run_blocking(_import_dependencies))
    await asyncio.shield(_loading)


# ---------------------------------------------------------------------- shutdown


def _close_all_at_shutdown() -> None:
    """Shutdown hook: close every open session of this runtime (and with it its pool)."""
    current = runtime.current().generation
    if not any(c._generation == current for c in list(_open)):
        return  # nothing of this process to close; do not start a loop just for that
    runtime.current().call(_aclose_all, name="close MCP sessions")


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
