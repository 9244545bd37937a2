"""``LocalFleet``: start, inspect, break and stop an embedded Fleet.

The server either runs in daemon threads of this process (``in_process=True``, the
default: cheapest to start, fine for tests) or in a child process (``in_process=False``:
no GIL contention with the caller, for benchmarks and heavy runs). The Python API is the
same in both modes because inspection and faults always go through the authenticated
``/_local`` admin routes.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from fleetenv.local.config import (
    DEFAULT_REGIONS,
    HarnessFactory,
    LocalFleetConfig,
    LocalFleetError,
    check_bind_host,
    resolve_apps,
    resolve_harness,
)

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec

ADMIN_TIMEOUT_SECONDS = 30.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class Faults:
    """Fault injection on a running local Fleet (see ``fleetenv.local`` for the kinds)."""

    def __init__(self, fleet: LocalFleet) -> None:
        self._fleet = fleet

    def add(
        self,
        kind: str,
        *,
        instance: str | None = None,
        tool: str | None = None,
        route: str | None = None,
        method: str | None = None,
        key: str | None = None,
        seconds: float | None = None,
        status: int | None = None,
        message: str | None = None,
        payload: str | None = None,
        size: int | None = None,
        retryable: bool | None = None,
        times: int | None = None,
    ) -> str:
        """Register a fault; returns its id (for ``clear``). ``times=None``: until cleared."""
        spec: dict[str, Any] = {"kind": kind}
        for name, value in (("instance", instance), ("tool", tool), ("route", route),
                            ("method", method), ("key", key), ("seconds", seconds),
                            ("status", status), ("message", message), ("payload", payload),
                            ("size", size), ("retryable", retryable), ("times", times)):
            if value is not None:
                spec[name] = value
        return str(self._fleet._admin("POST", "/_local/faults", spec)["id"])

    def clear(self, fault_id: str | None = None) -> int:
        """Remove one fault, or all; held (hung) requests are released and proceed."""
        path = "/_local/faults" if fault_id is None else f"/_local/faults/{quote(fault_id)}"
        return int(self._fleet._admin("DELETE", path)["cleared"])

    def list(self) -> list[dict[str, Any]]:
        return list(self._fleet._admin("GET", "/_local/faults"))

    def expire(self, instance_id: str) -> dict[str, Any]:
        """Expire an instance now, exactly as if its TTL had run out."""
        return dict(self._fleet._admin("POST", f"/_local/instances/{quote(instance_id)}/expire"))


class LocalFleet:
    """An embedded Fleet on loopback that fleet-python and MCP clients talk to unchanged.

    ``with LocalFleet() as fleet:`` then point fleet-python at ``fleet.base_url`` with
    ``fleet.token`` as the API key (``fleet.env()`` gives the two environment variables).

    ``apps``: ``{env_key: AppSpec}``, an import path ``"module:ATTR"`` (the only form
    ``in_process=False`` accepts), or None for ``fleetenv.local.apps.APPS``.
    ``ttl_seconds`` is the default instance lifetime; ``verifier_timeout`` caps each
    verifier run; ``verifier_workers`` pre-warmed worker processes run them, and more
    start on demand, one per verification in flight, up to ``verifier_workers_max``;
    ``instance_limit`` live instances before creates get Fleet's 403.
    ``runner_token_gate``: instance-manager routes answer 404 without the
    ``X-Runner-Token`` served at ``/v1/runner-auth/token``, as gated Fleet clusters do.
    ``regions``: what ``/v1/regions`` lists and creates may name, the first being the
    default (others: Fleet's 400); by default ``local``, then Fleet's own regions.
    ``browser``: instances offer a ``cdp`` resource backed by a headless Chromium
    (``chromium``: its executable; default: found on PATH); without one, no ``cdp``.
    ``require_mcp_auth``: instances' MCP endpoints answer 401 without the API key
    (``Authorization: Bearer <token>``).
    (A subprocess server, ``in_process=False``, always uses the defaults of these five.)
    ``harness``: what runs harness jobs (``POST /v1/jobs``), called once per job
    (fleetenv's: ``fleetenv.rollouts.harness.ScriptedHarness``), or its import path
    ``"module:ATTR"`` (the only form ``in_process=False`` accepts); None: jobs are refused.
    """

    def __init__(
        self,
        *,
        apps: Mapping[str, AppSpec] | str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        in_process: bool = True,
        log_level: str = "WARNING",
        allow_non_loopback: bool = False,
        ttl_seconds: int = 3600,
        verifier_timeout: float = 30.0,
        verifier_workers: int = 2,
        verifier_workers_max: int = 32,
        instance_limit: int = 1000,
        startup_timeout: float = 30.0,
        runner_token_gate: bool = True,
        regions: tuple[str, ...] = DEFAULT_REGIONS,
        browser: bool = True,
        chromium: str | None = None,
        require_mcp_auth: bool = False,
        harness: HarnessFactory | str | None = None,
    ) -> None:
        check_bind_host(host, allow_non_loopback)
        if not in_process and any(v is not None and not isinstance(v, str)
                                  for v in (apps, harness)):
            raise LocalFleetError(
                "in_process=False can only load apps and a harness by import path "
                "('package.module:ATTR'), not from objects")
        self._apps = apps
        self._harness = harness
        self.token = token or secrets.token_urlsafe(24)
        self.config = LocalFleetConfig(
            host=host, port=port, token=self.token, log_level=log_level,
            allow_non_loopback=allow_non_loopback, default_ttl_seconds=ttl_seconds,
            verifier_timeout=verifier_timeout, verifier_workers=verifier_workers,
            verifier_workers_max=verifier_workers_max, instance_limit=instance_limit,
            runner_token=secrets.token_urlsafe(24) if runner_token_gate else "",
            regions=_regions(regions), browser=browser, chromium=chromium,
            require_mcp_auth=require_mcp_auth,
        )
        self.in_process = in_process
        self.startup_timeout = startup_timeout
        self.base_url = ""
        self.faults = Faults(self)
        self._server: Any = None
        self._child: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        mode = "in-process" if self.in_process else "subprocess"
        return f"<LocalFleet {self.base_url or 'not started'} ({mode})>"

    # ----- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> LocalFleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        if self._server is not None:
            return bool(self._server.alive)
        return self._child is not None and self._child.poll() is None

    def start(self) -> LocalFleet:
        if self.running:
            return self
        if self.in_process:
            self._start_in_process()
        else:
            self._start_child()
        return self

    def _start_in_process(self) -> None:
        apps = resolve_apps(self._apps)
        from fleetenv.local.server import ServerThread, quiet_loggers

        quiet_loggers(self.config.log_level)
        server = ServerThread(self.config, apps, resolve_harness(self._harness))
        server.start(self.startup_timeout)
        self._server = server
        self.base_url = server.base_url

    def _start_child(self) -> None:
        env = dict(os.environ)
        env["FLEETENV_LOCAL_TOKEN"] = self.token
        env["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_ROOT, *(p for p in sys.path if p and os.path.isdir(p))]
        )
        c = self.config
        command = [
            sys.executable, "-m", "fleetenv.local.child",
            "--host", c.host, "--port", str(c.port), "--log-level", c.log_level,
            "--ttl-seconds", str(c.default_ttl_seconds),
            "--verifier-timeout", str(c.verifier_timeout),
            "--verifier-workers", str(c.verifier_workers),
            "--verifier-workers-max", str(c.verifier_workers_max),
            "--instance-limit", str(c.instance_limit),
        ]
        if isinstance(self._apps, str):
            command += ["--apps", self._apps]
        if isinstance(self._harness, str):
            command += ["--harness", self._harness]
        if c.allow_non_loopback:
            command.append("--allow-non-loopback")
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=env, close_fds=True)
        lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=_forward_first_line, args=(child, lines), daemon=True,
                         name="fleetenv-local-child-reader").start()
        try:
            line = lines.get(timeout=self.startup_timeout)
        except queue.Empty:
            line = b""
        try:
            ready = json.loads(line) if line else {}
        except ValueError:
            ready = {}
        if "base_url" not in ready:
            _stop_child(child)
            raise LocalFleetError(
                f"the local Fleet subprocess did not become ready within "
                f"{self.startup_timeout:g} s (exit status {child.poll()}); see its stderr"
            )
        self._child = child
        self.base_url = ready["base_url"]

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        child, self._child = self._child, None
        if child is not None:
            _stop_child(child)

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C raises KeyboardInterrupt here)."""
        while self.running:
            if self._server is not None:
                self._server.join(0.5)
            elif self._child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._child.wait(0.5)

    # ----- convenience --------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """``FLEET_BASE_URL`` / ``FLEET_API_KEY`` for fleet-python and fleetenv."""
        return {"FLEET_BASE_URL": self.base_url, "FLEET_API_KEY": self.token}

    def runner_token(self) -> str | None:
        """The ``X-Runner-Token`` the manager routes require (None: they are not gated),
        fetched as fleet-python does, from ``GET /v1/runner-auth/token``."""
        try:
            answer = self._admin("GET", "/v1/runner-auth/token")
        except LocalFleetError as exc:
            if "(404)" in str(exc):  # no gate configured, as on an ungated Fleet
                return None
            raise
        token = answer.get("token") if isinstance(answer, dict) else None
        return token if isinstance(token, str) and token else None

    def client(self, *, max_retries: int = 0, timeout: float = 60.0) -> Any:
        """A fleet-python ``Fleet`` pointed at this server."""
        import fleet

        return fleet.Fleet(api_key=self.token, base_url=self.base_url,
                           max_retries=max_retries, timeout=timeout)

    # ----- inspection ---------------------------------------------------------------------

    def instances(self, status: str | None = None) -> list[dict[str, Any]]:
        """Every instance ever created (InstanceResponse plus ``ttl_seconds``,
        ``expires_at``, ``stop_reason``, ``tool_calls``), optionally by status."""
        path = "/_local/instances" + (f"?status={quote(status)}" if status else "")
        return list(self._admin("GET", path))

    def tool_call_counts(self, instance: str | None = None) -> dict[str, int]:
        """Tool executions by tool name, for one instance or summed over all."""
        per_instance = self._admin("GET", "/_local/tool-calls")["instances"]
        total: Counter[str] = Counter()
        for instance_id, counts in per_instance.items():
            if instance is None or instance_id == instance:
                total.update(counts)
        return dict(total)

    def tool_calls_by_call_id(self) -> dict[str, dict[str, Any]]:
        """``{call_id: {"count", "instance", "tool"}}`` for calls that sent a
        ``fleetenv/call_id`` in ``_meta``; a count above 1 means a call ran twice."""
        return dict(self._admin("GET", "/_local/tool-calls")["call_ids"])

    def _admin(self, method: str, path: str, body: Any = None) -> Any:
        if not self.base_url:
            raise LocalFleetError("the local Fleet is not running; call start() first")
        parts = urlsplit(self.base_url)
        if parts.hostname is None:  # start() always sets http://host:port
            raise LocalFleetError(f"the local Fleet base URL {self.base_url!r} names no host")
        connection = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=ADMIN_TIMEOUT_SECONDS
        )
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except OSError as exc:
            raise LocalFleetError(
                f"local Fleet admin call {method} {path} failed: {exc}"
            ) from exc
        finally:
            connection.close()
        data = json.loads(raw) if raw else None
        if response.status >= 400:
            # repr(): the raw bytes as b'...' text.
            message = data.get("detail") if isinstance(data, dict) else repr(raw[:200])
            raise LocalFleetError(f"local Fleet admin call {method} {path} failed "
                                  f"({response.status}): {message}")
        return data


def _regions(regions: tuple[str, ...] | list[str] | str) -> tuple[str, ...]:
    names = (regions,) if isinstance(regions, str) else tuple(regions)
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise LocalFleetError(f"regions={regions!r} must name at least one region, e.g. "
                              "('local',) or ('us-west-1', 'eu-west-2')")
    return tuple(n.strip() for n in names)


def _forward_first_line(child: subprocess.Popen[bytes], lines: queue.Queue[bytes]) -> None:
    assert child.stdout is not None
    lines.put(child.stdout.readline())
    # keep draining so the child never blocks on a full pipe
    for _ in child.stdout:
        pass


def _stop_child(child: subprocess.Popen[bytes]) -> None:
    """Closing stdin asks the child to stop cleanly; escalate if it does not."""
    try:
        if child.stdin is not None:
            child.stdin.close()
    except OSError:
        pass
    for action, timeout in ((None, 15.0), (child.terminate, 5.0), (child.kill, 5.0)):
        if action is not None:
            action()
        try:
            child.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue
