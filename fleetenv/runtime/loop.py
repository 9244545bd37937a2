"""The one background event loop of the process.

Every piece of async work in fleetenv (MCP sessions, their HTTP pool) lives on a single
daemon thread named ``fleetenv-loop``, started lazily, that serves anyio's blocking portal.
Blocking callers hand coroutines to it (`call`, `submit`); callers that run their own
asyncio loop await it (`call_async`). There is never a loop per call or per thread, so
loop-bound objects (httpx2 clients, MCP sessions) are created, used and closed on the
same loop, and Ctrl-C in a caller cancels the loop-side work instead of orphaning it.

Lifecycle rules, each one learned the hard way (see the research notes):

* The thread is fleetenv's own, not anyio's ``start_blocking_portal``: interrupted while
  it starts, that context manager joins its thread, which serves until stopped, so one
  Ctrl-C at the wrong millisecond hung the caller. Here the loop thread (which never
  receives Ctrl-C) installs itself as the current loop; callers wait for it outside the
  lock and may leave at any moment (`_Handoff`).
* Interpreter exit runs the registered shutdown hooks (in the main thread, while the
  loop still runs: they close sessions, delete instances), then stops the loop.
* After ``os.fork()`` the loop thread does not exist in the child. The child gets a fresh
  loop on first use; the parent's portal is parked, never dropped (dropping it would run
  its finalizer against a loop nobody runs and deadlock the child). Objects created in
  the parent remember the runtime *generation* they were made in and refuse use in the
  child through `check_generation`.
* Blocking work never runs on the loop thread: the blocking entry points refuse to run
  there (`LoopThreadError`) because they would wait for themselves forever.
"""

from __future__ import annotations

import _thread
import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from fleetenv.core.errors import DeadlineExceeded, FleetEnvError, LoopThreadError
from fleetenv.runtime.groups import unwrap_group

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

if TYPE_CHECKING:
    from anyio.abc import TaskGroup
    from anyio.from_thread import BlockingPortal

__all__ = [
    "LOOP_THREAD_NAME",
    "add_shutdown_hook",
    "await_future",
    "call",
    "call_async",
    "call_soon",
    "cancel_running",
    "check_generation",
    "generation",
    "in_loop_thread",
    "in_short_thread",
    "on_fleetenv_loop",
    "remove_shutdown_hook",
    "shutdown",
    "start_service",
    "submit",
]

T = TypeVar("T")
P = ParamSpec("P")

LOOP_THREAD_NAME = "fleetenv-loop"

# How often a blocked MAIN thread wakes up to let Python deliver a pending
# KeyboardInterrupt. An untimed wait is only interrupted by a real SIGINT, not by
# `_thread.interrupt_main()` (which is how IPython and test harnesses interrupt), so the
# main thread's waits are sliced. Other threads never receive a KeyboardInterrupt (Python
# delivers signals to the main thread only), so they block on the future itself and cost
# nothing while they wait: with hundreds of episodes in worker threads, 10 wake-ups a
# second each added up to real CPU on the caller's side.
_WAIT_SLICE_S = 0.1
# After cancelling loop-side work, how long a caller waits for it to finish unwinding
# before re-raising (so "Ctrl-C leaves nothing running" holds in the common case).
_CANCEL_GRACE_S = 2.0
# Extra time the caller-side watchdog grants beyond an in-loop deadline: the in-loop
# deadline is the real one; the watchdog only catches a wedged loop.
_WATCHDOG_GRACE_S = 5.0
# Upper bounds for starting and for stopping the loop thread.
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0

logger = logging.getLogger("fleetenv.runtime")


@dataclass
class _Loop:
    """One running loop thread and what is needed to stop it."""

    portal: BlockingPortal
    thread: threading.Thread
    aio: asyncio.AbstractEventLoop
    services: TaskGroup
    generation: int
    # tasks started by submit/call, so shutdown can cancel them (touched on the loop only)
    jobs: set[asyncio.Task[Any]] = field(default_factory=set)


_lock = threading.Lock()
_state: _Loop | None = None
_starting: _Handoff | None = None  # a start whose loop has not come up yet
_generation = 0
_exiting = False
_hooks: list[Callable[[], None]] = []
_hooks_lock = threading.Lock()
# Portals of earlier generations after a fork: referenced forever so their finalizers never
# run in a process where their loop thread does not exist.
_abandoned: list[object] = []


# ---------------------------------------------------------------------------- start / state


