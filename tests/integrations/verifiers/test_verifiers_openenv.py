"""The verifiers recipe, end to end: ``vf-eval`` on Fleet tasks through the OpenEnv server.

verifiers 0.4's own OpenEnv taskset (``id = "openenv"``) connects to a running OpenEnv
server by ``base_url`` and plays one task per ``resets`` entry; fleetenv's server is that
OpenEnv server. The model is a scripted OpenAI-compatible server on loopback that plays
each task's reference solution, verifiers' ``null`` harness runs it as a subprocess, and
the grade comes from the local Fleet's verifier.

Runs only where verifiers is installed (``.ci/verifiers`` builds that virtualenv: verifiers
pins ``mcp==2.0.0``, so it cannot share the dev virtualenv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers.v1.tasksets.openenv")
pytest.importorskip("fleetenv.adapters.openenv.server")

from _support.waiting import wait_for
from scripted_model import ScriptedModel

from fleetenv import bundled_tasks_path
from fleetenv.adapters.openenv.server import FleetServerSettings, OpenEnvServer
from fleetenv.core.task_files import load_tasks
from fleetenv.fleet.session import Session
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(600)

TASKS = {task.key: task for task in load_tasks(bundled_tasks_path())}
#: One task solved by tool calls then a final text turn; one that submits an answer.
KEYS = ["helpdesk-assign-api-ticket", "helpdesk-busiest-agent"]


@pytest.fixture
def openenv_server(local_fleet: LocalFleet) -> Iterator[OpenEnvServer]:
    with Session(api_key=local_fleet.token, base_url=local_fleet.base_url) as session, \
            OpenEnvServer(FleetServerSettings.build(list(TASKS.values()), session=session)
                          ) as server:
        yield server


def eval_config(server_url: str, model_url: str) -> str:
    resets = ", ".join(f'{{task = "{key}"}}' for key in KEYS)
    return f'''model = "scripted-reference"
push = false
max_concurrent = 2

[client]
base_url = "{model_url}"
api_key_var = "SCRIPTED_MODEL_KEY"

[env.taskset]
id = "openenv"
base_url = "{server_url}"
resets = [{resets}]

[env.player.harness]
id = "null"

[env.player.runtime]
type = "subprocess"
'''


def test_vf_eval_plays_fleet_tasks_through_the_openenv_server(openenv_server, local_fleet,
                                                              tmp_path: Path):
    solutions = {key: [{"tool_name": call.name, "arguments": dict(call.arguments)}
                       for call in TASKS[key].reference_solution] for key in KEYS}
    vf_eval = Path(sys.executable).with_name("vf-eval")
    with ScriptedModel(solutions) as model:
        (tmp_path / "eval.toml").write_text(eval_config(openenv_server.url, model.base_url))
        done = subprocess.run(
            [str(vf_eval), "@", "eval.toml", "--no-rich"], cwd=tmp_path, text=True,
            capture_output=True, timeout=500,
            env={**os.environ, "SCRIPTED_MODEL_KEY": "not-a-secret"})
        assert done.returncode == 0, done.stderr[-4000:]

    (traces_file,) = tmp_path.glob("outputs/*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    assert len(episodes) == len(KEYS)
    played: dict[str, Any] = {}
    for episode in episodes:
        errors = episode["errors"] + [e for t in episode["traces"] for e in t["errors"]]
        assert episode["ok"] and not errors, ([e["message"] for e in errors],
                                              done.stderr[-4000:])
        (trace,) = episode["traces"]
        played[episode["task"]["data"]["reset"]["task"]] = trace["rewards"]
    assert played == {key: {"openenv_reward": {"score": 1.0, "weight": 1.0}} for key in KEYS}
    assert len(model.requests) >= sum(len(s) for s in solutions.values())
    # Every OpenEnv session verifiers opened has been closed, and its instance deleted.
    wait_for(lambda: not local_fleet.instances(status="running"), timeout=30,
             what="the episodes' instances to be deleted")
