"""Runtime: the one background event loop and the one pool of blocking threads.

Higher layers never create event loops or threads; they hand work to the process's
`Runtime` (`current()`): coroutines to its loop (`call`, `submit`, `call_async`,
`start_service`), blocking functions to its pool (`submit_blocking`, `run_blocking`).
"""

from fleetenv.runtime.groups import unwrap_group
from fleetenv.runtime.loop import (
    LOOP_THREAD_NAME,
    MAX_POOL_THREADS,
    POOL_THREAD_PREFIX,
    Runtime,
    add_shutdown_hook,
    await_future,
    current,
    on_fleetenv_loop,
    remove_shutdown_hook,
    shutdown,
)

__all__ = [
    "LOOP_THREAD_NAME",
    "MAX_POOL_THREADS",
    "POOL_THREAD_PREFIX",
    "Runtime",
    "add_shutdown_hook",
    "await_future",
    "current",
    "on_fleetenv_loop",
    "remove_shutdown_hook",
    "shutdown",
    "unwrap_group",
]
