"""Instances: creation, lookup, TTL expiry and stopping.

Only the server's event loop touches the store (routes, the TTL reaper, the admin
route), so it needs no locks; blocking file work goes to worker threads.

A stopped instance (deleted, or its TTL ran out) keeps its record so the control plane
can still report it as ``"stopped"``, as Fleet does; its database file is removed and
its MCP sessions are ended. Requests to its instance URLs are answered with
``410 Gone`` and a JSON ``detail``: fast (fleet-python retries 404 and 5xx, not 410),
unambiguous, and the MCP client surfaces it as an HTTP error on its next request.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from fleetenv.local.cdp import Browser
from fleetenv.local.databases import InstanceDatabase, SeedCache, copy_database
from fleetenv.local.mcp_host import InstanceMCP, ToolGate, ToolTemplates
from fleetenv.local.wire import ControlPlaneError

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec

logger = logging.getLogger("fleetenv.local")


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Instance:
    instance_id: str
    app: AppSpec
    version: str
    data_key: str
    data_version: str
    ttl_seconds: int
    region: str
    created_at: float
    env_variables: dict[str, Any] | None = None
    run_id: str | None = None
    profile_id: str | None = None
    heartbeat_interval: int | None = None
    image_type: str | None = None
    status: str = "pending"
    stop_reason: str | None = None
    updated_at: float = 0.0
    terminated_at: float | None = None
    last_heartbeat: float | None = None
    db: InstanceDatabase | None = None
    mcp: InstanceMCP | None = None
    tool_counts: Counter[str] = field(default_factory=Counter)
    browser: Browser | None = None
    """Its headless Chromium, once ``/resources/cdp/start`` asked for it."""
    resets: list[dict[str, Any]] = field(default_factory=list)
    """Every manager reset: the ``seed`` and ``timestamp`` it was sent, and when."""

    @property
    def env_key(self) -> str:
        return self.app.key

    @property
    def expires_at(self) -> float:
        """When its TTL runs out: ``ttl_seconds`` after it was created or, as on Fleet, its
        last heartbeat (a heartbeat extends the lifetime of an instance still in use)."""
        return max(self.created_at, self.last_heartbeat or 0.0) + self.ttl_seconds

    def reset_ui(self) -> None:
        """Reset the ``computer`` tool's UI state (view, focus, typed text) with the
        database, so a new episode starts on the app's start screen, as a fresh page load
        does. Apps that draw their own ``computer`` tool keep theirs."""
        from fleetenv.local.apps.computer import computer_session

        mcp = self.mcp
        session = computer_session(mcp.computer) if mcp is not None else None
        if session is not None:
            session.reset_ui()

    @property
    def running(self) -> bool:
        return self.status == "running"

    def response(self, base_url: str) -> dict[str, Any]:
        """The ``InstanceResponse`` fleet-python parses (all seven manager URLs)."""
        root = f"{base_url}/instances/{self.instance_id}/"
        manager = f"{root}api/v1/env"
        return {
            "instance_id": self.instance_id,
            "env_key": self.env_key,
            "version": self.version,
            "status": self.status,
            "subdomain": self.instance_id,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at or self.created_at),
            "terminated_at": iso(self.terminated_at),
            "team_id": "local",
            "region": self.region,
            "env_variables": self.env_variables,
            "data_key": self.data_key,
            "data_version": self.data_version,
            "health": self.running,
            "run_id": self.run_id,
            "profile_id": self.profile_id,
            "heartbeat_interval": self.heartbeat_interval,
            "heartbeat_region": None,
            "urls": {
                "root": root,
                "app": [root],
                "api": None,
                "health": f"{manager}/health",
                "api_docs": None,
                "manager": {
                    "api": manager,
                    "docs": f"{manager}/docs",
                    "reset": f"{manager}/reset",
                    "diff": f"{manager}/diff",
                    "snapshot": f"{manager}/snapshot",
                    "execute_verifier_function": f"{manager}/execute_verifier_function",
                    "execute_verifier_function_with_upload": (
                        f"{manager}/execute_verifier_function_with_upload"
                    ),
                },
            },
        }

    def describe(self, base_url: str) -> dict[str, Any]:
        """The response plus what only the local Fleet knows (for tests and the admin API)."""
        out = self.response(base_url)
        out.update(
            ttl_seconds=self.ttl_seconds,
            expires_at=iso(self.expires_at),
            stop_reason=self.stop_reason,
            image_type=self.image_type,
            tool_calls=dict(self.tool_counts),
            resets=list(self.resets),
            browser_pid=self.browser.pid if self.browser and self.browser.running else None,
        )
        return out


class InstanceStore:
    def __init__(
        self,
        *,
        apps: dict[str, AppSpec],
        workdir: Path,
        host: str,
        default_ttl_seconds: int,
        instance_limit: int,
    ) -> None:
        self.apps = apps
        self.host = host
        self.default_ttl_seconds = default_ttl_seconds
        self.instance_limit = instance_limit
        self._instances: dict[str, Instance] = {}
        #: The pending and running ones (stopped records stay in `_instances`), so that
        #: counting and reaping cost the live instances, not every one ever created.
        self._live: dict[str, Instance] = {}
        self._seeds = SeedCache(workdir / "seeds")
        self._instance_dir = workdir / "instances"
        self._by_request_id: dict[str, tuple[dict[str, Any], str]] = {}
        self._creating: dict[str, anyio.Event] = {}
        self._wakeup = anyio.Event()
        self._next_reap = 0.0  # when the reaper wakes up next (time.time())
        self._tool_templates: ToolTemplates = {}  # shared by every instance's MCP servers
        #: Awaited first by `stop_all`: other resources that must end with the server
        #: (their open MCP streams would hold up its graceful shutdown).
        self.on_stop_all: list[Callable[[], Awaitable[None]]] = []

    # ----- lookup -------------------------------------------------------------------------

    def get(self, instance_id: str) -> Instance | None:
        return self._instances.get(instance_id)

    def all(self) -> list[Instance]:
        return list(self._instances.values())

    def running_count(self) -> int:
        return len(self._live)

    # ----- creation -----------------------------------------------------------------------

    def parse_create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Validate a create request into instance fields, with Fleet's error wording.

        fleet-python maps a 400 by substring: "environment" + "not found" is
        FleetEnvironmentNotFoundError, and only without "environment" does "version" +
        "not found" become FleetVersionNotFoundError, so version errors say "env".
        """
        env_key = body.get("env_key")
        if not isinstance(env_key, str) or not env_key:
            raise ControlPlaneError(400, "env_key is required")
        app = self.apps.get(env_key)
        if app is None:
            raise ControlPlaneError(
                400, f"Environment '{env_key}' not found (local Fleet serves: "
                f"{', '.join(sorted(self.apps)) or 'nothing'})",
            )
        version = body.get("env_version") or app.default_version
        if version not in app.versions:
            raise ControlPlaneError(
                400, f"Version '{version}' not found for env '{env_key}' "
                f"(available: {', '.join(app.versions)})",
            )
        default_data_key, _ = app.default_data
        data_key = body.get("data_key") or default_data_key
        if data_key not in app.data:
            raise ControlPlaneError(
                400, f"Data key '{data_key}' does not exist for env '{env_key}' "
                f"(available: {', '.join(app.data)})",
            )
        data_version = body.get("data_version") or app.data[data_key][0]
        if data_version not in app.data[data_key]:
            raise ControlPlaneError(
                400, f"Data version '{data_version}' not found for data key '{data_key}' "
                f"(available: {', '.join(app.data[data_key])})",
            )
        ttl = body.get("ttl_seconds")
        if ttl is None:
            ttl = self.default_ttl_seconds
        if not isinstance(ttl, (int, float)) or ttl <= 0:
            raise ControlPlaneError(400, f"ttl_seconds must be a positive number, not {ttl!r}")
        return {
            "app": app,
            "version": version,
            "data_key": data_key,
            "data_version": data_version,
            "ttl_seconds": ttl,
            "region": body.get("region") or "local",
            "env_variables": body.get("env_variables"),
            "run_id": body.get("run_id"),
            "profile_id": body.get("profile_id"),
            "heartbeat_interval": body.get("heartbeat_interval"),
            "image_type": body.get("image_type"),
        }

    async def create(
        self,
        body: dict[str, Any],
        *,
        request_id: str | None,
        task_group: Any,
        gate_for: Any,
        fail_boot: str | None = None,
    ) -> Instance:
        """Create (or, for a repeated ``X-Request-ID``, return) an instance.

        A repeat of a request id whose create is still running waits for it; a repeat
        with a different body is a 409, as reusing an idempotency key should be.
        """
        if request_id is not None:
            in_flight = self._creating.get(request_id)
            if in_flight is not None:
                with anyio.fail_after(60):
                    await in_flight.wait()
            known = self._by_request_id.get(request_id)
            if known is not None:
                known_body, instance_id = known
                if known_body != body:
                    raise ControlPlaneError(
                        409, f"Request id '{request_id}' was already used for a different "
                        f"create request (instance '{instance_id}'); send a new X-Request-ID",
                    )
                return self._instances[instance_id]
        fields = self.parse_create(body)
        if self.running_count() >= self.instance_limit:
            raise ControlPlaneError(
                403, f"Instance limit reached: You have {self.running_count()} running "
                f"instances out of a maximum of {self.instance_limit}.",
            )
        done = anyio.Event()
        if request_id is not None:
            self._creating[request_id] = done
        try:
            now = time.time()
            instance = Instance(
                instance_id=secrets.token_hex(6), created_at=now, updated_at=now, **fields
            )
            self._instances[instance.instance_id] = instance
            self._live[instance.instance_id] = instance
            if request_id is not None:
                self._by_request_id[request_id] = (body, instance.instance_id)
            try:
                await self._boot(instance, task_group, gate_for(instance), fail_boot)
            except Exception as exc:
                logger.exception("instance %s of %r failed to boot", instance.instance_id,
                                 instance.env_key)
                instance.status = "error"
                instance.stop_reason = f"boot failed: {type(exc).__name__}: {exc}"
                await self.stop(instance, instance.stop_reason)
                raise ControlPlaneError(
                    500, f"Instance '{instance.instance_id}' of env '{instance.env_key}' failed "
                    f"to boot: {type(exc).__name__}: {exc} (a bug in the app or the local Fleet)",
                ) from exc
            if instance.expires_at < self._next_reap:  # sooner than the reaper looks again
                self._wakeup.set()
            return instance
        finally:
            if request_id is not None:
                self._creating.pop(request_id, None)
            done.set()

    async def _boot(
        self, instance: Instance, task_group: Any, gate: ToolGate, fail_boot: str | None
    ) -> None:
        if fail_boot is not None:
            self._live.pop(instance.instance_id, None)
            instance.status = "error"
            instance.stop_reason = fail_boot
            instance.terminated_at = instance.updated_at = time.time()
            return
        app = instance.app

        def prepare() -> InstanceDatabase:
            seed = self._seeds.seed_path(
                app.key, instance.data_key, instance.data_version, app.build_database
            )
            current = self._instance_dir / instance.instance_id / "current.sqlite"
            copy_database(seed, current)
            return InstanceDatabase(current=current, seed=seed)

        instance.db = await anyio.to_thread.run_sync(prepare)
        db = instance.db
        instance.mcp = InstanceMCP(app=app, db_factory=db.session, gate=gate, host=self.host,
                                   templates=self._tool_templates)
        await instance.mcp.start(task_group)
        instance.status = "running"
        instance.updated_at = time.time()

    # ----- stopping -----------------------------------------------------------------------

    async def stop(self, instance: Instance, reason: str) -> None:
        """Stop an instance (idempotent): end its MCP sessions, delete its database."""
        now = time.time()
        self._live.pop(instance.instance_id, None)
        if instance.status not in ("stopped", "error"):
            instance.status = "stopped"
            instance.stop_reason = reason
            instance.terminated_at = now
            instance.updated_at = now
        mcp, instance.mcp = instance.mcp, None
        if mcp is not None:
            await mcp.stop()
        browser, instance.browser = instance.browser, None
        if browser is not None:
            with anyio.CancelScope(shield=True):  # never leave a Chromium behind
                await anyio.to_thread.run_sync(browser.stop)
        db = instance.db
        if db is not None and not db.closed:
            await anyio.to_thread.run_sync(db.close)

    async def check_expiry(self, instance: Instance) -> None:
        if instance.running and time.time() >= instance.expires_at:
            await self.stop(instance, f"expired (ttl_seconds={instance.ttl_seconds:g})")

    async def expire_due(self) -> None:
        for instance in list(self._live.values()):
            await self.check_expiry(instance)

    async def reap_forever(self) -> None:
        """Stop instances whose TTL ran out; lookups also check, so this can be coarse."""
        while True:
            await self.expire_due()
            now = time.time()
            due = [i.expires_at for i in self._live.values() if i.running]
            delay = max(min([*(d - now for d in due), 1.0]), 0.01)
            self._wakeup = anyio.Event()
            self._next_reap = now + delay
            with anyio.move_on_after(delay):
                await self._wakeup.wait()

    async def stop_all(self) -> None:
        for stop_others in list(self.on_stop_all):  # browser leases (fleetenv.local.leases)
            await stop_others()
        for instance in list(self._instances.values()):
            await self.stop(instance, "local Fleet shut down")
