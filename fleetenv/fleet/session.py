"""``Session``: the one owner of what episodes share (docs/sessions.md).

A session owns its backend (real Fleet, or the embedded local one without an API key),
the registry of the instances it created, its caps, its retry policy, its event bus and
its HTTP clients. Not per session: Fleet's rate limits are per API key, so sessions with
the same key share one :class:`~fleetenv.fleet.limits.KeyLimiter`; the local Fleet is
one server per process; MCP traffic has pools of its own (``fleetenv.mcp.http``).
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.errors import ConfigurationError, FleetEnvError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.retry import RetryPolicy
from fleetenv.fleet.limits import Gate, key_limiter
from fleetenv.fleet.manager import ManagerClient, ManagerPool
from fleetenv.fleet.registry import InstanceRegistry, install_signal_handlers, untrack

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.client import FleetClient
    from fleetenv.fleet.provisioning import Instance, Provisioner

__all__ = ["Session"]

logger = logging.getLogger("fleetenv")


class Session:
    """Settings, connections and instances shared by the episodes that use it.

    ``Session(config)`` takes a resolved :class:`~fleetenv.FleetConfig`; otherwise the
    arguments are those of :func:`~fleetenv.resolve_config` (``api_key``, ``base_url``
    and any ``FleetConfig`` setting, e.g. ``Session(max_steps=20)``). ``events`` is the
    bus its episodes report to (default: a new bus that logs). Nothing remote happens
    until the first episode needs an instance. Thread-safe.
    """

    def __init__(
        self,
        config: FleetConfig | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        events: EventBus | None = None,
        **settings: Any,
    ) -> None:
        self.config: FleetConfig = _config(config, api_key, base_url, settings)
        from fleetenv.fleet.provisioning import new_run_tag

        #: Tag put on every instance this session creates (fleet-python's ``run_id``).
        self.run_tag: str = self.config.run_tag or new_run_tag()
        self.events: EventBus = events if events is not None else EventBus()
        #: The one retry policy of this session (budget: ``timeouts.provision``).
        self.retry: RetryPolicy = RetryPolicy(
            base_s=self.config.retry_base_s, cap_s=self.config.retry_cap_s,
            budget_s=self.config.timeouts.provision)
        self.creating = Gate("max_creating_instances", self.config.max_creating_instances)
        self.live = Gate("max_live_instances", self.config.max_live_instances)
        self.instances = InstanceRegistry()
        self._manager_pool = ManagerPool()
        self._provisioner: Provisioner | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        # Here, not at the first create: that often runs in a worker thread, and only the
        # main thread can install a signal handler.
        install_signal_handlers()

    @classmethod
    def shared(cls, config: FleetConfig | None = None, *, api_key: str | None = None,
               base_url: str | None = None, **settings: Any) -> Session:
        """The process's one open session for these settings (``config``, or the arguments
        of :func:`~fleetenv.resolve_config`; none: the environment's), made on first use
        and shared by every caller that asks with equal settings, so their caps hold
        across all of them. A closed one, or one inherited through ``fork``, is replaced.
        Like any session it deletes its instances when closed, at the latest at exit.

        Settings are equal when their ``FleetConfig`` is: two API keys are two sessions
        (compared by value, never shown)."""
        config = _config(config, api_key, base_url, settings)
        install_signal_handlers()  # the first shared session is often made in a worker
        with _shared_lock:
            session = _shared.get(config)
            if session is None or session.closed or session._pid != os.getpid():
                session = _shared[config] = cls(config)
            return session

    def __repr__(self) -> str:
        where = "local" if self.config.use_local else self.config.base_url
        state = "closed" if self._closed else f"{len(self.instances)} live instance(s)"
        return f"<Session {where} run_tag={self.run_tag!r} {state}>"

    # ------------------------------------------------------------------ lifecycle

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Delete every instance this session created and still holds, sweep leftovers
        of uncertain creates, and close its HTTP pools. Idempotent; never raises for a
        delete that failed (it is logged, and the instance's TTL reaps it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            provisioner = self._provisioner
        if os.getpid() != self._pid:
            return  # a forked child: the instances and sockets are the parent's
        try:
            self.instances.delete_all()
        finally:
            untrack(self.instances)
            self._manager_pool.close()
            if provisioner is not None:
                provisioner.client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ the backend

    @property
    def is_local(self) -> bool:
        """True when this session runs on the embedded local Fleet."""
        return self.config.use_local

    @property
    def base_url(self) -> str:
        """The control plane this session talks to (starts the local Fleet if needed)."""
        return self.client.base_url

    @property
    def provisioner(self) -> Provisioner:
        """The session's Fleet, built on first use: its client, caps and registry."""
        self._check_usable()
        provisioner = self._provisioner
        if provisioner is not None:
            return provisioner
        with self._lock:
            if self._provisioner is None:
                self._provisioner = self._build_provisioner()
            return self._provisioner

    @property
    def client(self) -> FleetClient:
        return self.provisioner.client

    def _build_provisioner(self) -> Provisioner:
        from fleetenv.fleet.client import FleetClient
        from fleetenv.fleet.provisioning import Provisioner

        config = self.config
        if config.use_local:
            from fleetenv.fleet.backend import local_fleet

            local = local_fleet()
            base_url, api_key = local.base_url, local.token
        else:
            if config.api_key is None:  # FleetConfig's own validation rules this out
                raise ConfigurationError("no API key", field="api_key")
            base_url, api_key = config.base_url, config.api_key.get_secret_value()
        # Creates, polls, deletes and verifications each run under their own overall
        # deadline (timeouts.verify is the real bound of a verification, with no floor);
        # timeout_s only bounds a request made outside any of them.
        client = FleetClient(api_key, base_url, timeout_s=config.timeouts.read,
                             connect_timeout_s=config.timeouts.connect)
        return Provisioner(
            client, registry=self.instances, creating=self.creating, live=self.live,
            key_limit=key_limiter(base_url, api_key), retry=self.retry,
            run_tag=self.run_tag, delete_timeout_s=config.timeouts.delete)

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise FleetEnvError(
                "this session was created in the parent process; a forked child cannot "
                "use it (its sockets and instances belong to the parent)",
                hint="create a new fleetenv.Session in the child process")
        if self._closed:
            raise FleetEnvError("the session is closed",
                                hint="create a new fleetenv.Session")

    # ------------------------------------------------------------------ services

    def manager(self, instance: Instance) -> ManagerClient:
        """A client for ``instance``'s manager API over this session's pools."""
        self._check_usable()
        return ManagerClient(instance.manager_url, pool=self._manager_pool,
                             instance_id=instance.instance_id,
                             timeout_s=self.config.timeouts.read,
                             connect_timeout_s=self.config.timeouts.connect,
                             runner_tokens=self.client.runner_tokens)

    def verifier_retry(self) -> RetryPolicy:
        """The retry policy of one verification (bounded by ``timeouts.verify``)."""
        return self.retry.with_budget(self.config.timeouts.verify, max_attempts=3)

    def live_instance_ids(self) -> list[str]:
        """Instances this session created and has not deleted yet."""
        return self.instances.live_ids()

    def sweep(self, run_tag: str | None = None) -> list[str]:
        """Delete every running instance tagged ``run_tag`` (default: this session's tag),
        including ones created by other processes with the same tag; returns their ids.

        Only sweep a tag when nothing created under it is still in use."""
        return self.provisioner.sweep_tag(run_tag or self.run_tag)


_shared_lock = threading.Lock()
_shared: dict[FleetConfig, Session] = {}  # Session.shared(), by settings


def _config(config: FleetConfig | None, api_key: str | None, base_url: str | None,
            settings: dict[str, Any]) -> FleetConfig:
    """``config``, or the config the settings resolve to; never both."""
    if config is None:
        return resolve_config(api_key=api_key, base_url=base_url, **settings)
    if api_key is not None or base_url is not None or settings:
        raise ConfigurationError(
            "pass either a config or settings (api_key=, base_url=, ...), not both",
            hint="apply changes with config.replace(...)")
    return config
