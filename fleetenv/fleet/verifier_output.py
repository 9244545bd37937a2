"""Reading what a verifier says besides its score: judge errors, accumulators, apps.

Fleet's verifiers print structured text to stdout, and trainers built on OpenEnv's
``fleet_env`` grade from it. These parsers keep its rules exactly, because reward curves of
running experiments depend on them:

- A line that *starts* with ``JUDGE ERROR:`` means the LLM judge inside a verifier failed
  (a brownout), whatever score the run returned: the grade is unknown, and the run may be
  retried. A mention in the middle of a line is not one.
- ``>>> ERROR_ACCUMULATOR >>>`` / ``>>> SUCCESS_ACCUMULATOR >>>`` blocks hold Python list
  literals of failed and passed checks; the partial score is ``passed / (failed + passed)``.
- A multi-app verifier prints ``App <name>: 0|1`` per app, each app's own output between
  ``<<< VERIFY_<name> <<<`` and ``>>> VERIFY_<name> >>>``. An app that passed only by
  saying nothing changed ("no unexpected changes", "No filesystem changes",
  "No-unexpected-envelopes") is *trivial* and counts for nothing: it would pay an agent
  for doing nothing there.

Which verifiers want the conversation is decided from the parsed source (``ast``), not a
regular expression, which would miss multi-line signatures and defaults that contain
parentheses. Each source is parsed once (cached).

CPython before 3.11.8 / 3.12.2 builds AST objects with state shared by all threads, and
two threads building at once can fail with a spurious ``SystemError: AST constructor
recursion depth mismatch`` (gh-106905). Grading threads run these parsers at once, so
every ``ast`` call here goes through :func:`_build_ast`: one at a time, and retried if
another library's thread clashed with it anyway.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fleetenv.core.types import AppGrade

__all__ = [
    "PartialScore",
    "accepts_conversation",
    "judge_failed",
    "parse_accumulators",
    "parse_multi_app",
    "parse_partial",
]

logger = logging.getLogger("fleetenv.verifier")

_T = TypeVar("_T")
_AST_LOCK = threading.Lock()
_AST_ATTEMPTS = 3
#: Longest accumulator block read as a list literal; a longer one is unreadable (None).
MAX_ACCUMULATOR_CHARS = 1 << 20
_JUDGE_ERROR = re.compile(r"^JUDGE ERROR:", re.MULTILINE)
_APP_LINE = re.compile(r"^App (\S+): (\d+)$", re.MULTILINE)
_TRIVIAL_MARKERS = ("no unexpected changes", "no filesystem changes", "no-unexpected-envelopes")


def _build_ast(build: Callable[[], _T]) -> _T:
    """``build()`` (an ``ast`` call) under the process's AST lock; a spurious
    ``SystemError`` from a clash with a thread outside fleetenv is retried."""
    for attempt in range(1, _AST_ATTEMPTS + 1):
        with _AST_LOCK:
            try:
                return build()
            except SystemError:
                if attempt == _AST_ATTEMPTS:
                    raise
                logger.info("building an AST clashed with another thread (gh-106905); "
                            "retrying")
    raise AssertionError("unreachable")  # pragma: no cover


def _block(stdout: str, name: str) -> str | None:
    """The text between the first ``>>> name >>>`` line and the next ``<<< name <<<``
    line (at least one character), or None. ``str.find`` only: linear in ``stdout``."""
    start, end = f">>> {name} >>>\n", f"\n<<< {name} <<<"
    head = stdout.find(start)
    if head < 0:
        return None
    body = head + len(start)
    tail = stdout.find(end, body + 1)
    return None if tail < 0 else stdout[body:tail]


_ERRORS = "ERROR_ACCUMULATOR"
_SUCCESSES = "SUCCESS_ACCUMULATOR"


@dataclass(frozen=True)
class PartialScore:
    """The partial score read from a verifier's stdout, and the per-app verdicts."""

    score: float | None
    apps: dict[str, AppGrade]


def judge_failed(stdout: str | None) -> bool:
    """True when a line of ``stdout`` starts with ``JUDGE ERROR:``."""
    return bool(stdout) and _JUDGE_ERROR.search(stdout or "") is not None


