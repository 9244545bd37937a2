"""Browser leases (``/v1/browser``): a browser session on an instance's web UI.

A lease's ``computer`` tool draws the same screens as the instances' own
(:mod:`fleetenv.local.apps.computer`), with its own page state (view, focus, typed text)
over the instance's live database, like a browser tab; it adds ``navigate``. What is
imitated: docs/browser-use.md ("In the local Fleet"). A lease's TTL is checked on every
lookup.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

import anyio
from anyio.abc import TaskStatus
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fleetenv.local.instances import iso
from fleetenv.local.wire import ControlPlaneError, detail, guarded, json_body

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.local.apps.computer import ComputerSession
    from fleetenv.local.instances import Instance
    from fleetenv.local.mcp_host import InstanceMCPServer
    from fleetenv.local.state import LocalFleetState

logger = logging.getLogger("fleetenv.local")

__all__ = ["LeaseStore", "routes"]

#: How long a page "loads" after a navigation; screenshots show a blank page meanwhile.
LOAD_SECONDS = 0.3
DEFAULT_TTL_SECONDS = 1800


class _Page:
    """What the lease's browser shows: nothing, a page loading, or an app's UI."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.instance_id: str | None = None
        self.session: ComputerSession | None = None
        self.loaded_at = 0.0
        self.lock = threading.Lock()

    def loading(self) -> bool:
        return time.monotonic() < self.loaded_at


@dataclass(eq=False)
class LocalLease:
    lease_id: str
    allowed_hosts: tuple[str, ...]
    ttl_seconds: float
    created_at: float
    run_id: str | None = None
    status: str = "running"
    stop_reason: str | None = None
    terminated_at: float | None = None
    page: _Page = field(default_factory=_Page)
    server: InstanceMCPServer | None = field(default=None, repr=False)
    _stop: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _done: anyio.Event = field(default_factory=anyio.Event, repr=False)

    @property
    def expires_at(self) -> float:
        return self.created_at + self.ttl_seconds

    @property
    def running(self) -> bool:
        return self.status == "running"

    def response(self, base_url: str) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "browser_id": f"local-{self.lease_id}",
            "mcp_url": f"{base_url}/v1/browser/{self.lease_id}/mcp",
            "cdp_url": None,
            "stream_url": None,
            "host_domain": self.allowed_hosts[0] if self.allowed_hosts else None,
            "allowed_hosts": list(self.allowed_hosts),
            "status": self.status,
            "stop_reason": self.stop_reason,
            "ttl_seconds": self.ttl_seconds,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "terminated_at": iso(self.terminated_at),
            "run_id": self.run_id,
            "url": self.page.url,
            "instance_id": self.page.instance_id,
        }


