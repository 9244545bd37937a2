"""Every error fleetenv raises on purpose, in one place.

All of them derive from :class:`FleetEnvError`, and each says what was being done, for
which task / env / instance / endpoint (``err.context``), what to try (``err.hint``) and
whether trying the same thing again may work (``err.retryable``)::

    from fleetenv.errors import FleetEnvError, PermanentProvisioningError

    try:
        env.reset()
    except PermanentProvisioningError as err:   # bad key, unknown env or version
        print(err.hint)

Which to catch, by the decision to make:

* give up on the task: :class:`PermanentProvisioningError`, :class:`ConfigurationError`;
* try again later: any error with ``retryable`` set (:class:`TransientProvisioningError`,
  :class:`ConnectError`, ...);
* the reward is unknown: :class:`VerifierError` (from ``Grade.raise_for_status()``);
* the tool may have run: :class:`ToolCallMayHaveRunError` (never replayed for you).
"""

from fleetenv.core.errors import *  # noqa: F403  # this module is core.errors' public name
from fleetenv.core.errors import __all__ as __all__
