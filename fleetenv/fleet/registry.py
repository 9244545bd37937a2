"""Registries of live instances (one per session), and the process hooks that empty them.

Leaked instances cost money and hit instance limits, so every instance fleetenv creates
is recorded in its session's registry from the moment ``make()`` returns until its delete
succeeds. Normal ``close()``, ``with``-exit, Ctrl-C (the ``finally`` in the episode),
``Session.close()``, interpreter exit (``atexit``, via the runtime's shutdown hooks) and
SIGTERM (turned into ``SystemExit`` so the same exit path runs) all end in
:meth:`InstanceRegistry.delete_all`. The exit hooks are process-wide (there is one
interpreter exit), and reach every registry that still holds instances.

Deletes here are synchronous HTTP calls in the calling thread: at exit the event loop may
already be gone, and a delete must not depend on it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("fleetenv.instances")


@dataclass(frozen=True)
class LiveInstance:
    instance_id: str
    env_key: str
    delete: Callable[[], None]
    """Deletes the instance; must be idempotent and bounded by its own timeout."""


class InstanceRegistry:
    """Thread-safe set of instances this process created and has not deleted yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, LiveInstance] = {}
        self._sweepers: list[Callable[[], object]] = []
        self._pid = os.getpid()

    def add_sweeper(self, sweep: Callable[[], object]) -> None:
        """Register a callable that deletes leftovers the registry cannot know about
        (an instance created server-side whose create answer never arrived)."""
        with self._lock:
            self._sweepers.append(sweep)

    def add(self, instance: LiveInstance) -> None:
        with self._lock:
            self._live[instance.instance_id] = instance

    def discard(self, instance_id: str) -> None:
        with self._lock:
            self._live.pop(instance_id, None)

    def live_ids(self) -> list[str]:
        with self._lock:
            return list(self._live)

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def delete_all(self, *, workers: int = 8) -> int:
        """Delete every live instance (in parallel); return how many deletes succeeded.

        Never raises: it runs at exit, where an exception would only hide the others.
        In a forked child it does nothing, since the instances belong to the parent.
        """
        if os.getpid() != self._pid:
            return 0
        with self._lock:
            pending = list(self._live.values())
        deleted = self._delete(pending, workers) if pending else 0
        self._sweep()
        return deleted

    def _sweep(self) -> None:
        with self._lock:
            sweepers = list(self._sweepers)
        for sweep in sweepers:
            try:
                sweep()
            except Exception as exc:
                logger.warning("could not sweep leftover instances: %s", exc)

    def _delete(self, pending: list[LiveInstance], workers: int) -> int:
        logger.info("deleting %d live instance(s) before exit", len(pending))

        def delete_one(item: LiveInstance) -> bool:
            try:
                item.delete()
            except Exception as exc:
                logger.warning(
                    "could not delete instance %s (%s): %s; its TTL will reap it",
                    item.instance_id, item.env_key, exc,
                )
                return False
            self.discard(item.instance_id)
            return True

        # Plain threads, not a ThreadPoolExecutor: at interpreter exit concurrent.futures
        # refuses new work ("cannot schedule new futures after interpreter shutdown").
        results: list[bool] = []
        queue = list(pending)
        queue_lock = threading.Lock()

        def worker() -> None:
            while True:
                with queue_lock:
                    if not queue:
                        return
                    item = queue.pop()
                ok = delete_one(item)
                with queue_lock:
                    results.append(ok)

        threads = [threading.Thread(target=worker, name=f"fleetenv-delete-{n}", daemon=True)
                   for n in range(min(workers, len(pending)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()  # each delete is bounded by the HTTP client's timeout
        return sum(results)


_hooks_lock = threading.Lock()
_hooks_installed = False
#: Registries that may hold instances; each is removed when its session closes.
_registries: set[InstanceRegistry] = set()


def track(registry: InstanceRegistry) -> None:
    """Make interpreter exit and SIGTERM reach ``registry`` (and install the hooks)."""
    with _hooks_lock:
        _registries.add(registry)
    install_exit_hooks()


def untrack(registry: InstanceRegistry) -> None:
    with _hooks_lock:
        _registries.discard(registry)


def delete_everywhere() -> None:
    """Delete the live instances of every tracked registry (the exit hook)."""
    with _hooks_lock:
        registries = list(_registries)
    for registry in registries:
        registry.delete_all()


def install_exit_hooks() -> None:
    """Make interpreter exit and SIGTERM delete live instances (idempotent).

    Called lazily when the first instance is created, so importing fleetenv changes no
    signal handler. SIGTERM is only taken over when nobody else handles it (the default
    action would kill the process without running ``atexit``).
    """
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    from fleetenv.runtime.loop import add_shutdown_hook

    add_shutdown_hook(delete_everywhere)
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SystemExit unwinds the main thread through every `finally` and then runs atexit,
    # which is where live instances are deleted.
    raise SystemExit(128 + signum)