def _current() -> _Loop:
    state = _state
    if state is not None:
        return state
    with _lock:
        if _state is not None:
            return _state
        if _exiting:
            raise FleetEnvError(
                "the fleetenv runtime has shut down because the interpreter is exiting",
                hint="do not start fleetenv work from atexit handlers or finalizers",
            )
        handoff = _starting or _start()
    return handoff.wait()


def _start() -> _Handoff:
    """Start the loop thread; it installs itself as the current loop. Caller holds ``_lock``.

    Callers wait for the loop *outside* the lock (`_Handoff.wait`), and the loop thread,
    which never receives Ctrl-C, installs itself: so a caller interrupted while the loop
    starts leaves at once, and the loop it started is the current one, not an orphan.
    """
    global _starting
    handoff = _starting = _Handoff(_generation)
    try:
        # Not ``Thread.start()`` here: it waits on a Condition, and Ctrl-C in that wait
        # can leave the Condition's lock held, wedging the new thread in its bootstrap
        # (seen in CPython 3.11). A bare thread starts the real one, out of Ctrl-C's reach.
        _thread.start_new_thread(_spawn, (handoff,))
    except Exception:  # no thread: nothing will install itself
        _starting = None
        raise
    return handoff


def _spawn(handoff: _Handoff) -> None:
    try:
        threading.Thread(target=_serve, args=(handoff,), name=LOOP_THREAD_NAME,
                         daemon=True).start()
    except Exception as exc:  # out of threads: the waiting caller is told
        handoff.fail(exc)


class _Handoff:
    """One start of the loop thread, waited for by the callers that need it."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        # Released once the loop came up or failed. A bare lock, not an Event: Ctrl-C in
        # the main thread inside ``Event.wait`` can leave the Event's Condition locked
        # (it lands between the lock's acquire and the ``with`` that would release it),
        # and the loop thread would then block forever in ``set()``.
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self.loop: _Loop | None = None
        self.error: Exception | None = None
        #: Set under ``_lock`` by `shutdown()` (or a fork) before the loop came up: the
        #: loop then stops instead of installing itself.
        self.abandoned = False

    def install(self, loop: _Loop) -> bool:
        """From the loop thread: become the current loop; False if it must stop."""
        global _state, _starting
        with _lock:
            if _starting is self:
                _starting = None
            if self.abandoned or _exiting or self.generation != _generation:
                self.error = FleetEnvError("the fleetenv runtime shut down while its loop "
                                           "was starting")
                ok = False
            else:
                _state = self.loop = loop
                ok = True
        self._done.release()
        return ok

    def fail(self, error: Exception) -> None:
        global _starting
        with _lock:
            if _starting is self:
                _starting = None
        self.error = error
        self._done.release()

    @property
    def finished(self) -> bool:
        return self.loop is not None or self.error is not None

    def wait(self) -> _Loop:
        if self._done.acquire(timeout=_START_TIMEOUT_S):
            self._done.release()  # for the next caller waiting on the same start
        if self.loop is not None:
            return self.loop
        if self.error is None:
            raise FleetEnvError(
                f"the {LOOP_THREAD_NAME} thread did not start within {_START_TIMEOUT_S:.0f} s",
                hint="the machine may be out of threads or memory; report it if not")
        raise FleetEnvError(f"the {LOOP_THREAD_NAME} thread could not start: "
                            f"{self.error!r}") from self.error


def _serve(handoff: _Handoff) -> None:
    """The loop thread's body: serve the portal until it is stopped."""
    import anyio

    try:
        anyio.run(_serve_portal, handoff, backend="asyncio")
    except Exception as exc:  # the loop could not start (or died): the caller is told
        if not handoff.finished:
            handoff.fail(exc)
        else:
            logger.warning("fleetenv loop thread ended with an error: %r", exc)


async def _serve_portal(handoff: _Handoff) -> None:
    import anyio
    from anyio.from_thread import BlockingPortal

    async with BlockingPortal() as portal, anyio.create_task_group() as services:
        # Long-lived tasks (session owners) live in ``services``, with the loop.
        state = _Loop(portal=portal, thread=threading.current_thread(),
                      aio=asyncio.get_running_loop(), services=services,
                      generation=handoff.generation)
        if handoff.install(state):
            await portal.sleep_until_stopped()
        services.cancel_scope.cancel()


def generation() -> int:
    """Identity of the current runtime; changes after `shutdown()` and in a forked child.

    Objects bound to the loop record it when they start using the loop and pass it to
    `check_generation` before each use.
    """
    return _generation


