"""The control plane at the base URL: what ``FLEET_BASE_URL`` points at.

Routes and bodies follow fleet-python 0.2.133:
errors are ``{"detail": ...}`` with the status codes its error mapping turns into typed
exceptions. Authentication (bearer token) is checked by the caller (``asgi``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from fleetenv.local import leases, verification
from fleetenv.local.instances import Instance, iso
from fleetenv.local.jobs import JobRoutes
from fleetenv.local.state import LocalFleetState
from fleetenv.local.traces import TraceRoutes
from fleetenv.local.wire import ControlPlaneError, detail, guarded, header, json_body

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec

Endpoint = Callable[[Request], Awaitable[Response]]


def build_router(state: LocalFleetState) -> Router:
    routes = ControlPlaneRoutes(state)
    return Router(
        routes=[
            Route("/v1/env/instances", routes.create, methods=["POST"]),
            Route("/v1/env/instances", routes.list_instances, methods=["GET"]),
            Route("/v1/env/instances/batch", routes.delete_batch, methods=["DELETE"]),
            Route("/v1/env/instances/{instance_id}", routes.get_instance, methods=["GET"]),
            Route("/v1/env/instances/{instance_id}", routes.delete_instance, methods=["DELETE"]),
            Route("/v1/env/instances/{instance_id}/heartbeat", routes.heartbeat,
                  methods=["POST"]),
            Route("/v1/env/runs", routes.runs, methods=["GET"]),
            Route("/v1/env/", routes.list_envs, methods=["GET"]),
            Route("/v1/env/{env_key}", routes.get_env, methods=["GET"]),
            Route("/v1/regions", routes.regions, methods=["GET"]),
            Route("/v1/account", routes.account, methods=["GET"]),
            Route("/v1/runner-auth/token", routes.runner_token, methods=["GET"]),
            Route("/v1/verifiers/check", routes.verifier_check, methods=["GET"]),
            Route("/v1/verifiers/execute", routes.verifier_execute, methods=["POST"]),
            *leases.routes(state),  # browser leases (fleetenv.local.leases)
            *TraceRoutes(state.traces).routes(),
            *JobRoutes(state).routes(),  # task import, harness jobs (fleetenv.local.jobs)
        ],
        default=not_implemented,
    )


async def not_implemented(scope: Any, receive: Any, send: Any) -> None:
    # 501 rather than 404: fleet-python retries 404 (and 5xx except 501) for seconds.
    response = detail(
        501, f"{scope['method']} {scope['path']} is not implemented by the local Fleet"
    )
    await response(scope, receive, send)




class ControlPlaneRoutes:
    def __init__(self, state: LocalFleetState) -> None:
        self.state = state
        for name in (
            "create", "list_instances", "delete_batch", "get_instance", "delete_instance",
            "heartbeat", "runs", "list_envs", "get_env", "regions", "account",
            "runner_token", "verifier_check", "verifier_execute",
        ):
            setattr(self, name, guarded(getattr(self, name)))

    @property
    def base_url(self) -> str:
        return self.state.base_url

    async def _instance(self, request: Request) -> Instance:
        instance_id = request.path_params["instance_id"]
        instance = self.state.store.get(instance_id)
        if instance is None:
            raise ControlPlaneError(404, f"Instance '{instance_id}' not found")
        await self.state.store.check_expiry(instance)
        return instance

    # ----- instances ----------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        body = self._with_region(await json_body(request))
        faults = self.state.faults
        fault = faults.take("create_error")
        if fault is not None:
            status = fault.status or 503
            message = fault.message or (
                "Rate limit exceeded; retry later" if status == 429
                else f"Instance creation failed (injected {status} by local Fleet {fault.id})"
            )
            if fault.retryable is not None:  # Fleet's structured error body
                return detail(status, {"error": "create_failed", "message": message,
                                       "retryable": fault.retryable},
                              headers={"Retry-After": "1"})
            return detail(status, message, headers={"Retry-After": "1"})
        failed = faults.take("create_failed")
        instance = await self.state.store.create(
            body,
            request_id=header(request.scope, b"x-request-id"),
            task_group=self.state.task_group,
            gate_for=self.state.gate_for,
            fail_boot=(failed.message or "instance failed to boot (injected)") if failed else None,
        )
        # The instance exists from here on, whatever the client makes of the answer.
        reply = faults.take("create_reply")
        if reply is not None and reply.payload == "malformed":
            return Response(b"<html><body>502 Bad Gateway</body></html>", status_code=200,
                            media_type="text/html")
        if reply is not None and reply.seconds:
            await anyio.sleep(reply.seconds)
        return JSONResponse(instance.response(self.base_url))

    def _with_region(self, body: dict[str, Any]) -> dict[str, Any]:
        """Fleet's answer to a region it does not serve, in the words fleet-python parses
        into ``FleetRegionError(region=..., supported_regions=[...])``; the default region
        (the first) when the create names none."""
        regions = list(self.state.config.regions)
        region = body.get("region")
        if region is None:
            return {**body, "region": regions[0]}
        if region not in regions:
            raise ControlPlaneError(400, f"Region {region} not supported. Please use {regions!r}")
        return body

    async def list_instances(self, request: Request) -> Response:
        await self.state.store.expire_due()
        q = request.query_params
        out = []
        for instance in self.state.store.all():
            if q.get("status") and instance.status != q["status"]:
                continue
            if q.get("region") and instance.region != q["region"]:
                continue
            if q.get("run_id") and instance.run_id != q["run_id"]:
                continue
            if q.get("profile_id") and instance.profile_id != q["profile_id"]:
                continue
            out.append(instance.response(self.base_url))
        return JSONResponse(out)

    async def get_instance(self, request: Request) -> Response:
        instance = await self._instance(request)
        return JSONResponse(instance.response(self.base_url))

    async def delete_instance(self, request: Request) -> Response:
        instance = await self._instance(request)
        await self.state.store.stop(instance, "deleted")
        return JSONResponse(instance.response(self.base_url))

    async def delete_batch(self, request: Request) -> Response:
        q = request.query_params
        stopped = []
        for instance in self.state.store.all():
            if not instance.running:
                continue
            if q.get("run_id") and instance.run_id != q["run_id"]:
                continue
            if q.get("profile_id") and instance.profile_id != q["profile_id"]:
                continue
            await self.state.store.stop(instance, "deleted (batch)")
            stopped.append(instance.response(self.base_url))
        return JSONResponse(stopped)

    async def heartbeat(self, request: Request) -> Response:
        instance = await self._instance(request)
        if not instance.running:
            raise ControlPlaneError(
                400, f"Instance '{instance.instance_id}' is {instance.status} "
                f"({instance.stop_reason}); create a new instance",
            )
        now = time.time()
        instance.last_heartbeat = now
        interval = instance.heartbeat_interval
        return JSONResponse({
            "success": True,
            "instance_id": instance.instance_id,
            "last_heartbeat": iso(now),
            "deadline_timestamp": now + interval if interval else None,
            "interval_seconds": interval,
        })

    async def runs(self, request: Request) -> Response:
        grouped: dict[str, list[Instance]] = {}
        for instance in self.state.store.all():
            if instance.run_id:
                grouped.setdefault(instance.run_id, []).append(instance)
        out = []
        for run_id, members in grouped.items():
            running = sum(1 for i in members if i.running)
            if request.query_params.get("active") == "true" and not running:
                continue
            out.append({
                "run_id": run_id,
                "running_count": running,
                "total_count": len(members),
                "first_created_at": iso(min(i.created_at for i in members)),
                "last_created_at": iso(max(i.created_at for i in members)),
                "profile_id": members[0].profile_id,
            })
        return JSONResponse(out)

    # ----- environments and account -------------------------------------------------------

    def _environment(self, app: AppSpec) -> dict[str, Any]:
        return {
            "env_key": app.key,
            "name": app.name,
            "description": app.description,
            "default_version": app.default_version,
            "versions": {version: version for version in app.versions},
        }

    async def list_envs(self, request: Request) -> Response:
        return JSONResponse([self._environment(app) for app in self.state.apps.values()])

    async def get_env(self, request: Request) -> Response:
        env_key = request.path_params["env_key"]
        app = self.state.apps.get(env_key)
        if app is None:
            raise ControlPlaneError(400, f"Environment '{env_key}' not found")
        return JSONResponse(self._environment(app))

    async def regions(self, request: Request) -> Response:
        return JSONResponse(list(self.state.config.regions))

    async def account(self, request: Request) -> Response:
        return JSONResponse({
            "team_id": "local",
            "team_name": "local Fleet",
            "instance_limit": self.state.config.instance_limit,
            "instance_count": self.state.store.running_count(),
            "profile_id": None,
            "profile_name": None,
        })

    async def runner_token(self, request: Request) -> Response:
        """The token the instance-manager routes require, for API-key holders only (the
        bearer check ran already); 404 when they are not gated, as on an ungated Fleet,
        which fleet-python's runner_auth takes as "send no header"."""
        token = self.state.config.runner_token
        if not token:
            raise ControlPlaneError(404, "Not Found")
        return JSONResponse({"token": token})

    # ----- verifiers ----------------------------------------------------------------------

    async def verifier_check(self, request: Request) -> Response:
        return JSONResponse(verification.check(self.state, request.query_params.get("sha256")))

    async def verifier_execute(self, request: Request) -> Response:
        body = await json_body(request)
        result, queue_ms = await verification.execute(self.state, body)
        # A verifier may return NaN or infinity; Python's json writes them as literals
        # (and Python clients read them back), where starlette's JSONResponse would
        # fail the request. Clients must cope with a non-finite score, so send it.
        return Response(json.dumps(result, allow_nan=True, default=str),
                        media_type="application/json",
                        headers={"X-Verifier-Queue-Ms": str(queue_ms)})