class LeaseStore:
    """The leases of one local Fleet. Only the server's event loop touches it."""

    def __init__(self, state: LocalFleetState) -> None:
        self.state = state
        self.leases: dict[str, LocalLease] = {}
        state.store.on_stop_all.append(self.stop_all)

    async def stop_all(self) -> None:
        for lease in list(self.leases.values()):
            await self.stop(lease, "local Fleet shut down")

    async def create(self, body: dict[str, Any]) -> LocalLease:
        hosts = body.get("allowed_hosts")
        if (not isinstance(hosts, list) or not hosts
                or not all(isinstance(h, str) and h for h in hosts)):
            raise ControlPlaneError(
                422, "allowed_hosts must be a non-empty list of host names (the instance's "
                f"host at least), not {hosts!r}")
        ttl = body.get("ttl_seconds", DEFAULT_TTL_SECONDS)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
            raise ControlPlaneError(422, f"ttl_seconds must be a positive number, not {ttl!r}")
        run_id = body.get("run_id")
        if run_id is not None and not isinstance(run_id, str):
            raise ControlPlaneError(422, f"run_id must be a string or null, not {run_id!r}")
        lease = LocalLease(lease_id=f"lease-{secrets.token_hex(6)}",
                           allowed_hosts=tuple(h.lower() for h in hosts), ttl_seconds=ttl,
                           created_at=time.time(), run_id=run_id)
        lease.server = self._server(lease)
        lease.server.streamable_http_app(host=self.state.config.host)
        await self.state.task_group.start(self._run, lease)
        self.leases[lease.lease_id] = lease
        return lease

    async def _run(self, lease: LocalLease, *,
                   task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                   ) -> None:
        assert lease.server is not None
        try:
            async with lease.server.session_manager.run():
                task_status.started()
                await lease._stop.wait()
        finally:
            lease._done.set()

    async def get(self, lease_id: str) -> LocalLease:
        lease = self.leases.get(lease_id)
        if lease is None:
            raise ControlPlaneError(404, f"Browser lease '{lease_id}' not found")
        await self.check_expiry(lease)
        return lease

    async def check_expiry(self, lease: LocalLease) -> None:
        if lease.running and time.time() >= lease.expires_at:
            await self.stop(lease, f"expired (ttl_seconds={lease.ttl_seconds:g})")

    async def all(self) -> list[LocalLease]:
        for lease in list(self.leases.values()):
            await self.check_expiry(lease)
        return list(self.leases.values())

    async def stop(self, lease: LocalLease, reason: str) -> None:
        """Stop a lease (idempotent): end its MCP sessions; its record stays."""
        if lease.running:
            lease.status, lease.stop_reason = "stopped", reason
            lease.terminated_at = time.time()
        lease._stop.set()
        with anyio.move_on_after(5):
            await lease._done.wait()

    # ----- the browser -------------------------------------------------------------------

    def _server(self, lease: LocalLease) -> InstanceMCPServer:
        from fleetenv.local.mcp_host import InstanceMCPServer

        state = self.state

        async def gate(tool: str, call_id: str | None) -> Any:
            # Calls count against (and faults target) the instance the page shows.
            instance = state.store.get(lease.page.instance_id or "")
            if instance is None:
                return None
            return await state.gate_for(instance)(tool, call_id)

        server = InstanceMCPServer(f"browser-{lease.lease_id}", gate)
        browser = _Browser(lease, state)

        def computer(
            action: Annotated[
                Literal["navigate", "screenshot", "click", "type", "key", "scroll"],
                Field(description="What to do. Every action returns a screenshot afterwards."),
            ],
            url: Annotated[str | None, Field(description="navigate: the page to open.")] = None,
            x: Annotated[int | None, Field(description="click: pixels from the left edge.",
                                           ge=0)] = None,
            y: Annotated[int | None, Field(description="click: pixels from the top edge.",
                                           ge=0)] = None,
            text: Annotated[str | None, Field(description="type: text to type.")] = None,
            key: Annotated[str | None, Field(description="key: a key name, e.g. Enter.")] = None,
            direction: Annotated[Literal["up", "down"] | None,
                                 Field(description="scroll: direction.")] = None,
            amount: Annotated[int, Field(description="scroll: rows to move.", ge=1, le=50)] = 3,
        ) -> str:
            from fleetenv.local.apps.computer import screenshot_payload
            from fleetenv.local.apps.toolkit import tool_errors

            with tool_errors():
                png = browser.act(action, url, x, y, text, key, direction, amount)
            return screenshot_payload(png)

        computer.__doc__ = (
            "Operate a web browser. Navigate to a page, take a screenshot, click at pixel "
            "coordinates, type into the focused field, press keys or scroll. Returns "
            '{"base64_image": "data:image/png;base64,..."} showing the page afterwards.')
        server.add_tool(computer, name="computer", structured_output=False)
        return server


