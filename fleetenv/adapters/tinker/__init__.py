"""Fleet tasks for the Tinker cookbook's RL loop (``tinker_cookbook.rl``).

:class:`FleetEnvGroupBuilder` (the cookbook's ``EnvGroupBuilder``: one task,
``group_size`` episodes) makes one :class:`FleetTinkerEnv` (``Env``: tokens in and out)
per episode; :class:`FleetRLDatasetBuilder` / :class:`FleetRLDataset` feed the training
loop; :mod:`fleetenv.adapters.tinker.testing` runs it all without a model. Needs
``pip install 'fleetenv[tinker]'`` (tinker-cookbook: Python >= 3.11 and torch); without
it, importing raises ``ImportError`` saying so. docs/tinker.md has the rest.
"""

from __future__ import annotations

from fleetenv.adapters.tinker._cookbook import COOKBOOK_VERSION
from fleetenv.adapters.tinker.dataset import FleetRLDataset, FleetRLDatasetBuilder
from fleetenv.adapters.tinker.env import DEFAULT_SYSTEM_PROMPT, FleetTinkerEnv
from fleetenv.adapters.tinker.group import FleetEnvGroupBuilder, session_for

__all__ = ["COOKBOOK_VERSION", "DEFAULT_SYSTEM_PROMPT", "FleetEnvGroupBuilder",
           "FleetRLDataset", "FleetRLDatasetBuilder", "FleetTinkerEnv", "session_for"]
