"""One verifier worker process: ``python -m fleetenv.local.verifier_worker``.

Verifier code is arbitrary Python sent over HTTP; it may loop forever, call
``os._exit`` or crash the interpreter. So it never runs inside the server: it runs here,
in a process the server can kill. fleet-python is imported once at start-up, then the
worker serves jobs one at a time, one JSON line in on stdin, one JSON line out.

The protocol channel is a private duplicate of the original stdout; file descriptor 1
is pointed at stderr so that stray writes (C extensions, ``os.write(1, ...)``) cannot
corrupt it. ``print`` inside a verifier is captured and returned as ``stdout``.

The namespace is the one Fleet's runner gives verifier code: the score constants, the
text helpers and ``DatabaseSnapshot``/``IgnoreConfig`` from fleet-python, ``json``,
``re``, ``string``. The ``env`` argument is a fleet-python sync env in URL mode on the
instance's manager API, so ``env.instance.load()``, ``env.db("seed"|"current")``,
queries and ``diff(...).expect_only(...)`` all go over HTTP like on Fleet.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import io
import json
import os
import re
import string
import sys
import threading
import time
import traceback
from typing import Any, TextIO

# Same clean-up fleet-python applies before exec'ing verifier code: the decorator would
# wrap the function in an object that swallows exceptions.
_STRIP_PATTERNS = (
    re.compile(r"@verifier\([^)]*\)\s*\n"),
    re.compile(r"^from fleet\.verifiers.*import.*$\n?", re.MULTILINE),
    re.compile(r"^from fleet import verifier.*$\n?", re.MULTILINE),
    re.compile(r"^import fleet\.verifiers.*$\n?", re.MULTILINE),
    re.compile(r"^import fleet$\n?", re.MULTILINE),
)

_clients: dict[tuple[str, str], Any] = {}


def _namespace() -> dict[str, Any]:
    from fleet.verifiers import local_executor as lx
    from fleet.verifiers.code import TASK_FAILED_SCORE, TASK_SUCCESSFUL_SCORE
    from fleet.verifiers.db import DatabaseSnapshot, IgnoreConfig, SnapshotDiff

    return {
        "__builtins__": __builtins__,
        "__name__": "verifier",
        "TASK_SUCCESSFUL_SCORE": TASK_SUCCESSFUL_SCORE,
        "TASK_FAILED_SCORE": TASK_FAILED_SCORE,
        "normalized_contains": lx.normalized_contains,
        "normalized_string_comparison": lx.normalized_string_comparison,
        "extract_numbers": lx.extract_numbers,
        "contains_number": lx.contains_number,
        "DatabaseSnapshot": DatabaseSnapshot,
        "IgnoreConfig": IgnoreConfig,
        "SnapshotDiff": SnapshotDiff,
        "Environment": object,
        "json": json,
        "re": re,
        "string": string,
    }


def _client(base_url: str, token: str) -> Any:
    import fleet

    key = (base_url, token)
    if key not in _clients:
        _clients[key] = fleet.Fleet(api_key=token, base_url=base_url, max_retries=0, timeout=60.0)
    return _clients[key]


def _decode_args(job: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Positional args and kwargs without the env placeholder and the env marker."""
    if job.get("args"):
        import cloudpickle

        payload = cloudpickle.loads(base64.b64decode(job["args"]))
        args, kwargs = list(payload.get("args", ())), dict(payload.get("kwargs") or {})
        if args and args[0] is None:
            args = args[1:]
    else:
        args, kwargs = list(job.get("args_array") or []), {}
    if args and isinstance(args[-1], dict) and "env" in args[-1]:
        args = args[:-1]
    return args, kwargs


def _find_function(namespace: dict[str, Any], name: str | None) -> Any:
    if name and inspect.isfunction(namespace.get(name)):
        return namespace[name]
    for value in namespace.values():
        if inspect.isfunction(value) and value.__code__.co_filename == "<string>":
            return value
    raise LookupError(f"no function {name!r} (or any function) defined in the verifier code")


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    fault = job.get("fault")
    if fault == "crash":
        os._exit(70)
    if fault == "hang":
        threading.Event().wait()
    started = time.perf_counter()
    captured = io.StringIO()
    try:
        source = job["source"]
        for pattern in _STRIP_PATTERNS:
            source = pattern.sub("", source)
        namespace = _namespace()
        with contextlib.redirect_stdout(captured):
            exec(compile(source, "<string>", "exec"), namespace)
            function = _find_function(namespace, job.get("function_name"))
            args, kwargs = _decode_args(job)
            env = _client(job["base_url"], job["token"]).instance(job["manager_url"])
            env.instance.load()
            result = function(env, *args, **kwargs)
        return {"success": True, "result": _jsonable(result), "error": None,
                "stdout": captured.getvalue(), "elapsed_ms": _ms(started)}
    except (Exception, SystemExit) as exc:
        error = {"type": type(exc).__name__, "message": str(exc),
                 "traceback": traceback.format_exc()}
        return {"success": False, "result": None, "error": error,
                "stdout": captured.getvalue(), "elapsed_ms": _ms(started)}


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _exit_when_orphaned(parent: int) -> None:
    # Runs in its own session (no terminal Ctrl-C); if the server dies without
    # killing us, do not linger, even in the middle of a runaway verifier.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def _send(channel: TextIO, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def main() -> int:
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    _namespace()  # warm up: imports fleet-python and the DSL once
    import cloudpickle  # noqa: F401

    _send(channel, {"type": "ready", "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = run_job(json.loads(line))
        reply["type"] = "result"
        _send(channel, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
