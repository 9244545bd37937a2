"""Fleet tasks served over OpenEnv, driven by openenv-core's own clients and validator.

The server runs for real (uvicorn on a free loopback port, in a thread; one test starts
``fleetenv serve openenv`` as a subprocess) against the embedded local Fleet, and every
episode goes through openenv-core's WebSocket clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import requests

pytest.importorskip("openenv.core.env_server.http_server")

from _support.browser import chromium_page
from _support.waiting import wait_for
from openenv.cli._validation import validate_running_environment
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from fleetenv import bundled_tasks_path
from fleetenv.adapters.openenv.server import (
    FleetServerAction,
    FleetServerSettings,
    OpenEnvServer,
)
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.fleet.session import Session
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(180)

TASKS = load_tasks(bundled_tasks_path())
REPO = Path(__file__).resolve().parents[1]


def task_with(predicate: Any) -> Task:
    return next(task for task in TASKS if predicate(task))


#: A task solved by tool calls then a final turn; and one whose answer is submitted.
ACTION_TASK = task_with(lambda t: t.reference_solution and all(
    c.name != "submit_final_answer" for c in t.reference_solution))


@pytest.fixture(scope="module")
def session(local_fleet: LocalFleet) -> Iterator[Session]:
    with Session(api_key=local_fleet.token, base_url=local_fleet.base_url) as shared:
        yield shared


@pytest.fixture(scope="module")
def server(session: Session) -> Iterator[OpenEnvServer]:
    settings = FleetServerSettings.build(TASKS, session=session)
    with OpenEnvServer(settings, max_sessions=4) as running:
        yield running


def running_ids(fleet: LocalFleet) -> set[str]:
    return {i["instance_id"] for i in fleet.instances(status="running")}


def play_reference(client: Any, task: Task) -> Any:
    result = client.reset(task=task.key)
    assert not result.done and result.observation["task_key"] == task.key
    assert result.observation["text"] == task.prompt
    assert {t["function"]["name"] for t in result.observation["openai_tools"]} >= {
        c.name for c in task.reference_solution}
    for call in task.reference_solution:
        result = client.step({"type": "call_tool", "tool_name": call.name,
                              "arguments": dict(call.arguments)})
        assert not result.observation["is_error"], result.observation["text"]
        assert result.observation["tool_name"] == call.name
    return result


def test_a_bundled_task_is_solved_over_websocket_and_graded(server, local_fleet):
    with GenericEnvClient(base_url=server.url).sync() as client:
        play_reference(client, ACTION_TASK)
        final = client.step({"type": "turn", "text": "All done."})
        assert final.done and final.reward == 1.0
        info = final.observation["info"]
        assert info["stop_reason"] == "agent_done" and info["reward_status"] == "graded"
        assert info["reward_unknown"] is False
        state = client.state()
        assert state["task_key"] == ACTION_TASK.key and state["done"] is True
        assert state["reward"] == 1.0 and state["step_count"] == len(
            ACTION_TASK.reference_solution) + 1
        instance = state["instance_id"]
        assert instance in running_ids(local_fleet)
    wait_for(lambda: instance not in running_ids(local_fleet), timeout=30,
             what="the closed session's instance to be deleted")


def test_openenv_mcp_tool_client_lists_and_calls_the_tools(server):
    task = ACTION_TASK
    first = task.reference_solution[0]
    with MCPToolClient(base_url=server.url).sync() as client:
        client.reset(task=task.key)
        names = [tool.name for tool in client.list_tools()]
        assert first.name in names
        schema = next(t for t in client.list_tools() if t.name == first.name).input_schema
        assert set(first.arguments) <= set(schema["properties"])
        text = client.call_tool(first.name, **dict(first.arguments))
        assert isinstance(text, str) and text.strip()


def test_a_whole_turn_runs_every_call_and_an_unreadable_turn_is_an_observation(server):
    task = ACTION_TASK
    calls = task.reference_solution[:2]
    turn = "Let me look.\n" + "\n".join(
        "<tool_call>" + json.dumps({"name": c.name, "arguments": dict(c.arguments)})
        + "</tool_call>" for c in calls)
    with GenericEnvClient(base_url=server.url).sync() as client:
        client.reset(task=task.key)
        result = client.step({"text": turn})  # type inferred: a turn
        obs = result.observation
        assert [c["name"] for c in obs["tool_calls"]] == [c.name for c in calls]
        assert [m["role"] for m in obs["messages"]] == ["tool"] * len(calls)
        assert not result.done and client.state()["step_count"] == 1
        bad = client.step({"text": '<tool_call>{"name": "get_ticket", "argu</tool_call>'})
        assert bad.observation["parse_error"] and not bad.done
        assert client.state()["step_count"] == 2


def test_openenv_core_validator_passes(server):
    report = validate_running_environment(server.url, timeout_s=30)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert report["passed"], failed
    assert report["mode"] == "simulation"


def test_a_bad_task_key_is_a_clear_error_and_the_session_goes_on(server):
    with GenericEnvClient(base_url=server.url).sync() as client:
        with pytest.raises(RuntimeError) as caught:
            client.reset(task=ACTION_TASK.key + "x")
        message = str(caught.value)
        assert f"no task with key '{ACTION_TASK.key}x'" in message
        assert f"did you mean '{ACTION_TASK.key}'" in message
        assert client.reset(task=ACTION_TASK.key).observation["task_key"] == ACTION_TASK.key


def test_misuse_is_named(server):
    with GenericEnvClient(base_url=server.url).sync() as client:
        with pytest.raises(RuntimeError, match="no episode yet: send reset first"):
            client.step({"tool_name": "get_ticket", "arguments": {}})
        with pytest.raises(RuntimeError, match="reset\\(\\) needs a task"):
            client.reset()
        with pytest.raises(RuntimeError, match="unknown argument\\(s\\) 'tsk'"):
            client.reset(tsk=ACTION_TASK.key)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"type": "turn"})


def test_action_forms_are_read_without_a_type():
    assert FleetServerAction.model_validate({"tool_name": "a"}).type == "call_tool"
    assert FleetServerAction.model_validate({"message": {"role": "assistant"}}).type == "turn"
    assert FleetServerAction.model_validate({"type": "list_tools"}).type == "list_tools"
    with pytest.raises(ValueError, match="needs tool_name"):
        FleetServerAction.model_validate({})


def test_a_client_that_vanishes_mid_episode_gets_its_instance_deleted(server, local_fleet):
    import websockets

    async def vanish() -> str:
        ws_url = server.url.replace("http://", "ws://") + "/ws"
        async with websockets.connect(ws_url, open_timeout=10) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"task": ACTION_TASK.key}}))
            await asyncio.wait_for(ws.recv(), timeout=60)
            await ws.send(json.dumps({"type": "state"}))
            state = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
            instance: str = state["data"]["instance_id"]
            assert instance in running_ids(local_fleet)
            ws.transport.abort()  # no close frame: the client just disappears
        return instance

    instance = asyncio.run(vanish())
    wait_for(lambda: instance not in running_ids(local_fleet), timeout=30,
             what="the vanished client's instance to be deleted")


def test_sessions_past_the_cap_are_refused(session):
    import websockets

    async def refused(url: str) -> dict[str, Any]:
        async with websockets.connect(url.replace("http://", "ws://") + "/ws",
                                      open_timeout=10) as ws:
            frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 30))
            return frame

    settings = FleetServerSettings.build(TASKS, session=session, default_task=ACTION_TASK.key)
    with OpenEnvServer(settings, max_sessions=1) as small, \
            GenericEnvClient(base_url=small.url).sync() as first:
        first.reset()
        frame = asyncio.run(refused(small.url))
        assert frame["type"] == "error" and frame["data"]["code"] == "CAPACITY_REACHED"
        assert first.step({"type": "list_tools"}).observation["tools"]  # unharmed


@contextmanager
def serve_cli(tmp_path: Path, fleet: LocalFleet, *argv: str,
              **env_vars: str) -> Iterator[tuple[str, str]]:
    """``fleetenv serve ...`` on a one-task file, in a subprocess: yields its first two
    lines (where it serves, how to connect); stops it with Ctrl-C and checks it quit."""
    task_file = tmp_path / "tasks.json"
    raw = json.loads(bundled_tasks_path().read_text())
    task_file.write_text(json.dumps([t for t in raw if t["key"] == ACTION_TASK.key]))
    env = {**os.environ, "FLEET_API_KEY": fleet.token, "FLEET_BASE_URL": fleet.base_url,
           **env_vars}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetenv.cli.main", "serve", *argv, "--port", "0",
         "--tasks", str(task_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until the server prints its URL
        assert "OpenEnv server for 1 task(s) on Fleet at http://127.0.0.1:" in first, (
            first, proc.stderr.read() if proc.poll() is not None else "")
        yield first, proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "OpenEnv server stopped" in err


def test_fleetenv_serve_openenv_runs_in_the_foreground(tmp_path, local_fleet):
    """The CLI's legacy spelling (``serve --openenv``), on a task file, with a default
    task: start, validate, play, Ctrl-C."""
    with serve_cli(tmp_path, local_fleet, "--openenv") as (first, connect):
        url = first.split(" at ")[1].split()[0]
        assert connect.strip() == f"connect: GenericEnvClient(base_url={url!r})"
        assert validate_running_environment(url, timeout_s=30)["passed"]
        with GenericEnvClient(base_url=url).sync() as client:
            result = client.reset()  # the file's only task
            assert result.observation["task_key"] == ACTION_TASK.key


def test_fleetenv_serve_openenv_with_a_made_token_prints_the_url_to_connect(
        tmp_path, local_fleet):
    with serve_cli(tmp_path, local_fleet, "openenv",
                   FLEETENV_OPENENV_TOKEN="auto") as (first, connect):
        url = first.split(" at ")[1].split()[0]
        assert requests.get(url + "/health", timeout=30).status_code == 401
        found = re.fullmatch(r"connect: GenericEnvClient\(base_url='(http://fleetenv:"
                             r"[A-Za-z0-9_-]{32}@127\.0\.0\.1:\d+)'\)", connect.strip())
        assert found, connect
        with GenericEnvClient(base_url=found[1]).sync() as client:
            assert client.reset().observation["task_key"] == ACTION_TASK.key


def parse_serve(*argv: str) -> tuple[str, Any]:
    from fleetenv.cli import serve
    from fleetenv.cli.main import build_parser

    args = build_parser().parse_args(["serve", *argv])
    return serve._mode(args), args


@pytest.mark.parametrize(("argv", "mode", "port"), [
    (["local", "--port", "0"], "local", 0),
    (["--port", "0"], "local", 0),                      # the old flag-less spelling
    (["openenv", "--task", "k"], "openenv", None),
    (["--openenv", "--task", "k", "--port", "9"], "openenv", 9),  # the spelling
    (["--port", "9", "openenv"], "openenv", 9),         # a flag before the mode is kept
    (["openenv", "--token", "auto", "--allow-origin", "http://a", "--allow-origin",
      "http://b"], "openenv", None),
    (["local", "--token", "t"], "local", None),
])
def test_serve_modes_parse(argv, mode, port, capsys):
    chosen, args = parse_serve(*argv)
    assert chosen == mode and args.port == port
    if "--allow-origin" in argv:
        assert args.token == "auto" and args.allow_origin == ["http://a", "http://b"]
    note = "without a mode means 'fleetenv serve local'"
    legacy_local = "local" not in argv and "openenv" not in argv and "--openenv" not in argv
    assert (note in capsys.readouterr().err) == legacy_local


@pytest.mark.parametrize(("argv", "message"), [
    (["--openenv", "--ttl-seconds", "5"], "--ttl-seconds belong(s) to 'fleetenv serve local'"),
    (["--task", "k"], "--task belong(s) to 'fleetenv serve openenv'"),
    (["--allow-origin", "http://a"],
     "--allow-origin belong(s) to 'fleetenv serve openenv'"),
])
def test_serve_flags_of_the_other_mode_are_refused(argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        parse_serve(*argv)


@pytest.mark.parametrize("unknown_reward", [None, -1.0])
def test_an_unknown_grade_is_null_or_the_configured_reward(session, unknown_reward):
    """In-process (no server): a task without a verifier has no grade."""
    from fleetenv.adapters.openenv.server import FleetOpenEnvEnvironment

    ungraded = ACTION_TASK.model_copy(update={"key": "no-verifier", "verifier": None})
    settings = FleetServerSettings.build([ungraded], session=session,
                                         unknown_reward=unknown_reward)
    env = FleetOpenEnvEnvironment(settings)
    try:
        assert env.reset().task_key == "no-verifier"  # the only task
        final = env.step(FleetServerAction(type="turn", text="Done."))
        assert final.done and final.reward == unknown_reward
        assert final.info["reward_unknown"] is True
        assert final.info["reward_status"] != "graded"
        assert env.state.reward is None and env.state.done
    finally:
        env.close()
    assert env.fleet_env is None


def test_concurrent_sessions_each_get_their_own_instance(server, local_fleet):
    async def one() -> tuple[float | None, str]:
        async with GenericEnvClient(base_url=server.url) as client:
            await client.reset(task=ACTION_TASK.key)
            for call in ACTION_TASK.reference_solution:
                await client.step({"tool_name": call.name, "arguments": dict(call.arguments)})
            final = await client.step({"text": "Done."})
            state = await client.state()
            return final.reward, state["instance_id"]

    async def three() -> list[tuple[float | None, str]]:
        return list(await asyncio.gather(one(), one(), one()))

    results = asyncio.run(three())
    assert [reward for reward, _ in results] == [1.0, 1.0, 1.0]
    instances = {instance for _, instance in results}
    assert len(instances) == 3
    wait_for(lambda: not instances & running_ids(local_fleet), timeout=30,
             what="the three sessions' instances to be deleted")


def test_serve_openenv_refuses_a_public_interface_unless_asked():
    from fleetenv.cli.main import main

    with pytest.raises(SystemExit, match=r"not a loopback address.*--allow-non-loopback"):
        main(["serve", "openenv", "--host", "0.0.0.0"])


# ---------------------------------------------------------------------- who may connect

#: A page of another site: its script opens the server's WebSocket (``?ws=...``) and
#: tries a reset; ``window.outcome`` says what happened.
CROSS_SITE_PAGE = """<!doctype html><title>elsewhere</title><script>
const target = new URLSearchParams(location.search);
window.outcome = null;
let opened = false;
const ws = new WebSocket(target.get("ws"));
ws.onopen = () => {
  opened = true;
  ws.send(JSON.stringify({type: "reset", data: {task: target.get("task")}}));
};
ws.onmessage = (event) => {
  window.outcome = {opened, reply: JSON.parse(event.data).type};
  ws.close();
};
ws.onclose = (event) => {
  if (window.outcome === null) window.outcome = {opened, code: event.code};
};
</script>"""


@contextmanager
def page_server(html: str) -> Iterator[str]:
    """``html`` served on another loopback port (another origin); yields its origin."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def all_ids(fleet: LocalFleet) -> set[str]:
    return {i["instance_id"] for i in fleet.instances()}


