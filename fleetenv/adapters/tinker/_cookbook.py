"""The seam to tinker-cookbook: its modules, loaded once, typed ``Any`` on our side.

Why ``Any``: tinker-cookbook needs Python >= 3.11 and torch, so the dev and CI type
checks run without it; the adapter is checked against the real package by its tests
(``.ci/tinker``) instead. Why the base classes switch under ``TYPE_CHECKING``: mypy
then sees plain classes, and at run time they are the cookbook's own ABCs, so
``isinstance(builder, EnvGroupBuilder)`` holds for the cookbook's code.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

_INSTALL_HINT = (
    "fleetenv.adapters.tinker needs tinker-cookbook (Python >= 3.11, with torch): "
    "pip install 'fleetenv[tinker]'")


def load(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT} (importing {name} failed: {exc})") from exc


tinker: Any = load("tinker")
chz: Any = load("chz")
rl_types: Any = load("tinker_cookbook.rl.types")
renderers: Any = load("tinker_cookbook.renderers")
tokenizer_utils: Any = load("tinker_cookbook.tokenizer_utils")
completers: Any = load("tinker_cookbook.completers")
model_info: Any = load("tinker_cookbook.model_info")


def _version() -> tuple[int, ...]:
    try:
        raw = str(load("tinker_cookbook._version").__version__)
    except ImportError:  # pragma: no cover - every release on PyPI has it
        return (0,)
    parts = []
    for piece in raw.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


#: The installed tinker-cookbook release, e.g. ``(0, 5, 8)``.
COOKBOOK_VERSION = _version()

T = TypeVar("T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    EnvBase = object
    EnvGroupBuilderBase = object
    RLDatasetBase = object
    RLDatasetBuilderBase = object
    TokenCompleterBase = object

    @dataclass_transform(kw_only_default=True, frozen_default=True)
    def chz_class(cls: type[T]) -> type[T]: ...
else:
    EnvBase = rl_types.Env
    EnvGroupBuilderBase = rl_types.EnvGroupBuilder
    RLDatasetBase = rl_types.RLDataset
    RLDatasetBuilderBase = rl_types.RLDatasetBuilder
    TokenCompleterBase = completers.TokenCompleter

    def chz_class(cls):
        return chz.chz(cls)


# ---------------------------------------------------------------- the tokenizer guard

#: tinker-cookbook 0.5.x renders in worker threads with one shared fast tokenizer, and
#: HuggingFace's Rust tokenizer then fails with "Already borrowed" when a group's envs
#: render at once (fixed in 0.6). Below 0.6 every render/parse with a tokenizer holds
#: that tokenizer's lock; from 0.6 on, none is taken.
NEEDS_TOKENIZER_LOCK = COOKBOOK_VERSION < (0, 6)

_locks: dict[int, threading.Lock] = {}
_locks_guard = threading.Lock()


def tokenizer_lock(tokenizer: object) -> threading.Lock | None:
    """The lock guarding ``tokenizer`` (one per tokenizer object), or ``None`` when the
    installed cookbook does not need one."""
    if not NEEDS_TOKENIZER_LOCK:
        return None
    with _locks_guard:
        # Keyed by id: cookbook tokenizers are cached for the life of the process.
        return _locks.setdefault(id(tokenizer), threading.Lock())


def guarded(lock: threading.Lock | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` under ``lock`` (if any)."""
    with lock or contextlib.nullcontext():
        return fn(*args)
