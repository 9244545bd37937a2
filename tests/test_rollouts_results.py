"""Results files: JSONL round trip, a thread-safe writer, and readable errors on bad lines."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.core.config import resolve_config
from fleetenv.core.task_files import load_tasks
from fleetenv.core.types import RolloutResult
from fleetenv.local import LocalFleet
from fleetenv.rollouts.results import (
    SCHEMA_VERSION,
    ResultsFileError,
    ResultsWriter,
    iter_results,
    manifest_path,
    read_manifest,
    read_results,
    read_run,
)
from fleetenv.rollouts.rollout import run_episode

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
        # One flushed line per result; the manifest is beside the file.
        assert len(path.read_text(encoding="utf-8").splitlines()) == 2
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



def _cut_inside_a_character(path: Path) -> int:
    """Cut the file's last line between the two bytes of its last "ü" (as a kill or a
    full disk can); the length kept."""
    data = path.read_bytes()
    cut = data.rindex("ü".encode()) + 1
    path.write_bytes(data[:cut])
    return cut


def test_a_last_line_cut_inside_a_character_is_named_like_any_cut_line(
        tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.write(_full_result(0))
        writer.write(_full_result(1))
    _cut_inside_a_character(path)
    # What docs/rollouts.md promises for a bad line: a ResultsFileError naming the line,
    # here with what to do about a run killed while writing it.
    with pytest.raises(ResultsFileError) as info:
        read_results(path)
    assert f"{path}:2: not valid UTF-8" in info.value.message
    assert info.value.context == {"file": str(path), "line": "2"}
    assert "cut" in str(info.value.hint) and "--resume" in str(info.value.hint)
    # The lines before it still stream out first.
    seen = []
    with pytest.raises(ResultsFileError):
        for result in iter_results(path):
            seen.append(result.sample)
    assert seen == [0]


def test_bad_bytes_in_a_middle_line_name_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    good = json.dumps(_full_result().to_dict(), ensure_ascii=False).encode()
    torn = good[: good.index("ü".encode()) + 1]  # a cut line, then more lines after it
    path.write_bytes(good + b"\n" + torn + b"\n" + good + b"\n")
    with pytest.raises(ResultsFileError) as info:
        read_results(path)
    assert f"{path}:2: not valid UTF-8" in info.value.message
    assert info.value.context == {"file": str(path), "line": "2"}
    assert info.value.hint == "fix or delete the line"


def test_text_with_unicode_line_separators_stays_on_its_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    result = _full_result()
    result.final_answer = "a\u2028b\x85c\u2029d"  # raw in the file: JSON does not escape them
    with ResultsWriter(path) as writer:
        writer.write(result)
        writer.write(_full_result(1))
    assert "\u2028".encode() in path.read_bytes()
    assert read_results(path) == [result, _full_result(1)]

def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsFileError, match="cannot read the results file"):
        read_results(tmp_path / "nope.jsonl")
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(ResultsFileError, match="cannot open the results file"):
        ResultsWriter(blocker / "results.jsonl")


# ----------------------------------------------------------------------------- schema 3

def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line.strip()]


def test_every_line_is_a_result_and_the_manifest_is_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run-1.jsonl"
    with ResultsWriter(path, manifest={"policy": "reference", "samples_per_task": 2}) as out:
        out.write(_full_result(0))
        out.write(_full_result(1))
    # What pandas.read_json(path, lines=True) and `jq .reward` see: results, no NaN row.
    rows = _lines(path)
    assert len(rows) == 2 and all("record" not in row for row in rows)
    assert [row["reward"] for row in rows] == [0.5, 0.5]
    beside = manifest_path(path)
    assert beside == tmp_path / "run-1.manifest.json"
    manifest = read_manifest(path)
    assert manifest == json.loads(beside.read_text(encoding="utf-8"))
    assert manifest["record"] == "manifest" and manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["policy"] == "reference" and manifest["samples_per_task"] == 2
    assert manifest["fleetenv_version"] == fleetenv.__version__
    assert "mcp" in manifest["packages"] and manifest["started_at"].endswith("Z")
    assert read_run(path) == (manifest, [_full_result(0), _full_result(1)])
    # Two runs in one directory keep two manifests; nothing temporary is left behind.
    with ResultsWriter(tmp_path / "run-2.jsonl", manifest={"policy": "other"}):
        pass
    assert read_manifest(path)["policy"] == "reference"  # type: ignore[index]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run-1.jsonl", "run-1.manifest.json", "run-2.jsonl", "run-2.manifest.json"]


def test_a_resume_is_recorded_in_the_manifest_not_in_the_results(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path, manifest={"seed": 1}) as out:
        out.write(_full_result(0))
    first = read_manifest(path)
    with ResultsWriter(path, append=True, manifest={"seed": 1}) as out:
        out.write(_full_result(1))
    with ResultsWriter(path, append=True) as out:  # no manifest: nothing recorded
        out.write(_full_result(2))
    assert [row["sample"] for row in _lines(path)] == [0, 1, 2]
    manifest, results = read_run(path)
    assert manifest == first and "resumed" not in manifest
    assert [r.sample for r in results] == [0, 1, 2]
    resumes = json.loads(manifest_path(path).read_text(encoding="utf-8"))["resumes"]
    assert [(r["resumed"], r["seed"], r["record"]) for r in resumes] == [(True, 1, "manifest")]
    with ResultsWriter(path) as out:  # a fresh file starts a fresh manifest
        pass
    assert "resumes" not in json.loads(manifest_path(path).read_text(encoding="utf-8"))


def test_a_version_2_file_with_the_manifest_as_its_first_line_still_reads(
        tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    header = {"record": "manifest", "schema_version": 2, "seed": 1, "started_at": "x"}
    lines = [header, _full_result(0).to_dict(), {**header, "resumed": True},
             _full_result(1).to_dict()]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert read_manifest(path) == header
    assert read_run(path) == (header, [_full_result(0), _full_result(1)])
    assert read_results(path) == [_full_result(0), _full_result(1)]
    # Resumed, it gets a manifest file holding its manifest; its lines stay as they were.
    with ResultsWriter(path, append=True, manifest={"seed": 1}) as out:
        out.write(_full_result(2))
    assert read_manifest(path) == header
    beside = json.loads(manifest_path(path).read_text(encoding="utf-8"))
    assert [r["seed"] for r in beside["resumes"]] == [1]
    assert [r.sample for r in read_results(path)] == [0, 1, 2]


@pytest.mark.parametrize(("content", "expected"), [
    (b"{\"record\": \"manif", "not a JSON run manifest"),
    (b"[1]", "not a run manifest"),
    (b"\xff\xfe", "not a JSON run manifest"),
])
def test_a_broken_manifest_file_is_named(tmp_path: Path, content: bytes,
                                         expected: str) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as out:
        out.write(_full_result(0))
    manifest_path(path).write_bytes(content)
    for read in (read_manifest, read_run):
        with pytest.raises(ResultsFileError, match=expected) as info:
            read(path)
        assert info.value.context["file"] == str(manifest_path(path))
        assert "delete it" in str(info.value.hint)
    assert read_results(path) == [_full_result(0)]  # the results need no manifest


def test_a_version_1_file_without_a_manifest_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    lines = [json.dumps(_full_result(s).to_dict()) for s in (0, 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_manifest(path) is None
    assert [r.sample for r in read_results(path)] == [0, 1]
    assert read_run(path) == (None, [_full_result(0), _full_result(1)])


@pytest.mark.parametrize("cut", ["inside a character", "inside the JSON"])
def test_appending_to_a_file_whose_last_line_was_cut_starts_a_line_of_its_own(
        tmp_path: Path, cut: str) -> None:
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as writer:
        writer.write(_full_result(0))
        writer.write(dataclasses.replace(_full_result(1), final_answer="é" * 40))
    data = path.read_bytes()
    torn = data[:-10] if cut == "inside the JSON" else data[:data.rindex("é".encode()) + 1]
    path.write_bytes(torn)
    with ResultsWriter(path, append=True) as writer:
        writer.write(_full_result(2))
    assert [r.sample for r in read_results(path)] == [0, 2]


def test_appending_after_a_whole_last_line_without_its_newline_keeps_it(
        tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as writer:
        writer.write(_full_result(0))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # edited by hand, say
    with ResultsWriter(path, append=True) as writer:
        writer.write(_full_result(1))
    assert [r.sample for r in read_results(path)] == [0, 1]
