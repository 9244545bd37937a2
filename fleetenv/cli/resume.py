"""The run manifest ``fleetenv run`` writes, and ``--resume``: finish an interrupted run.

A run is identified by what decides its results: the task file's bytes (sha256), the task
selection, the policy and its sampling settings, the system prompt, samples per task, the
step limit and where it ran. ``--resume RESULTS.jsonl`` compares those with the file's
manifest (beside it; in an older file, its first line) and refuses (naming every
difference) when they differ, since results of two different runs in one file would make
its pass rates mean nothing; ``--force`` resumes anyway, and the resume's record in the
manifest says what changed.

Episodes are matched by ``(task_key, sample)``: every result in the file except the
cancelled ones counts as finished, and only the missing pairs run. The file is first
rewritten (atomically) without the cancelled results and without a last line that an
interrupted write left cut (between characters or inside one), so each pair ends up in
the file once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import ConfigurationError, ResultsFileError
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
    from fleetenv.core.types import RolloutResult
    from fleetenv.rollouts.results import is_header, manifest_path, read_manifest

    if not path.is_file():
        raise ConfigurationError(f"--resume {path}: no such results file",
                                 hint="pass the results file of the run to finish")
    # Bytes, split at newlines only: a line is decoded alone (it may be cut inside a
    # character), and text may hold U+2028 and the like, which str.splitlines splits at.
    lines = path.read_bytes().split(b"\n")
    kept: list[bytes] = []
    finished: set[tuple[str, int]] = set()
    first_line: dict[str, Any] | None = None
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    for index in nonblank:
        line = lines[index]
        try:
            data = json.loads(line.decode("utf-8"))
        except ValueError as exc:  # not UTF-8, or not JSON
            if index == nonblank[-1]:
                continue  # a write cut by the interrupt: that episode runs again
            what = "UTF-8" if isinstance(exc, UnicodeDecodeError) else "JSON"
            raise ResultsFileError(f"{path}:{index + 1}: not valid {what}",
                                   hint="fix or delete the line", file=str(path),
                                   line=index + 1) from None
        if not isinstance(data, dict):
            raise ResultsFileError(f"{path}:{index + 1}: expected a JSON object",
                                   hint="is this a fleetenv results file?", file=str(path))
        if is_header(data):  # a version 2 file's manifest or resume line
            first_line = data if index == nonblank[0] else first_line
            kept.append(line)
            continue
        result = RolloutResult.from_dict(data)
        if str(result.stop_reason) == "cancelled":
            continue
        finished.add((result.task_key, result.sample))
        kept.append(line)
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
    if len(kept) != len(nonblank):
        tmp = path.with_name(path.name + ".resume-tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, path)
    return finished, overridden
