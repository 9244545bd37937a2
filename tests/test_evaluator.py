"""The task evaluator against the embedded local Fleet's harness jobs, over real HTTP/MCP.

Every job here really runs: the local Fleet's harness plays each session as an episode
(reference solution or nothing) on a fresh instance and grades it with the task's
verifier. Failures are injected with the local Fleet's fault hooks: a boot failure makes
every session fail (the job errors), a hanging tool keeps the job running past the
client's deadline, 503s hit the polls, a 500 hits the job creation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import fleet
import pytest

from fleetenv import bundled_tasks_path
from fleetenv.cli.main import main
from fleetenv.core.config import ENV_API_KEY, ENV_BASE_URL
from fleetenv.core.errors import ConfigurationError, DeadlineExceeded
from fleetenv.core.task_files import load_tasks
from fleetenv.fleet.evaluator import (
    EvaluationError,
    EvaluationFailed,
    Evaluator,
    evaluate_task,
    evaluate_task_async,
)
from fleetenv.fleet.session import Session
from fleetenv.local import LocalFleet, LocalFleetError
from fleetenv.rollouts.harness import ScriptedHarness

TASKS = {task.key: task for task in load_tasks(bundled_tasks_path())}
TASK = TASKS["helpdesk-assign-api-ticket"]
ANSWER_TASK = TASKS["helpdesk-count-unassigned-open"]  # graded on the final answer
#: A session with the local Fleet's key looks like Fleet: name the local harness's model.
LOCAL = ["reference"]


@pytest.fixture
def session(local_fleet: LocalFleet) -> Iterator[Session]:
    with Session(api_key=local_fleet.token, base_url=local_fleet.base_url) as s:
        yield s


@pytest.fixture
def faults(local_fleet: LocalFleet) -> Iterator[Any]:
    local_fleet.faults.clear()
    yield local_fleet.faults
    local_fleet.faults.clear()


def jobs(local_fleet: LocalFleet) -> list[dict[str, Any]]:
    client = fleet.Fleet(api_key=local_fleet.token, base_url=local_fleet.base_url,
                         max_retries=0)
    return [job.model_dump() for job in client.list_jobs()]


def hits(faults: Any, fault_id: str) -> int | None:
    """How often a fault applied so far; ``None`` once it used up its ``times``."""
    return next((int(f["hits"]) for f in faults.list() if f["id"] == fault_id), None)


@pytest.mark.timeout(60)
def test_evaluate_scores_k_rollouts_per_model(local_fleet: LocalFleet,
                                              session: Session) -> None:
    evaluator = Evaluator(session=session, k=3, models=["reference", "noop"],
                          poll_interval_s=0.5, timeout_s=50)
    result = evaluator.evaluate(TASK)
    assert result.status == "completed" and result.task_key == TASK.key
    assert set(result.models) == {"reference", "noop"}
    reference, noop = result.models["reference"], result.models["noop"]
    assert reference.scores == [1.0, 1.0, 1.0] and reference.mean == 1.0
    assert reference.passed == 3 and all(s.step_count >= 3 for s in reference.sessions)
    assert noop.scores == [0.0, 0.0, 0.0] and noop.passed == 0 and noop.graded == 3
    assert result.num_sessions == 6 and result.num_errors == 0
    assert result.to_dict()["models"]["reference"]["mean"] == 1.0
    # The harness's instances are gone once the job is done.
    job_runs = [i for i in local_fleet.instances(status="running")]
    assert not job_runs


@pytest.mark.timeout(60)
def test_a_task_graded_on_its_final_answer_passes_with_the_reference(
        session: Session) -> None:
    result = evaluate_task(ANSWER_TASK.to_fleet_dict(), k=1, session=session, models=LOCAL,
                           poll_interval_s=0.5, timeout_s=50)
    assert result.models["reference"].scores == [1.0]


@pytest.mark.timeout(60)
def test_evaluate_async_keeps_the_callers_loop_running(session: Session) -> None:
    async def main() -> tuple[Any, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(ticker())
        result = await evaluate_task_async(TASK, k=1, session=session, models=LOCAL,
                                           poll_interval_s=0.5, timeout_s=50)
        seen = ticks  # ticks counted while the evaluation was in progress
        beat.cancel()
        return result, seen

    result, ticks = asyncio.run(main())
    assert result.models["reference"].scores == [1.0]
    assert ticks > 0


@pytest.mark.timeout(60)
def test_a_job_whose_sessions_all_fail_raises_evaluation_failed(
        local_fleet: LocalFleet, session: Session, faults: Any) -> None:
    faults.add("create_error", status=400, message="boot failure (test)")  # permanent
    evaluator = Evaluator(session=session, k=2, models=LOCAL, poll_interval_s=0.5, timeout_s=50)
    with pytest.raises(EvaluationFailed) as info:
        evaluator.evaluate(TASK)
    message = str(info.value)
    job_id = info.value.context["job"]
    assert job_id.startswith("job-") and job_id in message
    assert "errored" in message and "boot failure (test)" in message
    assert "hint:" in message


@pytest.mark.timeout(60)
def test_a_job_without_a_reference_solution_fails_with_the_harness_reason(
        session: Session) -> None:
    task = TASK.replace(key="no-reference", metadata={})
    with pytest.raises(EvaluationFailed, match="no reference solution to replay"):
        Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3,
                  timeout_s=50).evaluate(task)


@pytest.mark.timeout(60)
def test_cancelling_evaluate_async_stops_waiting_for_the_job(
        local_fleet: LocalFleet, session: Session, faults: Any) -> None:
    faults.add("tool_hang")  # the job would never end

    async def main() -> None:
        await asyncio.wait_for(
            evaluate_task_async(TASK, k=1, session=session, models=LOCAL,
                                poll_interval_s=0.3, timeout_s=50), timeout=1.5)

    with pytest.raises(TimeoutError):
        asyncio.run(main())
    assert any(j["status"] == "running" for j in jobs(local_fleet))


@pytest.mark.timeout(60)
def test_a_job_past_the_deadline_names_the_job_and_can_be_collected_later(
        local_fleet: LocalFleet, session: Session, faults: Any) -> None:
    faults.add("tool_hang")  # every session's first tool call hangs: the job never ends
    evaluator = Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3, timeout_s=2)
    with pytest.raises(DeadlineExceeded) as info:
        evaluator.evaluate(TASK)
    message = str(info.value)
    job_id = info.value.context["job"]
    assert f"evaluation job {job_id} did not finish within 2 s" in message
    assert f"wait({job_id!r})" in message and f"--job {job_id}" in message
    assert next(j for j in jobs(local_fleet) if j["id"] == job_id)["status"] == "running"
    faults.clear()  # the held tool call proceeds; the job can now finish
    later = Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3, timeout_s=50)
    result = later.wait(job_id, task_key=TASK.key)
    assert result.status == "completed" and result.models["reference"].scores == [1.0]


@pytest.mark.timeout(60)
def test_transient_503s_while_polling_are_retried(local_fleet: LocalFleet,
                                                  session: Session, faults: Any) -> None:
    fault = faults.add("http_error", route="/v1/jobs/*", method="GET", status=503, times=2)
    sessions_fault = faults.add("http_error", route="/v1/sessions/job/*", status=502,
                                times=1)
    result = Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3,
                       timeout_s=50).evaluate(TASK)
    assert result.models["reference"].scores == [1.0]
    assert hits(faults, fault) is None and hits(faults, sessions_fault) is None  # used up


@pytest.mark.timeout(60)
def test_job_creation_is_retried_only_when_fleet_cannot_have_created_it(
        local_fleet: LocalFleet, session: Session, faults: Any) -> None:
    before = len(jobs(local_fleet))
    unavailable = faults.add("http_error", route="/v1/jobs", method="POST", status=503,
                             times=1)
    result = Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3,
                       timeout_s=50).evaluate(TASK)
    assert result.models["reference"].scores == [1.0]
    assert hits(faults, unavailable) is None and len(jobs(local_fleet)) == before + 1

    # A 500 may come after the job was created: never re-POSTed (no duplicate job).
    failed = faults.add("http_error", route="/v1/jobs", method="POST", status=500, times=2)
    with pytest.raises(EvaluationError, match=r"creating the evaluation job.*500"):
        Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3,
                  timeout_s=50).evaluate(TASK)
    assert hits(faults, failed) == 1


@pytest.mark.timeout(60)
def test_a_job_creation_whose_connection_dropped_is_not_sent_again(
        local_fleet: LocalFleet, session: Session, faults: Any) -> None:
    # The request left and no answer came: Fleet may have created the job.
    dropped = faults.add("drop_connection", route="/v1/jobs", method="POST", times=2)
    with pytest.raises(EvaluationError, match=r"creating the evaluation job: no answer"):
        Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3,
                  timeout_s=50).evaluate(TASK)
    assert hits(faults, dropped) == 1


@pytest.mark.parametrize(("task", "field"), [
    ({"key": "t", "prompt": "p", "verifier_func": "def v(env): return 1"}, "env_key"),
    ({"key": "t", "env_id": "helpdesk", "verifier_func": "def v(env): return 1"}, "prompt"),
    ({"key": "t", "prompt": "p", "env_id": "helpdesk"}, "verifier"),
])
def test_bad_task_input_names_the_field(task: dict[str, Any], field: str,
                                        session: Session) -> None:
    with pytest.raises(ConfigurationError) as info:
        Evaluator(session=session, k=1, models=LOCAL).evaluate(task)
    assert info.value.context.get("field") == field
    assert field in str(info.value)


@pytest.mark.parametrize(("options", "field"), [
    ({"k": 0}, "k"), ({"models": []}, "models"), ({"models": "reference"}, "models"),
    ({"timeout_s": -1}, "timeout_s"), ({"max_steps": 0}, "max_steps"),
])
def test_bad_evaluator_settings_name_the_setting(options: dict[str, Any],
                                                 field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Evaluator(**options)
    assert info.value.context.get("field") == field


def test_a_task_for_an_environment_fleet_does_not_serve_is_refused(
        session: Session) -> None:
    task = TASK.replace(env_key="no-such-app", key="bad-env")
    with pytest.raises(ConfigurationError, match="Environment 'no-such-app' not found"):
        Evaluator(session=session, k=1, models=LOCAL).evaluate(task)


def test_a_model_the_local_harness_cannot_run_is_refused(session: Session) -> None:
    with pytest.raises(EvaluationError, match=r"not run by the local Fleet.*reference.*"
                       r"hint: check the model ids"):
        Evaluator(session=session, k=1, models=["anthropic/claude-sonnet-4.5"]
                  ).evaluate(TASK)


def test_a_local_fleet_built_without_a_harness_refuses_jobs_saying_so(
        notes_fleet: LocalFleet) -> None:
    """The local Fleet never imports fleetenv's rollouts: what runs its jobs is given to
    it (the ``local_fleet`` fixture gives ``ScriptedHarness``; ``notes_fleet`` nothing)."""
    task = {"key": "notes-nothing", "prompt": "Do nothing.", "env_id": "notes",
            "verifier_func": "def validate_task(env, final_answer=None):\n    return 1\n"}
    with (Session(api_key=notes_fleet.token, base_url=notes_fleet.base_url) as session,
          pytest.raises(EvaluationError, match=r"creating the evaluation job.*501.*"
                        r"built without a harness \(LocalFleet\(harness=")):
        Evaluator(session=session, k=1, models=LOCAL, timeout_s=30).evaluate(task)


@pytest.mark.timeout(90)
def test_a_subprocess_local_fleet_takes_its_harness_by_import_path() -> None:
    with pytest.raises(LocalFleetError, match="a harness by import path"):
        LocalFleet(in_process=False, harness=ScriptedHarness)
    with (LocalFleet(in_process=False, verifier_workers=1,
                     harness="fleetenv.rollouts.harness:ScriptedHarness") as local,
          Session(api_key=local.token, base_url=local.base_url) as session):
        result = Evaluator(session=session, k=1, models=LOCAL, poll_interval_s=0.3,
                           timeout_s=60).evaluate(TASK)
    assert result.models["reference"].scores == [1.0]


@pytest.mark.timeout(60)
def test_fleet_python_reads_the_local_harness_jobs(local_fleet: LocalFleet) -> None:
    """The wire format, checked by the SDK's own client methods and models."""
    from fleet.tasks import Task as FleetTask

    client = fleet.Fleet(api_key=local_fleet.token, base_url=local_fleet.base_url,
                         max_retries=0)
    sdk_task = FleetTask(**{k: v for k, v in TASK.to_fleet_dict().items()
                            if k != "task_modality"})
    assert client.import_single_task(sdk_task, project_key="p-eval").status_code == 200
    created = client.create_job(models=["reference"], project_key="p-eval", pass_k=1,
                                mode="tool-use")
    assert created.job_id.startswith("job-")
    evaluator = Evaluator(session=Session(api_key=local_fleet.token,
                                          base_url=local_fleet.base_url),
                          models=LOCAL, poll_interval_s=0.3, timeout_s=50)
    try:
        evaluator.wait(created.job_id)
    finally:
        evaluator.session.close()
    job = client.get_job(created.job_id)
    assert job.status == "completed" and job.id == created.job_id
    sessions = client.list_job_sessions(created.job_id)
    group = sessions.tasks[0]
    assert sessions.total_sessions == 1 and group.task_id == TASK.key
    assert group.passed_sessions == 1 and group.pass_rate == 1.0
    info = group.sessions[0]
    assert info.model == "reference" and info.status == "completed"
    assert info.verifier_execution is not None and info.verifier_execution.score == 1.0
    assert any(j.id == created.job_id for j in client.list_jobs())
    with pytest.raises(fleet.FleetAPIError, match=r"\['no-such-task'\] not found"):
        client.create_job(models=["reference"], task_keys=["no-such-task"])
    loaded = client.load_tasks(env_key="helpdesk", keys=[TASK.key])
    assert [t.key for t in loaded] == [TASK.key] and loaded[0].prompt == TASK.prompt
    assert client.get_task(TASK.key).environment_id == "helpdesk"


@pytest.mark.timeout(60)
def test_cli_evaluate_prints_per_model_scores(local_fleet: LocalFleet, tmp_path: Any,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV_API_KEY, local_fleet.token)
    monkeypatch.setenv(ENV_BASE_URL, local_fleet.base_url)
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(TASK.to_fleet_dict()) + "\n")
    code = main(["evaluate", str(path), "--k", "2", "--model", "reference", "--model",
                 "noop", "--poll", "0.3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{TASK.key}  job job-" in out
    assert "reference: mean score 1.00 over 2 rollouts (passed 2, graded 2)" in out
    assert "noop: mean score 0.00 over 2 rollouts (passed 0, graded 2)" in out
