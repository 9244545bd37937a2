"""``fleetenv run``: ``python -m fleetenv``, imports from the working directory, sampling
flags, the preflight, the run manifest and ``--resume``.

Commands run in-process through ``main()`` against the session's local Fleet (pointed at
by ``FLEET_API_KEY`` / ``FLEET_BASE_URL``, so the CLI treats it as a real Fleet and checks
its key), except where the thing under test is the process itself (``python -m``, the
console script's ``sys.path``). Model servers are ``responses`` callbacks, or a port with
nothing listening. Ctrl-C and the live progress display: tests/test_cli_interrupts.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import responses

from fleetenv import bundled_tasks_path
from fleetenv.cli.main import main
from fleetenv.core.config import ENV_API_KEY, ENV_BASE_URL
from fleetenv.core.task_files import load_tasks
from fleetenv.local import LocalFleet
from fleetenv.rollouts.results import (
    SCHEMA_VERSION,
    manifest_path,
    read_manifest,
    read_results,
)

BUNDLED = {t.key: t for t in load_tasks(bundled_tasks_path())}
HELPDESK_TOOLS = {"search_tickets", "get_ticket", "find_customers", "list_agents",
                  "create_ticket", "update_ticket", "add_comment", "set_tags", "ticket_stats"}
LLM = "https://llm.example/v1"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """``main()`` sets logger levels and formatters for the CLI; put them back."""
    import logging

    names = ["", "fleetenv", "fleetenv.events", "httpx", "httpx2", "httpcore", "mcp",
             "uvicorn", "uvicorn.access", "uvicorn.error", "urllib3", "fleet"]
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
def on_local_fleet(local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> LocalFleet:
    monkeypatch.setenv(ENV_API_KEY, local_fleet.token)
    monkeypatch.setenv(ENV_BASE_URL, local_fleet.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-run-0123456789")
    return local_fleet


def write_tasks(path: Path, keys: list[str]) -> Path:
    path.write_text("\n".join(json.dumps(BUNDLED[k].to_fleet_dict()) for k in keys) + "\n")
    return path


def result_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a results file, parsed: each one must be a result."""
    lines = [json.loads(line) for line in path.read_bytes().split(b"\n") if line.strip()]
    assert all("record" not in line for line in lines)
    return lines


def running_ids(fleet: LocalFleet) -> set[str]:
    return {str(i["instance_id"]) for i in fleet.instances(status="running")}


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (ENV_API_KEY, ENV_BASE_URL, "PYTHONPATH")}
    env.update(extra)
    return env


# ----------------------------------------------------------------------------- the process

@pytest.mark.timeout(60)
def test_python_m_fleetenv_is_the_fleetenv_command(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "fleetenv", "run", "--help"],
                          capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: fleetenv run")
    for flag in ("--temperature", "--max-tokens", "--system-prompt", "--seed",
                 "--extra-body", "--concurrency", "--workers", "--resume", "--force",
                 "--no-preflight"):
        assert flag in proc.stdout


