"""Every example runs as a user would run it: a fresh interpreter, no Fleet key (so the
embedded local Fleet), exit status 0 within its time limit."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.core.config import ENV_API_KEY, ENV_BASE_URL

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

HAVE_COOKBOOK = importlib.util.find_spec("tinker_cookbook") is not None
if os.environ.get("FLEETENV_REQUIRE_TINKER") and not HAVE_COOKBOOK:  # .ci/tinker: no skips
    raise RuntimeError("FLEETENV_REQUIRE_TINKER is set but tinker_cookbook is not importable")


def _tinker_output() -> re.Pattern[str]:
    """The whole of tinker_env.py's output: its group of four, each episode solved by the
    task's reference calls, where tinker-cookbook is installed (.ci/tinker); elsewhere
    the one line saying it skipped and what to install."""
    if not HAVE_COOKBOOK:
        return re.compile(
            re.escape("tinker_env: skipped: fleetenv.adapters.tinker needs tinker-cookbook "
                      "(Python >= 3.11, with torch): pip install 'fleetenv[tinker]' ")
            + r"\(importing [\w.]+ failed: No module named '[\w.]+'\)\n")
    task = next(t for t in fleetenv.load_tasks(bundled_tasks_path())
                if t.key == "helpdesk-assign-api-ticket")
    calls = len(task.reference_solution or [])
    episode = (rf"  stop=completed turns={calls + 1} provision_s=\d+\.\d\d "
               rf"tool_calls={calls} tool_errors=0 grade=graded\n")
    return re.compile(re.escape("tinker_env: group rewards [1.0, 1.0, 1.0, 1.0]\n")
                      + f"(?:{episode}){{4}}")


# name -> (time limit in seconds, text the output must contain, or match as a whole)
CASES: dict[str, tuple[int, str | re.Pattern[str]]] = {
    "browser_use.py": (30, "browser_use stop_reason=agent_done reward=1.0"),
    "quickstart.py": (30, "reward=1.0"),
    "custom_policy.py": (30, "reward=1.0 (graded)"),
    "tinker_style_loop.py": (45, "step=1 episodes=16"),
    "context_tools.py": (30, "answer=34 reward=1.0 tool_calls=1 tool_errors=0"),
    "gymnasium_env.py": (30, "stop_reason=agent_done reward=1.0"),
    "traces.py": (30, "traces: 3 uploaded to trace job 'examples-traces'"),
    "evaluate_task.py": (30, "reference: mean score 1.00 over 4 rollouts (passed 4, graded 4)"),
    "skyrl_env.py": (30, "skyrl: 4 trajectories, mean reward 1.00"),
    # Without tinker-cookbook (Python >= 3.11 and torch) it says it skipped; .ci/tinker
    # runs it for real: about 12 s of CPU, most of it importing torch and the cookbook
    # (53 s of wall time measured on 2 loaded cores), so the limit of the adapter's tests.
    "tinker_env.py": (180, _tinker_output()),
    "openenv_server.py": (60, "openenv_server done=True stop_reason=agent_done reward=1.0"),
}


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


# Each case's pytest timeout is above its own limit, so the limit's clearer failure comes first.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.timeout(limit + 30))
                                  for name, (limit, _) in sorted(CASES.items())])
def test_example_runs_against_the_local_fleet(name: str, tmp_path: Path) -> None:
    limit, expected = CASES[name]
    env = {k: v for k, v in os.environ.items()
           if k not in (ENV_API_KEY, ENV_BASE_URL, "OPENAI_API_KEY")}
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=limit)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    if isinstance(expected, re.Pattern):
        assert expected.fullmatch(proc.stdout), f"{name} printed:\n{proc.stdout[-2000:]}"
    else:
        assert expected in proc.stdout
    assert "Traceback" not in proc.stderr
