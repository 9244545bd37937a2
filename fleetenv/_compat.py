"""Deprecation shims for 0.1 names that moved in 1.0.

Old import paths keep working and warn once, naming the new place. Nothing here is
public; remove an entry one minor release after it was announced in the CHANGELOG.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

from fleetenv.core.deprecation import warn_once

__all__ = ["MOVED_MODULES", "MOVED_NAMES", "install_module_aliases", "moved_name"]

#: 0.1 module path -> its 1.0 home.
MOVED_MODULES: dict[str, str] = {
    "fleetenv.env.episode": "fleetenv.env.fleet_env",
    "fleetenv.rollouts.episode": "fleetenv.rollouts.rollout",
}

#: 0.1 top-level name -> the module it is imported from now (``fleetenv.<name>`` warns).
MOVED_NAMES: dict[str, str] = {
    name: "fleetenv.errors" for name in (
        "ConfigurationError", "ConnectError", "DeadlineExceeded", "EpisodeStateError",
        "InstanceGoneError", "InvalidActionError", "LoopThreadError",
        "PermanentProvisioningError", "ProvisioningError", "ToolArgumentsError",
        "ToolCallError", "ToolCallMayHaveRunError", "ToolError", "ToolNotFoundError",
        "TransientProvisioningError", "VerifierError",
    )
}


def moved_name(name: str) -> Any:
    """The object a moved top-level name refers to, with a one-time warning."""
    home = MOVED_NAMES[name]
    warn_once("fleetenv", name, f"fleetenv.{name} is deprecated; import it from {home} "
              f"(moved in fleetenv 1.0)", stacklevel=4)
    return getattr(importlib.import_module(home), name)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warn_once("module", self.old, f"module {self.old} is deprecated; import from "
                  f"{self.new} (moved in fleetenv 1.0)", stacklevel=8)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the new one, already imported."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


def install_module_aliases() -> None:
    """Make the 0.1 module paths importable (idempotent)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
