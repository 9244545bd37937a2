"""The one ASGI app of a local Fleet: routing, auth, HTTP-level faults and lifespan.

Paths:

* ``/v1/...``                         control plane (bearer token)
* ``/_local/...``                     admin: inspection and faults (bearer token)
* ``/instances/{id}/mcp[/]``          the instance's app tools (MCP, streamable HTTP)
* ``/instances/{id}/api/v1/mcp[/]``   the instance's ``computer`` tool (MCP)
* ``/instances/{id}/api/v1/env/...``  the instance's manager API (``X-Runner-Token``)
* ``/health``                         liveness, no auth

The lifespan owns a task group in which every instance's MCP session managers run, the
TTL reaper, and the verifier worker pool.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from fleetenv.local import admin, control_plane, manager_api, traces
from fleetenv.local.state import LocalFleetState
from fleetenv.local.wire import bearer_ok, detail, header, unauthorized

logger = logging.getLogger("fleetenv.local")

_MCP_ENDPOINTS = {"mcp": "mcp", "mcp/": "mcp", "api/v1/mcp": "api/v1/mcp",
                  "api/v1/mcp/": "api/v1/mcp"}
_MANAGER_PREFIX = "api/v1/env"


class LocalFleetApp:
    def __init__(self, state: LocalFleetState) -> None:
        self.state = state
        self._control = control_plane.build_router(state)
        self._manager = manager_api.build_router(state.config)
        self._admin = admin.build_router(state)
        self._trace_pages = traces.TracePages(state.traces, state.config.token)  # by view key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1000})

    # ----- lifespan -----------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        state = self.state
        try:
            async with anyio.create_task_group() as task_group:
                state.task_group = task_group
                state.loop = asyncio.get_running_loop()
                await anyio.to_thread.run_sync(state.pool.start)
                task_group.start_soon(state.store.reap_forever)
                await send({"type": "lifespan.startup.complete"})
                await receive()  # lifespan.shutdown
                await state.drain()
                task_group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(state.pool.close)
        await send({"type": "lifespan.shutdown.complete"})

    # ----- requests -----------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if path.startswith("/instances/"):
            await self._instance_request(scope, receive, send)
        elif path.startswith("/v1/"):
            if not bearer_ok(scope, self.state.config.token):
                await unauthorized(scope, receive, send)
                return
            if await self._http_faults(scope, receive, send, _control_instance(path)):
                return
            await self._control(scope, receive, send)
        elif path.startswith("/_local/"):
            if not bearer_ok(scope, self.state.config.token):
                await unauthorized(scope, receive, send)
                return
            await self._admin(scope, receive, send)
        elif path == "/traces" or path.startswith("/traces/"):
            await self._trace_pages(scope, receive, send)
        elif path in ("/", "/health"):
            await detail(200, "fleetenv local Fleet is up")(scope, receive, send)
        else:
            await detail(404, f"no such route on the local Fleet: {path}")(scope, receive, send)

    async def _instance_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        _, _, rest = scope["path"].partition("/instances/")
        instance_id, _, sub = rest.partition("/")
        if await self._http_faults(scope, receive, send, instance_id):
            return
        if not manager_api.runner_token_ok(scope, sub, self.state.config):
            await manager_api.gated_not_found(scope, receive, send)  # Fleet's router gate
            return
        store = self.state.store
        instance = store.get(instance_id)
        if instance is None:
            await detail(404, f"Instance '{instance_id}' not found on this local Fleet")(
                scope, receive, send)
            return
        await store.check_expiry(instance)
        if not instance.running or instance.mcp is None or instance.db is None:
            await detail(
                410, f"Instance '{instance_id}' is {instance.status} "
                f"({instance.stop_reason or 'not running'}); create a new instance",
            )(scope, receive, send)
            return
        endpoint = _MCP_ENDPOINTS.get(sub)
        if endpoint is not None:
            session_id = header(scope, b"mcp-session-id")
            if session_id is not None:
                fault = self.state.faults.take(
                    "session_loss", instance=instance_id, route=scope["path"]
                )
                if fault is not None:
                    await instance.mcp.forget_session(endpoint, session_id)
            config = self.state.config
            if await instance.mcp.intercept(  # MCP credentials and MCP-server faults
                    faults=self.state.faults, instance_id=instance_id, endpoint=endpoint,
                    required_token=config.token if config.require_mcp_auth else None,
                    scope=scope, receive=receive, send=send):
                return
            await instance.mcp.handle(endpoint, scope, receive, send)
            return
        if sub == _MANAGER_PREFIX or sub.startswith(_MANAGER_PREFIX + "/"):
            child = dict(scope)
            child["path"] = sub[len(_MANAGER_PREFIX):] or "/"
            child["root_path"] = scope.get("root_path", "") + f"/instances/{instance_id}/"\
                + _MANAGER_PREFIX
            child[manager_api.INSTANCE_SCOPE_KEY] = instance
            await self._manager(child, receive, send)
            return
        await detail(404, f"no such instance route: {sub!r} (have mcp, api/v1/mcp, "
                     "api/v1/env/...)")(scope, receive, send)

    async def _http_faults(
        self, scope: Scope, receive: Receive, send: Send, instance_id: str | None
    ) -> bool:
        """Apply the first matching HTTP fault; True when it already answered."""
        faults = self.state.faults
        target: dict[str, Any] = {"route": scope["path"], "method": scope["method"],
                                  "instance": instance_id}
        delay = faults.take("http_delay", **target)
        if delay is not None:
            await anyio.sleep(delay.seconds or 0.0)
        fault = faults.take(("drop_connection", "http_hang", "http_error"), **target)
        if fault is None:
            return False
        if fault.kind == "http_hang":
            if await faults.hang(fault):
                return False
            await _drop_connection(receive, send)
            return True
        if fault.kind == "drop_connection":
            await _drop_connection(receive, send)
            return True
        status = fault.status or 503
        message = fault.message or (
            "Rate limit exceeded; retry later" if status == 429
            else f"Service unavailable (injected {status} by local Fleet {fault.id})"
        )
        headers = {"Retry-After": "1"} if status in (429, 503) else None
        await detail(status, message, headers=headers)(scope, receive, send)
        return True


def _control_instance(path: str) -> str | None:
    prefix = "/v1/env/instances/"
    if path.startswith(prefix):
        return path[len(prefix):].split("/", 1)[0] or None
    return None


async def _drop_connection(receive: Receive, send: Send) -> None:
    """Close the client's socket without an HTTP response, like a crashed backend.

    ASGI has no "abort" message; uvicorn's ``send`` is a method of the request cycle,
    which holds the transport. The server is always run by us with uvicorn (h11).
    """
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise RuntimeError("drop_connection fault needs uvicorn's h11 protocol")
    transport.abort()
    # Wait for uvicorn to notice, so it does not try to send a 500 on a dead socket.
    with anyio.move_on_after(1.0):
        while (await receive())["type"] != "http.disconnect":
            pass
