"""A ``FleetEnv`` dropped without ``close()``: warn once, and delete its instance anyway.

In a notebook, re-running ``env = FleetEnv(task); env.reset()`` rebinds ``env`` and the
old env becomes garbage while its instance keeps running (and counting against the
account's limits) until its TTL or the kernel's exit. So every env is watched by a
:func:`weakref.finalize` that does not keep it alive. When the env is collected unclosed:

1. an :class:`UnclosedEnvWarning` (a ``ResourceWarning``, as Python warns for an
   unclosed file) names the task and the instance, once per env;
2. the cleanup ``close()`` would have done (the MCP sessions, the browser lease, the
   instance, a private session) runs on the runtime's pool. Never in the finalizer
   itself: the collector may run in any thread, fleetenv's event-loop thread included,
   where blocking on the loop would deadlock, and one holding ``threading``'s or the
   pool's own locks, where handing work to the pool would. So the finalizer only
   enqueues the job on the running event loop (``Runtime.call_soon``), which hands it
   to the pool. No loop running means the runtime was shut down (an env's MCP sessions
   start the loop before it holds anything), and the shutdown hooks already deleted its
   instance.

``close()`` detaches the finalizer; at interpreter exit it does not run (the exit hooks
of :mod:`fleetenv.fleet.registry` delete what is left); a forked child's copy does
nothing (the instance is the parent's).

Unlike ``ResourceWarning`` in general, this one is shown by default: it means money.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleetenv import runtime
from fleetenv.core.errors import FleetEnvError
from fleetenv.runtime.plans import run_sync

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.env.instance import InstanceLease
    from fleetenv.env.toolbox import Toolbox
    from fleetenv.fleet.session import Session

__all__ = ["UnclosedEnvWarning", "watch", "weak_callback"]

logger = logging.getLogger("fleetenv.env")


class UnclosedEnvWarning(ResourceWarning):
    """A ``FleetEnv`` was garbage-collected without ``close()`` (its instance is deleted
    in the background)."""


# Shown by default (ResourceWarning is not), once per message: each names its instance.
# Not over a policy the user chose with -W / PYTHONWARNINGS (the warnings docs' advice).
if not sys.warnoptions:
    warnings.filterwarnings("default", category=UnclosedEnvWarning)

def weak_callback(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` (a bound method) called through a weak reference: the env's helpers
    may call back into it without keeping it alive; once it is gone, calls do nothing."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> None:
        target = ref()
        if target is not None:
            target(*args, **kwargs)

    return call


def watch(env: object, *, task_key: str, lease: InstanceLease, toolbox: Toolbox,
          session: Session, owns_session: bool) -> weakref.finalize[..., object]:
    """Watch ``env``; the returned finalizer must be ``detach()``-ed by ``close()``.

    Nothing passed here may refer to ``env`` (strongly), or it would never be collected.
    """
    finalizer = weakref.finalize(env, _collected, task_key, lease, toolbox, session,
                                 owns_session, os.getpid())
    finalizer.atexit = False
    return finalizer


def _collected(task_key: str, lease: InstanceLease, toolbox: Toolbox, session: Session,
               owns_session: bool, pid: int) -> None:
    """The finalizer: quick and non-blocking (it may run in any thread)."""
    if os.getpid() != pid:
        return
    instance_id = lease.instance_id
    if instance_id is None and lease.browser is None and not owns_session:
        return  # nothing was left running
    where = f"instance {instance_id}" if instance_id else "no instance"
    warnings.warn(UnclosedEnvWarning(
        f"FleetEnv for task {task_key!r} ({where}) was garbage-collected without close(); "
        "fleetenv is deleting it now. Call env.close(), or use `with FleetEnv(...) as "
        "env:`, to release it yourself"), stacklevel=2)
    job = functools.partial(_clean_up, task_key, lease, toolbox, session, owns_session)
    now = runtime.current()
    now.call_soon(functools.partial(_start_cleanup, now, job))  # only enqueues, never blocks


def _clean_up(task_key: str, lease: InstanceLease, toolbox: Toolbox, session: Session,
              owns_session: bool) -> None:
    """What ``close()`` does after grading (an abandoned env is not graded: nobody
    would read its grade). Runs on the runtime's pool."""
    try:
        run_sync(toolbox.close_plan())
    except Exception as exc:  # the instance must still go
        logger.warning("closing the MCP sessions of a collected env (task %s): %s",
                       task_key, exc)
    try:
        lease.close()
    finally:
        if owns_session:
            lease.call_when_idle(session.close)


def _start_cleanup(now: runtime.Runtime, job: Callable[[], None]) -> None:
    """On the loop thread: hand ``job`` to the pool (it never waits for it)."""
    try:
        now.submit_blocking(_run, job)
    except (RuntimeError, FleetEnvError) as exc:  # shutting down: the exit hooks delete
        logger.warning("could not clean up a garbage-collected FleetEnv: %s", exc)


def _run(job: Callable[[], None]) -> None:
    try:
        job()
    except Exception as exc:  # logged: nobody else is there to hear about it
        logger.warning("could not clean up a garbage-collected FleetEnv: %s", exc)
