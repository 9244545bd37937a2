"""`ToolRouter`: the tools of one episode, gathered from its MCP endpoints, and call routing.

Each tool name goes to the FIRST endpoint (in the given order) that lists it; a fallback
endpoint is opened only when the endpoints before it serve no tool; a required endpoint
that fails is an error naming it, an optional one that is absent (404/405) is skipped.
The endpoints of each modality and why: docs/mcp.md ("ToolRouter").
"""

from __future__ import annotations

import concurrent.futures
import difflib
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetenv import runtime
from fleetenv.core.errors import ConfigurationError, ConnectError, FleetEnvError, ToolNotFoundError
from fleetenv.core.retry import RetryPolicy
from fleetenv.core.tool_results import ResourceBlock, ToolResult
from fleetenv.mcp.arguments import require_object
from fleetenv.mcp.connection import MCPConnection
from fleetenv.mcp.notifications import NotificationCallback
from fleetenv.mcp.resources import Resource, ResourceError, ResourceTemplate
from fleetenv.mcp.tools import Tool
from fleetenv.runtime import on_fleetenv_loop

if TYPE_CHECKING:
    import anyio

__all__ = ["MODALITIES", "Endpoint", "ToolRouter", "endpoints_for"]

MODALITIES = ("tool_use", "computer_use", "browser_use")

logger = logging.getLogger("fleetenv.mcp")


@dataclass(frozen=True)
class Endpoint:
    """One MCP endpoint of an episode. ``headers`` (auth) are never shown in reprs.

    A ``fallback`` endpoint is opened only if no endpoint before it serves a tool. A
    required endpoint that is absent (404/405) is no error when a fallback or optional
    endpoint serves tools.
    """

    url: str
    required: bool = True
    headers: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    fallback: bool = False


def endpoints_for(
    root: str,
    modality: str,
    browser_mcp_url: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    union: bool = False,
) -> list[Endpoint]:
    """The endpoints an episode of ``modality`` uses on an instance whose base URL is ``root``.

    ``tool_use``: ``{root}mcp`` (required), then ``{root}api/v1/mcp`` as its fallback
    (opened only when ``{root}mcp`` serves no tool: some images serve their tools there;
    elsewhere it serves only ``computer``, which a tool-use episode does not offer). With
    ``union``, ``{root}api/v1/mcp`` is opened with ``{root}mcp`` and its tools are added
    (it may be absent; ``{root}mcp`` too, when it serves tools).
    ``computer_use``: ``{root}api/v1/mcp``. ``browser_use``: the browser
    lease's MCP URL, which must be given. ``headers`` (the instance's credentials) go only
    to endpoints under ``root``: a lease elsewhere has its own credential, and the Fleet
    API key must not travel to another host.
    """
    base = root if root.endswith("/") else root + "/"
    if modality == "tool_use":
        return [
            Endpoint(f"{base}mcp", required=True, headers=headers),
            Endpoint(f"{base}api/v1/mcp", required=False, headers=headers, fallback=not union),
        ]
    if modality == "computer_use":
        return [Endpoint(f"{base}api/v1/mcp", required=True, headers=headers)]
    if modality == "browser_use":
        if not browser_mcp_url:
            raise ConfigurationError(
                "browser_use needs the browser lease's MCP URL",
                hint="pass browser_mcp_url",
            )
        own = browser_mcp_url.startswith(base)
        return [Endpoint(browser_mcp_url, required=True, headers=headers if own else None)]
    raise ConfigurationError(
        f"unknown modality {modality!r}", hint=f"use one of {', '.join(MODALITIES)}"
    )


def _is_absent(error: Exception) -> bool:
    return isinstance(error, ConnectError) and error.context.get("http_status") in {"404", "405"}


