"""Summaries of a batch of rollouts: what an eval reports and what a GRPO loop logs.

The counting rules are docs/rollouts.md, "Metrics". Each is made so a number cannot
silently mean something else: only graded rewards enter means, pass rates and pass@k
(an ungraded rollout is counted next to them, never averaged in as 0.0); a task with
fewer than k graded samples is excluded from pass@k and counted as excluded, since any
value for it would be a guess; every pass@k label names k and n.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fleetenv.core.errors import ArgumentTypeError, MetricsError
from fleetenv.core.types import RolloutResult

__all__ = [
    "EnvBreakdown",
    "MetricsError",
    "PassAtK",
    "Percentiles",
    "Summary",
    "pass_at_k",
    "percentile",
    "summarize",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) passes.

    Exact integer arithmetic (``math.comb``), so large n loses no precision.
    """
    if n < 1 or not 0 <= c <= n:
        raise MetricsError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise MetricsError(f"pass@{k} is undefined from n={n} samples",
                           hint="ask for k between 1 and the number of samples per task")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values`` by linear interpolation."""
    if not values:
        raise MetricsError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _variance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class PassAtK:
    """pass@k averaged over the tasks that have at least k graded samples."""

    k: int
    value: float | None
    tasks: int
    """Tasks included in the mean."""
    excluded: int
    """Tasks left out because they have fewer than k graded samples."""
    n_min: int = 0
    n_max: int = 0

    @property
    def label(self) -> str:
        if not self.tasks:  # e.g. every episode failed: say so, not a cryptic "n<1"
            if self.k == 1:
                return "pass@1 (no graded sample)"
            return f"pass@{self.k} (no task has {self.k} graded samples)"
        n = f"{self.n_min}" if self.n_min == self.n_max else f"{self.n_min}..{self.n_max}"
        return f"pass@{self.k} (n={n})"


@dataclass(frozen=True)
class Percentiles:
    """p50 / p90 / p99 of a duration in seconds (``None`` without data)."""

    count: int = 0
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls()
        return cls(len(values), percentile(values, 50), percentile(values, 90),
                   percentile(values, 99))

    def format_tail(self) -> str:
        """``"p90 12.70 s, p99 13.87 s (14 rollouts)"``; empty without data."""
        if not self.count:
            return ""
        return f"p90 {_secs(self.p90)}, p99 {_secs(self.p99)} ({self.count} rollouts)"


@dataclass(frozen=True)
class EnvBreakdown:
    """The numbers of one environment (``env_key`` as provisioned, ``key:version``)."""

    env_key: str
    rollouts: int
    graded: int
    passed: int
    pass_rate: float | None
    mean_reward: float | None
    tool_calls: int
    tool_errors: int
    tool_error_rate: float | None
    mean_turns: float | None
    errors: int


@dataclass(frozen=True)
class Summary:
    """What :func:`summarize` found. ``to_dict()`` for JSON, ``format_table()`` for people."""

    rollouts: int
    tasks: int
    graded: int
    ungraded: int
    errors: int
    passed: int
    pass_rate: float | None
    """Passed / graded."""
    mean_reward: float | None
    """Mean of graded rewards (``None`` when nothing was graded)."""
    pass_at_k: tuple[PassAtK, ...]
    reward_variance_per_task: dict[str, float]
    mean_reward_variance: float | None
    variance_tasks: int
    """Tasks with at least two graded samples (the ones a variance is defined for)."""
    nonzero_variance_share: float | None
    tool_calls: int
    tool_errors: int
    tool_error_rate: float | None
    stop_reasons: dict[str, int]
    error_types: dict[str, int]
    per_env: tuple[EnvBreakdown, ...]
    total_s: Percentiles = field(default_factory=Percentiles)
    provision_s: Percentiles = field(default_factory=Percentiles)

    def to_metrics(self) -> dict[str, float]:
        """Flat ``name -> number`` for a trainer's logger (W&B, TensorBoard, Tinker's
        ``ml_log``), with the names the Tinker and SkyRL Fleet loops log. Undefined values
        (nothing graded) are left out rather than logged as 0.
        """
        values: dict[str, float | None] = {
            "reward/mean": self.mean_reward,
            "reward/pass_rate": self.pass_rate,
            "reward/variance_per_prompt": self.mean_reward_variance,
            "reward/signal_ratio": self.nonzero_variance_share,
            "reward/graded": float(self.graded),
            "reward/ungraded": float(self.ungraded),
            "rollout/count": float(self.rollouts),
            "rollout/errors": float(self.errors),
            "rollout/tool_calls": float(self.tool_calls),
            "rollout/tool_error_rate": self.tool_error_rate,
            "time/total_s_p50": self.total_s.p50,
            "time/total_s_p90": self.total_s.p90,
            "time/provision_s_p50": self.provision_s.p50,
        }
        for p in self.pass_at_k:
            values[f"reward/pass_at_{p.k}"] = p.value
        for env in self.per_env:
            values[f"reward/{env.env_key}/pass_rate"] = env.pass_rate
            values[f"reward/{env.env_key}/mean"] = env.mean_reward
            values[f"rollout/{env.env_key}/tool_error_rate"] = env.tool_error_rate
            values[f"rollout/{env.env_key}/turns"] = env.mean_turns
        return {name: float(value) for name, value in values.items() if value is not None}

    def _repr_html_(self) -> str:
        """Jupyter's rich display of the table."""
        from fleetenv.core.rendering import summary_html

        return summary_html(self.format_table())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["pass_at_k"] = [dict(asdict(p), label=p.label) for p in self.pass_at_k]
        return data

    def format_table(self) -> str:
        """A compact fixed-width text table for the terminal."""
        lines = [f"rollouts {self.rollouts}  tasks {self.tasks}  graded {self.graded}  "
                 f"ungraded {self.ungraded}  errors {self.errors}", ""]
        rows: list[tuple[str, str, str]] = []
        for p in self.pass_at_k:
            note = f"{p.tasks} tasks" + (f", {p.excluded} excluded (fewer than {p.k} "
                                         "graded samples)" if p.excluded else "")
            rows.append((p.label, _num(p.value), note))
        rows.append(("mean reward (graded)", _num(self.mean_reward),
                     f"{self.graded} graded, {self.ungraded} ungraded"))
        rows.append(("pass rate (graded)", _pct(self.pass_rate),
                     f"{self.passed}/{self.graded}"))
        rows.append(("reward variance per task", _num(self.mean_reward_variance),
                     f"mean over {self.variance_tasks} tasks with >= 2 graded samples"))
        nonzero = (round(self.nonzero_variance_share * self.variance_tasks)
                   if self.nonzero_variance_share is not None else 0)
        rows.append(("tasks with nonzero variance", _pct(self.nonzero_variance_share),
                     f"{nonzero}/{self.variance_tasks}"))
        rows.append(("tool-error rate", _pct(self.tool_error_rate),
                     f"{self.tool_errors}/{self.tool_calls} calls"))
        for name, pct in (("total_s", self.total_s), ("provision_s", self.provision_s)):
            rows.append((f"{name} p50", _secs(pct.p50), pct.format_tail()))
        width = max(len(r[0]) for r in rows)
        value_width = max(len(r[1]) for r in rows)
        lines += [f"{a:<{width}}  {b:>{value_width}}  {c}".rstrip() for a, b, c in rows]

        if self.per_env:
            lines.append("")
            env_width = max(len("env"), *(len(e.env_key) for e in self.per_env))
            lines.append(f"{'env':<{env_width}}  {'rollouts':>8}  {'pass':>6}  "
                         f"{'reward':>6}  {'tool err':>8}  {'turns':>5}  {'errors':>6}")
            for e in self.per_env:
                lines.append(f"{e.env_key:<{env_width}}  {e.rollouts:>8}  "
                             f"{_pct(e.pass_rate):>6}  {_num(e.mean_reward):>6}  "
                             f"{_pct(e.tool_error_rate):>8}  {_num(e.mean_turns, 1):>5}  "
                             f"{e.errors:>6}")
        for title, counts in (("stop reason", self.stop_reasons), ("error", self.error_types)):
            if counts:
                lines.append("")
                name_width = max(len(title), *(len(k) for k in counts))
                lines.append(f"{title:<{name_width}}  {'count':>6}")
                for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
                    lines.append(f"{name:<{name_width}}  {count:>6}")
        return "\n".join(lines)


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _tool_totals(results: list[RolloutResult]) -> tuple[int, int]:
    """Tool calls and tool errors, the two sides of every tool-error rate. A result
    written before refused calls counted as calls can hold more errors than calls: each
    of its errors was a call."""
    calls = sum(max(r.tool_calls, r.tool_errors) for r in results)
    return calls, sum(r.tool_errors for r in results)


