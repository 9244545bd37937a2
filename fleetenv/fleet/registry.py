"""Registries of live instances (one per session), and the process hooks that empty them.

Every instance fleetenv creates is in its session's registry from the moment ``make()``
returns until its delete succeeds. ``close()``, ``with``-exit, Ctrl-C, ``Session.close()``,
interpreter exit (the runtime's shutdown hooks), SIGTERM and SIGHUP all end in
:meth:`InstanceRegistry.delete_all`; the exit hooks are process-wide and reach every
registry that still holds instances. What a signal does: :func:`install_signal_handlers`.
Deletes are synchronous HTTP calls in the calling thread: at exit the event loop may
already be gone.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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

    def remove_sweeper(self, sweep: Callable[[], object]) -> None:
        """Forget a sweeper added with :meth:`add_sweeper` (no error if it is not there)."""
        with self._lock:
            if sweep in self._sweepers:
                self._sweepers.remove(sweep)

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

        # Threads of their own, not the runtime's pool: this runs at interpreter exit,
        # when concurrent.futures has joined its pools and refuses new work, and after a
        # signal, while the runtime may be shutting down. They end with their deletes.
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

#: How long interpreter exit waits for the deletes a signal started (each delete is
#: bounded by its own timeout; this only bounds the wait for all of them).
_SIGNAL_CLEANUP_WAIT_S = 60.0

#: The signals that end the process after deleting its instances (no SIGHUP on Windows).
_SIGNALS = ((signal.SIGTERM,) if sys.platform == "win32"
            else (signal.SIGTERM, signal.SIGHUP))
_signals_installed = False
#: The handler each signal had before fleetenv's (called after the cleanup started).
_previous: dict[int, Any] = {}
#: Set (from the signal handler, in the main thread) once a signal started the cleanup.
_terminating = False
_cleanup_thread: threading.Thread | None = None
_cleanup_pid = 0
#: Set while the exit hook deletes (see ``exiting()``).
_exiting = False


def track(registry: InstanceRegistry) -> None:
    """Make interpreter exit, SIGTERM and SIGHUP reach ``registry`` (and install the
    hooks)."""
    with _hooks_lock:
        _registries.add(registry)
    install_exit_hooks()


def untrack(registry: InstanceRegistry) -> None:
    with _hooks_lock:
        _registries.discard(registry)


def terminating() -> bool:
    """True once this process received SIGTERM or SIGHUP (fleetenv creates no instance
    after it)."""
    return _terminating and _cleanup_pid == os.getpid()


def exiting() -> bool:
    """True while the exit hook deletes, once the interpreter exits, or once a signal
    started deleting: a delete then gets one quick retry, not the full backoff (nobody
    waits for it, and a Fleet that is gone, such as an embedded one already stopped, would
    hold the exit for ~10 s). After an explicit ``fleetenv.runtime.shutdown()`` fleetenv
    goes on working, and its deletes get their full retries again."""
    from fleetenv.runtime import at_interpreter_exit

    return _exiting or at_interpreter_exit() or terminating()


def delete_everywhere() -> None:
    """Delete the live instances of every tracked registry (the exit hook).

    If a signal already started this in the background, wait for it first (bounded),
    then delete whatever is left (an instance created meanwhile, a delete that failed)."""
    global _exiting
    _exiting = True
    try:
        thread = _cleanup_thread
        if (thread is not None and _cleanup_pid == os.getpid()
                and thread is not threading.current_thread()):
            thread.join(_SIGNAL_CLEANUP_WAIT_S)
        _delete_all_registries()
    finally:
        _exiting = False


def _delete_all_registries() -> None:
    with _hooks_lock:
        registries = list(_registries)
    for registry in registries:
        registry.delete_all()


def install_exit_hooks() -> None:
    """Make interpreter exit delete live instances (idempotent).

    Called lazily when the first instance is created, from any thread. Signals are
    :func:`install_signal_handlers`' business (it needs the main thread).
    """
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    from fleetenv.runtime import add_shutdown_hook

    add_shutdown_hook(delete_everywhere)
    install_signal_handlers()  # in case the first instance is made on the main thread


def install_signal_handlers() -> None:
    """Make SIGTERM and SIGHUP delete every live instance, then do what they did before
    (idempotent). The handler waits for nothing: a thread of its own deletes and cancels
    the work in flight on fleetenv's loop, and no instance is created after it.

    Only the main thread can install a signal handler, so this is a no-op elsewhere;
    fleetenv calls it from ``Session()``, ``Session.shared()``, ``Runner()`` and
    ``FleetEnv()``. A signal that is ignored (``SIG_IGN``: SIGHUP under ``nohup``) or
    handled outside Python is left alone. A Python handler installed before this one is
    called after fleetenv's cleanup has started; the default action becomes
    ``SystemExit(128 + signal)`` (so ``finally`` blocks and ``atexit`` run, which the
    default action would skip).
    """
    global _signals_installed
    if _signals_installed or threading.current_thread() is not threading.main_thread():
        return
    for signum in _SIGNALS:
        previous = signal.getsignal(signum)
        if previous is _on_signal or previous is signal.SIG_IGN or previous is None:
            continue  # ours already; the user chose to ignore it; or C code handles it
        try:
            signal.signal(signum, _on_signal)
        except ValueError:  # not the main interpreter (subinterpreters): nothing to do
            return
        _previous[signum] = previous
    _signals_installed = True


def _on_signal(signum: int, frame: Any) -> None:
    """The SIGTERM and SIGHUP handler (runs in the main thread, between two bytecodes).

    It takes no lock the interrupted code might hold: the deletes and the cancellation
    run in a new thread, and this only starts it."""
    _start_signal_cleanup(signum)
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    # SIG_DFL: end the process like the default would, but through SystemExit, which
    # unwinds the main thread through every `finally` and then runs atexit.
    raise SystemExit(128 + signum)


def _start_signal_cleanup(signum: int) -> None:
    global _terminating, _cleanup_thread, _cleanup_pid
    pid = os.getpid()
    if _terminating and _cleanup_pid == pid:
        return  # a second signal: the cleanup is already running
    _terminating, _cleanup_pid = True, pid
    # A thread of its own, not the runtime's pool: the handler may have interrupted the
    # pool's own locks, and the runtime may be shutting down (see delete_all).
    thread = threading.Thread(target=_signal_cleanup, args=(signal.Signals(signum).name,),
                              name="fleetenv-signal-cleanup", daemon=True)
    _cleanup_thread = thread
    thread.start()


def _signal_cleanup(name: str) -> None:
    logger.warning("%s: deleting every live fleetenv instance", name)
    try:
        from fleetenv import runtime

        runtime.current().cancel_running()  # hung tool calls must not hold up the exit
    except Exception as exc:
        logger.warning("could not cancel fleetenv's work in flight: %s", exc)
    _delete_all_registries()
