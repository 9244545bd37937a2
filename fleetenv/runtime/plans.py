"""Running episode logic from sync code and from asyncio code, written once.

The logic is a generator that *yields* the I/O it needs, so one copy serves both
drivers and the two cannot drift. An operation is one of two kinds:

- :class:`Blocking`: a blocking call (fleet-python, ``requests``). The sync driver runs
  it in the caller's thread; the async driver runs it on the runtime's pool, so the
  caller's event loop never blocks.
- :class:`OnLoop`: a coroutine function for fleetenv's loop thread (MCP), which
  enforces its own deadline there. The sync driver blocks on it; the async driver
  awaits it without a thread.

Exceptions raised by an operation are thrown back into the generator at the ``yield``,
so the logic reads as ordinary ``try``/``except`` code. Ctrl-C and task cancellation
are not caught by the drivers: they propagate, and the loop-side work is cancelled by
the runtime.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from fleetenv import runtime
from fleetenv.core.errors import FleetEnvError

T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Blocking:
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class OnLoop:
    fn: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()


Plan = Generator["Blocking | OnLoop", Any, T]


def run_sync(plan: Plan[T]) -> T:
    """Drive ``plan`` from the calling thread."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            op = plan.send(value) if error is None else plan.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value, error = None, None
        try:
            value = _run_here(op)
        except Exception as exc:
            error = exc
        except BaseException as exc:  # Ctrl-C: the plan's cleanup goes on elsewhere
            _unwind_later(plan, exc)
            raise


def _run_here(op: Blocking | OnLoop) -> Any:
    """One operation, from the calling thread (which must not be the loop thread)."""
    if isinstance(op, Blocking):
        return op.fn(*op.args)
    return runtime.current().call(op.fn, *op.args)


async def run_async(plan: Plan[T]) -> T:
    """Drive ``plan`` from a coroutine on any asyncio or trio loop other than fleetenv's."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            op = plan.send(value) if error is None else plan.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value, error = None, None
        try:
            if isinstance(op, Blocking):
                # In the caller's context, as in the sync driver: its trace span, and
                # whose calls these are (`fleetenv.fleet.deadlines.calls_owner`).
                value = await runtime.current().run_blocking(op.fn, *op.args)
            else:
                value = await runtime.current().call_async(op.fn, *op.args)
        except Exception as exc:
            error = exc
        except BaseException as exc:  # cancelled: the plan's cleanup goes on elsewhere
            _unwind_later(plan, exc)
            raise


def _unwind_later(plan: Plan[Any], interruption: BaseException) -> None:
    """Finish an interrupted plan's cleanup on the runtime's pool; the caller leaves now.

    A plan stopped at a ``yield`` by Ctrl-C or a cancelled ``await`` (say
    ``asyncio.wait_for(env.close_async(), 5)``) would otherwise be dropped half-way, its
    ``finally`` blocks (closing MCP sessions, deleting the instance) never run. The
    interruption is thrown into the plan, as into ordinary code, and the operations its
    cleanup yields still run, each with its own deadline.
    """
    # Shutting down (the pool refuses work): the exit hooks delete.
    with contextlib.suppress(RuntimeError, FleetEnvError):
        runtime.current().submit_blocking(_unwind, plan, interruption)


def _unwind(plan: Plan[Any], interruption: BaseException) -> None:
    value: Any = None
    error: BaseException | None = interruption
    while True:
        try:
            op = plan.send(value) if error is None else plan.throw(error)
        except StopIteration:
            return
        except type(interruption):  # the interruption came back out: cleanup is done
            return
        except Exception:
            logger.warning("cleanup after an interrupted call failed", exc_info=True)
            return
        value, error = None, None
        try:
            value = _run_here(op)
        except Exception as exc:
            error = exc
