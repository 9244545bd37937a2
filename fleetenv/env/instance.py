"""The instance under one ``FleetEnv``: created, reset, replaced and deleted here, with
the browser lease a ``browser_use`` task acts through (created after the instance,
navigated again at every reset, deleted before it, on every exit path).

Every method is blocking and runs in the caller's thread (or a worker thread for the
async twins), never on the event-loop thread. Events about the instance are reported
through the ``emit`` callback the env hands in, so they carry the rollout's ids.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fleetenv.core.errors import EpisodeStateError, FleetEnvError
from fleetenv.core.events import (
    InstanceDeleted,
    InstanceDeleteFailed,
    InstanceProvisioned,
    ProvisioningFailed,
    ProvisioningRetry,
    ResetFailed,
)
from fleetenv.core.redaction import register_secret
from fleetenv.core.retry import Deadline, RetryPolicy
from fleetenv.core.tasks import Task
from fleetenv.core.types import Modality
from fleetenv.fleet.warm_pool import pool_of

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.leases import BrowserLease, LeaseClient
    from fleetenv.fleet.manager import ManagerClient
    from fleetenv.fleet.provisioning import Instance, ProvisionRequest
    from fleetenv.fleet.session import Session

__all__ = ["InstanceLease"]

logger = logging.getLogger("fleetenv.leases")

Emit = Callable[..., None]
"""``emit(EventType, **fields)``: report an event for this env's rollout."""

#: Control-plane statuses that mean the instance will not come back.
_GONE_STATUSES = frozenset({"stopped", "error", "terminated"})
#: The headers of fleet-python's own requests that carry the credentials: an API key as
#: ``Authorization: Bearer``, or a ``flt login`` session as a JWT plus its team.
_CREDENTIAL_HEADERS = ("Authorization", "X-JWT-Token", "X-Team-ID")
#: Opening an instance's MCP sessions (all endpoints, all attempts, the wait for a
#: handshake slot) may take this many connect timeouts, within the episode deadline.
_MCP_OPEN_CONNECT_TIMEOUTS = 3
# Pacing of MCP setup retries: a server still starting needs well under a second more.
_MCP_RETRY_BASE_S = 0.1
_MCP_RETRY_CAP_S = 2.0
#: Registry label of browser leases (the registry lists them next to instances).
_LEASE_KIND = "browser-lease"