def _count(block: str | None) -> int | None:
    """Items in an accumulator block's list literal (0 without a block, None if unreadable)."""
    if block is None:
        return 0
    if len(block) > MAX_ACCUMULATOR_CHARS:
        return None
    literal = block.strip()
    try:
        value = _build_ast(lambda: ast.literal_eval(literal))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, SystemError):
        return None
    if not isinstance(value, list | tuple | set):
        return None
    return len(value)


def parse_accumulators(stdout: str) -> float | None:
    """``n_success / (n_errors + n_success)`` from the first accumulator blocks.

    ``None`` when there is no block, when both are empty, or when one does not parse as
    a list literal (a partial score from half-read output would be a made-up number), or
    is longer than ``MAX_ACCUMULATOR_CHARS``.
    """
    errors_block, successes_block = _block(stdout, _ERRORS), _block(stdout, _SUCCESSES)
    if errors_block is None and successes_block is None:
        return None
    errors, successes = _count(errors_block), _count(successes_block)
    if errors is None or successes is None or errors + successes == 0:
        return None
    return successes / (errors + successes)


def _app_block(stdout: str, name: str) -> str | None:
    start, end = f"<<< VERIFY_{name} <<<", f">>> VERIFY_{name} >>>"
    head = stdout.find(start)
    if head < 0:
        return None
    tail = stdout.find(end, head + len(start))
    return stdout[head + len(start): tail if tail >= 0 else len(stdout)]


def _is_trivial(block: str | None) -> bool:
    """A passed app's output only says that nothing changed.

    The text searched is the app's ``SUCCESS_ACCUMULATOR`` block when it printed one,
    else its whole ``VERIFY`` block (``PASS: ...`` lines of file checks).
    """
    if block is None:
        return False
    successes = _block(block, _SUCCESSES)
    text = (block if successes is None else successes).lower()
    return any(marker in text for marker in _TRIVIAL_MARKERS)


def parse_multi_app(stdout: str) -> PartialScore:
    """Per-app verdicts and ``real passed / real apps`` (``None`` without a real app)."""
    apps: dict[str, AppGrade] = {}
    for match in _APP_LINE.finditer(stdout):
        name, value = match.group(1), float(int(match.group(2)))
        passed = value >= 1.0
        apps[name] = AppGrade(score=value,
                              trivial=passed and _is_trivial(_app_block(stdout, name)))
    real = [app for app in apps.values() if not app.trivial]
    if not real:
        return PartialScore(None, apps)
    return PartialScore(sum(app.passed for app in real) / len(real), apps)


def parse_partial(stdout: str | None) -> PartialScore:
    """The partial score of a run: the multi-app rule if any ``App <name>: n`` line is
    present (and only that rule), else the accumulators."""
    if not stdout:
        return PartialScore(None, {})
    if _APP_LINE.search(stdout):
        return parse_multi_app(stdout)
    return PartialScore(parse_accumulators(stdout), {})


def _run_function(tree: ast.Module) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function Fleet's runner calls: the first one the source defines at top level."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return node
    return None


def accepts_conversation(source: str | None) -> bool:
    """Does the verifier's function take a ``conversation`` parameter?

    Read from the parsed source: the function Fleet runs (the first top-level ``def``),
    or a top-level ``verify`` (OpenEnv's ``fleet_env`` rule). A ``**kwargs`` catch-all does
    not count: such a verifier did not ask for the transcript. Source that does not
    parse says no; running it will report the syntax error.
    """
    if not source:
        return False
    try:
        return _takes_conversation(source)
    except SystemError as exc:  # gh-106905 on every attempt: not cached, asked again
        logger.warning("could not read the verifier's signature (%s); sending no "
                       "conversation", exc)
        return False


@functools.lru_cache(maxsize=256)
def _takes_conversation(source: str) -> bool:
    """:func:`accepts_conversation`'s answer, parsed once per verifier source."""
    try:
        tree = _build_ast(lambda: ast.parse(source))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    candidates = [_run_function(tree)]
    candidates += [node for node in tree.body
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                   and node.name == "verify"]
    for function in candidates:
        if function is None:
            continue
        arguments = function.args
        # Keyword-passable parameters only: the conversation travels as a kwarg.
        names = [a.arg for a in (*arguments.args, *arguments.kwonlyargs)]
        if "conversation" in names:
            return True
    return False
