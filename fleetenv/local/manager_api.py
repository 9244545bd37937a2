"""The instance manager API under ``{root}api/v1/env`` (no auth, like Fleet's).

fleet-python parses these bodies with pydantic *without checking the status code*, so
failures travel inside a 200 body (``success: false`` plus ``error``/``message``), and
unknown routes answer 501 rather than a 404 the SDK would retry for seconds.
The dispatcher (``asgi``) puts the live instance in ``scope["fleetenv.instance"]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from fleetenv.local import databases
from fleetenv.local.instances import Instance, iso
from fleetenv.local.wire import BadBody, detail, json_body

INSTANCE_SCOPE_KEY = "fleetenv.instance"
RESOURCES = [
    {"name": "current", "type": "sqlite", "mode": "rw", "label": "current state"},
    {"name": "seed", "type": "sqlite", "mode": "ro", "label": "state at reset"},
]


def build_router() -> Router:
    return Router(
        routes=[
            Route("/reset", reset, methods=["POST"]),
            Route("/resources", resources, methods=["GET"]),
            Route("/resources/sqlite/{name}/describe", describe, methods=["GET"]),
            Route("/resources/sqlite/{name}/query", query, methods=["POST"]),
            Route("/diff/structured", diff_structured, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/execute_verifier_function", execute_verifier_function, methods=["POST"]),
        ],
        default=_not_implemented,
    )


async def _not_implemented(scope: Any, receive: Any, send: Any) -> None:
    response = detail(501, f"{scope['method']} manager route {scope['path']} is not "
                      "implemented by the local Fleet")
    await response(scope, receive, send)


def _instance(request: Request) -> Instance:
    instance: Instance = request.scope[INSTANCE_SCOPE_KEY]
    return instance


def _db(instance: Instance) -> databases.InstanceDatabase:
    # The dispatcher routes here only for an instance whose database exists, and stopping
    # closes that database without unsetting it, so it stays there for the whole request.
    db = instance.db
    assert db is not None, f"manager route reached for {instance.instance_id} without a database"
    return db


async def _body(request: Request) -> dict[str, Any] | Response:
    try:
        return await json_body(request)
    except BadBody as exc:
        return detail(422, str(exc))


async def reset(request: Request) -> Response:
    instance = _instance(request)
    body = await _body(request)
    if isinstance(body, Response):
        return body
    started = time.monotonic()
    try:
        await anyio.to_thread.run_sync(_db(instance).reset)
    except databases.InstanceStopped:
        return _gone(instance)
    ms = (time.monotonic() - started) * 1000
    return JSONResponse({"success": True,
                         "message": f"Reset {instance.instance_id} to seed in {ms:.1f} ms"})


async def _locked(instance: Instance, work: Callable[[], dict[str, Any]]) -> Response:
    try:
        return JSONResponse(await anyio.to_thread.run_sync(_db(instance).locked, work))
    except databases.InstanceStopped:
        return _gone(instance)


def _gone(instance: Instance) -> Response:
    # It stopped while this request was in flight: answer as a stopped instance does.
    return detail(410, f"Instance '{instance.instance_id}' is {instance.status} "
                  f"({instance.stop_reason}); create a new instance")


async def resources(request: Request) -> Response:
    return JSONResponse(RESOURCES)


def _resource_error(name: str) -> dict[str, Any]:
    return {"success": False, "resource_name": name, "tables": None,
            "error": f"unknown sqlite resource {name!r}; this instance has 'current' and 'seed'",
            "message": "unknown resource"}


async def describe(request: Request) -> Response:
    instance = _instance(request)
    name = request.path_params["name"]
    path = _db(instance).path_for(name)
    if path is None:
        return JSONResponse(_resource_error(name))

    return await _locked(instance, lambda: databases.describe(path, name))


async def query(request: Request) -> Response:
    instance = _instance(request)
    name = request.path_params["name"]
    path = _db(instance).path_for(name)
    body = await _body(request)
    if isinstance(body, Response):
        return body
    if path is None:
        error = _resource_error(name)
        return JSONResponse({"success": False, "error": error["error"], "message": "failed"})
    sql = body.get("query")
    if not isinstance(sql, str):
        return JSONResponse({"success": False, "error": "'query' (a SQL string) is required",
                             "message": "failed"})
    args = body.get("args")
    # The seed is shared by every instance of its data version: never writable.
    read_only = bool(body.get("read_only", False)) or name == "seed"

    return await _locked(
        instance, lambda: databases.run_query(path, sql, args, read_only=read_only)
    )


async def diff_structured(request: Request) -> Response:
    instance = _instance(request)
    body = await _body(request)
    if isinstance(body, Response):
        return body
    db = _db(instance)
    return await _locked(
        instance, lambda: databases.structured_diff(db.seed, db.current, body.get("ignore_config"))
    )


async def health(request: Request) -> Response:
    return JSONResponse({"status": "healthy", "timestamp": iso(time.time()),
                         "service": "fleetenv-local-manager"})


async def execute_verifier_function(request: Request) -> Response:
    return JSONResponse({
        "success": False,
        "error": "the local Fleet runs verifiers through POST /v1/verifiers/execute "
                 "(Task.verify / verify_detailed), not the manager's legacy route",
        "message": "not supported",
    })
