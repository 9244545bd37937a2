"""Results files: JSONL round trip, a thread-safe writer, and readable errors on bad lines."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import fleetenv
from fleetenv.core.config import resolve_config
from fleetenv.core.task_files import load_tasks
from fleetenv.local import LocalFleet
from fleetenv.local.apps import bundled_tasks_path
from fleetenv.rollouts.results import (
    SCHEMA_VERSION,
    ResultsFileError,
    ResultsWriter,
    iter_results,
    read_manifest,
    read_results,
    read_run,
)
from fleetenv.rollouts.rollout import RolloutResult, run_episode

pytestmark = pytest.mark.timeout(30)


def _full_result(sample: int = 0) -> RolloutResult:
    return RolloutResult(
        task_key="helpdesk-x", env_key="helpdesk:v1", sample=sample, rollout_id="r1",
        policy="reference", reward=0.5, grade_status="graded", grade_reason=None,
        stop_reason="agent_done", turns=3, tool_calls=4, tool_errors=1,
        tool_error_messages=["no such ticket: 9"], timings={"provision_s": 0.2, "total_s": 1.5},
        instance_id="inst-1", final_answer="42", verifier_stdout="checked 3 rows\n",
        verifier_error=None, verifier_execution_id="exec-1",
        error=None,
        transcript=[{"role": "user", "content": "Fix ticket 9 — ünïcode"},
                    {"role": "assistant", "content": None,
                     "tool_calls": [{"id": "c1", "type": "function",
                                     "function": {"name": "get", "arguments": "{}"}}]}],
    )


def test_results_round_trip_through_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "out" / "results.jsonl"  # the writer creates missing directories
    originals = [_full_result(0), RolloutResult(task_key="t", env_key="e", stop_reason="error",
                                                error={"type": "ValueError", "message": "x"})]
    with ResultsWriter(path) as writer:
        for result in originals:
            writer.write(result)
        # The header record, then one flushed line per result.
        assert len(path.read_text(encoding="utf-8").splitlines()) == 3
    assert read_results(path) == originals
    with ResultsWriter(path, append=True) as writer:
        writer.write(_full_result(7))
    assert [r.sample for r in read_results(path)] == [0, 0, 7]
    with ResultsWriter(path) as writer:  # append=False starts over
        writer.write(_full_result(9))
    assert [r.sample for r in iter_results(path)] == [9]


def test_a_real_rollout_round_trips(local_fleet: LocalFleet, tmp_path: Path) -> None:
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    task = next(t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use")
    result = run_episode(task, "reference", config=config)
    assert result.reward == 1.0
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.write(result)
    line = path.read_text(encoding="utf-8")
    assert local_fleet.token not in line  # no secret in a results file
    (back,) = read_results(path)
    assert back == result
    assert back.transcript and back.instance_id and back.timings["total_s"] > 0


def test_writer_is_safe_across_threads(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    writer = ResultsWriter(path)
    start = threading.Barrier(8)

    def write_many(worker: int) -> None:
        start.wait(timeout=10)
        for i in range(50):
            writer.write(_full_result(worker * 1000 + i))

    threads = [threading.Thread(target=write_many, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    writer.close()
    writer.close()  # idempotent
    samples = sorted(r.sample for r in read_results(path))
    assert samples == sorted(w * 1000 + i for w in range(8) for i in range(50))
    with pytest.raises(ResultsFileError, match="closed"):
        writer.write(_full_result())


@pytest.mark.parametrize(("bad_line", "expected"), [
    ('{"task_key": "t", "env_key": "e", "rew', "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"env_key": "e"}', "missing or non-string task_key"),
    ('{"task_key": "t", "env_key": "e", "reward": "high"}', "reward must be a number"),
    ('{"task_key": "t", "env_key": "e", "turns": 1, "timings": 5, "sample": [}', "not valid"),
])
def test_a_bad_line_is_named_by_file_and_line_number(tmp_path: Path, bad_line: str,
                                                     expected: str) -> None:
    path = tmp_path / "results.jsonl"
    good = json.dumps(_full_result().to_dict())
    path.write_text(f"{good}\n\n{good}\n{bad_line}\n", encoding="utf-8")
    with pytest.raises(ResultsFileError) as info:
        read_results(path)
    message = str(info.value)
    assert f"{path}:4:" in message and expected in message
    assert info.value.context["line"] == "4" and info.value.context["file"] == str(path)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsFileError, match="cannot read the results file"):
        read_results(tmp_path / "nope.jsonl")
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(ResultsFileError, match="cannot open the results file"):
        ResultsWriter(blocker / "results.jsonl")


# ----------------------------------------------------------------------------- schema 2

def test_a_new_file_starts_with_the_run_manifest(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path, manifest={"policy": "reference", "samples_per_task": 2}) as out:
        out.write(_full_result(0))
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert first["record"] == "manifest" and first["schema_version"] == SCHEMA_VERSION
    manifest = read_manifest(path)
    assert manifest == first
    assert manifest["policy"] == "reference" and manifest["samples_per_task"] == 2
    assert manifest["fleetenv_version"] == fleetenv.__version__
    assert "mcp" in manifest["packages"] and manifest["started_at"].endswith("Z")
    assert read_results(path) == [_full_result(0)]  # the header is not a result


def test_a_resumed_file_keeps_its_first_manifest(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path, manifest={"seed": 1}) as out:
        out.write(_full_result(0))
    with ResultsWriter(path, append=True, manifest={"seed": 1}) as out:
        out.write(_full_result(1))
    manifest, results = read_run(path)
    assert manifest is not None and manifest["seed"] == 1 and "resumed" not in manifest
    assert [r.sample for r in results] == [0, 1]
    headers = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
               if '"record"' in line]
    assert [h.get("resumed") for h in headers] == [None, True]


def test_a_version_1_file_without_a_manifest_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    lines = [json.dumps(_full_result(s).to_dict()) for s in (0, 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_manifest(path) is None
    assert [r.sample for r in read_results(path)] == [0, 1]
    assert read_run(path) == (None, [_full_result(0), _full_result(1)])
