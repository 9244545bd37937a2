"""A ``FleetEnv`` dropped without ``close()``: warn once, and delete its instance anyway.

A notebook that re-runs ``env = FleetEnv(task); env.reset()`` drops the old env while its
instance keeps running (and costing). A :func:`weakref.finalize` per env warns once
(:class:`UnclosedEnvWarning`, shown by default: it means money) and has ``close()``'s
cleanup run on the runtime's pool. Never in the finalizer itself: the collector may run
on the loop thread (blocking on the loop would deadlock) or in a thread holding
``threading``'s or the pool's locks (handing work to the pool would). So it only enqueues
the job with ``Runtime.call_soon``; no loop running means the runtime was shut down and
its hooks already deleted the instance. ``close()`` detaches the finalizer; at exit the
hooks of :mod:`fleetenv.fleet.registry` delete instead; a forked child's copy does nothing.
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
