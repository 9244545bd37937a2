"""The one background loop: entry points, deadlines, interrupts, shutdown, fork."""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import logging
import os
import sys
import threading
import time

import anyio
import pytest
from _support.waiting import wait_child, wait_for

from fleetenv import runtime
from fleetenv.core.errors import DeadlineExceeded, FleetEnvError, LoopThreadError

pytestmark = pytest.mark.timeout(20)


async def double(x: int) -> int:
    await anyio.sleep(0)
    return x * 2


async def task_names() -> set[str]:
    return {task.get_name() for task in asyncio.all_tasks()}


def names() -> set[str]:
    """The names of the tasks on the loop now."""
    return runtime.current().call(task_names)


async def fail_in_group() -> None:
    async with anyio.create_task_group() as group:

        async def boom() -> None:
            raise ValueError("the leaf")

        group.start_soon(boom)


def test_call_submit_and_the_thread() -> None:
    assert runtime.current().call(double, 21) == 42
    assert runtime.current().submit(double, 4).result(timeout=5) == 8

    async def where() -> tuple[str, bool]:
        return threading.current_thread().name, runtime.current().in_loop_thread()

    assert runtime.current().call(where) == (runtime.LOOP_THREAD_NAME, True)
    assert not runtime.current().in_loop_thread()
    loops = {runtime.current().call(asyncio_loop_id) for _ in range(3)}
    assert len(loops) == 1, "every call runs on the same loop"


async def asyncio_loop_id() -> int:
    return id(asyncio.get_running_loop())


def test_blocking_api_refuses_the_loop_thread() -> None:
    async def nested() -> None:
        runtime.current().call(double, 1)

    with pytest.raises(LoopThreadError, match="fleetenv-loop"):
        runtime.current().call(nested)


def test_single_leaf_groups_are_unwrapped() -> None:
    with pytest.raises(ValueError, match="the leaf"):
        runtime.current().call(fail_in_group)


def test_timeout_cancels_the_loop_side_task() -> None:
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="slow"):
        runtime.current().call(slow, timeout=0.2, name="slow")
    # A hang bound, not a speed claim: the 0.2 s in-loop deadline, not the caller-side
    # watchdog (deadline + 5 s) nor the 10 s sleep.
    assert time.monotonic() - started < 2
    assert cancelled.wait(2)
    assert "slow" not in names()


def test_ctrl_c_cancels_the_loop_side_task() -> None:
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        runtime.current().call(anyio.sleep, 10, name="interrupted-sleep")
    assert time.monotonic() - started < 3  # hang bound: interrupted at 0.3 s, not after 10 s
    assert "interrupted-sleep" not in names()


def test_future_cancel_cancels_the_task() -> None:
    future = runtime.current().submit(anyio.sleep, 10, name="cancel-me")
    wait_for(lambda: "cancel-me" in names(), what="the task to start")
    assert future.cancel()
    wait_for(lambda: "cancel-me" not in names(), what="the task to end")


def test_call_from_a_thread_that_runs_its_own_asyncio_loop() -> None:
    """The Jupyter case: blocking API inside a running loop, and call_async."""

    async def user_code() -> tuple[int, int]:
        blocking = runtime.current().call(double, 5)  # blocks this loop; no nested-loop error
        awaited = await runtime.current().call_async(double, 7)
        return blocking, awaited

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, user_code()).result(timeout=10) == (10, 14)
    assert asyncio.run(user_code()) == (10, 14)


def test_call_async_timeout_and_cancellation() -> None:
    async def main() -> None:
        with pytest.raises(DeadlineExceeded):
            await runtime.current().call_async(anyio.sleep, 5, timeout=0.1)
        with pytest.raises(ValueError, match="the leaf"):
            await runtime.current().call_async(fail_in_group)
        task = asyncio.ensure_future(
            runtime.current().call_async(anyio.sleep, 10, name="awaited-sleep"))
        await asyncio.sleep(0.1)
        assert "awaited-sleep" in names()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    wait_for(lambda: "awaited-sleep" not in names(), what="the sleep to end")