def check_generation(created_in: int, what: str) -> None:
    """Refuse to use a loop-bound object from an earlier runtime (fork child or after shutdown)."""
    if created_in != _generation:
        raise FleetEnvError(
            f"{what} belongs to a fleetenv runtime that no longer exists in this process "
            "(it was opened before os.fork() or before fleetenv.runtime.shutdown())",
            hint="open a new one in this process; objects cannot cross fork()",
        )


def in_loop_thread() -> bool:
    """True when called on the ``fleetenv-loop`` thread itself."""
    state = _state
    return state is not None and threading.get_ident() == state.thread.ident


def _refuse_loop_thread(what: str) -> None:
    if in_loop_thread():
        raise LoopThreadError(
            f"{what} was called on the {LOOP_THREAD_NAME} thread, where it would wait for itself"
        )


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


# ---------------------------------------------------------------------------- entry points


async def _run_job(
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    timeout: float | None,
    finished: threading.Event | None,
) -> T:
    """Await ``fn(*args)`` on the loop, under ``timeout``, and signal when it has unwound."""
    import anyio

    try:
        if timeout is None:
            return await fn(*args)
        with anyio.move_on_after(timeout):
            return await fn(*args)
        raise DeadlineExceeded(
            f"{_name_of(fn)} did not finish within {timeout:g} s",
            hint="raise the timeout, or check that the remote side is responsive",
        )
    finally:
        if finished is not None:
            finished.set()


