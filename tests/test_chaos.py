"""A smaller run of the chaos suite (tests/chaos/run.py) on every CI run, with two seeds."""

from __future__ import annotations

import pytest
from chaos.run import passed, run_chaos

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("seed", [11, 20261121])
def test_chaos_100_episodes_nothing_hangs_leaks_or_is_lost(seed: int) -> None:
    lines = [f"replay: python tests/chaos/run.py --episodes 100 --workers 16 "
             f"--fault-rate 0.3 --seed {seed}"]
    summary = run_chaos(episodes=100, workers=16, fault_rate=0.3, seed=seed, log=lines.append)
    report = "\n".join(lines)
    assert summary["results"] == summary["episodes"] == 100, report
    assert summary["leaked_instances"] == 0, report
    assert summary["stray_threads"] == 0, report
    assert summary["duplicate_tool_calls"] == 0, report
    assert summary["unaccounted"] == 0, report
    assert summary["wrong_rewards"] == 0, report
    assert summary["max_episode_s"] <= summary["deadline_s"], report
    assert passed(summary), report