def browser_reset(page: Any, page_origin: str, server_url: str) -> dict[str, Any]:
    """Load the cross-site page in Chromium and wait for its reset attempt's outcome."""
    ws = server_url.replace("http://", "ws://") + "/ws"
    page.navigate(f"{page_origin}/?{urlencode({'ws': ws, 'task': ACTION_TASK.key})}")
    outcome: dict[str, Any] = wait_for(lambda: page.eval("window.outcome"), timeout=90,
                                       what="the page's WebSocket to open and answer, or close")
    return outcome


def test_a_web_page_of_another_site_cannot_reset_from_a_real_browser(server, local_fleet):
    """The attack: any page open in the user's browser opens ws://127.0.0.1:PORT/ws."""
    before = all_ids(local_fleet)
    with page_server(CROSS_SITE_PAGE) as origin, chromium_page("test_openenv_server") as page:
        outcome = browser_reset(page, origin, server.url)
    assert outcome == {"opened": False, "code": 1006}  # the handshake was refused
    assert all_ids(local_fleet) == before  # no instance was created


def test_an_allowed_origin_plays_from_a_real_browser(session, local_fleet):
    """The same page works once its origin is listed (so the refusal above is Origin's)."""
    before = all_ids(local_fleet)
    settings = FleetServerSettings.build(TASKS, session=session)
    with page_server(CROSS_SITE_PAGE) as origin, \
            OpenEnvServer(settings, allowed_origins=[origin + "/"]) as listed, \
            chromium_page("test_openenv_server") as page:
        outcome = browser_reset(page, origin, listed.url)
        assert outcome == {"opened": True, "reply": "observation"}
        page.navigate(listed.url + "/health")  # a page the server serves: same origin
        same_origin = page.eval("""new Promise((resolve) => {
            const ws = new WebSocket(location.origin.replace("http", "ws") + "/ws");
            ws.onopen = () => ws.send(JSON.stringify({type: "state"}));
            ws.onmessage = (event) => { resolve(JSON.parse(event.data).type); ws.close(); };
            ws.onclose = (event) => resolve("closed " + event.code);
        })""")
        assert same_origin == "state"
    created = all_ids(local_fleet) - before
    assert len(created) == 1  # the listed page's reset, deleted with its session
    wait_for(lambda: not created & running_ids(local_fleet), timeout=30,
             what="the page's instance to be deleted")


