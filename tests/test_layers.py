"""The layers of the package (docs/local-fleet.md, "Where the local Fleet sits"): data
flows down, nothing below imports from above, and the embedded local Fleet sits on top,
imported only by the top of the house.

Read from the source, every import counted: top-level, lazy (inside a function) and
annotation-only (``if TYPE_CHECKING:``) alike, since each is a dependency of the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fleetenv"

#: Bottom to top. A module may import its own layer and the ones below it.
LAYERS = (
    ("fleetenv._version", "fleetenv.core", "fleetenv.errors", "fleetenv.events"),
    ("fleetenv.runtime",),
    ("fleetenv.mcp",),
    ("fleetenv.fleet",),
    ("fleetenv.env",),
    ("fleetenv.rollouts",),
    ("fleetenv.reports", "fleetenv.adapters"),
    ("fleetenv.cli", "fleetenv.__main__", "fleetenv"),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every fleetenv module ``name`` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # a submodule, or a name the module defines
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in out if m == "fleetenv" or m.startswith("fleetenv.")}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer(module: str) -> int | None:
    """The layer of ``module``; ``None`` for fleetenv.local, which sits beside the stack."""
    if _within(module, "fleetenv.local"):
        return None
    for level, prefixes in enumerate(LAYERS):
        if module in prefixes or any(_within(module, p) for p in prefixes if p != "fleetenv"):
            return level
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def test_nothing_imports_from_a_layer_above_it() -> None:
    back_up = []
    for name, path in sorted(MODULES.items()):
        here = _layer(name)
        if here is None:
            continue
        for target in sorted(_imports(name, path)):
            there = _layer(target)
            if there is not None and there > here:
                back_up.append(f"{name} -> {target}")
    assert not back_up, "imports that run back up the layers:\n" + "\n".join(back_up)


def test_the_local_fleet_imports_none_of_the_stack() -> None:
    """It serves Fleet's API to the stack over HTTP and MCP; what it needs of fleetenv
    beyond the plain task model of fleetenv.core is given to it (its harness)."""
    reached = sorted(
        f"{name} -> {target}"
        for name, path in MODULES.items() if _within(name, "fleetenv.local")
        for target in _imports(name, path)
        if target in MODULES and not _within(target, "fleetenv.local")
        and not _within(target, "fleetenv.core"))
    assert not reached, "fleetenv.local imports the stack:\n" + "\n".join(reached)


def test_only_the_top_imports_the_local_fleet() -> None:
    importers = sorted(
        f"{name} -> {target}"
        for name, path in MODULES.items() if not _within(name, "fleetenv.local")
        for target in _imports(name, path) if _within(target, "fleetenv.local")
        if name != "fleetenv" and not _within(name, "fleetenv.cli"))
    assert not importers, "below the top, these import fleetenv.local:\n" + "\n".join(
        importers)
