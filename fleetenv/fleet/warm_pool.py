"""Warm pool: reuse a session's instances between episodes instead of re-creating them.

The rules (same environment only, reset right before reuse, never a dirty instance, a
hard cap, expiry before the TTL) are in docs/warm-pool.md. There is no background
thread: expired idle instances are deleted at the next take or return
(:meth:`WarmPool.trim`) and at :meth:`WarmPool.close`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import ConfigurationError, FleetEnvError

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.provisioning import Instance, ProvisionListener, ProvisionRequest
    from fleetenv.fleet.session import Session

__all__ = ["PoolStats", "WarmPool", "pool_of"]

logger = logging.getLogger("fleetenv.pool")

_pools: weakref.WeakKeyDictionary[Session, WarmPool] = weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


def pool_of(session: Session) -> WarmPool | None:
    """The open warm pool of ``session``, if it has one (the provisioning hook)."""
    with _pools_lock:
        pool = _pools.get(session)
    return pool if pool is not None and not pool.closed else None


@dataclass
class PoolStats:
    """What the pool did so far."""

    created: int = 0
    """Instances created through the pool (a miss)."""
    reused: int = 0
    """Episodes that got a warm instance (a hit)."""
    returned: int = 0
    """Instances kept after an episode."""
    dirty: int = 0
    """Instances deleted because their episode did not end cleanly."""
    reset_failed: int = 0
    """Warm instances deleted because their reset failed."""
    expired: int = 0
    """Idle instances deleted for their TTL or ``max_idle_s``."""
    full: int = 0
    """Instances deleted because the pool was full, or to free a live slot."""


@dataclass
class _Born:
    key: tuple[Any, ...]
    expires_at: float
    """Monotonic time after which no new episode may start on it."""


@dataclass
class _Idle:
    instance: Instance
    key: tuple[Any, ...]
    expires_at: float


class WarmPool:
    """Keeps a session's instances between episodes and resets them for the next one.

    Thread-safe. Attaches itself to ``session`` (one pool per session); ``close()``
    detaches it and deletes the idle instances.
    """

    def __init__(self, session: Session, *, max_instances: int = 8,
                 max_idle_s: float = 300.0,
                 expire_before_ttl_s: float | None = None) -> None:
        if max_instances < 1:
            raise ConfigurationError(f"max_instances must be at least 1, got {max_instances}",
                                     field="max_instances",
                                     hint="leave the pool out to never reuse instances")
        if max_idle_s <= 0:
            raise ConfigurationError(f"max_idle_s must be positive, got {max_idle_s}",
                                     field="max_idle_s")
        if expire_before_ttl_s is not None and expire_before_ttl_s < 0:
            raise ConfigurationError(
                f"expire_before_ttl_s must be 0 or more, got {expire_before_ttl_s}",
                field="expire_before_ttl_s")
        self.session = session
        self.max_instances = max_instances
        self.max_idle_s = max_idle_s
        self.expire_before_ttl_s = expire_before_ttl_s
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._idle: list[_Idle] = []  # oldest first
        self._born: dict[str, _Born] = {}
        self._closed = False
        with _pools_lock:
            current = _pools.get(session)
            if current is not None and not current.closed:
                raise ConfigurationError("this session already has a warm pool",
                                         hint="close it first, or share it")
            _pools[session] = self

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._idle)} idle"
        return f"<WarmPool {state}, max_instances={self.max_instances}>"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> int:
        """Instances waiting for an episode."""
        with self._lock:
            return len(self._idle)

    # ------------------------------------------------------------------ the hook

    def provision(self, request: ProvisionRequest, *,
                  listener: ProvisionListener | None = None) -> Instance:
        """A reset warm instance that fits ``request``, else a new one (the provisioner's
        ``provision``, same errors)."""
        key = _key(request)
        self.trim()
        while True:
            idle = self._take(key)
            if idle is None:
                break
            started = time.monotonic()
            if self._reset(idle.instance):
                instance = idle.instance
                instance.provision_seconds = time.monotonic() - started
                instance.attempts = 0  # no create was sent for this episode
                with self._lock:
                    self.stats.reused += 1
                return instance
            with self._lock:
                self.stats.reset_failed += 1
            self._delete(idle.instance)
        self._make_room()
        instance = self.session.provisioner.provision(request, listener=listener)
        ttl = request.ttl_seconds
        if ttl is not None:
            born = time.monotonic() - instance.provision_seconds
            with self._lock:
                self._born[instance.instance_id] = _Born(
                    key=key, expires_at=born + ttl - self._margin(ttl))
        with self._lock:
            self.stats.created += 1
        return instance

    def give_back(self, instance: Instance, *, dirty: bool) -> bool:
        """Keep ``instance`` for a later episode; ``False``: not kept, the caller deletes
        it (dirty, unknown to the pool, about to expire, or the pool is full)."""
        with self._lock:
            born = self._born.get(instance.instance_id)
            if self._closed or instance.deleted or born is None:
                return False
            now = time.monotonic()
            refused = ("dirty" if dirty else "expired" if now >= born.expires_at
                       else "full" if len(self._idle) >= self.max_instances else None)
            if refused is not None:
                setattr(self.stats, refused, getattr(self.stats, refused) + 1)
                del self._born[instance.instance_id]  # the caller deletes it
                return False
            self._idle.append(_Idle(instance=instance, key=born.key,
                                    expires_at=min(born.expires_at, now + self.max_idle_s)))
            self.stats.returned += 1
            return True

    # ------------------------------------------------------------------ housekeeping

    def trim(self) -> int:
        """Delete idle instances that expired; returns how many."""
        now = time.monotonic()
        with self._lock:
            expired = [i for i in self._idle if now >= i.expires_at]
            self._idle = [i for i in self._idle if now < i.expires_at]
            self.stats.expired += len(expired)
        for idle in expired:
            self._delete(idle.instance)
        return len(expired)

    def close(self) -> None:
        """Detach from the session and delete the idle instances. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            self._born.clear()
        with _pools_lock:
            if _pools.get(self.session) is self:
                del _pools[self.session]
        for entry in idle:
            self._delete(entry.instance)

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _take(self, key: tuple[Any, ...]) -> _Idle | None:
        with self._lock:
            for index, idle in enumerate(self._idle):
                if idle.key == key and not idle.instance.deleted:
                    return self._idle.pop(index)
        return None

    def _make_room(self) -> None:
        """The live cap is full and idle instances hold slots: free the oldest one, or
        the create below would wait for a slot that only an idle instance can give."""
        live = self.session.live
        with self._lock:
            if live.in_use < live.capacity or not self._idle:
                return
            oldest = self._idle.pop(0)
            self.stats.full += 1
        self._delete(oldest.instance)

    def _margin(self, ttl: float) -> float:
        """How much TTL must be left for an instance to serve another episode."""
        if self.expire_before_ttl_s is not None:
            return self.expire_before_ttl_s
        config = self.session.config
        deadline = config.timeouts.episode
        if deadline is not None and deadline + config.timeouts.verify < ttl:
            return deadline + config.timeouts.verify
        return ttl / 2

    def _reset(self, instance: Instance) -> bool:
        try:
            self.session.manager(instance).reset(
                seed=None, timeout_s=self.session.config.timeouts.reset)
        except Exception as exc:  # any failure makes it dirty; a fresh one replaces it
            logger.info("warm instance %s did not reset (%s: %s); deleting it",
                        instance.instance_id, type(exc).__name__, exc)
            return False
        return True

    def _delete(self, instance: Instance) -> None:
        with self._lock:
            self._born.pop(instance.instance_id, None)
        try:
            self.session.provisioner.delete(instance)
        except FleetEnvError as exc:  # handed to the sweeper; its TTL reaps it otherwise
            logger.warning("could not delete pooled instance %s: %s",
                           instance.instance_id, exc)


def _key(request: ProvisionRequest) -> tuple[Any, ...]:
    """What must match for an instance to serve another episode."""
    variables = json.dumps(request.env_variables or {}, sort_keys=True, default=str)
    return (request.env_key, request.env_version, request.data_key, request.data_version,
            variables, str(request.modality), request.region, request.run_tag)