def _graded_reward(result: RolloutResult) -> float | None:
    return result.reward if result.graded and result.reward is not None else None


def summarize(results: Iterable[RolloutResult], ks: Sequence[int] = (1,)) -> Summary:
    """Summarise ``results`` (any iterable: a list, ``read_results(...)``, a runner).

    ``ks``: the k of every pass@k to compute; each must be >= 1.
    """
    bad = [k for k in ks if not isinstance(k, int) or k < 1]
    if bad:
        raise MetricsError(f"pass@k needs whole numbers k >= 1, got {bad}")
    items = _results_of(results)
    by_task: dict[str, list[float]] = defaultdict(list)
    tasks: set[str] = set()
    by_env: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in items:
        tasks.add(result.task_key)
        by_env[result.env_key].append(result)
        reward = _graded_reward(result)
        if reward is not None:
            by_task[result.task_key].append(reward)

    graded_rewards = [r for rewards in by_task.values() for r in rewards]
    passed = sum(1 for r in graded_rewards if r >= 1.0)
    variances = {task: _variance(rewards) for task, rewards in sorted(by_task.items())
                 if len(rewards) >= 2}
    nonzero = sum(1 for v in variances.values() if v > 0)
    tool_calls, tool_errors = _tool_totals(items)
    return Summary(
        rollouts=len(items),
        tasks=len(tasks),
        graded=len(graded_rewards),
        ungraded=len(items) - len(graded_rewards),
        errors=sum(1 for r in items if r.error is not None),
        passed=passed,
        pass_rate=_rate(passed, len(graded_rewards)),
        mean_reward=_mean(graded_rewards),
        pass_at_k=tuple(_pass_at(k, by_task, len(tasks)) for k in dict.fromkeys(ks)),
        reward_variance_per_task=variances,
        mean_reward_variance=_mean(list(variances.values())),
        variance_tasks=len(variances),
        nonzero_variance_share=_rate(nonzero, len(variances)),
        tool_calls=tool_calls,
        tool_errors=tool_errors,
        tool_error_rate=_rate(tool_errors, tool_calls),
        stop_reasons=dict(Counter(r.stop_reason or "unknown" for r in items)),
        error_types=dict(Counter(r.error.get("type", "unknown") for r in items if r.error)),
        per_env=tuple(_env_breakdown(env, rs) for env, rs in sorted(by_env.items())),
        total_s=Percentiles.of([r.timings["total_s"] for r in items if "total_s" in r.timings]),
        provision_s=Percentiles.of([r.timings["provision_s"] for r in items
                                    if "provision_s" in r.timings and r.instance_id]),
    )