class ToolRouter:
    """Routes tool calls by name to the endpoint that owns the tool.

    Blocking methods may be called from any thread but the fleetenv loop; ``a``-prefixed
    coroutines may be awaited on any event loop. Opens on first use; `close` closes every
    connection (also on context-manager exit). ``connect_timeout_s``, ``call_timeout_s``,
    ``read_timeout_s`` and ``retry`` (session setup) go to every `MCPConnection` (each
    operation's one deadline is enforced there), and so does
    ``on_notification`` (each notification names its endpoint). When a server says its
    tools changed, ``tools_version`` goes up and `refresh_tools` routes the new list.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        connect_timeout_s: float = 10.0,
        call_timeout_s: float = 60.0,
        read_timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        on_notification: NotificationCallback | None = None,
    ) -> None:
        if not endpoints:
            raise ConfigurationError("a ToolRouter needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self._connections: dict[str, MCPConnection] = {
            endpoint.url: MCPConnection(
                endpoint.url,
                headers=endpoint.headers,
                connect_timeout_s=connect_timeout_s,
                call_timeout_s=call_timeout_s,
                read_timeout_s=read_timeout_s,
                retry=retry,
                on_notification=on_notification,
            )
            for endpoint in self.endpoints
        }
        self._tools: list[Tool] | None = None
        self._owners: dict[str, MCPConnection] = {}
        self._skipped: list[str] = []
        self._unused: list[str] = []
        self._lock: anyio.Lock | None = None

    def __repr__(self) -> str:
        urls = ", ".join(endpoint.url for endpoint in self.endpoints)
        return f"ToolRouter([{urls}])"

    # ------------------------------------------------------------------ views

    @property
    def tools(self) -> list[Tool]:
        """Every routable tool, in endpoint order (available after `open`)."""
        if self._tools is None:
            raise FleetEnvError(
                "the tool router is not open yet", hint="call open() (or list_tools()) first"
            )
        return list(self._tools)

    @property
    def skipped_endpoints(self) -> list[str]:
        """Endpoints that turned out not to exist (HTTP 404/405): optional ones, and
        required ones whose fallback served the tools instead."""
        return list(self._skipped)

    @property
    def unused_endpoints(self) -> list[str]:
        """Fallback endpoints that were not opened: an endpoint before them served tools
        (or failed otherwise than by being absent, and that failure is the open's error)."""
        return list(self._unused)

    def openai_tools(self) -> list[dict[str, Any]]:
        """`tools` in OpenAI function format."""
        return [tool.openai() for tool in self.tools]

    def endpoint_of(self, name: str) -> str:
        """The URL of the endpoint that serves tool ``name``."""
        return self._owner(name).url

    @property
    def tools_version(self) -> int:
        """Grows each time an endpoint says its tool list changed (see `refresh_tools`)."""
        return sum(connection.tools_version for connection in self._connections.values())

    # ------------------------------------------------------------------ blocking API

    def open(self) -> ToolRouter:
        """Open every endpoint and build the routing table."""
        runtime.current().call(self.aopen, name="open tool router")
        return self

    def list_tools(self) -> list[Tool]:
        """Open if needed, then return `tools`."""
        self.open()
        return self.tools

    def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Call tool ``name`` on the endpoint that owns it."""
        arguments = require_object(name, arguments)  # ToolArgumentsError, in the caller
        return runtime.current().call(
            functools.partial(self.acall, name, arguments, timeout_s=timeout_s, meta=meta),
            name=f"call {name}",
        )

    def call_future(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future[ToolResult]:
        """Start a call and return its future at once."""
        arguments = require_object(name, arguments)  # ToolArgumentsError, in the caller
        return runtime.current().submit(
            functools.partial(self.acall, name, arguments, timeout_s=timeout_s, meta=meta),
            name=f"call {name}",
        )

    def refresh_tools(self, *, force: bool = False) -> list[Tool]:
        """List again the endpoints whose tools changed (every endpoint if ``force``) and
        route the new lists; returns `tools`."""
        return runtime.current().call(functools.partial(self.arefresh_tools, force=force),
                                      name="refresh tools")

    def list_resources(self) -> list[Resource]:
        """The resources of every endpoint, in endpoint order (each names its endpoint)."""
        return runtime.current().call(self.alist_resources, name="list resources")

    def list_resource_templates(self) -> list[ResourceTemplate]:
        """The resource templates of every endpoint, in endpoint order."""
        return runtime.current().call(self.alist_resource_templates,
                                      name="list resource templates")

    def read_resource(self, uri: str, *, endpoint: str | None = None) -> tuple[ResourceBlock, ...]:
        """Read ``uri`` from ``endpoint``, or else from the first endpoint that serves it."""
        return runtime.current().call(
            functools.partial(self.aread_resource, uri, endpoint=endpoint), name=f"read {uri}")

    def close(self) -> None:
        """Close every connection. Idempotent."""
        for connection in self._connections.values():
            connection.close()

    def __enter__(self) -> ToolRouter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ coroutine API

    @on_fleetenv_loop
    async def aopen(self) -> None:
        """Coroutine twin of `open`: endpoints are opened concurrently."""
        import anyio

        if self._tools is not None:
            return
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._tools is not None:
                return
            outcomes: dict[str, Exception | None] = {}

            async def open_one(connection: MCPConnection) -> None:
                try:
                    await connection.aopen()
                    outcomes[connection.url] = None
                except Exception as exc:  # judged below, per endpoint
                    outcomes[connection.url] = exc

            # Endpoints open concurrently, in waves: each fallback waits for the result
            # of the endpoints before it, and is opened only if none of them has tools
            # and none failed for another reason than being absent (404/405).
            wave: list[Endpoint] = []
            self._unused = []
            for endpoint in [*self.endpoints, None]:
                if endpoint is not None and not endpoint.fallback:
                    wave.append(endpoint)
                    continue
                if wave:
                    async with anyio.create_task_group() as group:
                        for member in wave:
                            group.start_soon(open_one, self._connections[member.url])
                    wave = []
                if endpoint is not None:  # a fallback
                    if self._settled(outcomes):
                        self._unused.append(endpoint.url)
                    else:
                        wave.append(endpoint)
            try:
                self._route(outcomes)
            except Exception:
                await self.aclose()
                raise
            logger.debug("MCP endpoints opened: %s; absent: %s; not opened: %s",
                         [c.url for c in self._open_connections()], self._skipped,
                         self._unused)

    @on_fleetenv_loop
    async def alist_tools(self) -> list[Tool]:
        """Coroutine twin of `list_tools`."""
        await self.aopen()
        return self.tools

    @on_fleetenv_loop
    async def acall(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Coroutine twin of `call`."""
        arguments = require_object(name, arguments)  # before anything is opened or sent
        await self.aopen()
        return await self._owner(name).acall_tool(name, arguments, timeout_s=timeout_s,
                                                  meta=meta)

    @on_fleetenv_loop
    async def arefresh_tools(self, *, force: bool = False) -> list[Tool]:
        """Coroutine twin of `refresh_tools`."""
        await self.aopen()
        assert self._lock is not None  # made by aopen
        async with self._lock:
            for connection in self._open_connections():
                await connection.alist_tools(refresh=force)  # lists only if changed
            self._reroute()
        return self.tools

    @on_fleetenv_loop
    async def alist_resources(self) -> list[Resource]:
        """Coroutine twin of `list_resources`."""
        await self.aopen()
        return [item for connection in self._open_connections()
                for item in await connection.alist_resources()]

    @on_fleetenv_loop
    async def alist_resource_templates(self) -> list[ResourceTemplate]:
        """Coroutine twin of `list_resource_templates`."""
        await self.aopen()
        return [item for connection in self._open_connections()
                for item in await connection.alist_resource_templates()]

    @on_fleetenv_loop
    async def aread_resource(
        self, uri: str, *, endpoint: str | None = None
    ) -> tuple[ResourceBlock, ...]:
        """Coroutine twin of `read_resource`. Reading has no effect, so asking the
        endpoints in turn is safe; the first one's error is raised if none serves it."""
        await self.aopen()
        if endpoint is not None:
            connection = self._connections.get(endpoint)
            if connection is None:
                raise ConfigurationError(
                    f"{endpoint!r} is not an endpoint of this router",
                    hint="use one of " + ", ".join(repr(url) for url in self._connections),
                )
            return await connection.aread_resource(uri)
        first: ResourceError | None = None
        for connection in self._open_connections():
            try:
                return await connection.aread_resource(uri)
            except ResourceError as exc:
                first = first or exc
        assert first is not None  # a router has at least one open endpoint
        raise first

    @on_fleetenv_loop
    async def aclose(self) -> None:
        """Coroutine twin of `close`."""
        import anyio

        async with anyio.create_task_group() as group:
            for connection in self._connections.values():
                group.start_soon(connection.aclose)

    # ------------------------------------------------------------------ internals

    def _serves(self, url: str, outcomes: Mapping[str, Exception | None]) -> bool:
        """True when endpoint ``url`` opened and lists at least one tool."""
        return outcomes.get(url, False) is None and bool(self._connections[url]._tools)

    def _settled(self, outcomes: Mapping[str, Exception | None]) -> bool:
        """True when an endpoint opened so far lists a tool, or failed otherwise than by
        being absent: its error is the open's outcome, and a fallback must not spend the
        budget again."""
        return any(self._serves(url, outcomes) or (error is not None and not _is_absent(error))
                   for url, error in outcomes.items())

    def _route(self, outcomes: Mapping[str, Exception | None]) -> None:
        skipped: list[str] = []
        rescued = any((endpoint.fallback or not endpoint.required)
                      and self._serves(endpoint.url, outcomes) for endpoint in self.endpoints)
        for endpoint in self.endpoints:
            if endpoint.url in self._unused:
                continue
            error = outcomes.get(endpoint.url)
            if error is not None:
                if (not endpoint.required or rescued) and _is_absent(error):
                    skipped.append(endpoint.url)
                    continue
                raise error
        self._skipped = skipped
        self._reroute()

    def _open_connections(self) -> list[MCPConnection]:
        """The connections of the endpoints that exist and were opened, in endpoint order."""
        return [self._connections[endpoint.url] for endpoint in self.endpoints
                if endpoint.url not in self._skipped and endpoint.url not in self._unused]

    def _reroute(self) -> None:
        """Rebuild the routing table from the connections' current tool lists."""
        tools: list[Tool] = []
        owners: dict[str, MCPConnection] = {}
        for connection in self._open_connections():
            for tool in connection._tools or ():
                if tool.name not in owners:  # the first endpoint listing a name owns it
                    owners[tool.name] = connection
                    tools.append(tool)
        self._owners, self._tools = owners, tools

    def _owner(self, name: str) -> MCPConnection:
        connection = self._owners.get(name)
        if connection is not None:
            return connection
        names = sorted(self._owners)
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        if close:
            hint = "did you mean " + " or ".join(repr(match) for match in close) + "?"
        elif names:
            shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
            hint = f"available tools: {shown}"
        else:
            hint = "no endpoint of this episode lists any tool"
        raise ToolNotFoundError(f"no tool named {name!r}", tool=name, hint=hint)
