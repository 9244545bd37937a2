"""Bad text never kills a run: text that cannot be encoded, JSON nested too deeply, a
NaN score. Each becomes a typed error or an unknown grade for that one episode, and the
results file always gets its line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fleetenv
from fleetenv import (
    Done,
    FleetEnv,
    PolicyContext,
    Reply,
    ResultsWriter,
    Runner,
    ToolCall,
    bundled_tasks_path,
)
from fleetenv.errors import ConfigurationError, ResultsFileError
from fleetenv.events import EventBus
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASKS = [t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use"]
LONE_SURROGATE = "caf\udce9"  # what a byte-level decode with surrogateescape leaves behind
DEEP = "[" * 100_000 + "]" * 100_000


def session_on(fleet: LocalFleet) -> fleetenv.Session:
    return fleetenv.Session(api_key=fleet.token, base_url=fleet.base_url,
                            events=EventBus(sinks=[]))


def surrogate_policy(context: PolicyContext) -> Reply:
    return Reply(message={"role": "assistant", "content": f"I give up {LONE_SURROGATE}"},
                 actions=(Done(),))


def test_unencodable_text_in_a_reply_still_gets_its_result_line(
        local_fleet: LocalFleet, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    with session_on(local_fleet) as session, ResultsWriter(out) as writer, \
            Runner(session=session, workers=2, progress=False) as runner:
        for result in runner.run(TASKS[:2], surrogate_policy):
            writer.write(result)
    results = fleetenv.read_results(out)
    assert len(results) == 2
    assert all(r.error is None for r in results)
    contents = [m.get("content") for r in results for m in r.transcript
                if m.get("role") == "assistant"]
    assert contents == [f"I give up {LONE_SURROGATE}"] * 2  # kept exactly, as JSON escapes
    out.read_text(encoding="utf-8")  # the file itself is valid UTF-8


def test_a_transcript_too_deep_to_serialise_still_gets_a_line(tmp_path: Path) -> None:
    deep: Any = []
    for _ in range(50_000):
        deep = [deep]
    result = fleetenv.RolloutResult(task_key="t", env_key="e",
                                    transcript=[{"role": "tool", "content": deep}])
    out = tmp_path / "results.jsonl"
    with ResultsWriter(out) as writer:
        writer.write(result)
    (back,) = fleetenv.read_results(out)
    assert back.task_key == "t" and back.transcript == []
    assert back.error is not None and "transcript" in back.error["message"]


def test_deeply_nested_arguments_are_a_tool_error_the_agent_sees(
        local_fleet: LocalFleet) -> None:
    with session_on(local_fleet) as session, FleetEnv(TASKS[0], session=session) as env:
        env.reset()
        obs, _, terminated, truncated, _ = env.step(ToolCall("get_ticket", DEEP))
        assert obs.is_error and "nested too deeply" in (obs.error or "")
        assert not (terminated or truncated)  # the episode goes on


def test_deeply_nested_json_files_fail_with_a_typed_error(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.json"
    tasks.write_text(DEEP)
    with pytest.raises(ConfigurationError, match="nested too deeply"):
        fleetenv.load_tasks(tasks)
    results = tmp_path / "results.jsonl"
    results.write_text(DEEP + "\n")
    with pytest.raises(ResultsFileError, match="nested too deeply"):
        fleetenv.read_results(results)


def test_a_nan_score_is_an_unknown_grade_not_a_nan_reward(local_fleet: LocalFleet) -> None:
    task = TASKS[0].replace(
        key="nan-score", verifier=(
            "def validate_task(env, final_answer=None):\n"
            "    return float('nan')\n"))
    with session_on(local_fleet) as session, FleetEnv(task, session=session) as env:
        env.reset()
        _, reward, terminated, _, info = env.step(Done())
    assert terminated and reward is None
    assert info["reward_reason"] == "bad_result"
    assert "nan" in (info["verifier_error"] or "").lower()
    json.dumps(info, allow_nan=False, default=str)  # nothing non-finite escaped