def _results_of(results: object) -> list[RolloutResult]:
    """``results`` as a list, refusing what is not rollout results with what to pass."""
    where = "summarize(results)"
    if isinstance(results, str | bytes | os.PathLike):
        raise ArgumentTypeError(f"{where} needs rollout results, got the path {results!r:.80}",
                                hint="summarize(fleetenv.read_results(path))")
    if not isinstance(results, Iterable):
        raise ArgumentTypeError(f"{where} needs an iterable of RolloutResult, got a "
                                f"{type(results).__name__}",
                                hint="pass a list of results, read_results(path) or a runner")
    items = list(results)
    for item in items:
        if not isinstance(item, RolloutResult):
            hint = ("turn dicts into results with fleetenv.RolloutResult.from_dict(d)"
                    if isinstance(item, dict) else "pass what run_episode / Runner returned")
            raise ArgumentTypeError(f"{where} needs RolloutResult items, got a "
                                    f"{type(item).__name__}", hint=hint)
    return items


def _pass_at(k: int, by_task: dict[str, list[float]], all_tasks: int) -> PassAtK:
    values: list[float] = []
    sizes: list[int] = []
    for rewards in by_task.values():
        n = len(rewards)
        if n >= k:
            values.append(pass_at_k(n, sum(1 for r in rewards if r >= 1.0), k))
            sizes.append(n)
    return PassAtK(k=k, value=_mean(values), tasks=len(values),
                   excluded=all_tasks - len(values),
                   n_min=min(sizes, default=0), n_max=max(sizes, default=0))


def _env_breakdown(env_key: str, results: list[RolloutResult]) -> EnvBreakdown:
    rewards = [r for r in (_graded_reward(x) for x in results) if r is not None]
    passed = sum(1 for r in rewards if r >= 1.0)
    calls, errors = _tool_totals(results)
    return EnvBreakdown(
        env_key=env_key, rollouts=len(results), graded=len(rewards), passed=passed,
        pass_rate=_rate(passed, len(rewards)), mean_reward=_mean(rewards),
        tool_calls=calls, tool_errors=errors, tool_error_rate=_rate(errors, calls),
        mean_turns=_mean([float(r.turns) for r in results]),
        errors=sum(1 for r in results if r.error is not None),
    )
