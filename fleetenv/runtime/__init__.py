"""Runtime: the one background event loop and the one pool of blocking threads.

Higher layers never create event loops or threads; they hand work to the process's
`Runtime` (`current()`): coroutines to its loop (`call`, `submit`, `call_async`,
`start_service`), blocking functions to its pool (`submit_blocking`, `run_blocking`).
"""

from fleetenv.runtime.groups import unwrap_group
from fleetenv.runtime.loop import *  # noqa: F403  # the loop's public names, as its __all__
from fleetenv.runtime.loop import __all__ as _loop_names

__all__ = [*_loop_names, "unwrap_group"]