def test_blocking_work_runs_on_one_bounded_pool_awaited_from_any_loop() -> None:
    def where(value: int) -> tuple[str, int]:
        return threading.current_thread().name, value

    async def awaited() -> tuple[str, int]:
        return await runtime.current().run_blocking(where, 2)

    name, _ = runtime.current().submit_blocking(where, 1).result(timeout=10)
    assert name.startswith(runtime.POOL_THREAD_PREFIX)
    for outcome in (asyncio.run(awaited()), anyio.run(awaited, backend="trio"),
                    runtime.current().call(awaited)):  # the fleetenv loop's own
        assert outcome[0].startswith(runtime.POOL_THREAD_PREFIX) and outcome[1] == 2
    release = threading.Event()
    jobs = [runtime.current().submit_blocking(lambda: (release.wait(10), where(0))[1])
            for _ in range(runtime.MAX_POOL_THREADS + 8)]
    release.set()
    names = {job.result(timeout=20)[0] for job in jobs}
    assert len(names) <= runtime.MAX_POOL_THREADS  # the rest queued for a thread


def test_timers_fire_on_the_loop_and_cancel_from_any_thread() -> None:
    fired: list[str] = []
    start = time.monotonic()
    runtime.current().call_at(start + 0.05, lambda: fired.append(threading.current_thread().name))
    cancel = runtime.current().call_at(start + 0.1, lambda: fired.append("cancelled"))
    cancel()
    runtime.current().call_at(start + 0.3, lambda: fired.append("last"))
    wait_for(lambda: "last" in fired, what="the last timer")
    assert fired == [runtime.LOOP_THREAD_NAME, "last"]
    assert time.monotonic() - start >= 0.3


def test_start_service_contains_late_failures(caplog: pytest.LogCaptureFixture) -> None:
    # Containment is about the service group: `call` would work even if a late failure
    # tore the group down, so the test watches a sibling service and the group itself.
    release = threading.Event()

    async def sibling(*, task_status) -> None:
        task_status.started("sibling up")
        while not release.is_set():
            await anyio.sleep(0.01)

    async def service(*, task_status) -> None:
        task_status.started("ready")
        await anyio.sleep(0.01)
        raise RuntimeError("late failure")

    async def early(*, task_status) -> None:
        raise KeyError("early failure")

    async def start_all() -> tuple[str, str]:
        up = await runtime.current().start_service(sibling, name="sibling")
        value = await runtime.current().start_service(service, name="late")
        with pytest.raises(KeyError):
            await runtime.current().start_service(early)
        return up, value

    async def start_another() -> str:
        return await runtime.current().start_service(sibling, name="sibling-2")

    try:
        with caplog.at_level(logging.WARNING, logger="fleetenv.runtime"):
            assert runtime.current().call(start_all) == ("sibling up", "ready")
            wait_for(lambda: "late" not in names(), what="the late failure")
            assert "sibling" in names(), "a late failure cancelled a sibling"
            # the group still takes work
            assert runtime.current().call(start_another) == "sibling up"
        logged = [r for r in caplog.records if r.name == "fleetenv.runtime"
                  and "background task late failed" in r.getMessage()]
        assert len(logged) == 1 and logged[0].exc_info is not None
        assert str(logged[0].exc_info[1]) == "late failure"
    finally:
        release.set()
    wait_for(lambda: not {"sibling", "sibling-2"} & names(),
             what="the siblings to end")
    assert runtime.current().call(double, 2) == 4
    with pytest.raises(LoopThreadError, match="must be awaited on the fleetenv loop"):
        asyncio.run(runtime.current().start_service(service))  # another loop: refused


