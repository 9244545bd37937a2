"""Runtime: the one background event loop, futures, deadlines, shutdown, fork safety.

Higher layers never create event loops; they hand coroutines to this loop:
`call` (blocking), `submit` (a `concurrent.futures.Future`), `call_async` (from another
asyncio loop), and `start_service` (long-lived owner tasks, awaited on the loop).
"""

from fleetenv.runtime.groups import unwrap_group
from fleetenv.runtime.loop import (
    LOOP_THREAD_NAME,
    add_shutdown_hook,
    call,
    call_async,
    check_generation,
    generation,
    in_loop_thread,
    in_short_thread,
    remove_shutdown_hook,
    shutdown,
    start_service,
    submit,
)

__all__ = [
    "LOOP_THREAD_NAME",
    "add_shutdown_hook",
    "call",
    "call_async",
    "check_generation",
    "generation",
    "in_loop_thread",
    "in_short_thread",
    "remove_shutdown_hook",
    "shutdown",
    "start_service",
    "submit",
    "unwrap_group",
]
