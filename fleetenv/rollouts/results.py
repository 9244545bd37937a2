"""Results files: one JSON line per rollout, everything in a :class:`RolloutResult`.

JSONL because a run is a stream: each line is written and flushed as its rollout
finishes, so a run killed half-way still leaves every finished rollout on disk, and a
results file of 100 000 rollouts can be read (``iter_results``) without holding it all.

A line holds the task key, env key, sample, reward and grade status, stop reason, turns,
tool calls and errors, timings, instance id, verifier stdout / error, the error of a
failed rollout and the transcript. Secrets never reach it: error texts were redacted by
``run_episode`` and the config (with its key) is not part of a result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from fleetenv.core.errors import ResultsFileError
from fleetenv.rollouts.rollout import RolloutResult

__all__ = ["ResultsFileError", "ResultsWriter", "iter_results", "read_results"]

_REQUIRED = ("task_key", "env_key")


def _json_fallback(value: Any) -> Any:
    # A policy may put odd objects into its assistant message (a pydantic model, bytes):
    # keep the line writable instead of failing a whole batch over one transcript.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return str(value)


class ResultsWriter:
    """Appends one ``RolloutResult.to_dict()`` per line, flushed; safe to share between
    threads (executor callbacks write from several).

    ``append=False`` (default) starts a fresh file; ``append=True`` adds to an existing
    one (resuming a run). Parent directories are created.
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.count = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] | None = open(  # noqa: SIM115 (closed by close())
                self.path, "a" if append else "w", encoding="utf-8")
        except OSError as exc:
            raise ResultsFileError(f"cannot open the results file for writing: {exc}",
                                   hint="check the directory exists and is writable",
                                   file=str(self.path)) from exc

    def __repr__(self) -> str:
        return f"ResultsWriter({str(self.path)!r}, written={self.count})"

    def write(self, result: RolloutResult) -> None:
        """Write one result as one line and flush it.

        Whatever a policy or a tool put into the transcript, the rollout gets its line:
        text that is not valid Unicode (lone surrogates) is written as JSON escapes, and a
        transcript too deeply nested to serialise is replaced by ``[]`` with the reason in
        ``error``.
        """
        line = _to_line(result)
        with self._lock:
            if self._file is None:
                raise ResultsFileError("the results writer is closed",
                                       hint="open a new ResultsWriter(path, append=True)",
                                       file=str(self.path))
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except OSError as exc:
                raise ResultsFileError(f"cannot write to the results file: {exc}",
                                       hint="check free disk space and permissions",
                                       file=str(self.path)) from exc
            self.count += 1

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _to_line(result: RolloutResult) -> str:
    try:
        data = result.to_dict()
        line = json.dumps(data, ensure_ascii=False, default=_json_fallback)
    except (RecursionError, ValueError) as exc:
        reason = ("nested too deeply to serialise" if isinstance(exc, RecursionError)
                  else f"not serialisable ({exc})")
        message = f"the transcript was dropped from this line: it is {reason}"
        kept = dataclasses.replace(result, transcript=[], error=result.error or {
            "type": "ResultsFileError", "message": message})
        if result.error is not None:
            kept.error = {**result.error, "message": f"{result.error['message']}; {message}"}
        data = kept.to_dict()
        line = json.dumps(data, ensure_ascii=False, default=_json_fallback)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from a surrogateescape decode) are not UTF-8; as JSON
        # escapes they are valid text and read back as the same Python string.
        line = json.dumps(data, ensure_ascii=True, default=_json_fallback)
    return line


def iter_results(path: str | os.PathLike[str]) -> Iterator[RolloutResult]:
    """Yield the results of a JSONL file one by one; blank lines are skipped.

    Raises :class:`ResultsFileError` naming the file and the line number for a line that
    is not a JSON object with at least ``task_key`` and ``env_key``.
    """
    file = Path(path)
    try:
        handle = open(file, encoding="utf-8")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise ResultsFileError(f"cannot read the results file: {exc}",
                               hint="check the path", file=str(file)) from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield _parse_line(line, file, number)


def read_results(path: str | os.PathLike[str]) -> list[RolloutResult]:
    """Every result of a JSONL results file, in file order (see :func:`iter_results`)."""
    return list(iter_results(path))


def _parse_line(line: str, file: Path, number: int) -> RolloutResult:
    where: dict[str, Any] = {"file": str(file), "line": number}
    try:
        data = json.loads(line)
    except RecursionError:  # json's parser recurses once per nesting level
        raise ResultsFileError(f"{file}:{number}: JSON nested too deeply to read",
                               hint="fix or delete the line", **where) from None
    except json.JSONDecodeError as exc:
        raise ResultsFileError(
            f"{file}:{number}: not valid JSON ({exc.msg} at column {exc.colno})",
            hint="a run killed while writing can leave a cut last line: delete that line",
            **where) from None
    if not isinstance(data, dict):
        raise ResultsFileError(
            f"{file}:{number}: expected a JSON object, got {type(data).__name__}",
            hint="each line must be one RolloutResult.to_dict()", **where)
    missing = [name for name in _REQUIRED if not isinstance(data.get(name), str)]
    if missing:
        raise ResultsFileError(
            f"{file}:{number}: missing or non-string {', '.join(missing)}",
            hint="is this a fleetenv results file?", **where)
    reward = data.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise ResultsFileError(f"{file}:{number}: reward must be a number or null, got "
                               f"{type(reward).__name__}", hint="fix or delete the line",
                               **where)
    try:
        return RolloutResult.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ResultsFileError(f"{file}:{number}: not a rollout result ({exc})",
                               hint="fix or delete the line", **where) from None
