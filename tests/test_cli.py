"""The ``fleetenv`` command: demo, run, tools, report, help and error lines.

The demo and the error path run as real subprocesses (``python -m fleetenv.cli.main``),
the way a user starts them. The other commands run in-process through ``main()`` against
the session's local Fleet (``FLEET_API_KEY`` / ``FLEET_BASE_URL`` pointed at it), which
exercises the same code over the same sockets without paying for another interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import responses

from fleetenv import bundled_tasks_path
from fleetenv.cli.main import COMMANDS, main
from fleetenv.core.config import ENV_API_KEY, ENV_BASE_URL
from fleetenv.core.task_files import load_tasks
from fleetenv.local import LocalFleet

BUNDLED = load_tasks(bundled_tasks_path())
HELPDESK_TOOLS = {"search_tickets", "get_ticket", "find_customers", "list_agents",
                  "create_ticket", "update_ticket", "add_comment", "set_tags", "ticket_stats"}


def cli(*args: str, timeout: float, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m fleetenv.cli.main ARGS`` with no Fleet settings in its environment."""
    child_env = {k: v for k, v in os.environ.items() if k not in (ENV_API_KEY, ENV_BASE_URL)}
    child_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "fleetenv.cli.main", *args], env=child_env,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """``main()`` sets logger levels for the CLI; put them back for the other tests."""
    names = ["", "fleetenv", "fleetenv.events", "httpx", "httpx2", "httpcore", "mcp",
             "uvicorn", "uvicorn.access", "uvicorn.error", "urllib3", "fleet"]
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
def on_local_fleet(local_fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> LocalFleet:
    """Point the in-process CLI at the session's local Fleet, as a Fleet user would."""
    monkeypatch.setenv(ENV_API_KEY, local_fleet.token)
    monkeypatch.setenv(ENV_BASE_URL, local_fleet.base_url)
    return local_fleet


def write_tasks(path: Path, keys: list[str]) -> Path:
    by_key = {t.key: t for t in BUNDLED}
    path.write_text("\n".join(json.dumps(by_key[k].to_fleet_dict()) for k in keys) + "\n")
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The result lines of a results file (not its header records)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert all("record" not in line for line in lines)  # every line a result
    return lines


# ----------------------------------------------------------------------------- demo

@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                Path]:
    out = tmp_path_factory.mktemp("demo") / "results.jsonl"
    # A Fleet key in the environment: the demo ignores it, and says so once.
    proc = cli("demo", "--samples", "2", "--workers", "16", "--out", str(out), timeout=60,
               env={ENV_API_KEY: "sk-not-for-the-demo"})
    return proc, out


