"""Running episode logic from sync code and from asyncio code, written once.

The logic is a generator that *yields* the I/O it needs, so one copy serves both drivers:
:class:`Blocking` (run in the caller's thread, or on the pool by the async driver),
:class:`OnLoop` (a coroutine for fleetenv's loop thread, with its own deadline) and
:class:`Await` (awaited where the async driver runs; the sync driver refuses it).
An operation's exception is thrown back in at the ``yield``. Ctrl-C and cancellation are
thrown into the plan too, and its ``finally`` cleanup runs on the pool while the
interruption propagates (or first, in the caller, with ``finish_here=True``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from fleetenv import runtime
from fleetenv.core.errors import ConfigurationError, FleetEnvError
from fleetenv.runtime.loop import name_of

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
    name: str | None = None
    """The loop-side task's name (default: the function's, see `runtime.loop.name_of`)."""


@dataclass(frozen=True)
class Await:
    fn: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()
    hint: str = "drive the plan from async code"
    """What the sync driver's refusal tells the caller to do instead."""


Op = Blocking | OnLoop | Await
Plan = Generator[Op, Any, T]


def run_sync(plan: Plan[T], *, finish_here: bool = False) -> T:
    """Drive ``plan`` from the calling thread (see the module docstring)."""
    value: Any = None
    error: BaseException | None = None
    interrupted: BaseException | None = None
    while True:
        op = _advance(plan, value, error, interrupted)
        if isinstance(op, _Done):
            result: T = op.value
            return result
        value, error = None, None
        try:
            value = _run_here(op)
        except Exception as exc:
            error = exc
        except BaseException as exc:  # Ctrl-C
            if interrupted is not None or not finish_here:
                _unwind_later(plan, exc)
                raise
            interrupted = error = exc


async def run_async(plan: Plan[T], *, finish_here: bool = False) -> T:
    """Drive ``plan`` from a coroutine on any asyncio or trio loop, fleetenv's included."""
    import anyio

    value: Any = None
    error: BaseException | None = None
    interrupted: BaseException | None = None
    while True:
        op = _advance(plan, value, error, interrupted)
        if isinstance(op, _Done):
            result: T = op.value
            return result
        value, error = None, None
        try:
            if interrupted is None:
                value = await _await(op)
            else:  # the plan's cleanup, after a cancellation: it runs to its end
                with anyio.CancelScope(shield=True):
                    value = await _await(op)
        except Exception as exc:
            error = exc
        except BaseException as exc:  # cancelled
            if interrupted is not None or not finish_here:
                _unwind_later(plan, exc)
                raise
            interrupted = error = exc


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value


def _advance(plan: Plan[Any], value: Any, error: BaseException | None,
             interrupted: BaseException | None) -> Op | _Done:
    """The plan's next operation, or `_Done` with its result. After an interruption the
    plan ends by re-raising it; whatever else its cleanup raises is logged, and the
    interruption is raised instead (it is never swallowed)."""
    try:
        return plan.send(value) if error is None else plan.throw(error)
    except StopIteration as stop:
        if interrupted is not None:
            raise interrupted from None
        return _Done(stop.value)
    except BaseException as exc:
        if interrupted is None or exc is interrupted:
            raise
        logger.warning("cleanup after an interruption failed", exc_info=True)
        raise interrupted from None


def _run_here(op: Op) -> Any:
    """One operation, from the calling thread (which must not be the loop thread)."""
    if isinstance(op, Blocking):
        return op.fn(*op.args)
    if isinstance(op, Await):
        raise ConfigurationError(f"{name_of(op.fn)} is a coroutine function, which "
                                 "blocking code cannot await", hint=op.hint)
    return runtime.current().call(op.fn, *op.args, name=op.name)


async def _await(op: Op) -> Any:
    if isinstance(op, Blocking):
        # In the caller's context, as in the sync driver: its trace span, and whose
        # calls these are (`fleetenv.fleet.deadlines.calls_owner`).
        return await runtime.current().run_blocking(op.fn, *op.args)
    if isinstance(op, Await):
        return await op.fn(*op.args)
    return await runtime.current().call_async(op.fn, *op.args, name=op.name)


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
    with contextlib.suppress(type(interruption)):  # it comes back out when cleanup is done
        error: BaseException | None = interruption
        value: Any = None
        while True:
            op = _advance(plan, value, error, interruption)
            if isinstance(op, _Done):  # unreachable: an interrupted plan ends by raising
                return
            value, error = None, None
            try:
                value = _run_here(op)
            except Exception as exc:
                error = exc
