"""Results files: one JSON line per rollout, everything in a :class:`RolloutResult`.

JSONL because a run is a stream: each line is written and flushed as its rollout
finishes, so a run killed half-way still leaves every finished rollout on disk, and a
results file of 100 000 rollouts can be read (``iter_results``) without holding it all.

A line holds the task key, env key, sample, reward and grade status, stop reason, turns,
tool calls and errors, timings, instance id, verifier stdout / error, the error of a
failed rollout and the transcript. Secrets never reach it: error texts were redacted by
``run_episode`` and the config (with its key) is not part of a result.

Schema (version 2)
------------------
The first line of a file written by :class:`ResultsWriter` is a *header record*, the run
manifest: a JSON object with ``"record": "manifest"`` and ``"schema_version": 2``, plus
``fleetenv_version``, ``python``, ``packages`` (name -> version of the packages that shape
a result), ``started_at`` (UTC, ISO 8601) and whatever the writer of the run adds (the
``fleetenv run`` command adds ``command``, ``tasks_file``, ``tasks_sha256``, ``task_keys``,
``policy``, ``policy_spec``, ``sampling``, ``seed``, ``samples_per_task``, ``max_steps``,
``system_prompt_sha256`` and ``fleet``). A resumed run appends another header record with
``"resumed": true``; the first one is the run's manifest. Every other line is one
``RolloutResult.to_dict()``. Why a header and not a field per line: one record per run says
once what makes two runs comparable, and result lines stay what they always were.

Version 1 files (before the header existed) have result lines only; they read the same,
with :func:`read_manifest` returning ``None``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import threading
import time
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from fleetenv._version import __version__
from fleetenv.core.errors import ResultsFileError
from fleetenv.core.redaction import scrub_secrets, scrub_value
from fleetenv.rollouts.rollout import RolloutResult

__all__ = ["MANIFEST_RECORD", "SCHEMA_VERSION", "ResultsFileError", "ResultsWriter",
           "base_manifest", "is_header",
           "iter_results", "read_manifest", "read_results", "read_run"]

#: Version of the results-file layout this module writes (see the module docstring).
SCHEMA_VERSION = 2
#: The ``record`` value that marks a header line (absent from result lines).
MANIFEST_RECORD = "manifest"
#: Packages whose versions can change what a result holds, recorded in the manifest.
RECORDED_PACKAGES = ("mcp", "fleet-python", "requests", "httpx", "pydantic", "anyio")

_REQUIRED = ("task_key", "env_key")


def base_manifest() -> dict[str, Any]:
    """The header fields every results file carries: schema, versions, start time."""
    packages: dict[str, str] = {}
    for name in RECORDED_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"record": MANIFEST_RECORD, "schema_version": SCHEMA_VERSION,
            "fleetenv_version": __version__, "python": platform.python_version(),
            "packages": packages,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def is_header(data: Mapping[str, Any]) -> bool:
    """Whether a parsed line is a header record rather than a result."""
    return data.get("record") == MANIFEST_RECORD


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

    ``append=False`` (default) starts a fresh file, whose first line is the header record:
    :func:`base_manifest` plus ``manifest`` (the run's settings). ``append=True`` adds to
    an existing one (resuming a run); a header is written then only when ``manifest`` is
    given (marked ``"resumed": true``). Parent directories are created.
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False,
                 manifest: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.count = 0
        header: dict[str, Any] | None = None
        if not append or manifest is not None:
            header = scrub_value({**base_manifest(), **dict(manifest or {}),
                                  "record": MANIFEST_RECORD, "schema_version": SCHEMA_VERSION})
            if append:
                header["resumed"] = True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] | None = open(  # noqa: SIM115 (closed by close())
                self.path, "a" if append else "w", encoding="utf-8")
            if header is not None:
                self._file.write(json.dumps(header, ensure_ascii=True,
                                            default=_json_fallback) + "\n")
                self._file.flush()
        except OSError as exc:
            raise ResultsFileError(f"cannot open the results file for writing: {exc}",
                                   hint="check the directory exists and is writable",
                                   file=str(self.path)) from exc
        self.manifest = header

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
    return scrub_secrets(line)  # what a tool or a policy echoed: no registered secret


def iter_results(path: str | os.PathLike[str]) -> Iterator[RolloutResult]:
    """Yield the results of a JSONL file one by one; blank lines and header records are
    skipped (files of either schema version read the same).

    Raises :class:`ResultsFileError` naming the file and the line number for a line that
    is not a JSON object with at least ``task_key`` and ``env_key``.
    """
    for item in _iter_records(Path(path)):
        if isinstance(item, RolloutResult):
            yield item


def read_results(path: str | os.PathLike[str]) -> list[RolloutResult]:
    """Every result of a JSONL results file, in file order (see :func:`iter_results`)."""
    return list(iter_results(path))


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run manifest (the first header record) of a results file; ``None`` for a
    version 1 file, which has none. Reads only up to the first result line."""
    for item in _iter_records(Path(path)):
        return item if isinstance(item, dict) else None
    return None


def read_run(path: str | os.PathLike[str]
             ) -> tuple[dict[str, Any] | None, list[RolloutResult]]:
    """The manifest (or ``None``) and every result of a results file, in one pass."""
    manifest: dict[str, Any] | None = None
    results: list[RolloutResult] = []
    for item in _iter_records(Path(path)):
        if isinstance(item, RolloutResult):
            results.append(item)
        elif manifest is None:
            manifest = item
    return manifest, results


def _iter_records(file: Path) -> Iterator[RolloutResult | dict[str, Any]]:
    """Header records (as dicts) and results, in file order."""
    try:
        handle = open(file, encoding="utf-8")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise ResultsFileError(f"cannot read the results file: {exc}",
                               hint="check the path", file=str(file)) from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield _parse_line(line, file, number)


def _parse_line(line: str, file: Path, number: int) -> RolloutResult | dict[str, Any]:
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
    if is_header(data):
        return data
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