@pytest.mark.timeout(90)
def test_demo_solves_every_bundled_task_on_a_fresh_machine(
        demo_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"all {len(BUNDLED)} bundled tasks solved in all 2 sample(s)" in proc.stdout
    assert "pass@2 (n=2)" in proc.stdout and str(out) in proc.stdout
    assert "Traceback" not in proc.stderr
    # Quiet by default: no per-request lines from httpx / per-episode lifecycle events.
    assert "HTTP Request" not in proc.stderr and "rollout_started" not in proc.stderr
    assert "embedded local Fleet" in proc.stderr
    # One story about the key: "it is set but ignored", not also "no key configured".
    assert "FLEET_API_KEY is set" in proc.stderr
    assert "no Fleet API key configured" not in proc.stderr
    assert "sk-not-for-the-demo" not in proc.stderr + proc.stdout
    lines = read_lines(out)
    assert len(lines) == len(BUNDLED) * 2
    assert Counter((r["task_key"], r["sample"]) for r in lines) == Counter(
        (t.key, s) for t in BUNDLED for s in (0, 1))
    assert all(r["reward"] == 1.0 and r["grade_status"] == "graded" for r in lines)


@pytest.mark.timeout(90)
def test_report_summarises_the_demo_results(
        demo_run: tuple[subprocess.CompletedProcess[str], Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    _, out = demo_run
    assert main(["report", str(out)]) == 0
    table = capsys.readouterr().out
    assert "pass@1 (n=2)" in table and "pass@2 (n=2)" in table
    assert f"rollouts {len(BUNDLED) * 2}" in table

    assert main(["report", str(out), "--k", "1", "--k", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [(p["k"], p["value"]) for p in summary["pass_at_k"]] == [(1, 1.0), (2, 1.0)]
    assert summary["rollouts"] == len(BUNDLED) * 2 and summary["errors"] == 0


def test_demo_ignores_a_fleet_key_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from fleetenv.cli.demo import demo_config

    monkeypatch.setenv(ENV_API_KEY, "sk-not-for-the-demo")
    monkeypatch.setenv(ENV_BASE_URL, "https://fleet.invalid")
    config = demo_config()
    assert config.use_local and config.api_key is None
    assert "sk-not-for-the-demo" not in repr(config)
    assert "runs there" in capsys.readouterr().err


def test_demo_names_the_unsolved_tasks() -> None:
    from fleetenv.cli.demo import unsolved_tasks
    from fleetenv.core.types import RolloutResult

    results = [
        RolloutResult("a", "helpdesk", sample=0, reward=1.0, grade_status="graded"),
        RolloutResult("a", "helpdesk", sample=1, reward=0.0, grade_status="graded"),
        RolloutResult("b", "helpdesk", sample=0, reward=1.0, grade_status="graded"),
        RolloutResult("b", "helpdesk", sample=1, reward=1.0, grade_status="graded"),
        RolloutResult("c", "helpdesk", sample=0, error={"type": "X", "message": "boom"}),
    ]
    unsolved = unsolved_tasks(["a", "b", "c"], results, samples=2)
    assert list(unsolved) == ["a", "c"]
    assert "reward 0.0" in unsolved["a"] and "boom" in unsolved["c"]


# ----------------------------------------------------------------------------- run

@pytest.mark.timeout(60)
def test_run_reference_policy_on_a_task_file(on_local_fleet: LocalFleet, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent",
                                                   "shop-count-shipped",
                                                   "helpdesk-who-filed-ticket"])
    out = tmp_path / "out" / "results.jsonl"
    code = main(["run", str(tasks), "--policy", "reference", "-n", "2", "--workers", "4",
                 "--out", str(out), "--task", "helpdesk-busiest-agent",
                 "--task", "shop-count-shipped"])
    assert code == 0
    printed = capsys.readouterr()
    assert "pass@2 (n=2)" in printed.out and str(out) in printed.out
    assert f"Fleet at {on_local_fleet.base_url}" in printed.err
    lines = read_lines(out)
    assert sorted((r["task_key"], r["sample"]) for r in lines) == [
        ("helpdesk-busiest-agent", 0), ("helpdesk-busiest-agent", 1),
        ("shop-count-shipped", 0), ("shop-count-shipped", 1)]
    assert all(r["reward"] == 1.0 and r["policy"] == "reference" for r in lines)
    assert on_local_fleet.token not in out.read_text()
    assert not [i for i in on_local_fleet.instances(status="running")
                if i.get("instance_id") in {r["instance_id"] for r in lines}]


@pytest.mark.timeout(60)
def test_run_openai_policy_reads_its_key_from_the_environment(
        on_local_fleet: LocalFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--model / --base-url reach the chat-completions request; the key comes from
    OPENAI_API_KEY and appears in no output."""
    key = "sk-test-cli-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["helpdesk-busiest-agent"])
    seen: list[dict[str, Any]] = []

    def reply(request: Any) -> tuple[int, dict[str, str], str]:
        body = json.loads(request.body)
        seen.append({"body": body, "auth": request.headers.get("Authorization")})
        if len(body["messages"]) <= 1:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "list_agents", "arguments": "{}"}}]}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_2", "type": "function", "function": {
                    "name": "submit_final_answer",
                    "arguments": json.dumps({"answer": "nobody@helpdesk.example"})}}]}
        return 200, {}, json.dumps({"choices": [{"index": 0, "message": message,
                                                 "finish_reason": "tool_calls"}]})

    out = tmp_path / "results.jsonl"
    with responses.RequestsMock(passthru_prefixes=("http://127.0.0.1",)) as mock:
        mock.add_callback(responses.POST, "https://llm.example/v1/chat/completions",
                          callback=reply)
        code = main(["run", str(tasks), "--policy", "openai", "--model", "tiny-model",
                     "--base-url", "https://llm.example/v1", "--out", str(out)])
    assert code == 0
    assert seen and all(s["body"]["model"] == "tiny-model" for s in seen)
    assert seen[0]["auth"] == f"Bearer {key}"
    [result] = read_lines(out)
    assert result["tool_calls"] == 1 and result["final_answer"] == "nobody@helpdesk.example"
    assert result["grade_status"] == "graded" and result["reward"] == 0.0
    printed = capsys.readouterr()
    assert key not in printed.out + printed.err + out.read_text()


@pytest.mark.timeout(60)
def test_run_fails_with_one_line_when_every_episode_fails(
        on_local_fleet: LocalFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = {"key": "nowhere", "prompt": "p", "env_id": "no-such-app"}
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([task]))
    code = main(["run", str(tasks), "--policy", "reference", "--out",
                 str(tmp_path / "r.jsonl")])
    assert code == 1
    err = capsys.readouterr().err
    assert "every episode failed" in err and "no-such-app" in err


@pytest.mark.parametrize(("argv", "expected"), [
    (["--policy", "openai"], "--policy openai needs --model"),
    (["--policy", "reference", "--model", "m"], "only apply to --policy openai"),
    (["--policy", "telepathy"], "unknown policy 'telepathy'"),
    (["--policy", "import:no_such_module_xyz:policy"], "cannot import policy"),
])
def test_run_rejects_bad_policy_options_before_any_work(
        argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["run", str(tmp_path / "never-read.json"), *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("fleetenv run: error: ") and expected in err[0], err


# ----------------------------------------------------------------------------- tools

@pytest.mark.timeout(60)
def test_tools_lists_the_helpdesk_tools_and_deletes_its_instance(
        on_local_fleet: LocalFleet, capsys: pytest.CaptureFixture[str]) -> None:
    before = {i["instance_id"] for i in on_local_fleet.instances(status="running")}
    assert main(["tools", "helpdesk"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(HELPDESK_TOOLS)} tool(s) of helpdesk (tool_use)")
    names = {line.split(":")[0] for line in out.splitlines()[1:] if not line.startswith(" ")}
    assert names == HELPDESK_TOOLS
    assert "    ticket_id: integer  The ticket number, e.g. 1042." in out
    assert {i["instance_id"] for i in on_local_fleet.instances(status="running")} <= before

    assert main(["tools", "helpdesk", "--modality", "computer_use", "--json"]) == 0
    [computer] = json.loads(capsys.readouterr().out)
    assert computer["function"]["name"] == "computer"
    assert {i["instance_id"] for i in on_local_fleet.instances(status="running")} <= before


# ----------------------------------------------------------------------------- errors, help

@pytest.mark.timeout(30)
def test_an_error_is_one_line_without_a_traceback(tmp_path: Path) -> None:
    proc = cli("run", str(tmp_path / "missing.json"), "--policy", "reference", timeout=30)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    first, *rest = proc.stderr.strip().splitlines()
    assert first.startswith("fleetenv run: error: task file not found")
    assert "missing.json" in first and "hint:" in first
    assert rest == ["(run with --debug for the traceback)"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: fleetenv {command}") and len(text.splitlines()) > 5


def test_top_level_help_lists_commands_without_importing_the_stack() -> None:
    probe = ("import sys, contextlib, io\n"
             "from fleetenv.cli.main import main\n"
             "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
             "    main([])\n"
             "heavy = [m for m in ('mcp', 'fleet', 'httpx2', 'fleetenv.env.fleet_env')"
             " if m in sys.modules]\n"
             "print(out.getvalue()); print('HEAVY', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    for command in COMMANDS:
        assert command in proc.stdout
    assert "HEAVY []" in proc.stdout