class _Browser:
    """The page state machine behind a lease's ``computer`` tool (runs in worker threads:
    MCPServer runs sync tools there, so the page has its own lock)."""

    def __init__(self, lease: LocalLease, state: LocalFleetState) -> None:
        self._lease = lease
        self._state = state

    def act(self, action: str, url: str | None, x: int | None, y: int | None,
            text: str | None, key: str | None, direction: str | None, amount: int) -> bytes:
        from fleetenv.local.apps.toolkit import AppError

        page = self._lease.page
        with page.lock:
            if action == "navigate":
                if not url:
                    raise AppError("action 'navigate' needs 'url'")
                self._navigate(page, url)
                return _blank("Loading " + url)
            if page.session is None:
                if action != "screenshot":
                    raise AppError("no page is open; navigate to the app's URL first")
                return _blank("about:blank")
            if page.loading():
                if action != "screenshot":
                    raise AppError("the page is still loading; take a screenshot first")
                return _blank("Loading " + (page.url or ""))
            session = page.session
        return session.act(action, x, y, text, key, direction, amount)

    def _navigate(self, page: _Page, url: str) -> None:
        from fleetenv.local.apps.computer import ComputerSession, computer_session
        from fleetenv.local.apps.toolkit import AppError

        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or not host:
            raise AppError(f"cannot navigate to {url!r}: give an http(s) URL")
        if host not in self._lease.allowed_hosts:
            raise AppError(f"navigation to {host!r} is blocked: this browser lease allows "
                           f"only {', '.join(self._lease.allowed_hosts)}")
        instance = self._instance_at(url)
        served = computer_session(instance.mcp.computer) if instance.mcp else None
        if served is None or served.make_screen is None:
            raise AppError(f"{url} has no web UI this browser can show (env "
                           f"{instance.env_key!r} draws no screen)")
        page.url, page.instance_id = url, instance.instance_id
        page.session = ComputerSession(served.db, served.make_screen(), served.make_screen)
        page.loaded_at = time.monotonic() + LOAD_SECONDS

    def _instance_at(self, url: str) -> Instance:
        from fleetenv.local.apps.toolkit import AppError

        prefix = f"{self._state.base_url}/instances/"
        if not url.startswith(prefix):
            raise AppError(f"{url} is not an app of this local Fleet; open an instance's "
                           f"root URL ({prefix}<instance_id>/)")
        instance_id = url[len(prefix):].split("/", 1)[0]
        instance = self._state.store.get(instance_id)
        if instance is None or not instance.running:
            raise AppError(f"{url}: instance {instance_id!r} is not running (HTTP 410)")
        return instance


def _blank(caption: str) -> bytes:
    from fleetenv.local.apps.screen import GREY, Canvas, fit
    from fleetenv.local.apps.widgets import SCREEN_HEIGHT, SCREEN_WIDTH

    canvas = Canvas(SCREEN_WIDTH, SCREEN_HEIGHT)
    canvas.text(8, 8, fit(caption, 60), color=GREY)
    return canvas.to_png()


# ----- routes ----------------------------------------------------------------------------


def routes(state: LocalFleetState) -> list[Route]:
    """The lease routes over a new store of ``state``, for the control plane's router."""
    store = LeaseStore(state)

    async def create(request: Request) -> Response:
        lease = await store.create(await json_body(request))
        return JSONResponse(lease.response(state.base_url))

    async def list_leases(request: Request) -> Response:
        q = request.query_params
        return JSONResponse([
            lease.response(state.base_url) for lease in await store.all()
            if (not q.get("run_id") or lease.run_id == q["run_id"])
            and (not q.get("status") or lease.status == q["status"])])

    async def get(request: Request) -> Response:
        lease = await store.get(request.path_params["lease_id"])
        return JSONResponse(lease.response(state.base_url))

    async def delete(request: Request) -> Response:
        lease = await store.get(request.path_params["lease_id"])
        await store.stop(lease, "deleted")
        return JSONResponse(lease.response(state.base_url))

    return [
        Route("/v1/browser", guarded(create), methods=["POST"]),
        Route("/v1/browser", guarded(list_leases), methods=["GET"]),
        Route("/v1/browser/{lease_id}", guarded(get), methods=["GET"]),
        Route("/v1/browser/{lease_id}", guarded(delete), methods=["DELETE"]),
        Route("/v1/browser/{lease_id}/mcp", _LeaseMCP(store)),
        Route("/v1/browser/{lease_id}/mcp/", _LeaseMCP(store)),
    ]


class _LeaseMCP:
    """The ASGI endpoint of every lease's MCP server."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lease_id = scope.get("path_params", {}).get("lease_id", "")
        lease = self._store.leases.get(lease_id)
        if lease is not None:
            await self._store.check_expiry(lease)
        if lease is None or not lease.running or lease.server is None:
            reason = ("not found" if lease is None
                      else f"{lease.status} ({lease.stop_reason or 'not running'})")
            status = 404 if lease is None else 410
            await detail(status, f"Browser lease '{lease_id}' is {reason}; create a new "
                         "lease")(scope, receive, send)
            return
        await lease.server.session_manager.handle_request(scope, receive, send)
