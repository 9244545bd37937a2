"""``/v1/verifiers/check`` and ``/v1/verifiers/execute``, the way Fleet's runner does them.

fleet-python ships a verifier as a zip bundle (``verifier.py``) named by its SHA-256,
uploads it only when ``check`` says the server lacks it, and sends the arguments
cloudpickled (with a ``None`` placeholder for ``env`` first and ``{"env": id}`` last).
The instance is named only by that trailing marker: an instance id, or in URL mode the
manager URL itself. The code runs in a worker process (``worker_pool``), never here. The
``verifier_*`` faults act here (docs/local-fleet.md, "Fault injection").

``execution_time_ms`` is the run's own time; the time the run waited for a free worker
is answered apart, in the ``X-Verifier-Queue-Ms`` header (a local Fleet extra: the
response model fleet-python parses has no field for it, and drops unknown ones).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import secrets
import time
import zipfile
from typing import Any

import anyio

from fleetenv.local.instances import iso
from fleetenv.local.state import LocalFleetState
from fleetenv.local.wire import ControlPlaneError


def check(state: LocalFleetState, sha256: str | None) -> dict[str, Any]:
    known = bool(sha256) and sha256 in state.bundles
    return {"success": known, "key": None, "version": None, "display_src": None,
            "created_at": None, "comment": None}


def _bundle(state: LocalFleetState, body: dict[str, Any]) -> tuple[bytes, bool]:
    sha = body.get("sha256")
    if body.get("bundle"):
        try:
            data = base64.b64decode(body["bundle"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ControlPlaneError(400, f"bundle is not valid base64: {exc}") from exc
        sha = sha or hashlib.sha256(data).hexdigest()
        state.bundles[sha] = data
        return data, False
    if sha and sha in state.bundles:
        return state.bundles[sha], True
    # fleet-python re-sends with the bundle when the error says "not found".
    raise ControlPlaneError(404, f"Verifier bundle '{sha}' not found; upload it with 'bundle'")


def _source(bundle: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
            return archive.read("verifier.py").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError) as exc:
        raise ControlPlaneError(
            400, f"verifier bundle is not a zip with a UTF-8 verifier.py: {exc}"
        ) from exc


def _env_reference(body: dict[str, Any]) -> str:
    args = body.get("args_array") or []
    marker = args[-1] if args else None
    env = marker.get("env") if isinstance(marker, dict) else None
    if not isinstance(env, str):
        raise ControlPlaneError(
            400, "args_array must end with {'env': <instance id or manager URL>}"
        )
    return env


async def execute(state: LocalFleetState, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The execute answer, and the milliseconds the run waited for a worker."""
    bundle, cache_hit = _bundle(state, body)
    source = _source(bundle)
    reference = _env_reference(body)
    if reference.startswith(("http://", "https://")):
        manager_url, instance_id = reference.rstrip("/"), _instance_in_url(reference)
    else:
        instance = state.store.get(reference)
        if instance is None:
            raise ControlPlaneError(
                400, f"Instance '{reference}' does not exist on this local Fleet; "
                "verify against a live instance",
            )
        instance_id = instance.instance_id
        manager_url = f"{state.base_url}/instances/{instance_id}/api/v1/env"
    key = body.get("key")
    unavailable = state.faults.take("verifier_unavailable", instance=instance_id, key=key)
    if unavailable is not None:  # the runner is overloaded or restarting: nothing ran
        raise ControlPlaneError(unavailable.status or 503, unavailable.message
                                or "verifier runner unavailable, try again")
    delay = state.faults.take("verifier_delay", instance=instance_id, key=key)
    if delay is not None and delay.seconds:
        await anyio.sleep(delay.seconds)
    judge = state.faults.take("verifier_judge_error", instance=instance_id, key=key)
    fault = state.faults.take(("verifier_crash", "verifier_hang"), instance=instance_id, key=key)
    requested = body.get("timeout")
    limit = state.config.verifier_timeout
    if isinstance(requested, (int, float)) and requested > 0:
        limit = min(float(requested), limit)
    job = {
        "source": source,
        "function_name": body.get("function_name"),
        "args": body.get("args"),
        "args_array": body.get("args_array"),
        "manager_url": manager_url,
        "base_url": state.base_url,
        "token": state.config.token,
        "fault": {"verifier_crash": "crash", "verifier_hang": "hang"}.get(fault.kind)
        if fault else None,
    }
    started = time.monotonic()
    # Blocks for the queue and the run: on the pool's threads, so that queued runs never
    # hold the shared ones that tool calls and the running verifiers' queries need.
    outcome = await anyio.to_thread.run_sync(state.pool.run, job, limit, started,
                                             limiter=state.pool_threads)
    queue_ms = int(outcome.get("queue_ms") or 0)
    stdout = outcome.get("stdout") or ""
    if judge is not None:  # the run succeeded, but its LLM judge (say) was browned out
        stdout = f"JUDGE ERROR: {judge.message or 'judge service unavailable (503)'}\n{stdout}"
    return {
        "success": bool(outcome.get("success")),
        "result": outcome.get("result"),
        "stdout": stdout,
        "error": outcome.get("error"),
        "execution_time_ms": max(0, int((time.monotonic() - started) * 1000) - queue_ms),
        "execution_id": f"exec-{secrets.token_hex(8)}",
        "verifier_id": body.get("verifier_id") or key,
        "key": key,
        "version": None,
        "display_src": None,
        "created_at": iso(time.time()),
        "comment": None,
        "bundle_cache_hit": cache_hit,
    }, queue_ms


def _instance_in_url(url: str) -> str | None:
    marker = "/instances/"
    if marker not in url:
        return None
    return url.split(marker, 1)[1].split("/", 1)[0] or None