@pytest.mark.timeout(90)
def test_the_fleetenv_script_imports_a_policy_from_the_working_directory(
        tmp_path: Path) -> None:
    """The console script's sys.path starts with its bin directory, not the working
    directory: ``--policy import:mypol:policy`` must still find ./mypol.py."""
    script = Path(sys.executable).with_name("fleetenv")
    assert script.exists(), "pip install -e . installs the fleetenv console script"
    (tmp_path / "mypol.py").write_text(
        "from fleetenv.rollouts.policy import ScriptedPolicy\n"
        "policy = ScriptedPolicy.reference()\n")
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    proc = subprocess.run([str(script), "run", str(tasks), "--policy", "import:mypol:policy",
                           "--out", "r.jsonl"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=90, env=child_env())
    assert proc.returncode == 0, proc.stderr
    [result] = result_lines(tmp_path / "r.jsonl")
    assert result["reward"] == 1.0 and result["error"] is None
    # CLI messages are plain lines, not service-log records with timestamps.
    assert "using the embedded local Fleet" in proc.stderr
    assert not re.search(r"^\d{4}-\d\d-\d\d|INFO|fleetenv\.\w+:", proc.stderr, re.M), proc.stderr


# ----------------------------------------------------------------------------- sampling

@pytest.mark.timeout(60)
def test_sampling_flags_reach_every_request_and_the_results(
        on_local_fleet: LocalFleet, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    prompt = tmp_path / "system.txt"
    prompt.write_text("You are careful.")
    bodies: list[dict[str, Any]] = []
    logprobs = {"content": [{"token": "x", "logprob": -0.25, "top_logprobs": []}]}

    def reply(request: Any) -> tuple[int, dict[str, str], str]:
        body = json.loads(request.body)
        bodies.append(body)
        done = any(m.get("role") == "tool" for m in body["messages"])
        message: dict[str, Any] = {"role": "assistant", "content": "done" if done else None}
        if not done:
            message["tool_calls"] = [{"id": "c1", "type": "function", "function": {
                "name": "list_agents", "arguments": "{}"}}]
        return 200, {}, json.dumps({"choices": [{"index": 0, "message": message,
                                                 "logprobs": logprobs,
                                                 "finish_reason": "stop"}]})

    out = tmp_path / "results.jsonl"
    with responses.RequestsMock(passthru_prefixes=("http://127.0.0.1",)) as mock:
        mock.add_callback(responses.POST, f"{LLM}/chat/completions", callback=reply)
        code = main(["run", str(tasks), "--policy", "openai", "--model", "m",
                     "--base-url", LLM, "-n", "2", "--concurrency", "2",
                     "--temperature", "0.3", "--max-tokens", "64", "--seed", "7",
                     "--extra-body", '{"top_p": 0.5, "logprobs": true}',
                     "--system-prompt", f"@{prompt}", "--out", str(out)])
    assert code == 0
    preflight, *episodes = bodies
    assert preflight["messages"] == [{"role": "user", "content": "Reply with OK."}]
    assert len(episodes) == 4  # two samples, two turns each
    for body in episodes:
        assert (body["temperature"], body["max_tokens"], body["top_p"]) == (0.3, 64, 0.5)
        assert body["logprobs"] is True
        assert body["messages"][0] == {"role": "system", "content": "You are careful."}
    assert {body["seed"] for body in episodes} == {7, 8}  # sample i sends seed + i
    results = result_lines(out)
    assert sorted(r["sample"] for r in results) == [0, 1]
    for result in results:
        assert result["turn_meta"][0]["logprobs"] == logprobs
        offered = {t["function"]["name"] for t in result["tools"]}
        assert offered == HELPDESK_TOOLS | {"submit_final_answer"}  # the task wants one
    manifest = read_manifest(out)
    assert manifest is not None and manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["sampling"] == {"temperature": 0.3, "max_tokens": 64,
                                    "extra_body": {"top_p": 0.5, "logprobs": True}}
    assert manifest["seed"] == 7 and manifest["samples_per_task"] == 2
    assert manifest["policy"] == "openai:m" and manifest["system_prompt_sha256"]
    assert manifest["policy_spec"]["options"]["api_key_env"] == "OPENAI_API_KEY"


@pytest.mark.parametrize(("argv", "expected"), [
    (["--policy", "reference", "--temperature", "0.5"], "--temperature only apply"),
    (["--policy", "openai", "--model", "m", "--extra-body", "[1]"],
     "--extra-body must be a JSON object"),
    (["--policy", "openai", "--model", "m", "--extra-body", "{nope"],
     "--extra-body is not valid JSON"),
    (["--policy", "reference", "--system-prompt", "@no-such-file.txt"],
     "--system-prompt @no-such-file.txt: cannot read"),
    (["--policy", "reference", "--force"], "--force only applies with --resume"),
])
def test_bad_sampling_options_fail_before_any_work(
        argv: list[str], expected: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path / "never-read.json"), *argv]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("fleetenv run: error: ") and expected in first, first


# ----------------------------------------------------------------------------- preflight

def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(60)
def test_a_wrong_base_url_fails_the_run_at_once_with_one_line(
        on_local_fleet: LocalFleet, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    before = running_ids(on_local_fleet)
    out = tmp_path / "results.jsonl"
    code = main(["run", str(tasks), "--policy", "openai", "--model", "m", "--base-url",
                 f"http://127.0.0.1:{dead_port()}/v1", "--out", str(out)])
    assert code == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith("fleetenv run: error: could not reach the model server: ")
    assert "Connection refused" in lines[0] and "--base-url" in lines[0]
    assert lines[1:] == ["(run with --debug for the traceback)"]
    assert "urllib3" not in err and "HTTPConnectionPool" not in err
    assert not out.exists() and running_ids(on_local_fleet) <= before


@pytest.mark.parametrize(("status", "expected"), [
    (401, "refused the API key (HTTP 401): bad key"),
    (404, "answered 404: no model m"),
])
@pytest.mark.timeout(60)
def test_a_refused_model_request_fails_the_run_before_provisioning(
        status: int, expected: str, on_local_fleet: LocalFleet, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    out = tmp_path / "results.jsonl"
    before = running_ids(on_local_fleet)
    message = "bad key" if status == 401 else "no model m"
    with responses.RequestsMock(passthru_prefixes=("http://127.0.0.1",)) as mock:
        mock.add(responses.POST, f"{LLM}/chat/completions", status=status,
                 json={"error": {"message": message}})
        code = main(["run", str(tasks), "--policy", "openai", "--model", "m",
                     "--base-url", LLM, "--out", str(out)])
        assert len(mock.calls) == 1  # no retries, no episode
    assert code == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert expected in first, first
    assert not out.exists() and running_ids(on_local_fleet) <= before


@pytest.mark.timeout(60)
def test_a_rejected_fleet_key_fails_the_run_before_provisioning(
        on_local_fleet: LocalFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV_API_KEY, "not-the-local-token")
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    out = tmp_path / "results.jsonl"
    before = running_ids(on_local_fleet)
    assert main(["run", str(tasks), "--policy", "reference", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[-2]
    assert first.startswith("fleetenv run: error: the Fleet check failed before anything "
                            "was provisioned"), err
    assert "401" in first and "FLEET_API_KEY" in first
    assert "not-the-local-token" not in err
    assert running_ids(on_local_fleet) <= before and not out.exists()


# ----------------------------------------------------------------------------- resume

@pytest.mark.timeout(90)
def test_resume_runs_only_the_missing_episodes(
        on_local_fleet: LocalFleet, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent",
                                                   "shop-count-shipped"])
    out = tmp_path / "results.jsonl"
    argv = ["run", str(tasks), "--policy", "reference", "-n", "2", "--workers", "4"]
    assert main([*argv, "--out", str(out)]) == 0
    results = out.read_text().splitlines()
    assert len(results) == 4 and len(result_lines(out)) == 4
    manifest = read_manifest(out)
    assert manifest is not None and manifest_path(out).is_file()
    # As an interrupted run leaves it: one episode missing, one cancelled, a cut line.
    cancelled = json.loads(results[1])
    cancelled.update(stop_reason="cancelled", reward=None,
                     error={"type": "RolloutCancelled", "message": "the run was cancelled"})
    out.write_text("\n".join([results[0], json.dumps(cancelled), results[2]])
                   + "\n" + results[3][:40])
    kept = {(json.loads(line)["task_key"], json.loads(line)["sample"])
            for line in (results[0], results[2])}
    capsys.readouterr()

    assert main([*argv, "--resume", str(out)]) == 0
    printed = capsys.readouterr()
    assert "2 episode(s) (+2 from before)" in printed.out
    assert read_manifest(out) == manifest
    pairs = sorted((r.task_key, r.sample) for r in read_results(out))
    assert pairs == sorted((k, s) for k in ("helpdesk-busiest-agent", "shop-count-shipped")
                           for s in (0, 1))
    assert kept <= set(pairs) and all(r.reward == 1.0 for r in read_results(out))
    assert len(result_lines(out)) == 4  # every line a result
    resumes = json.loads(manifest_path(out).read_text())["resumes"]
    assert [r["resumed"] for r in resumes] == [True] and resumes[0]["samples_per_task"] == 2

    # Another run's settings: refused, naming what differs; --force mixes them anyway.
    assert main([*argv[:-4], "-n", "3", "--resume", str(out)]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert "not comparable (samples_per_task: 2 -> 3)" in first and "--force" in first
    assert main([*argv[:-4], "-n", "3", "--resume", str(out), "--force"]) == 0
    assert len(read_results(out)) == 6  # the third sample of each task
    assert "--force: resuming although samples_per_task" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_resume_refuses_a_file_without_a_manifest_unless_forced(
        on_local_fleet: LocalFleet, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"task_key": "helpdesk-busiest-agent",
                               "env_key": "helpdesk:v1", "sample": 0, "reward": 1.0,
                               "grade_status": "graded", "stop_reason": "agent_done"}) + "\n")
    argv = ["run", str(tasks), "--policy", "reference", "-n", "2", "--resume", str(old)]
    assert main(argv) == 1
    assert "has no run manifest" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    assert sorted(r.sample for r in read_results(old)) == [0, 1]
    # The resume's record says what the resumed part ran; the file's first part still
    # has no manifest, so it stays a file that needs --force to resume.
    assert read_manifest(old) is None and len(result_lines(old)) == 2
    beside = json.loads(manifest_path(old).read_text())
    assert beside["resumes"][0]["resumed"] is True
    assert beside["resumes"][0]["resume_overrode"] == ["no manifest in the file"]
    assert main(argv) == 1 and "has no run manifest" in capsys.readouterr().err


@pytest.mark.timeout(90)
def test_resume_reruns_an_episode_whose_last_line_was_cut_inside_a_character(
        on_local_fleet: LocalFleet, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    out = tmp_path / "results.jsonl"
    argv = ["run", str(tasks), "--policy", "reference", "-n", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    first, second = (json.loads(line) for line in out.read_bytes().split(b"\n")[:2])
    # Results are written as UTF-8 (ensure_ascii=False): a kept line may hold U+2028 raw,
    # and a kill can cut the last line between the two bytes of an "é".
    first["final_answer"] = "line\u2028separator"
    second["final_answer"] = "café"
    kept = json.dumps(first, ensure_ascii=False).encode()
    cut = json.dumps(second, ensure_ascii=False).encode()
    out.write_bytes(kept + b"\n" + cut[: cut.index("é".encode()) + 1])
    capsys.readouterr()

    assert main([*argv, "--resume", str(out)]) == 0
    assert "1 episode(s) (+1 from before)" in capsys.readouterr().out
    results = read_results(out)
    assert sorted(r.sample for r in results) == [0, 1]
    assert results[0].final_answer == "line\u2028separator"  # kept as it was
    assert results[1].sample == second["sample"] and results[1].reward == 1.0  # run again
    assert len(result_lines(out)) == 2


@pytest.mark.timeout(90)
def test_resume_reads_the_manifest_line_of_a_file_written_before_it_moved_beside(
        on_local_fleet: LocalFleet, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    out = tmp_path / "results.jsonl"
    argv = ["run", str(tasks), "--policy", "reference", "-n", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    # The layout of a version 2 file: the manifest is the first line, nothing beside it.
    manifest = {**json.loads(manifest_path(out).read_text()), "schema_version": 2}
    manifest_path(out).unlink()
    first_result = out.read_text().splitlines()[0]
    out.write_text(json.dumps(manifest) + "\n" + first_result + "\n")
    assert read_manifest(out) == manifest
    capsys.readouterr()

    assert main([*argv[:-2], "-n", "3", "--resume", str(out)]) == 1  # still compared
    assert "not comparable (samples_per_task: 2 -> 3)" in capsys.readouterr().err
    assert main([*argv, "--resume", str(out)]) == 0
    assert "1 episode(s) (+1 from before)" in capsys.readouterr().out
    assert sorted(r.sample for r in read_results(out)) == [0, 1]
    assert read_manifest(out) == manifest  # now beside the file, with the resume
    beside = json.loads(manifest_path(out).read_text())
    assert [r["resumed"] for r in beside["resumes"]] == [True]
