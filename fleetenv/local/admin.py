"""``/_local/...``: inspection and fault injection, behind the same bearer token.

``LocalFleet`` uses these routes in both modes (in-process and subprocess), so the
Python API and the HTTP API cannot drift, and all state changes happen on the server's
event loop.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from fleetenv.local.faults import FaultError
from fleetenv.local.state import LocalFleetState
from fleetenv.local.wire import BadBody, detail, json_body


def build_router(state: LocalFleetState) -> Router:
    async def list_instances(request: Request) -> Response:
        await state.store.expire_due()
        status = request.query_params.get("status")
        return JSONResponse([
            inst.describe(state.base_url)
            for inst in state.store.all()
            if status is None or inst.status == status
        ])

    async def expire_instance(request: Request) -> Response:
        instance = state.store.get(request.path_params["instance_id"])
        if instance is None:
            return detail(404, f"Instance '{request.path_params['instance_id']}' not found")
        await state.store.stop(instance, "expired (forced by the expire fault)")
        return JSONResponse(instance.describe(state.base_url))

    async def tool_calls(request: Request) -> Response:
        return JSONResponse({
            "instances": {i.instance_id: dict(i.tool_counts) for i in state.store.all()},
            "call_ids": state.tool_calls.by_call_id,
        })

    async def add_fault(request: Request) -> Response:
        try:
            fault = state.faults.add(await json_body(request))
        except (FaultError, BadBody, TypeError) as exc:
            return detail(400, str(exc))
        return JSONResponse(fault.to_dict())

    async def list_faults(request: Request) -> Response:
        return JSONResponse(state.faults.list())

    async def clear_faults(request: Request) -> Response:
        return JSONResponse({"cleared": state.faults.clear()})

    async def remove_fault(request: Request) -> Response:
        return JSONResponse({"cleared": int(state.faults.remove(request.path_params["fault_id"]))})

    async def drain(request: Request) -> Response:
        await state.drain()
        return JSONResponse({"drained": True})

    return Router(routes=[
        Route("/_local/instances", list_instances, methods=["GET"]),
        Route("/_local/instances/{instance_id}/expire", expire_instance, methods=["POST"]),
        Route("/_local/tool-calls", tool_calls, methods=["GET"]),
        Route("/_local/faults", add_fault, methods=["POST"]),
        Route("/_local/faults", list_faults, methods=["GET"]),
        Route("/_local/faults", clear_faults, methods=["DELETE"]),
        Route("/_local/faults/{fault_id}", remove_fault, methods=["DELETE"]),
        Route("/_local/drain", drain, methods=["POST"]),
    ])
