"""A smaller run of the chaos suite (tests/chaos/run.py) on every CI run."""

from __future__ import annotations

import pytest
from chaos.run import passed, run_chaos

pytestmark = pytest.mark.timeout(300)


def test_chaos_100_episodes_nothing_hangs_leaks_or_is_lost() -> None:
    lines: list[str] = []
    summary = run_chaos(episodes=100, workers=16, fault_rate=0.3, seed=11, log=lines.append)
    report = "\n".join(lines)
    assert summary["results"] == summary["episodes"] == 100, report
    assert summary["leaked_instances"] == 0, report
    assert summary["stray_threads"] == 0, report
    assert summary["duplicate_tool_calls"] == 0, report
    assert summary["unaccounted"] == 0, report
    assert summary["wrong_rewards"] == 0, report
    assert summary["max_episode_s"] <= summary["deadline_s"], report
    assert passed(summary)
