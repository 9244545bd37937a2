"""The threads of a run: the runtime's loop and its one bounded pool, nothing else.

A fresh process (so no other test's thread can hide or fake anything) runs 64 episodes
with a ``Runner`` against a local Fleet in a process of its own. It samples the names of
its threads while the run goes on and lists them after the runner closed. Before, a run
also started pools and threads of its own (the asyncio mode's fleetenv-episode-io and
fleetenv-episode-policy pools, a thread per SSL context build and per slow import, ...).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from fleetenv import runtime
from fleetenv.local import LocalFleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUN_SCRIPT = """
import json, os, threading
import fleetenv
from fleetenv import bundled_tasks_path

tasks = [t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use"]
config = fleetenv.resolve_config(api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"])
seen, done = set(), threading.Event()

def sample():
    while not done.is_set():
        seen.update(t.name for t in threading.enumerate())
        done.wait(0.02)

sampler = threading.Thread(target=sample, name="test-sampler")
sampler.start()
with fleetenv.Runner(workers=64, mode=os.environ["T_MODE"], config=config,
                     events=fleetenv.EventBus(sinks=[]), progress=False) as runner:
    results = list(runner.run(tasks[:4] * 16, "reference"))
stops = [str(r.stop_reason) for r in results]
errors = sorted({str(r.error) for r in results if r.error})
done.set()
sampler.join()
after = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
print(json.dumps({"stops": stops, "errors": errors, "during": sorted(seen),
                  "after": after}), flush=True)
"""

RUNTIME = re.compile(rf"^({runtime.LOOP_THREAD_NAME}|{runtime.POOL_THREAD_PREFIX}_\d+)$")
RUNNER_WORKER = re.compile(r"^fleetenv-rollout_\d+$")
OURS = {"MainThread", "test-sampler"}  # the script's own threads


@pytest.fixture(scope="module")
def fleet() -> Iterator[LocalFleet]:
    # Verifying 64 episodes at once on a small machine can take a while: the episodes'
    # ending is what counts here, not their grade.
    with LocalFleet(in_process=False, verifier_timeout=120.0) as running:
        yield running


def _run(fleet: LocalFleet, mode: str) -> dict[str, Any]:
    env = {**os.environ, "T_KEY": fleet.token, "T_URL": fleet.base_url, "T_MODE": mode}
    done = subprocess.run([sys.executable, "-c", RUN_SCRIPT], capture_output=True, text=True,
                          timeout=540, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["stops"] == ["agent_done"] * 64, report["errors"]
    return report


def _pool(names: list[str]) -> list[str]:
    return [name for name in names if name.startswith(runtime.POOL_THREAD_PREFIX)]


@pytest.mark.parametrize("mode", ["threads", "asyncio"])
def test_a_run_has_the_loop_one_bounded_pool_and_its_workers_only(
        fleet: LocalFleet, mode: str) -> None:
    report = _run(fleet, mode)
    during, after = report["during"], report["after"]
    workers = [name for name in during if RUNNER_WORKER.match(name)]
    others = [name for name in during if name not in OURS and not RUNTIME.match(name)
              and not RUNNER_WORKER.match(name)]
    assert not others, f"threads besides the runtime's and the runner's: {others}"
    assert runtime.LOOP_THREAD_NAME in during
    assert len(_pool(during)) <= runtime.MAX_POOL_THREADS, _pool(during)
    if mode == "threads":
        assert 0 < len(workers) <= 64, workers
    else:  # the episodes are coroutines on the loop: no thread of their own
        assert not workers, workers
    # After close: the runtime's threads only (idle pool threads stay until exit).
    assert all(RUNTIME.match(name) for name in after), after
