"""`Runtime`: the process's one event-loop thread and its one pool of blocking threads.

One `Runtime` (the process's is `current()`) owns the ``fleetenv-loop`` thread and the
bounded ``fleetenv-io*`` pool, as anyio's ``BlockingPortal`` owns its loop: `call` and
`submit` from blocking code, `call_async` and `run_blocking` from any asyncio or trio
loop, `call_soon` from any thread or finalizer. Its lifecycle (exit hooks, fork
generations, `LoopThreadError`) is docs/runtime.md. Rules the code below keeps:

* The loop thread installs itself; callers wait for it outside the lock and may leave at
  any moment (`_Handoff`). Not anyio's ``start_blocking_portal``: interrupted while
  starting, it joins a thread that serves until stopped, so a Ctrl-C there would hang.
* After ``os.fork()`` the parent's runtime is parked, never dropped (dropping it would
  run finalizers against a loop nobody runs and deadlock the child).
* A pool job may wait for the network or a cap, never for a pool job queued behind it
  (see ``fleetenv.rollouts.dispatch.LoopDispatch``).
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
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
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
    "MAX_POOL_THREADS",
    "POOL_THREAD_PREFIX",
    "Runtime",
    "add_shutdown_hook",
    "at_interpreter_exit",
    "await_future",
    "current",
    "on_fleetenv_loop",
    "remove_shutdown_hook",
    "shutdown",
]

T = TypeVar("T")
P = ParamSpec("P")

LOOP_THREAD_NAME = "fleetenv-loop"
POOL_THREAD_PREFIX = "fleetenv-io"
#: The pool's bound (the Runtime's default): blocking operations running at once. It
#: covers the asyncio-mode Runner's episodes (one blocking operation each at a time:
#: a create, which may wait for the creating cap, a verification, a delete, a sync
#: policy's turn) plus the few jobs of their own (trace uploads, cleanups); more
#: episodes than that queue for a thread and lose nothing.
MAX_POOL_THREADS = 32

# How often a blocked MAIN thread wakes up to let Python deliver a pending
# KeyboardInterrupt. An untimed wait is only interrupted by a real SIGINT, not by
# `_thread.interrupt_main()` (which is how IPython and test harnesses interrupt), so the
# main thread's waits are sliced. Other threads never receive a KeyboardInterrupt, so
# they block on the future itself and cost nothing while they wait.
_WAIT_SLICE_S = 0.1
# After cancelling loop-side work, how long a caller waits for it to finish unwinding
# before re-raising (so "Ctrl-C leaves nothing running" holds in the common case).
_CANCEL_GRACE_S = 2.0
# Upper bounds for starting and for stopping the loop thread (the runtime's own life,
# not an operation's timeout).
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
    # tasks started by submit/call, so shutdown can cancel them (touched on the loop only)
    jobs: set[asyncio.Task[Any]] = field(default_factory=set)


_lock = threading.Lock()  # guards starts, stops and the swap of the current runtime
_hooks: list[Callable[[], None]] = []
_hooks_lock = threading.Lock()
# Runtimes of earlier generations after a fork, and loops that did not stop: referenced
# forever so their finalizers never run where their threads do not exist.
_abandoned: list[object] = []
_at_exit = False  # see at_interpreter_exit


class Runtime:
    """The loop thread and the pool of one generation; see the module docstring.

    Made by `current()`, never by hand. Threads start on first use: the loop on the
    first coroutine, the pool on the first blocking function. Every method may be
    called from any thread; the blocking ones (`call`, `submit`, `submit_blocking`) not
    on the loop thread, where they raise `LoopThreadError`.
    """

    def __init__(self, generation: int, *, max_threads: int = MAX_POOL_THREADS,
                 refuse: str | None = None) -> None:
        #: Identity of this runtime; loop-bound objects record it (`check_generation`).
        self.generation = generation
        self.max_threads = max_threads
        self._refuse = refuse  # why this runtime never starts (the interpreter exits)
        self._loop: _Loop | None = None
        self._starting: _Handoff | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stopped = False

    def __repr__(self) -> str:
        state = ("stopped" if self._stopped else "running" if self._loop is not None
                 else "idle")
        return f"Runtime(generation={self.generation}, {state})"

    # ------------------------------------------------------------------ coroutines

    def call(self, async_fn: Callable[..., Awaitable[T]], *args: Any,
             timeout: float | None = None, name: str | None = None) -> T:
        """Run ``async_fn(*args)`` on the loop and block until it is done.

        ``timeout`` is enforced inside the loop, the one place (the task is cancelled,
        then `DeadlineExceeded` is raised); the caller waits for the outcome without a
        timer of its own. If the caller is interrupted (Ctrl-C or any other exception
        while waiting) the loop-side task is cancelled and given a moment to unwind
        before the exception propagates. A single-leaf exception group is unwrapped.
        """
        self._refuse_loop_thread("Runtime.call()")
        loop = self._running()
        job = _Call()

        def start() -> None:
            if job.abandoned:  # the caller left before the loop got to it: never start
                job.done.release()
                return
            job.task = loop.aio.create_task(_settle(loop, job, async_fn, args, timeout))
            job.task.set_name(name or name_of(async_fn))

        try:
            loop.aio.call_soon_threadsafe(start, context=_loop_context())
        except RuntimeError as exc:  # the loop was closed under us (shutdown in progress)
            raise _not_running(exc) from None
        result: T = job.wait(loop)
        return result

    def submit(self, async_fn: Callable[..., Awaitable[T]], *args: Any,
               name: str | None = None) -> concurrent.futures.Future[T]:
        """Schedule ``async_fn(*args)`` on the loop and return its future at once.

        ``future.cancel()`` cancels the loop-side task. Exceptions arrive unchanged (a
        single-leaf exception group is NOT unwrapped here; `call` does that).
        """
        self._refuse_loop_thread("Runtime.submit()")
        return self._schedule(async_fn, args, None, name or name_of(async_fn))

    async def call_async(self, async_fn: Callable[..., Awaitable[T]], *args: Any,
                         timeout: float | None = None, name: str | None = None) -> T:
        """Await ``async_fn(*args)`` on the loop from ANY event loop.

        For async trainers, notebooks and test runners: asyncio (plain, pytest-asyncio's,
        Jupyter's) or trio (directly or through anyio). The caller's loop stays free while
        the work runs on the fleetenv loop; cancelling the awaiting task cancels the
        loop-side task. Awaited on the fleetenv loop itself, it simply awaits the
        function. A single-leaf exception group is unwrapped; work cancelled on the loop
        side (`cancel_running`, shutdown) raises ``concurrent.futures.CancelledError``.
        """
        if self.in_loop_thread():
            if timeout is None:  # nothing to bound here: the function itself
                return await async_fn(*args)
            return await _run_job(async_fn, args, timeout)
        future = self._schedule(async_fn, args, timeout, name or name_of(async_fn))
        try:
            return await await_future(future)
        except BaseExceptionGroup as group:
            leaf = unwrap_group(group)
            if leaf is group:
                raise
            leaf.__suppress_context__ = True
            raise leaf  # noqa: B904 - the leaf is the real error; the group is noise

    async def start_service(self, fn: Callable[..., Awaitable[None]], *args: Any,
                            name: str | None = None) -> Any:
        """Start a long-lived task on the loop; return what it passed to
        ``task_status.started``.

        Must be awaited on the loop. The task outlives the caller (it lives in the
        runtime's service task group until it returns or the loop stops), which is what
        an MCP session owner needs: it enters and exits its contexts in one task.
        Failures before ``started()`` propagate to the caller; failures after it are
        logged and contained, so one broken session never cancels its siblings.
        """
        if not self.in_loop_thread():
            raise LoopThreadError("start_service() must be awaited on the fleetenv loop",
                                  hint="use Runtime.call(...) to get onto the loop")
        label = name or name_of(fn)
        return await self._running().services.start(_contained, fn, args, label, name=label)

    # ------------------------------------------------------------------ callbacks

    def call_soon(self, fn: Callable[[], object]) -> bool:
        """Have the loop thread call ``fn()`` soon; False (and nothing done) if no loop runs.

        Safe from any thread, the loop's own included, and from a finalizer: it only
        appends to the running loop's queue (no lock, no thread started, no wait) and
        never starts a loop. ``fn`` runs on the loop thread, so it must not block.
        """
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.aio.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: shutting down, and nothing will run it
            return False
        return True

    def call_at(self, when: float, fn: Callable[[], object]) -> Callable[[], None]:
        """Have the loop call ``fn()`` at ``time.monotonic() == when``; returns a function
        (callable from any thread) that cancels it. ``fn`` must not block."""
        aio = self._running().aio
        timer: list[asyncio.TimerHandle] = []
        cancelled = False

        def arm() -> None:
            if not cancelled:
                timer.append(aio.call_at(when, fn))  # asyncio's clock is time.monotonic

        def disarm() -> None:
            for handle in timer:
                handle.cancel()

        def cancel() -> None:
            nonlocal cancelled
            cancelled = True
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing will fire
                aio.call_soon_threadsafe(disarm)

        try:
            aio.call_soon_threadsafe(arm)
        except RuntimeError as exc:  # the loop was closed under us (shutdown in progress)
            raise FleetEnvError(f"the fleetenv loop is not running ({exc})") from None
        return cancel

    # ------------------------------------------------------------------ the pool

    def submit_blocking(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on the pool, in the caller's context variables (its trace
        span, whose calls these are); its future at once."""
        return self._executor().submit(contextvars.copy_context().run, fn, *args)

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Await ``fn(*args)`` run on the pool, from any asyncio or trio loop (this
        runtime's included): the awaiting loop stays free. Cancelling the awaiting task
        cancels the job if it has not started (a running function runs to its end)."""
        return await await_future(self.submit_blocking(fn, *args))

    # ------------------------------------------------------------------ state

    def in_loop_thread(self) -> bool:
        """True when called on this runtime's ``fleetenv-loop`` thread."""
        loop = self._loop
        return loop is not None and threading.get_ident() == loop.thread.ident

    def check_generation(self, created_in: int, what: str) -> None:
        """Refuse to use a loop-bound object of an earlier runtime (fork child, shutdown)."""
        if created_in != self.generation:
            raise FleetEnvError(
                f"{what} belongs to a fleetenv runtime that no longer exists in this process "
                "(it was opened before os.fork() or before fleetenv.runtime.shutdown())",
                hint="open a new one in this process; objects cannot cross fork()",
            )

    def cancel_running(self) -> int:
        """Cancel every job in flight on the loop (tool calls, session setup); callers
        waiting on them get ``CancelledError``. Does not wait, never starts a loop, works
        from any thread. Long-lived services (MCP session owners) are untouched. Returns
        how many jobs were asked to stop. SIGTERM uses it so that hung calls do not hold
        up the exit."""
        loop = self._loop
        if loop is None:
            return 0
        count = len(loop.jobs)

        def cancel_all() -> None:
            for job in list(loop.jobs):
                job.cancel()

        try:
            loop.aio.call_soon_threadsafe(cancel_all)
        except RuntimeError:  # the loop is closed already: nothing runs on it
            return 0
        return count

    # ------------------------------------------------------------------ internals

    def _refuse_loop_thread(self, what: str) -> None:
        if self.in_loop_thread():
            raise LoopThreadError(
                f"{what} was called on the {LOOP_THREAD_NAME} thread, where it would wait "
                "for itself")

    def _refusal(self) -> FleetEnvError | None:
        if self._refuse is not None:
            return FleetEnvError(self._refuse,
                                 hint="do not start fleetenv work from atexit handlers or "
                                 "finalizers")
        if self._stopped:
            return FleetEnvError("this fleetenv runtime was shut down",
                                 hint="use fleetenv.runtime.current(), the runtime now")
        return None

    def _running(self) -> _Loop:
        """The loop, started if needed (callers wait outside the lock, see `_Handoff`)."""
        loop = self._loop
        if loop is not None:
            return loop
        with _lock:
            if self._loop is not None:
                return self._loop
            refusal = self._refusal()
            if refusal is not None:
                raise refusal
            handoff = self._starting or self._start()
        return handoff.wait()

    def _start(self) -> _Handoff:
        """Start the loop thread; it installs itself. Caller holds ``_lock``.

        Not ``Thread.start()`` here: it waits on a Condition, and Ctrl-C in that wait can
        leave the Condition's lock held, wedging the new thread in its bootstrap. A bare
        thread starts the real one, out of Ctrl-C's reach.
        """
        handoff = self._starting = _Handoff(self)
        try:
            _thread.start_new_thread(_spawn, (handoff,))
        except Exception:  # no thread: nothing will install itself
            self._starting = None
            raise
        return handoff

    def _executor(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is not None:
            return pool
        with _lock:
            refusal = self._refusal()
            if refusal is not None:
                raise refusal
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_threads,
                                                thread_name_prefix=POOL_THREAD_PREFIX)
            return self._pool

    def _schedule(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
                  timeout: float | None, name: str) -> concurrent.futures.Future[T]:
        """Start ``fn(*args)`` as a task on the loop without waiting for the loop to pick
        it up.

        The task resolves the future itself, as its last step, and nobody waits for the
        spawn: the portal's ``start_task_soon`` blocks the caller until the loop
        acknowledges it, and ``run_coroutine_threadsafe`` resolves one iteration late.
        ``future.cancel()`` cancels the task. Tasks are tracked so `stop` can cancel them.
        """
        loop = self._running()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            if future.cancelled():  # cancelled before the loop got to it: never start
                return
            task = loop.aio.create_task(_tracked(loop, future, fn, args, timeout))
            task.set_name(name)

            def cancel_task(done: concurrent.futures.Future[T]) -> None:
                if done.cancelled() and not task.done():
                    loop.aio.call_soon_threadsafe(task.cancel)

            future.add_done_callback(cancel_task)

        try:
            loop.aio.call_soon_threadsafe(start, context=_loop_context())
        except RuntimeError as exc:  # the loop was closed under us (shutdown in progress)
            raise _not_running(exc) from None
        return future

    def _stop(self) -> None:
        """Stop the loop (cancel what still runs, join its thread) and let the pool's
        threads end once their work is done; within bounds, never blocking exit."""
        with _lock:
            self._stopped = True
            if self._starting is not None:  # a loop still starting stops, not installs
                self._starting.abandoned = True
                self._starting = None
            loop, pool = self._loop, self._pool
        if pool is not None:
            pool.shutdown(wait=False)
        if loop is None:
            return
        try:
            loop.portal.start_task_soon(_cancel_jobs, loop).result(timeout=_STOP_TIMEOUT_S)
            loop.portal.start_task_soon(loop.portal.stop, True).result(timeout=_STOP_TIMEOUT_S)
        except Exception as exc:  # the loop is wedged or already gone: park it
            logger.warning("fleetenv loop did not stop cleanly: %s", exc)
            _abandoned.append(loop)
            return
        loop.thread.join(_STOP_TIMEOUT_S)
        if loop.thread.is_alive():
            logger.warning("fleetenv loop thread did not exit within %s s", _STOP_TIMEOUT_S)
            _abandoned.append(loop)

    @property
    def _started(self) -> bool:
        return self._loop is not None or self._starting is not None or self._pool is not None


# The current runtime: read without a lock (finalizers and the loop thread read it).
_current = Runtime(0)


def current() -> Runtime:
    """The process's runtime now (a fresh one after `shutdown()` and in a forked child)."""
    return _current


# ---------------------------------------------------------------------------- the loop


class _Handoff:
    """One start of a runtime's loop thread, waited for by the callers that need it."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Released once the loop came up or failed. A bare lock, not an Event: Ctrl-C in
        # the main thread inside ``Event.wait`` can leave the Event's Condition locked,
        # and the loop thread would then block forever in ``set()``.
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self.loop: _Loop | None = None
        self.error: Exception | None = None
        #: Set under ``_lock`` when the runtime stops (or forks) before the loop came
        #: up: the loop then stops instead of installing itself.
        self.abandoned = False

    def install(self, loop: _Loop) -> bool:
        """From the loop thread: become the runtime's loop; False if it must stop."""
        runtime = self.runtime
        with _lock:
            if runtime._starting is self:
                runtime._starting = None
            if self.abandoned or runtime._stopped:
                self.error = FleetEnvError("the fleetenv runtime shut down while its loop "
                                           "was starting")
                ok = False
            else:
                runtime._loop = self.loop = loop
                ok = True
        self._done.release()
        return ok

    def fail(self, error: Exception) -> None:
        with _lock:
            if self.runtime._starting is self:
                self.runtime._starting = None
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


def _spawn(handoff: _Handoff) -> None:
    try:
        threading.Thread(target=_serve, args=(handoff,), name=LOOP_THREAD_NAME,
                         daemon=True).start()
    except Exception as exc:  # out of threads: the waiting caller is told
        handoff.fail(exc)


def _serve(handoff: _Handoff) -> None:
    """The loop thread's body: serve until the runtime stops."""
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
        loop = _Loop(portal=portal, thread=threading.current_thread(),
                     aio=asyncio.get_running_loop(), services=services)
        if handoff.install(loop):
            await portal.sleep_until_stopped()
        services.cancel_scope.cancel()


def name_of(fn: Callable[..., Any]) -> str:
    """A task's name for ``fn``: its qualified name, a partial's function's. Never a repr:
    the arguments bound in a partial (a tool call's, say) stay out of names and messages."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


async def _run_job(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
                   timeout: float | None) -> T:
    """Await ``fn(*args)`` on the loop, under ``timeout``."""
    import anyio

    if timeout is None:
        return await fn(*args)
    with anyio.move_on_after(timeout):
        return await fn(*args)
    raise DeadlineExceeded(
        f"{name_of(fn)} did not finish within {timeout:g} s",
        hint="raise the timeout, or check that the remote side is responsive",
    )


def _not_running(exc: RuntimeError) -> FleetEnvError:
    return FleetEnvError(f"the fleetenv loop is not running ({exc})",
                         hint="the runtime is shutting down; do not start new work now")


class _Call:
    """One `Runtime.call`: its outcome, handed from the loop to the waiting thread by one
    lock, released once the job has unwound (the cheapest wake-up a thread can have)."""

    __slots__ = ("abandoned", "done", "error", "result", "task")

    def __init__(self) -> None:
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.task: asyncio.Task[None] | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False  # the caller was interrupted

    def wait(self, loop: _Loop) -> Any:
        # Only the main thread can be interrupted by a signal: only it wakes up periodically.
        slice_s = _WAIT_SLICE_S if threading.current_thread() is threading.main_thread() else -1
        try:
            while not self.done.acquire(timeout=slice_s):
                pass
        except BaseException:
            # Interrupted (KeyboardInterrupt, ...): cancel the loop-side task and let it
            # unwind, so nothing keeps running behind the caller's back. Re-raised.
            self.abandoned = True
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing runs there
                loop.aio.call_soon_threadsafe(self._cancel)
            self.done.acquire(timeout=_CANCEL_GRACE_S)
            raise
        error = self.error
        if error is None:
            return self.result
        if isinstance(error, asyncio.CancelledError):  # cancel_running or shutdown
            raise concurrent.futures.CancelledError() from None
        raise unwrap_group(error)

    def _cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


async def _settle(loop: _Loop, job: _Call, fn: Callable[..., Awaitable[Any]],
                  args: tuple[Any, ...], timeout: float | None) -> None:
    """Run one `Runtime.call` job and hand its outcome to its waiter."""
    task = asyncio.current_task()
    assert task is not None
    loop.jobs.add(task)
    try:
        job.result = await _run_job(fn, args, timeout)
    except BaseException as exc:
        job.error = exc
        if not isinstance(exc, Exception):  # cancellation or exit: this task ends with it
            raise
    finally:
        loop.jobs.discard(task)
        job.done.release()


async def _tracked(loop: _Loop, future: concurrent.futures.Future[T],
                   fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
                   timeout: float | None) -> None:
    """Run one job and hand its outcome to ``future`` (the task itself never fails)."""
    task = asyncio.current_task()
    assert task is not None
    loop.jobs.add(task)
    try:
        result = await _run_job(fn, args, timeout)
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
        loop.jobs.discard(task)


def _loop_context() -> contextvars.Context:
    """The caller's context variables for a task on the fleetenv loop, minus the name of
    the caller's async library: sniffio keeps it in a context variable, and a task that
    inherited "trio" from a trio caller would make anyio drive the asyncio loop as trio."""
    context = contextvars.copy_context()
    sniffio: Any = sys.modules.get("sniffio")
    if sniffio is not None and context.get(sniffio.current_async_library_cvar, None):
        context.run(sniffio.current_async_library_cvar.set, None)
    return context


async def _cancel_jobs(loop: _Loop) -> None:
    jobs = list(loop.jobs)
    for job in jobs:
        job.cancel()
    if jobs:
        await asyncio.wait(jobs, timeout=_STOP_TIMEOUT_S / 2)


class _StartedFlag:
    """A ``task_status`` stand-in that remembers whether ``started()`` was called."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.started_called = False

    def started(self, value: Any = None) -> None:
        self.started_called = True
        self._inner.started(value)


async def _contained(fn: Callable[..., Awaitable[None]], args: tuple[Any, ...], label: str,
                     *, task_status: Any) -> None:
    status = _StartedFlag(task_status)
    try:
        await fn(*args, task_status=status)
    except Exception:
        if not status.started_called:
            raise
        logger.warning("fleetenv background task %s failed", label, exc_info=True)


# ---------------------------------------------------------------------------- awaiting


async def await_future(future: concurrent.futures.Future[T]) -> T:
    """Await a ``concurrent.futures`` future from the caller's asyncio or trio loop.

    The loop stays free while another thread (the fleetenv loop, the pool) finishes the
    future; cancelling the awaiting task cancels the future. asyncio's ``wrap_future``
    would do this for asyncio only.
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
    ``from_thread.run_sync(..., token=)`` would wait for the caller's loop to run it, on
    the fleetenv loop thread, which must never wait for a user's loop. A caller's loop
    that has already closed is not woken (nobody is waiting any more).
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
    ``aopen``, ``acall_tool``...): awaited anywhere, it runs on the fleetenv loop through
    `Runtime.call_async` (directly when already there), so the caller's loop is never
    blocked and the object's locks, events and sessions are only ever touched by the
    loop they belong to. No timeout of its own: the operation's deadline applies."""

    label = name_of(fn)

    @functools.wraps(fn)
    async def hop(*args: P.args, **kwargs: P.kwargs) -> T:
        runtime = _current
        if runtime.in_loop_thread():  # already there (a call within a call): no hop
            return await fn(*args, **kwargs)
        return await runtime.call_async(functools.partial(fn, *args, **kwargs), name=label)

    return hop


# ---------------------------------------------------------------------------- shutdown


def add_shutdown_hook(fn: Callable[[], None]) -> None:
    """Run ``fn()`` at interpreter exit (and in `shutdown`), before the loop stops.

    Hooks run in the thread that shuts down (the main thread at exit), newest first, so
    they may use the blocking API (`Runtime.call`). Adding the same function twice is a
    no-op. Hooks persist across `shutdown()` and fork; a hook must only act on objects of
    the current process and runtime (see `Runtime.generation`) and must be idempotent.
    Exceptions are logged, never propagated.
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
            logger.warning("fleetenv shutdown hook %s failed: %s", name_of(hook), exc)


def _replace(refuse: str | None = None) -> Runtime | None:
    """Make a new runtime current; the old one, if it ever started anything, to stop."""
    global _current
    with _lock:
        old = _current
        if not old._started and refuse is None:
            return None
        _current = Runtime(old.generation + 1, max_threads=old.max_threads, refuse=refuse)
    return old


def shutdown() -> None:
    """Run the shutdown hooks, then stop the current runtime's loop and pool. Idempotent.

    Loop-bound objects made before the call refuse further use; the next fleetenv call
    starts a fresh runtime (except at interpreter exit).
    """
    _current._refuse_loop_thread("fleetenv.runtime.shutdown()")
    _run_hooks()
    old = _replace()
    if old is not None:
        old._stop()


def at_interpreter_exit() -> bool:
    """True once the interpreter's exit started shutting fleetenv down (an explicit
    `shutdown` does not count: fleetenv goes on working after it)."""
    return _at_exit


def _shutdown_at_exit() -> None:
    global _at_exit
    _at_exit = True
    try:
        _run_hooks()
    finally:
        old = _replace(refuse="the fleetenv runtime has shut down because the interpreter "
                       "is exiting")
        if old is not None:
            old._stop()


atexit.register(_shutdown_at_exit)


# ---------------------------------------------------------------------------- fork


def _before_fork() -> None:
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    global _lock, _hooks_lock, _current
    # The forking thread held _lock; a fresh lock is simpler than reasoning about owners.
    _lock = threading.Lock()
    _hooks_lock = threading.Lock()
    _abandoned.append(_current)  # its threads were the parent's: never stop or drop it
    _current = Runtime(_current.generation + 1, max_threads=_current.max_threads)


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
