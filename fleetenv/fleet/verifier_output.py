"""Reading what a verifier says besides its score: judge errors, accumulators, apps.

Fleet's verifiers print structured text to stdout, and trainers built on OpenEnv's
``fleet_env`` grade from it; these parsers keep its rules exactly (docs/grading.md), and
where they differ at the edges, docs/porting.md says why. Which verifiers want the
conversation is read from the parsed source (``ast``), once per source.
"""

from __future__ import annotations

import ast
import bisect
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
#: ``<<< VERIFY_<name> <<<`` (an app's block opens) or ``>>> VERIFY_<name> >>>`` (closes).
_VERIFY_MARKER = re.compile(r"(<<<|>>>) VERIFY_(\S+) \1")
_TRIVIAL_MARKERS = ("no unexpected changes", "no filesystem changes", "no-unexpected-envelopes")
_TRIVIAL = re.compile("|".join(map(re.escape, _TRIVIAL_MARKERS)), re.IGNORECASE)


def _build_ast(build: Callable[[], _T]) -> _T:
    """``build()`` (an ``ast`` call) under the process's AST lock: CPython before
    3.11.8 / 3.12.2 shares AST-building state between threads, and two building at once
    can fail with a spurious ``SystemError`` (gh-106905). One that happens anyway (a
    thread outside fleetenv clashed with it) is retried."""
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
_SUCCESS_HEAD, _SUCCESS_TAIL = f">>> {_SUCCESSES} >>>\n", f"\n<<< {_SUCCESSES} <<<"


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


class _Markers:
    """Where one stdout's markers are, each kind found in one pass, so that every app's
    block is judged by lookups (``bisect``) instead of new searches of the stdout: the
    parse stays linear in its size however many apps and blocks it has."""

    def __init__(self, stdout: str) -> None:
        self.blocks = _verify_blocks(stdout)
        self.success_heads = _positions(stdout, _SUCCESS_HEAD)
        self.success_tails = _positions(stdout, _SUCCESS_TAIL)
        #: (start, end) of each trivial marker, any case; they never overlap, so both
        #: the starts and the ends are in order.
        self.trivial = [match.span() for match in _TRIVIAL.finditer(stdout)]

    def is_trivial(self, name: str) -> bool:
        """A passed app's output only says that nothing changed.

        The text searched is the app's ``SUCCESS_ACCUMULATOR`` block when it printed one,
        else its whole ``VERIFY`` block (``PASS: ...`` lines of file checks). An app
        without a complete ``VERIFY`` block is not trivial: leaving it out of the grade
        needs its own output as the evidence.
        """
        block = self.blocks.get(name)
        if block is None:
            return False
        start, end = block
        # The first SUCCESS block inside this one, as _block() finds it in the block's text.
        head = _first_within(self.success_heads, start, end - len(_SUCCESS_HEAD))
        if head is not None:
            body = head + len(_SUCCESS_HEAD)
            tail = _first_within(self.success_tails, body + 1, end - len(_SUCCESS_TAIL))
            if tail is not None:
                start, end = body, tail
        first = bisect.bisect_left(self.trivial, (start, 0))
        return first < len(self.trivial) and self.trivial[first][1] <= end


def _verify_blocks(stdout: str) -> dict[str, tuple[int, int]]:
    """Each app's first complete ``VERIFY`` block, as (start, end) of the text between
    ``<<< VERIFY_<name> <<<`` and the next ``>>> VERIFY_<name> >>>``. One pass."""
    opened: dict[str, int] = {}
    blocks: dict[str, tuple[int, int]] = {}
    for marker in _VERIFY_MARKER.finditer(stdout):
        kind, name = marker.group(1), marker.group(2)
        if name in blocks:
            continue
        if kind == "<<<":
            opened.setdefault(name, marker.end())
        elif name in opened:
            blocks[name] = (opened[name], marker.start())
    return blocks


def _positions(text: str, needle: str) -> list[int]:
    """Where ``needle`` starts in ``text``, in order (one pass)."""
    found: list[int] = []
    at = text.find(needle)
    while at >= 0:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def _first_within(positions: list[int], start: int, last: int) -> int | None:
    """The first of the sorted ``positions`` in ``[start, last]``, or None."""
    index = bisect.bisect_left(positions, start)
    if index < len(positions) and positions[index] <= last:
        return positions[index]
    return None


def parse_multi_app(stdout: str) -> PartialScore:
    """Per-app verdicts and ``real passed / real apps`` (``None`` without a real app).

    An app passed when its line says 1 (``App a: 2`` did not pass, as in the original).
    Every line counts, so an app printed twice counts twice, as in the original; its
    second verdict is ``apps["<name>#2"]``.
    """
    markers = _Markers(stdout)
    apps: dict[str, AppGrade] = {}
    seen: dict[str, int] = {}
    for match in _APP_LINE.finditer(stdout):
        name, digits = match.group(1), match.group(2)
        passed = digits.lstrip("0") == "1"
        grade = AppGrade(score=float(digits), trivial=passed and markers.is_trivial(name))
        apps[_unique_key(apps, seen, name)] = grade
    real = [app for app in apps.values() if not app.trivial]
    if not real:
        return PartialScore(None, apps)
    return PartialScore(sum(app.passed for app in real) / len(real), apps)


def _unique_key(apps: dict[str, AppGrade], seen: dict[str, int], name: str) -> str:
    """``name``, or ``name#2``, ``name#3``... for its later verdicts."""
    key = name
    while key in apps:
        seen[name] = seen.get(name, 1) + 1
        key = f"{name}#{seen[name]}"
    return key


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