class InstanceLease:
    """Holds at most one live instance for one env, and gives it back on ``drop``."""

    def __init__(self, session: Session, task: Task, *, ttl_seconds: int,
                 run_tag: str | None, emit: Emit,
                 on_instance: Callable[[str], None]) -> None:
        self.session = session
        self.task = task
        self.ttl_seconds = ttl_seconds
        self.run_tag = run_tag
        self._emit = emit
        self._on_instance = on_instance
        self._lock = threading.Lock()
        self._closed = False
        #: Creates under way (a cancelled async reset leaves one running in its worker
        #: thread) and what must wait for them to end (see `call_when_idle`).
        self._provisioning = 0
        self._when_idle: list[Callable[[], None]] = []
        self.instance: Instance | None = None
        #: The most recent instance's id, kept after it was deleted.
        self.last_instance_id: str | None = None
        #: The browser lease of a ``browser_use`` episode (see `fleetenv.fleet.leases`).
        self.browser: BrowserLease | None = None
        self._lease_client: LeaseClient | None = None
        self._pid = os.getpid()
        #: Set by the env: its episode closed cleanly (``reusable``); a tool call failed
        #: and may still run on the server (``tainted``). A warm pool keeps the instance
        #: only when reusable and not tainted (see ``fleetenv.fleet.warm_pool``).
        self.reusable = False
        self.tainted = False
        #: Tool calls sent and not yet settled (a close from another thread may land
        #: while one is out: the instance is then not reusable, taint or not).
        self._calls_out = 0

    @contextlib.contextmanager
    def call_out(self) -> Iterator[None]:
        """Count a tool call as out for its whole life, the taint included: the count
        drops only after the call's failure (if any) marked the instance."""
        with self._lock:
            self._calls_out += 1
        try:
            yield
        finally:
            with self._lock:
                self._calls_out -= 1

    def keep_if_clean(self, clean: bool) -> None:
        """Set by a closing env: reusable when it closed cleanly and no call is out."""
        with self._lock:
            self.reusable = clean and not self._calls_out

    @property
    def instance_id(self) -> str | None:
        instance = self.instance
        return instance.instance_id if instance else None

    def provision(self) -> None:
        """Create the instance; it is stored here before this returns, so a caller that
        is cancelled meanwhile still leaves it for ``drop()`` to delete."""
        from fleetenv.fleet.provisioning import ProvisionRequest

        task = self.task
        request = ProvisionRequest(
            env_key=task.env_key, env_version=task.env_version, data_key=task.data_key,
            data_version=task.data_version, env_variables=dict(task.env_variables or {}),
            modality=task.modality, ttl_seconds=self.ttl_seconds, task_key=task.key,
            run_tag=self.run_tag, region=self.session.config.region,
        )

        with self._lock:
            self._provisioning += 1
        try:
            self._provision(request)
            self._open_browser()
        finally:
            with self._lock:
                self._provisioning -= 1
                waiting: list[Callable[[], None]] = []
                if not self._provisioning:
                    waiting, self._when_idle = self._when_idle, []
            for fn in waiting:
                fn()

    def call_when_idle(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` now, or when the create under way ends. For closing a private
        session: a create still running in a worker thread (its async reset was
        cancelled) must finish on an open session, so the instance it makes is deleted
        rather than left running until its TTL."""
        with self._lock:
            if self._provisioning:
                self._when_idle.append(fn)
                return
        fn()

    def _provision(self, request: ProvisionRequest) -> None:
        task = self.task
        attempts = 0  # creates actually sent (0: it failed waiting for a slot)

        def listener(kind: str, details: dict[str, Any]) -> None:
            nonlocal attempts
            if kind == "attempt":
                attempts = details["attempt"]
            elif kind == "retry":
                self._emit(ProvisioningRetry, attempt=details["attempt"],
                           delay_s=details["delay_s"], error_type=details["error_type"],
                           error=details["error"])

        pool = pool_of(self.session)
        provision = pool.provision if pool is not None else self.session.provisioner.provision
        try:
            instance = provision(request, listener=listener)
        except Exception as exc:
            self._emit(ProvisioningFailed, attempts=attempts, error_type=type(exc).__name__,
                       error=str(exc))
            raise
        with self._lock:
            closed = self._closed
            self.instance, self.tainted = instance, False
        self.last_instance_id = instance.instance_id
        self._on_instance(instance.instance_id)
        self._emit(InstanceProvisioned, seconds=instance.provision_seconds,
                   attempts=instance.attempts)
        if closed:  # close() ran while we were provisioning: do not leak the new instance
            self.drop("closed")
            raise EpisodeStateError("the environment was closed during reset()",
                                    task=task.key)

    def reset(self, seed: int | None) -> bool:
        """Restore the seed state. On failure the instance is dropped and ``False``
        returned (the failure is reported as an event, never silently ignored)."""
        timeout_s = self.session.config.timeouts.reset
        try:
            self.manager().reset(seed=seed, timeout_s=timeout_s)
        except FleetEnvError as exc:
            self._emit(ResetFailed, error_type=type(exc).__name__, error=str(exc),
                       timeout_s=timeout_s)
            self.drop("reset_failed")
            return False
        self._open_browser()  # the browser reloads the app's start page with the data
        return True

    def drop(self, reason: str) -> None:
        """Delete the instance (idempotent) and report it. In a forked child it only
        forgets the instance: the instance is the parent's."""
        if os.getpid() != self._pid:
            self.instance = self.browser = None
            return
        self.drop_browser(reason)
        with self._lock:
            instance, self.instance = self.instance, None
        if instance is None:
            return
        pool = pool_of(self.session) if reason == "closed" else None
        if pool is not None and pool.give_back(instance,
                                               dirty=self.tainted or not self.reusable):
            return  # kept warm for the next episode of the same environment
        try:
            self.session.provisioner.delete(instance)
        except Exception as exc:
            self._emit(InstanceDeleteFailed, error_type=type(exc).__name__, error=str(exc))
            return
        self._emit(InstanceDeleted, reason=reason)

    def close(self) -> None:
        """No new instance may be kept from now on; deletes the current one."""
        with self._lock:
            self._closed = True
        self.drop("closed")

    def is_gone(self) -> bool:
        """Ask the control plane whether the instance stopped (unknown counts as not)."""
        instance = self.instance
        if instance is None:
            return True
        try:
            status = self.session.client.sdk.instance(instance.instance_id).status
        except Exception:
            return False  # unknown: treat the failure as a tool error, not as expiry
        return status in _GONE_STATUSES

    def require(self) -> Instance:
        """The live instance; raises ``EpisodeStateError`` when there is none."""
        instance = self.instance
        if instance is None:
            raise EpisodeStateError("no instance yet", hint="call reset() first",
                                    task=self.task.key)
        return instance

    def manager(self) -> ManagerClient:
        return self.session.manager(self.require())

    # ------------------------------------------------------------------ MCP

    def mcp_headers(self) -> dict[str, str]:
        """The credentials for the instance's MCP endpoints: the ones fleet-python sends
        to Fleet itself. Secrets: they go to the MCP connections, whose reprs, logs and
        errors never show headers."""
        headers: dict[str, str] = self.session.client.sdk.client.get_headers()
        sent = {name: value for name, value in headers.items() if name in _CREDENTIAL_HEADERS}
        for value in sent.values():  # e.g. a login's JWT: scrubbed like the API key
            register_secret(value)
        return sent

    def mcp_setup_retry(self, deadline: Deadline) -> RetryPolicy:
        """How opening the MCP sessions retries, bounded by what is left of ``deadline``
        (the episode's): at most ``_MCP_OPEN_CONNECT_TIMEOUTS`` connect timeouts of the
        servers' time for the whole open. Time queued for a handshake slot is not the
        servers' time: with a thousand episodes opening at once most of them wait there,
        so the queue is bounded by the episode deadline instead, not by the budget."""
        budget_s = deadline.cap(
            self.session.config.timeouts.connect * _MCP_OPEN_CONNECT_TIMEOUTS)
        return RetryPolicy(base_s=_MCP_RETRY_BASE_S, cap_s=_MCP_RETRY_CAP_S,
                           budget_s=max(budget_s, 0.001),
                           queue_budget_s=deadline.remaining())


    # ------------------------------------------------------------------ browser lease

    def wants_browser(self) -> bool:
        """A ``browser_use`` task without a browser MCP URL of its own gets a lease."""
        return (self.task.modality == Modality.BROWSER_USE
                and not (self.task.metadata or {}).get("browser_mcp_url"))

    def browser_mcp(self) -> tuple[str, dict[str, str]] | None:
        """The lease's MCP URL and credential, for the toolbox (None: no lease)."""
        lease = self.browser
        return (lease.mcp_url, dict(lease.headers)) if lease is not None else None

    def _client(self) -> LeaseClient:
        from fleetenv.fleet.leases import for_session

        if self._lease_client is None:
            client = self._lease_client = for_session(self.session)
            # A lease created behind a lost answer is found by its tag at session close
            # and exit, unless sibling processes share the tag (a runner's workers).
            if self.session.provisioner.sweeps_shared_tags:
                self.session.instances.add_sweeper(client.sweep_unsure)
        return self._lease_client

    def _open_browser(self) -> None:
        """Create the lease (once per instance) and bring its browser to the app's start
        page; on failure the lease is deleted and the error raised (the instance stays,
        for ``drop``)."""
        if not self.wants_browser():
            return
        from fleetenv.fleet.leases import wait_until_ready
        from fleetenv.fleet.registry import LiveInstance

        instance = self.require()
        config = self.session.config
        lease = self.browser
        if lease is None:
            host = urlsplit(instance.root_url).hostname
            if not host:
                raise FleetEnvError(f"instance {instance.instance_id} has no root URL to "
                                    "open in a browser", task=self.task.key)
            client = self._client()
            lease = client.create([host], ttl_seconds=self.ttl_seconds,
                                  run_tag=instance.run_tag or self.run_tag,
                                  task=self.task.key)
            # From here on the lease exists: registered before anything else can fail.
            self.session.instances.add(LiveInstance(
                lease.lease_id, _LEASE_KIND, functools.partial(self._delete_lease, lease)))
            with self._lock:
                self.browser, closed = lease, self._closed
            if closed:
                self.drop_browser("closed")
                raise EpisodeStateError("the environment was closed during reset()",
                                        task=self.task.key)
        try:
            wait_until_ready(lease, instance.root_url,
                             budget_s=config.timeouts.connect * _MCP_OPEN_CONNECT_TIMEOUTS,
                             connect_timeout_s=config.timeouts.connect,
                             call_timeout_s=config.timeouts.call, task=self.task.key)
        except Exception:
            self.drop_browser("unhealthy")
            raise

    def _delete_lease(self, lease: BrowserLease) -> None:
        self._client().delete(lease)
        self.session.instances.discard(lease.lease_id)

    def drop_browser(self, reason: str) -> None:
        """Delete the browser lease (idempotent). A failed delete is logged with the
        sweep command; the lease stays registered, so session close and exit retry it."""
        with self._lock:
            lease, self.browser = self.browser, None
        if lease is None or os.getpid() != self._pid:
            return
        try:
            self._delete_lease(lease)
        except Exception as exc:
            logger.warning("could not delete browser lease %s (%s): %s", lease.lease_id,
                           reason, exc)