def _schedule(
    state: _Loop,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    timeout: float | None,
    finished: threading.Event | None,
    name: str,
) -> concurrent.futures.Future[T]:
    """Start ``fn(*args)`` as a task on the loop without waiting for the loop to pick it up.

    Measured on the tool-call path: the portal's ``start_task_soon`` blocks the caller
    until the loop acknowledges the spawn, and ``run_coroutine_threadsafe`` resolves the
    future one loop iteration after the task ends (behind whatever else is ready). Here the
    task resolves the future itself, as its last step, and nobody waits for the spawn.
    ``future.cancel()`` cancels the task. Tasks are tracked so `shutdown` can cancel them.
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def start() -> None:
        if future.cancelled():  # cancelled before the loop got to it: never start
            if finished is not None:
                finished.set()
            return
        task = state.aio.create_task(_tracked(state, future, fn, args, timeout, finished))
        task.set_name(name)

        def cancel_task(done: concurrent.futures.Future[T]) -> None:
            if done.cancelled() and not task.done():
                state.aio.call_soon_threadsafe(task.cancel)

        future.add_done_callback(cancel_task)

    try:
        state.aio.call_soon_threadsafe(start, context=_loop_context())
    except RuntimeError as exc:  # the loop was closed under us (shutdown in progress)
        raise FleetEnvError(
            f"the fleetenv loop is not running ({exc})",
            hint="the runtime is shutting down; do not start new work now",
        ) from None
    return future


def _loop_context() -> contextvars.Context:
    """The caller's context variables for a task on the fleetenv loop, minus the name of
    the caller's async library: sniffio keeps it in a context variable, and a task that
    inherited "trio" from a trio caller would make anyio drive the asyncio loop as trio."""
    context = contextvars.copy_context()
    sniffio: Any = sys.modules.get("sniffio")
    if sniffio is not None and context.get(sniffio.current_async_library_cvar, None):
        context.run(sniffio.current_async_library_cvar.set, None)
    return context


async def _tracked(
    state: _Loop,
    future: concurrent.futures.Future[T],
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    timeout: float | None,
    finished: threading.Event | None,
) -> None:
    """Run one job and hand its outcome to ``future`` (the task itself never fails)."""
    task = asyncio.current_task()
    assert task is not None
    state.jobs.add(task)
    try:
        result = await _run_job(fn, args, timeout, finished)
    except Exception as exc:
        if future.set_running_or_notify_cancel():
            future.set_exception(exc)
    except BaseException as exc:  # cancellation or exit: tell the waiter, then re-raise
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        elif future.set_running_or_notify_cancel():
            future.set_exception(exc)
        raise
    else:
        if future.set_running_or_notify_cancel():
            future.set_result(result)
    finally:
        state.jobs.discard(task)


def call_soon(fn: Callable[[], object]) -> bool:
    """Have the loop thread call ``fn()`` soon; False (and nothing done) if no loop runs.

    Safe from any thread, the loop's own included, and from a finalizer: it only appends
    to the running loop's queue (no lock, no thread started, no wait) and never starts a
    loop. ``fn`` runs on the loop thread, so it must not block.
    """
    state = _state
    if state is None:
        return False
    try:
        state.aio.call_soon_threadsafe(fn)
    except RuntimeError:  # the loop is closed: shutting down, and nothing will run it
        return False
    return True


def submit(
    async_fn: Callable[..., Awaitable[T]], *args: Any, name: str | None = None
) -> concurrent.futures.Future[T]:
    """Schedule ``async_fn(*args)`` on the loop and return its future at once.

    ``future.cancel()`` cancels the loop-side task. Exceptions arrive unchanged (a
    single-leaf exception group is NOT unwrapped here; `call` does that).
    """
    _refuse_loop_thread("fleetenv.runtime.submit()")
    return _schedule(_current(), async_fn, args, None, None, name or _name_of(async_fn))


def call(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    timeout: float | None = None,
    name: str | None = None,
) -> T:
    """Run ``async_fn(*args)`` on the loop and block until it is done.

    ``timeout`` is enforced inside the loop (the task is cancelled, then
    `DeadlineExceeded` is raised). If the caller is interrupted (Ctrl-C or any other
    exception while waiting) the loop-side task is cancelled and given a moment to
    unwind before the exception propagates. A single-leaf exception group is unwrapped
    to its leaf.
    """
    _refuse_loop_thread("fleetenv.runtime.call()")
    label = name or _name_of(async_fn)
    finished = threading.Event()
    future = _schedule(_current(), async_fn, args, timeout, finished, label)
    watchdog = None if timeout is None else timeout + _WATCHDOG_GRACE_S
    return _wait(future, finished, watchdog, label)


def _wait(
    future: concurrent.futures.Future[T],
    finished: threading.Event,
    watchdog: float | None,
    what: str,
) -> T:
    deadline = None if watchdog is None else time.monotonic() + watchdog
    # Only the main thread can be interrupted by a signal: only it wakes up periodically.
    sliced = threading.current_thread() is threading.main_thread()
    try:
        while True:
            slice_s: float | None = _WAIT_SLICE_S if sliced else None
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded(
                        f"{what} did not finish within {watchdog:g} s and the fleetenv loop "
                        "did not stop it",
                        hint="the loop thread may be blocked by non-async code; report a bug",
                    )
                slice_s = remaining if slice_s is None else min(slice_s, remaining)
            try:
                # returns as soon as the future is done; raises CancelledError if cancelled
                error = future.exception(timeout=slice_s)
                break
            except concurrent.futures.TimeoutError:
                continue
    except BaseException:
        # Interrupted (KeyboardInterrupt, watchdog, ...): cancel the loop-side task and
        # let it unwind, so nothing keeps running behind the caller's back. Re-raised.
        future.cancel()
        finished.wait(_CANCEL_GRACE_S)
        raise
    if error is None:
        return future.result()
    raise unwrap_group(error)


async def call_async(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    timeout: float | None = None,
    name: str | None = None,
) -> T:
    """Await ``async_fn(*args)`` on the fleetenv loop from ANY event loop.

    For async trainers, notebooks and test runners: asyncio (plain, pytest-asyncio's,
    Jupyter's) or trio (directly or through anyio). The caller's loop stays free while the
    work runs on the fleetenv loop. Cancelling the awaiting task cancels the loop-side
    task. Called from a coroutine already on the fleetenv loop, it simply awaits the
    function. A single-leaf exception group is unwrapped to its leaf; work cancelled on
    the loop side (`cancel_running`, shutdown) raises ``concurrent.futures.CancelledError``,
    as `call` does.
    """
    if in_loop_thread():
        return await _run_job(async_fn, args, timeout, None)
    future = _schedule(_current(), async_fn, args, timeout, None, name or _name_of(async_fn))
    try:
        return await await_future(future)
    except BaseExceptionGroup as group:
        leaf = unwrap_group(group)
        if leaf is group:
            raise
        leaf.__suppress_context__ = True
        raise leaf  # noqa: B904 - the leaf is the real error; the group is noise


async def await_future(future: concurrent.futures.Future[T]) -> T:
    """Await a ``concurrent.futures`` future from the caller's asyncio or trio loop.

    The loop stays free while another thread (the fleetenv loop, a worker pool) finishes
    the future; cancelling the awaiting task cancels the future. asyncio's
    ``wrap_future`` would do this for asyncio only.
    """
    done, wake = _waker()
    future.add_done_callback(lambda _: wake())
    try:
        await done.wait()
    finally:
        if not future.done():  # the awaiting task was cancelled (or interrupted)
            future.cancel()  # ... so the work behind it is cancelled too
    return future.result()


def _waker() -> tuple[Any, Callable[[], None]]:
    """An event of the CALLER's loop, and a function any thread may call to set it.

    The function never blocks: it hands ``event.set`` to the caller's loop (asyncio's
    ``call_soon_threadsafe``, trio's ``TrioToken.run_sync_soon``) and returns. anyio's
    ``from_thread.run_sync(..., token=)`` would do the hand-over too, but it waits for the
    caller's loop to run it, and it would run on the fleetenv loop thread, which must
    never wait for a user's loop (a user loop blocked in the blocking API would deadlock).
    A caller's loop that has already closed is not woken (nobody is waiting any more).
    """
    import anyio

    event = anyio.Event()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: trio is the other loop anyio runs on
        trio: Any = sys.modules.get("trio")
        if trio is None:
            raise FleetEnvError(
                "fleetenv's async API needs a running asyncio or trio event loop",
                hint="await it from asyncio.run(...), anyio.run(...) or trio.run(...)",
            ) from None
        token = trio.lowlevel.current_trio_token()

        def wake_trio() -> None:
            with contextlib.suppress(trio.RunFinishedError):  # the caller's run ended
                token.run_sync_soon(event.set)

        return event, wake_trio

    def wake_asyncio() -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed
            loop.call_soon_threadsafe(event.set)

    return event, wake_asyncio


def on_fleetenv_loop(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Decorator for a public coroutine of a loop-bound object (an MCP connection's
    ``aopen``, ``acall_tool``...): awaited on the fleetenv loop it runs directly; awaited
    on any other loop (the caller's asyncio or trio loop) it runs on the fleetenv loop
    through `call_async`, so the caller's loop is never blocked and the object's locks,
    events and sessions are only ever touched by the loop they belong to. No extra
    timeout: the operation's own timeouts apply, on the loop that runs it."""

    @functools.wraps(fn)
    async def hop(*args: P.args, **kwargs: P.kwargs) -> T:
        if in_loop_thread():
            return await fn(*args, **kwargs)
        return await call_async(functools.partial(fn, *args, **kwargs), name=_name_of(fn))

    return hop


async def in_short_thread(fn: Callable[[], T], *, name: str = "fleetenv-blocking") -> T:
    """Await ``fn()`` run in a new thread that ends when ``fn`` returns.

    For rare blocking work that must stay off the loop (a slow first import, building an
    SSL context). anyio's ``to_thread`` would do it in a pooled worker that then idles
    until the loop stops; a one-off thread leaves nothing behind.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if not future.done():  # the awaiting task may have been cancelled meanwhile
            (future.set_result if ok else future.set_exception)(value)

    def target() -> None:
        try:
            result = fn()
        except Exception as exc:
            loop.call_soon_threadsafe(deliver, False, exc)
        else:
            loop.call_soon_threadsafe(deliver, True, result)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await future


async def start_service(
    fn: Callable[..., Awaitable[None]], *args: Any, name: str | None = None
) -> Any:
    """Start a long-lived task on the loop and return what it passed to ``task_status.started``.

    Must be awaited on the loop. The task outlives the caller (it lives in the runtime's
    service task group until it returns or the loop stops), which is what an MCP session
    owner needs: it enters and exits its contexts in one task. Failures before
    ``started()`` propagate to the caller; failures after it are logged and contained, so
    one broken session never cancels its siblings.
    """
    if not in_loop_thread():
        raise LoopThreadError(
            "start_service() must be awaited on the fleetenv loop",
            hint="use fleetenv.runtime.call(...) to get onto the loop",
        )
    label = name or _name_of(fn)
    return await _current().services.start(_contained, fn, args, label, name=label)


class _StartedFlag:
    """A ``task_status`` stand-in that remembers whether ``started()`` was called."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.started_called = False

    def started(self, value: Any = None) -> None:
        self.started_called = True
        self._inner.started(value)


async def _contained(
    fn: Callable[..., Awaitable[None]], args: tuple[Any, ...], label: str, *, task_status: Any
) -> None:
    status = _StartedFlag(task_status)
    try:
        await fn(*args, task_status=status)
    except Exception:
        if not status.started_called:
            raise
        logger.warning("fleetenv background task %s failed", label, exc_info=True)


# ---------------------------------------------------------------------------- shutdown


def add_shutdown_hook(fn: Callable[[], None]) -> None:
    """Run ``fn()`` at interpreter exit (and in `shutdown`), before the loop stops.

    Hooks run in the thread that shuts down (the main thread at exit), newest first, so
    they may use the blocking API (`call`). Adding the same function twice is a no-op.
    Hooks persist across `shutdown()` and fork; a hook must only act on objects of the
    current process and runtime (see `generation`) and must be idempotent. Exceptions
    are logged, never propagated.
    """
    with _hooks_lock:
        if fn not in _hooks:
            _hooks.append(fn)


def remove_shutdown_hook(fn: Callable[[], None]) -> None:
    """Forget a hook added with `add_shutdown_hook` (no error if it is not registered)."""
    with _hooks_lock:
        if fn in _hooks:
            _hooks.remove(fn)


def _run_hooks() -> None:
    with _hooks_lock:
        hooks = list(reversed(_hooks))
    for hook in hooks:
        try:
            hook()
        except Exception as exc:
            logger.warning("fleetenv shutdown hook %s failed: %s", _name_of(hook), exc)


def shutdown() -> None:
    """Run the shutdown hooks, then stop the loop thread. Idempotent.

    Loop-bound objects made before the call refuse further use; the next fleetenv call
    starts a fresh loop (except at interpreter exit).
    """
    global _state, _generation
    _refuse_loop_thread("fleetenv.runtime.shutdown()")
    _run_hooks()
    with _lock:
        _abandon_start()
        state, _state = _state, None
        if state is not None:
            _generation += 1
    if state is not None:
        _stop(state)


def _abandon_start() -> None:
    """A loop still starting stops instead of installing itself. Caller holds ``_lock``."""
    global _starting
    if _starting is not None:
        _starting.abandoned = True
        _starting = None


async def _cancel_jobs(state: _Loop) -> None:
    jobs = list(state.jobs)
    for job in jobs:
        job.cancel()
    if jobs:
        await asyncio.wait(jobs, timeout=_STOP_TIMEOUT_S / 2)


def cancel_running() -> int:
    """Cancel every job in flight on the loop (tool calls, session setup); callers waiting
    on them get ``CancelledError``. Does not wait, never starts a loop, works from any
    thread except the loop's own. Long-lived services (MCP session owners) are untouched.
    Returns how many jobs were asked to stop. SIGTERM uses it so that hung calls do not
    hold up the exit."""
    state = _state
    if state is None:
        return 0
    count = len(state.jobs)

    def cancel_all() -> None:
        for job in list(state.jobs):
            job.cancel()

    try:
        state.aio.call_soon_threadsafe(cancel_all)
    except RuntimeError:  # the loop is closed already: nothing runs on it
        return 0
    return count


def _stop(state: _Loop) -> None:
    """Cancel what is still running on the loop and join its thread, within a bound."""
    try:
        state.portal.start_task_soon(_cancel_jobs, state).result(timeout=_STOP_TIMEOUT_S)
        state.portal.start_task_soon(state.portal.stop, True).result(timeout=_STOP_TIMEOUT_S)
    except Exception as exc:  # the loop is wedged or already gone: park it, never block exit
        logger.warning("fleetenv loop did not stop cleanly: %s", exc)
        _abandoned.append(state)
        return
    state.thread.join(_STOP_TIMEOUT_S)
    if state.thread.is_alive():
        logger.warning("fleetenv loop thread did not exit within %s s", _STOP_TIMEOUT_S)
        _abandoned.append(state)


def _shutdown_at_exit() -> None:
    global _exiting, _state, _generation
    try:
        _run_hooks()
    finally:
        with _lock:
            _exiting = True
            state, _state = _state, None
            if state is not None:
                _generation += 1
        if state is not None:
            _stop(state)


atexit.register(_shutdown_at_exit)


# ---------------------------------------------------------------------------- fork


def _before_fork() -> None:
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    global _lock, _hooks_lock, _state, _starting, _generation
    # The forking thread held _lock; a fresh lock is simpler than reasoning about owners.
    _lock = threading.Lock()
    _hooks_lock = threading.Lock()
    if _state is not None:
        _abandoned.append(_state)
        _state = None
    _starting = None  # its thread was the parent's
    _generation += 1


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
