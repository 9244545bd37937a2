"""Results files: one ``RolloutResult.to_dict()`` JSON line per rollout, and the run
manifest in a file beside it (:func:`manifest_path`), written whole and atomically.

JSONL because a run is a stream: each line is written and flushed as its rollout
finishes, so a run killed half-way still leaves every finished rollout on disk, and a
results file of 100 000 rollouts can be read (``iter_results``) without holding it all.
Lines are decoded one by one, so a line cut inside a character is named like any other
bad line. The layout (schema version 3), the manifest's fields and how the files of older
versions read: docs/cli.md, "Results files, the run manifest and --resume".
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
from fleetenv.core.types import RolloutResult

__all__ = ["MANIFEST_RECORD", "SCHEMA_VERSION", "ResultsFileError", "ResultsWriter",
           "base_manifest", "is_header", "iter_results", "manifest_path", "read_manifest",
           "read_results", "read_run"]

#: Version of the results-file layout this module writes.
SCHEMA_VERSION = 3
#: The ``record`` value that marks a manifest (in version 2 files, a header line).
MANIFEST_RECORD = "manifest"
#: How much of a results file's end is read to find its last line before appending.
_TAIL_BYTES = 1 << 20
#: Packages whose versions can change what a result holds, recorded in the manifest.
RECORDED_PACKAGES = ("mcp", "fleet-python", "requests", "httpx", "pydantic", "anyio")
#: The largest manifest file read (a manifest is a few kB; each resume adds as much).
MAX_MANIFEST_BYTES = 16 << 20

_REQUIRED = ("task_key", "env_key")


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """Where the run manifest of the results file ``path`` is: ``<stem>.manifest.json``
    in the same directory."""
    return Path(path).with_suffix(".manifest.json")


def base_manifest() -> dict[str, Any]:
    """The fields every run manifest carries: schema, versions, start time."""
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
    """Whether a parsed object is a manifest rather than a result."""
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

    ``append=False`` (default) starts a fresh file and writes its manifest beside it
    (:func:`manifest_path`): :func:`base_manifest` plus ``manifest`` (the run's settings).
    ``append=True`` adds to an existing one (resuming a run); when ``manifest`` is given,
    it is added to the manifest's ``resumes`` (marked ``"resumed": true``). Parent
    directories are created.
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
            if append:
                _end_last_line(self.path)
            self._file: IO[str] | None = open(  # noqa: SIM115 (closed by close())
                self.path, "a" if append else "w", encoding="utf-8")
        except OSError as exc:
            raise ResultsFileError(f"cannot open the results file for writing: {exc}",
                                   hint="check the directory exists and is writable",
                                   file=str(self.path)) from exc
        if header is not None:
            try:
                if append:
                    _add_resume(self.path, header)
                else:
                    _write_manifest_file(self.path, header, [])
            except BaseException:
                self.close()
                raise
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


def _end_last_line(results: Path) -> None:
    """Before appending: a last line without its newline is ended if it is a whole
    record, and cut off if it is a torn one (a kill mid-write), so the next line starts
    on a line of its own."""
    if not results.is_file() or results.stat().st_size == 0:
        return
    with open(results, "rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(0, size - _TAIL_BYTES)
        handle.seek(start)
        tail = handle.read()
        if tail.endswith(b"\n"):
            return
        if b"\n" not in tail and start > 0:  # a last line longer than the tail
            start = 0
            handle.seek(0)
            tail = handle.read()
        line_start = start + tail.rfind(b"\n") + 1
        if is_torn(tail[line_start - start:]):  # that rollout never finished writing
            handle.truncate(line_start)
        else:
            handle.write(b"\n")


def is_torn(line: bytes) -> bool:
    """Whether a results file's last line is a write cut short: not UTF-8 JSON."""
    try:
        json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is a ValueError
        return True
    return False


def _add_resume(results: Path, record: dict[str, Any]) -> None:
    """Add a resume's record to the manifest beside ``results`` (made from a version 2
    file's first line when there is no manifest file yet)."""
    beside = _read_manifest_file(results)
    if beside is None:
        has_lines = results.is_file() and results.stat().st_size > 0
        beside = (read_manifest(results) if has_lines else None), []
    manifest, resumes = beside
    _write_manifest_file(results, manifest, [*resumes, record])