def test_shutdown_runs_hooks_first_then_restarts_lazily() -> None:
    seen: list[str] = []

    def first() -> None:
        seen.append("first")

    def second() -> None:
        # hooks run before the loop stops, so they can still use it
        seen.append(f"second:{runtime.current().call(double, 1)}")

    runtime.add_shutdown_hook(first)
    runtime.add_shutdown_hook(second)
    runtime.add_shutdown_hook(second)  # a no-op
    try:
        runtime.current().call(double, 1)
        before = runtime.current().generation
        runtime.shutdown()
        assert seen == ["second:2", "first"]
        assert runtime.current().generation == before + 1
        assert not any(t.name == runtime.LOOP_THREAD_NAME for t in threading.enumerate())
        runtime.shutdown()  # idempotent
        with pytest.raises(FleetEnvError, match="no longer exists"):
            runtime.current().check_generation(before, "a session")
        assert runtime.current().call(double, 3) == 6  # a fresh loop
    finally:
        runtime.remove_shutdown_hook(first)
        runtime.remove_shutdown_hook(second)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_fresh_loop() -> None:
    assert runtime.current().call(double, 1) == 2
    parent_generation = runtime.current().generation
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report through the pipe, never return into pytest
        code = 1
        try:
            refused = False
            try:
                runtime.current().check_generation(parent_generation, "parent object")
            except FleetEnvError:
                refused = True
            child = runtime.current()
            ok = refused and child.call(double, 21) == 42 and not child.in_loop_thread()
            code = 0 if ok else 2
        finally:
            os.write(write_fd, str(code).encode())
            os._exit(code)
    os.close(write_fd)
    status = wait_child(pid, timeout=15)
    report = os.read(read_fd, 16)
    os.close(read_fd)
    assert status == 0 and report == b"0"
    assert runtime.current().call(double, 2) == 4  # the parent is unaffected




def _waits_on_the_future(fn: object) -> int:
    """How many times the current thread blocked on a lock while running ``fn`` (a
    waiter of `Runtime.call` blocks on its job's lock: each acquire is one wake-up)."""
    asks = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal asks
        if event == "c_call" and getattr(arg, "__qualname__", "") == "lock.acquire":
            asks += 1

    sys.setprofile(profile)
    try:
        fn()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return asks


def test_only_the_main_thread_wakes_up_while_it_waits() -> None:
    # Ctrl-C reaches the main thread only: it wakes up every 0.1 s to let it in. Any
    # other thread blocks on the job's lock, once, however long the wait.
    def wait() -> None:
        runtime.current().call(anyio.sleep, 0.5)

    in_main = _waits_on_the_future(wait)
    in_worker: list[int] = []
    worker = threading.Thread(target=lambda: in_worker.append(_waits_on_the_future(wait)))
    worker.start()
    worker.join(timeout=10)
    # the first acquire arms the job's lock; then the waits
    assert in_main >= 1 + 3  # sliced: this is what lets _thread.interrupt_main() through
    assert in_worker == [1 + 1]


_INTERRUPTED_STARTS = r"""
import random, signal, sys, threading, time
from fleetenv import runtime

async def nothing():
    return 1

def interrupt(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
random.seed(7)
interrupted = 0
for attempt in range(300):
    runtime.shutdown()
    try:
        signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0, 0.004))
        runtime.current().call(nothing, timeout=30)
        signal.setitimer(signal.ITIMER_REAL, 0)
        time.sleep(0.005)  # a late alarm lands here, not in the next start
    except KeyboardInterrupt:
        interrupted += 1
    except RuntimeError as error:  # CPython's Condition.wait, interrupted inside its lock
        assert isinstance(error.__context__, KeyboardInterrupt), error
        interrupted += 1
signal.setitimer(signal.ITIMER_REAL, 0)
assert runtime.current().call(nothing, timeout=30) == 1  # still works
deadline = time.monotonic() + 20
def loops():
    return [t for t in threading.enumerate() if t.name == runtime.LOOP_THREAD_NAME]
while len(loops()) > 1 and time.monotonic() < deadline:
    time.sleep(0.05)
print("interrupted", interrupted, "loops", len(loops()), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGALRM")
@pytest.mark.timeout(180)
def test_ctrl_c_while_the_loop_starts_never_hangs_and_leaves_one_loop() -> None:
    """Ctrl-C (here: an alarm raising KeyboardInterrupt) at random moments of starting the
    loop. Before, anyio's ``start_blocking_portal`` joined its thread when interrupted
    while it started, and that thread served forever: the caller hung. Now every start
    returns, an abandoned loop stops itself, and the process exits."""
    import subprocess

    child = subprocess.run([sys.executable, "-c", _INTERRUPTED_STARTS], capture_output=True,
                           text=True, timeout=150)
    assert child.returncode == 0, child.stderr[-3000:]
    words = child.stdout.split()
    assert int(words[words.index("interrupted") + 1]) > 0, child.stdout  # it did interrupt
    assert words[words.index("loops") + 1] == "1", child.stdout
