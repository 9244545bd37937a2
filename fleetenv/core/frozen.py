"""Read-only JSON containers for data that many rollouts share.

One ``Task`` object is handed to many episodes at once (threads of a runner, samples of
a GRPO group). If one policy popped an item from ``task.metadata["reference_solution"]``
every later episode would see the damage, so task data is frozen all the way down.
The containers subclass ``dict`` and ``list`` so ``json.dumps``, ``isinstance`` checks
and ``==`` against plain values keep working; they pickle as plain values rebuilt frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = ["FrozenDict", "FrozenList", "freeze", "thaw"]

_HINT = "data shared between episodes is read-only; build a new object (e.g. task.replace(...))"


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise TypeError(f"this container is read-only: {_HINT}")


class FrozenDict(dict[Any, Any]):
    """A ``dict`` that refuses every mutation."""

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle would otherwise refill the dict through the refused __setitem__.
        return (FrozenDict, (dict(self),))


class FrozenList(list[Any]):
    """A ``list`` that refuses every mutation."""

    __setitem__ = _refuse
    __delitem__ = _refuse
    __iadd__ = _refuse
    __imul__ = _refuse
    append = _refuse
    extend = _refuse
    insert = _refuse
    remove = _refuse
    pop = _refuse
    clear = _refuse
    sort = _refuse
    reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def freeze(value: Any) -> Any:
    """Return ``value`` with every dict and list (at any depth) replaced by a frozen copy."""
    if isinstance(value, Mapping):
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """Return a plain, mutable deep copy of ``value`` (the inverse of ``freeze``)."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value
