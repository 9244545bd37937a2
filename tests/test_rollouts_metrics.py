"""Metrics over rollout results, checked against numbers worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from fleetenv.core.types import RolloutResult
from fleetenv.rollouts.metrics import MetricsError, pass_at_k, percentile, summarize


def test_pass_at_k_matches_hand_computed_values() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)          # c/n
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)          # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)          # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 3, 3) == 1.0                         # n-c = 2 < k: always a pass
    assert pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    # Large n stays exact: 1 - C(900,10)/C(1000,10)
    expected = 1 - math.prod((900 - i) / (1000 - i) for i in range(10))
    assert pass_at_k(1000, 100, 10) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 6), (5, 2, 0), (5, 6, 1), (0, 0, 1),
                                           (5, -1, 1)])
def test_pass_at_k_rejects_undefined_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(MetricsError):
        pass_at_k(n, c, k)


def test_percentile_interpolates_linearly() -> None:
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)      # 1 + 9 * 0.9
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(MetricsError):
        percentile([], 50)


def _result(task: str, env: str, reward: float | None, *, index: int, graded: bool = True,
            error: str | None = None, tool_errors: int = 0,
            stop: str = "agent_done") -> RolloutResult:
    return RolloutResult(
        task_key=task, env_key=env, sample=index, reward=reward,
        grade_status="graded" if graded and reward is not None else "unknown",
        stop_reason="error" if error else stop, turns=2 if error is None else 0,
        tool_calls=2, tool_errors=tool_errors,
        error={"type": error, "message": "boom"} if error else None,
        instance_id=None if error else f"inst-{task}-{index}",
        timings={"total_s": float(index), "provision_s": index / 10.0},
    )


def _batch() -> list[RolloutResult]:
    """Task A: 5 graded, rewards 1 1 0 0 1 (c=3); task B: 5 graded zeros + 1 ungraded;
    task C: 1.0 and 0.5 with a tool error each; task D: one provisioning failure.
    total_s runs 1..14 over the 14 rollouts."""
    counter = iter(range(1, 15))
    batch = [_result("A", "e1", r, index=next(counter)) for r in (1.0, 1.0, 0.0, 0.0, 1.0)]
    batch += [_result("B", "e1", 0.0, index=next(counter)) for _ in range(3)]
    batch.append(_result("B", "e1", None, index=next(counter), graded=False))
    batch += [_result("B", "e1", 0.0, index=next(counter)) for _ in range(2)]
    batch += [_result("C", "e2", r, index=next(counter), tool_errors=1,
                      stop="max_steps") for r in (1.0, 0.5)]
    batch.append(_result("D", "e2", None, index=next(counter), error="PermanentProvisioningError"))
    assert len(batch) == 14
    return batch


def test_summary_numbers_match_hand_computation() -> None:
    summary = summarize(_batch(), ks=(1, 3))
    assert (summary.rollouts, summary.tasks, summary.graded, summary.ungraded,
            summary.errors, summary.passed) == (14, 4, 12, 2, 1, 4)
    # Mean over graded only: (3 + 0 + 1.5) / 12, never (4.5 / 14) with None as 0.
    assert summary.mean_reward == pytest.approx(0.375)
    assert summary.pass_rate == pytest.approx(4 / 12)

    at1, at3 = summary.pass_at_k
    # pass@1: A 3/5, B 0, C 1/2; D has no graded sample and is excluded.
    assert at1.value == pytest.approx((0.6 + 0.0 + 0.5) / 3)
    assert (at1.tasks, at1.excluded, at1.label) == (3, 1, "pass@1 (n=2..5)")
    # pass@3: A (n=5, c=3 -> 1.0), B (0.0); C (n=2) and D are excluded.
    assert at3.value == pytest.approx(0.5)
    assert (at3.tasks, at3.excluded, at3.label) == (2, 2, "pass@3 (n=5)")

    # Population variance per task: A mean .6 -> (3*.16 + 2*.36)/5 = .24; B 0;
    # C mean .75 -> (.0625 + .0625)/2 = .0625.
    assert summary.reward_variance_per_task == pytest.approx({"A": 0.24, "B": 0.0,
                                                              "C": 0.0625})
    assert summary.variance_tasks == 3
    assert summary.nonzero_variance_share == pytest.approx(2 / 3)
    assert summary.mean_reward_variance == pytest.approx((0.24 + 0.0625) / 3)

    assert (summary.tool_calls, summary.tool_errors) == (28, 2)
    assert summary.tool_error_rate == pytest.approx(2 / 28)
    assert summary.stop_reasons == {"agent_done": 11, "max_steps": 2, "error": 1}
    assert summary.error_types == {"PermanentProvisioningError": 1}

    # total_s = 1..14: p50 = 7.5, p90 at position 11.7 -> 12.7, p99 at 12.87 -> 13.87.
    assert (summary.total_s.p50, summary.total_s.p90, summary.total_s.p99) == pytest.approx(
        (7.5, 12.7, 13.87))
    assert summary.total_s.count == 14
    # provision_s only where an instance existed (D failed to provision): 0.1..1.3.
    assert summary.provision_s.count == 13
    assert summary.provision_s.p50 == pytest.approx(0.7)

    e1, e2 = summary.per_env
    assert (e1.env_key, e1.rollouts, e1.graded, e1.passed, e1.errors) == ("e1", 11, 10, 3, 0)
    assert e1.mean_reward == pytest.approx(0.3) and e1.pass_rate == pytest.approx(0.3)
    assert e1.tool_error_rate == 0.0 and e1.mean_turns == pytest.approx(2.0)
    assert (e2.env_key, e2.rollouts, e2.graded, e2.passed, e2.errors) == ("e2", 3, 2, 1, 1)
    assert e2.mean_reward == pytest.approx(0.75)
    assert e2.tool_error_rate == pytest.approx(2 / 6)
    assert e2.mean_turns == pytest.approx(4 / 3)


def test_summary_renders_as_json_and_as_a_table() -> None:
    summary = summarize(_batch(), ks=(1, 3))
    data = json.loads(json.dumps(summary.to_dict()))
    assert [p["label"] for p in data["pass_at_k"]] == ["pass@1 (n=2..5)", "pass@3 (n=5)"]
    assert data["mean_reward"] == pytest.approx(0.375)

    table = summary.format_table()
    assert "pass@3 (n=5)" in table and "2 excluded (fewer than 3 graded samples)" in table
    assert "12 graded, 2 ungraded" in table
    assert "tasks with nonzero variance" in table and "2/3" in table
    assert "7.50 s" in table and "p90 12.70 s, p99 13.87 s (14 rollouts)" in table
    env_lines = [line for line in table.splitlines() if line.startswith(("e1 ", "e2 "))]
    assert len(env_lines) == 2 and "30.0%" in env_lines[0]
    widths = {len(line) for line in env_lines}
    assert len(widths) == 1  # fixed width columns
    assert "PermanentProvisioningError" in table


def test_summary_of_nothing_graded_has_no_numbers_not_zeros() -> None:
    results = [_result("A", "e1", None, index=1, error="ValueError"),
               _result("A", "e1", None, index=2, graded=False)]
    summary = summarize(results, ks=(1,))
    assert summary.mean_reward is None and summary.pass_rate is None
    assert summary.pass_at_k[0].value is None and summary.pass_at_k[0].excluded == 1
    assert summary.pass_at_k[0].label == "pass@1 (no graded sample)"
    assert summary.nonzero_variance_share is None
    assert "-" in summary.format_table()
    empty = summarize([])
    assert empty.rollouts == 0 and empty.total_s.count == 0
    assert "rollouts 0" in empty.format_table()


def test_summarize_rejects_bad_k() -> None:
    with pytest.raises(MetricsError, match="k >= 1"):
        summarize(_batch(), ks=(0,))


def test_to_metrics_is_flat_named_and_leaves_out_undefined_values() -> None:
    metrics = summarize(_batch(), ks=(1, 3)).to_metrics()
    assert metrics["reward/mean"] == pytest.approx(0.375)
    assert metrics["reward/pass_at_1"] == pytest.approx((0.6 + 0.0 + 0.5) / 3)
    assert metrics["reward/pass_at_3"] == pytest.approx(0.5)
    assert metrics["reward/signal_ratio"] == pytest.approx(2 / 3)
    assert (metrics["reward/graded"], metrics["reward/ungraded"]) == (12.0, 2.0)
    assert metrics["rollout/tool_error_rate"] == pytest.approx(2 / 28)
    assert metrics["reward/e2/mean"] == pytest.approx(0.75)
    assert all(isinstance(v, float) for v in metrics.values())
    # Nothing graded: the reward means are undefined, so they are absent, not 0.
    empty = summarize([_result("D", "e2", None, index=1, error="X")]).to_metrics()
    assert "reward/mean" not in empty and "reward/pass_rate" not in empty
    assert empty["rollout/errors"] == 1.0


def test_a_result_with_more_tool_errors_than_calls_never_rates_above_100_percent() -> None:
    # Written before refused calls counted as calls: 4 errors (2 of them refused), 2 calls.
    old = RolloutResult(task_key="A", env_key="e1", reward=0.0, grade_status="graded",
                        tool_calls=2, tool_errors=4)
    summary = summarize([old, _result("B", "e1", 1.0, index=1)])
    assert (summary.tool_errors, summary.tool_calls) == (4, 4 + 2)
    assert summary.tool_error_rate == pytest.approx(4 / 6)
    alone = summarize([old])
    assert alone.tool_error_rate == 1.0 and alone.per_env[0].tool_error_rate == 1.0
    assert "100.0%  4/4 calls" in alone.format_table()
    assert alone.to_metrics()["rollout/tool_error_rate"] == 1.0