def test_http_with_a_foreign_origin_or_host_is_refused(server, local_fleet):
    before = all_ids(local_fleet)
    port = server.url.rsplit(":", 1)[1]
    reset = {"task": ACTION_TASK.key}
    evil_origin = requests.post(server.url + "/reset", json=reset, timeout=30,
                                headers={"Origin": "http://evil.example"})
    assert evil_origin.status_code == 403
    assert "Origin 'http://evil.example' is not this server's" in evil_origin.json()["detail"]
    rebound = requests.post(server.url + "/reset", json=reset, timeout=30,
                            headers={"Host": f"evil.example:{port}"})  # DNS rebinding
    assert rebound.status_code == 403
    assert "Host 'evil.example:" in rebound.json()["detail"]
    for host in (f"evil.example:{port}", "127.0.0.1:1", "127.0.0.1", f"127.0.0.1:{port}:1",
                 f"localhost.evil.example:{port}"):
        assert requests.get(server.url + "/health", headers={"Host": host},
                            timeout=30).status_code == 403, host
    for host in (f"LocalHost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):  # loopback
        assert requests.get(server.url + "/health", headers={"Host": host},
                            timeout=30).status_code == 200, host
    same = requests.get(server.url + "/schema", headers={"Origin": server.url}, timeout=30)
    assert same.status_code == 200  # a page the server served
    assert all_ids(local_fleet) == before


def test_a_websocket_with_a_foreign_origin_is_refused_before_it_opens(server):
    import websockets

    async def handshake(origin: str) -> int:
        try:
            async with websockets.connect(server.url.replace("http://", "ws://") + "/ws",
                                          origin=origin, open_timeout=10):
                return 101
        except websockets.InvalidStatus as exc:
            return int(exc.response.status_code)

    assert asyncio.run(handshake("http://evil.example")) == 403
    assert asyncio.run(handshake("null")) == 403  # a sandboxed or file:// page
    assert asyncio.run(handshake(server.url)) == 101


TOKEN = "t0ken-for-the-tests-only-1234567"


def test_a_token_is_needed_when_set_and_sent_in_the_base_url(session, local_fleet):
    from fleetenv.adapters.openenv.access import url_with_token

    settings = FleetServerSettings.build(TASKS, session=session, default_task=ACTION_TASK.key)
    with OpenEnvServer(settings, token=TOKEN) as guarded:
        url = url_with_token(guarded.url, TOKEN)
        assert url == guarded.url.replace("http://", f"http://fleetenv:{TOKEN}@")
        assert requests.get(guarded.url + "/health", timeout=30).status_code == 401
        wrong = url_with_token(guarded.url, TOKEN[:-1] + "x")
        assert requests.get(wrong + "/health", timeout=30).status_code == 401
        assert requests.get(url + "/health", timeout=30).status_code == 200
        with pytest.raises(ConnectionError, match="401"), \
                GenericEnvClient(base_url=guarded.url).sync() as client:
            client.reset()
        # openenv-core's clients send the URL's userinfo as Basic auth (websockets on
        # /ws, requests in the validator): no other change for the client.
        with GenericEnvClient(base_url=url).sync() as client:
            assert client.reset().observation["task_key"] == ACTION_TASK.key
        assert validate_running_environment(url, timeout_s=30)["passed"]
        # With a token, any Host passes: a rebound page cannot know the token.
        assert requests.get(url + "/health", headers={"Host": "proxy.example"},
                            timeout=30).status_code == 200


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"token": "short"}, "at least 16 printable ASCII characters"),
    ({"token": "has a space in it, sixteen+"}, "without spaces"),
    ({"allowed_origins": ["http://x.example/path"]}, "is not an origin"),
    ({"allowed_origins": ["x.example"]}, "is not an origin"),
])
def test_bad_access_settings_are_named_at_startup(session, kwargs, message):
    from fleetenv.adapters.openenv.server import create_fleet_app
    from fleetenv.core.errors import ConfigurationError

    settings = FleetServerSettings.build(TASKS, session=session)
    with pytest.raises(ConfigurationError, match=message) as caught:
        create_fleet_app(settings, **kwargs)
    assert "short" not in str(caught.value) and "sixteen" not in str(caught.value)