def _write_manifest_file(results: Path, manifest: dict[str, Any] | None,
                         resumes: list[dict[str, Any]]) -> None:
    """Write the manifest file whole: a temporary file, then ``os.replace``."""
    file = manifest_path(results)
    document = {**(manifest or {}), **({"resumes": resumes} if resumes else {})}
    text = json.dumps(document, ensure_ascii=True, indent=2, default=_json_fallback) + "\n"
    temporary = file.with_name(f".{file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, file)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise ResultsFileError(f"cannot write the run manifest: {exc}",
                               hint="check free disk space and permissions",
                               file=str(file)) from exc


def _read_manifest_file(results: Path
                        ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]] | None:
    """The manifest (``None`` if it has none) and the resume records in the manifest file
    beside ``results``; ``None`` when there is no such file (an older results file)."""
    file = manifest_path(results)
    try:
        with open(file, "rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ResultsFileError(f"cannot read the run manifest: {exc}",
                               hint="check the file's permissions", file=str(file)) from exc
    where: dict[str, Any] = {"file": str(file),
                             "hint": "fix it, or delete it: the results read without it"}
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ResultsFileError(f"{file}: over {MAX_MANIFEST_BYTES >> 20} MB, too large for "
                               "a run manifest", **where)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ResultsFileError(f"{file}: not a JSON run manifest ({exc})", **where) from None
    resumes = data.pop("resumes", []) if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(resumes, list):
        raise ResultsFileError(f"{file}: not a run manifest (expected a JSON object with "
                               "a list of resumes)", **where)
    return (data if is_header(data) else None), resumes


def iter_results(path: str | os.PathLike[str]) -> Iterator[RolloutResult]:
    """Yield the results of a JSONL file one by one; blank lines and the header lines of
    version 2 files are skipped (files of every schema version read the same).

    Raises :class:`ResultsFileError` naming the file and the line number for a line that
    is not UTF-8 text of a JSON object with at least ``task_key`` and ``env_key``.
    """
    for item in _iter_records(Path(path)):
        if isinstance(item, RolloutResult):
            yield item


def read_results(path: str | os.PathLike[str]) -> list[RolloutResult]:
    """Every result of a JSONL results file, in file order (see :func:`iter_results`)."""
    return list(iter_results(path))


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run manifest of a results file: the one beside it (:func:`manifest_path`) or,
    for a version 2 file, its first line; ``None`` for a version 1 file, which has none.
    Reads no result line (a version 2 file: only its first)."""
    file = Path(path)
    beside = _read_manifest_file(file)
    if beside is not None:
        return beside[0]
    for item in _iter_records(file):
        return item if isinstance(item, dict) else None
    return None


def read_run(path: str | os.PathLike[str]
             ) -> tuple[dict[str, Any] | None, list[RolloutResult]]:
    """The manifest (:func:`read_manifest`) and every result (:func:`read_results`)."""
    return read_manifest(path), read_results(path)


def _iter_records(file: Path) -> Iterator[RolloutResult | dict[str, Any]]:
    """Header lines (as dicts) and results, in file order. Read as bytes and decoded line
    by line: a line cut inside a character is one bad line, not a failed file."""
    try:
        handle = open(file, "rb")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise ResultsFileError(f"cannot read the results file: {exc}",
                               hint="check the path", file=str(file)) from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield parse_line(line, file, number)


#: The hint for a bad last line without its newline: what a kill or a full disk leaves.
_CUT_HINT = ("a run killed while writing leaves its last line cut: `fleetenv run ... "
             "--resume FILE` runs that episode again, or delete the line")


def parse_line(raw: bytes, file: Path, number: int) -> RolloutResult | dict[str, Any]:
    """Line ``number`` of a results file: a result, or a version 2 file's header (a dict).
    Raises :class:`ResultsFileError` naming the file and the line."""
    where: dict[str, Any] = {"file": str(file), "line": number}
    # Every line is written with its newline last: only a cut line lacks it.
    hint = "fix or delete the line" if raw.endswith(b"\n") else _CUT_HINT
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{file}:{number}: not valid UTF-8 (at byte {exc.start + 1})",
                               hint=hint, **where) from None
    except RecursionError:  # json's parser recurses once per nesting level
        raise ResultsFileError(f"{file}:{number}: JSON nested too deeply to read",
                               hint="fix or delete the line", **where) from None
    except json.JSONDecodeError as exc:
        raise ResultsFileError(
            f"{file}:{number}: not valid JSON ({exc.msg} at column {exc.colno})",
            hint=hint, **where) from None
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
