"""The run manifest ``fleetenv run`` writes, and ``--resume``: finish an interrupted run
(docs/cli.md, "Results files, the run manifest and --resume").

A run is identified by what decides its results (:data:`COMPARED_FIELDS`); results of
two different runs in one file would make its pass rates mean nothing, so a resume with
other settings is refused unless forced. Episodes are matched by ``(task_key, sample)``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.redaction import hide_credentials

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.rollouts.policy_spec import PolicySpec

#: Manifest fields that must match for two runs to share a results file.
COMPARED_FIELDS = ("tasks_sha256", "task_keys", "policy_spec", "sampling", "seed",
                   "samples_per_task", "max_steps", "system_prompt_sha256", "fleet")


def sha256_of(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_manifest(*, command: str, tasks_file: str | None, task_keys: Sequence[str] | None,
                 spec: PolicySpec, sampling: Mapping[str, Any], seed: int | None,
                 samples: int, max_steps: int | None, system_prompt: str | None,
                 fleet: str) -> dict[str, Any]:
    """The run-specific part of the run manifest (``ResultsWriter`` adds versions, the
    schema version and ``started_at``). Holds no secret: the policy options name the
    environment variable of the key, never the key."""
    return {
        "command": command,
        "tasks_file": tasks_file,
        "tasks_sha256": sha256_of(tasks_file) if tasks_file else None,
        "task_keys": sorted(task_keys) if task_keys else None,
        "policy": spec.describe(),
        # A credential in the options (--extra-body '{"api_key": ...}') as a digest: not
        # stored, and a changed value still differs.
        "policy_spec": {"kind": spec.kind, "options": hide_credentials(dict(spec.options))},
        "sampling": hide_credentials(dict(sampling)),
        "seed": seed,
        "samples_per_task": samples,
        "max_steps": max_steps,
        "system_prompt_sha256": (hashlib.sha256(system_prompt.encode("utf-8")).hexdigest()
                                 if system_prompt else None),
        "fleet": fleet,
    }


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"field: old -> new"`` for every compared field that differs."""
    out = []
    for name in COMPARED_FIELDS:
        before, after = _canonical(old.get(name)), _canonical(new.get(name))
        if before != after:
            out.append(f"{name}: {_short(before)} -> {_short(after)}")
    return out


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def prepare_resume(path: Path, manifest: Mapping[str, Any], *, force: bool
                   ) -> tuple[set[tuple[str, int]], list[str]]:
    """Check ``path`` can be resumed with ``manifest``; return the finished
    ``(task_key, sample)`` pairs and the differences that ``force`` overrode.

    Rewrites the file without cancelled results and without a cut last line.
    Raises :class:`ConfigurationError` when the runs are not comparable (without
    ``force``) and :class:`ResultsFileError` for a file that is not a results file.
    """
    from fleetenv.core.types import StopReason
    from fleetenv.rollouts.results import is_torn, manifest_path, parse_line, read_manifest

    if not path.is_file():
        raise ConfigurationError(f"--resume {path}: no such results file",
                                 hint="pass the results file of the run to finish")
    # Read as bytes, split at newlines only: a line is decoded alone (it may be cut inside
    # a character), and text may hold U+2028 and the like, which str.splitlines splits at.
    with path.open("rb") as handle:
        lines = [(number, line) for number, line in enumerate(handle, start=1) if line.strip()]
    kept: list[bytes] = []
    finished: set[tuple[str, int]] = set()
    first_line: dict[str, Any] | None = None
    for number, line in lines:
        if number == lines[-1][0] and is_torn(line):
            continue  # a write cut by the interrupt: that episode runs again
        record = parse_line(line, path, number)
        if isinstance(record, dict):  # a version 2 file's manifest or resume line
            first_line = record if number == lines[0][0] else first_line
        elif record.stop_reason is StopReason.CANCELLED:
            continue
        else:
            finished.add((record.task_key, record.sample))
        kept.append(line.rstrip(b"\n"))
    old_manifest = read_manifest(path) if manifest_path(path).is_file() else first_line
    if old_manifest is None:
        if not force:
            raise ConfigurationError(
                f"cannot resume {path}: it has no run manifest (written by an older "
                "fleetenv), so nothing says it is the same run",
                hint="pass --force to resume it anyway, or start a new results file")
        overridden = ["no manifest in the file"]
    else:
        overridden = differences(old_manifest, manifest)
        if overridden and not force:
            raise ConfigurationError(
                f"cannot resume {path}: the runs are not comparable ("
                + "; ".join(overridden) + ")",
                hint="resume with the same task file, policy and settings, or pass --force "
                     "to mix them anyway, or start a new results file")
    if len(kept) != len(lines):
        tmp = path.with_name(path.name + ".resume-tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, path)
    return finished, overridden
