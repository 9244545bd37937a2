"""The public API is deliberate: what ``__all__`` lists is what exists, is documented,
and (for errors) is raised somewhere; 0.1 names that moved still work and say where."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fleetenv
import fleetenv.errors
import fleetenv.events

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fleetenv"
DOCS = ROOT / "docs"

TRAINER_API = ["Runner", "run_episode", "RolloutResult", "PolicyContext", "Reply",
               "PolicySpec", "summarize", "read_results", "ResultsWriter"]


def test_dir_lists_only_public_names() -> None:
    assert dir(fleetenv) == sorted(fleetenv.__all__)
    assert not [name for name in fleetenv.__all__
                if name.startswith("_") and name != "__version__"]


def test_every_public_name_resolves() -> None:
    for name in fleetenv.__all__:
        assert getattr(fleetenv, name) is not None, name
    for name in [*TRAINER_API, "Session", "StopReason", "GradeStatus", "Modality"]:
        assert name in fleetenv.__all__, name


@pytest.mark.parametrize("module", [fleetenv.errors, fleetenv.events])
def test_public_modules_export_what_they_define(module: object) -> None:
    for name in module.__all__:  # type: ignore[attr-defined]
        assert hasattr(module, name), name


ERROR_MODULES = ("fleetenv.errors", "fleetenv.core.errors")


def _errors_raised_in(source: str, module: str) -> set[str]:
    """Names of fleetenv's exception classes that ``source`` (the module ``module``)
    constructs, or hands on to be raised (``give_up`` builders and the like return them),
    or raises as a bare class: ``X(...)``, ``raise X``, ``errors.X(...)``,
    ``fleetenv.errors.X(...)``. Names count only where they are bound to fleetenv's
    errors (mcp's ``ToolError`` is not fleetenv's)."""
    tree = ast.parse(source)
    classes: dict[str, str] = {}  # local name -> class name
    if module in ERROR_MODULES:
        classes.update((name, name) for name in fleetenv.errors.__all__)
    modules: set[str] = set()  # local dotted names of fleetenv's error modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                               module.rpartition(".")[0])
            for alias in node.names:
                if base in ERROR_MODULES:
                    classes[alias.asname or alias.name] = alias.name
                elif f"{base}.{alias.name}" in ERROR_MODULES:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(alias.asname or alias.name for alias in node.names
                           if alias.name in ERROR_MODULES)
    found: set[str] = set()
    for node in ast.walk(tree):
        target = (node.func if isinstance(node, ast.Call)
                  else node.exc if isinstance(node, ast.Raise) else None)
        if isinstance(target, ast.Name) and target.id in classes:
            found.add(classes[target.id])
        elif isinstance(target, ast.Attribute) and ast.unparse(target.value) in modules:
            found.add(target.attr)
    return found


def _raised_names() -> set[str]:
    """The error classes fleetenv's own source raises, over every module of it."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names |= _errors_raised_in(path.read_text(encoding="utf-8"), module)
    return names


def test_the_raise_scan_reads_every_form_of_raising() -> None:
    source = (
        "import fleetenv.errors\n"
        "from fleetenv import errors\n"
        "from fleetenv.core import errors as fleetenv_errors\n"
        "from fleetenv.core.errors import ToolCallError as Failed, RolloutCancelled\n"
        "from mcp.server.mcpserver.exceptions import ToolError\n"
        "raise errors.ConnectError('x')\n"
        "raise fleetenv_errors.InstanceGoneError('x')\n"
        "error = fleetenv.errors.VerifierError('x')\n"
        "raise Failed('x')\n"
        "raise RolloutCancelled\n"
        "raise ToolError('the MCP server\\'s, not fleetenv\\'s')\n"
        "isinstance(error, errors.ResourceError)\n")
    assert _errors_raised_in(source, "fleetenv.example") == {
        "ConnectError", "InstanceGoneError", "VerifierError", "ToolCallError",
        "RolloutCancelled"}
    relative = "from .errors import DeadlineExceeded\nraise DeadlineExceeded('x')\n"
    assert _errors_raised_in(relative, "fleetenv.core.example") == {"DeadlineExceeded"}


def test_every_exported_error_is_raised_somewhere() -> None:
    raised = _raised_names()
    never = [name for name in fleetenv.errors.__all__ if name not in raised]
    assert not never, f"exported from fleetenv.errors but nothing raises them: {never}"


def test_every_error_says_whether_to_retry() -> None:
    for name in fleetenv.errors.__all__:
        cls = getattr(fleetenv.errors, name)
        assert isinstance(cls.__dict__.get("retryable"), bool), (
            f"{name} does not state retryable = True or False in its own class body")
        assert cls("x").retryable is cls.retryable
        assert cls("x", retryable=not cls.retryable).retryable is not cls.retryable


def test_the_errors_page_gives_each_class_its_retryable() -> None:
    rows = re.findall(r"^\| (`\w+`(?:, `\w+`)*) \|.*\| (yes|no) \|[^|]*\|$",
                      (DOCS / "errors.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert len(rows) >= 10, "the table of docs/errors.md was not found"
    for names, says in rows:
        for name in re.findall(r"`(\w+)`", names):
            cls = getattr(fleetenv.errors, name)
            assert cls.retryable is (says == "yes"), f"docs/errors.md: {name} {says}"


def _documented_names() -> set[str]:
    """Names the API reference pages render with mkdocstrings (``::: fleetenv.X``)."""
    found: set[str] = set()
    for page in DOCS.rglob("*.md"):
        found.update(re.findall(r"^::: fleetenv\.(\w+)\s*$", page.read_text(encoding="utf-8"),
                                re.MULTILINE))
    return found


def test_docs_reference_every_public_name() -> None:
    documented = _documented_names()
    missing = [name for name in fleetenv.__all__
               if name != "__version__" and name not in documented]
    assert not missing, f"not in the API reference (docs/): {missing}"
    unknown = sorted(documented - set(fleetenv.__all__) - {"errors", "events"})
    assert not unknown, f"the API reference documents names fleetenv does not export: {unknown}"


def test_import_fleetenv_is_cheap() -> None:
    code = ("import sys, fleetenv\n"
            "heavy = [m for m in ('mcp', 'httpx', 'httpx2', 'fleet') if m in sys.modules]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"
