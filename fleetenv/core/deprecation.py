"""Deprecation shims: 0.1 names keep working for a while, and say where they went.

Each shim warns once per process and per name (a warning per call would drown a
training log), with ``DeprecationWarning`` pointed at the caller's line.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["renamed_kwargs", "warn_once"]

_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def warn_once(where: str, old: str, message: str, *, stacklevel: int = 3) -> None:
    """Emit ``message`` as a ``DeprecationWarning`` the first time ``(where, old)`` is seen."""
    with _lock:
        if (where, old) in _warned:
            return
        _warned.add((where, old))
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)


def renamed_kwargs(given: dict[str, Any], renames: Mapping[str, str], *, where: str,
                   stacklevel: int = 4) -> dict[str, Any]:
    """Translate deprecated keyword names in ``given`` (a ``**kwargs`` dict) to new ones.

    Returns ``{new_name: value}`` for every old name found (warning once for each);
    raises ``TypeError``, as Python would, for any other unexpected keyword.
    """
    out: dict[str, Any] = {}
    for name, value in given.items():
        new = renames.get(name)
        if new is None:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
        warn_once(where, name, f"{where}({name}=...) is deprecated; use {new}=... "
                  "(renamed in fleetenv 1.0)", stacklevel=stacklevel)
        out[new] = value
    return out
