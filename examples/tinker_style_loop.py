"""The skeleton of a synchronous GRPO-style training loop, with parallel rollouts.

    python examples/tinker_style_loop.py

A Tinker-style trainer is a plain ``for`` loop: sample a batch of tasks, roll out G
episodes per task with the current policy, score each episode against its group (GRPO:
advantage = reward - mean reward of the same task's group), take an optimiser step, log
metrics, repeat. fleetenv's ``Runner`` does the rollout part from this ordinary
synchronous code: ``runner.run(batch, policy, samples_per_task=G)`` plays every episode
on a thread pool (all MCP traffic shares fleetenv's one event-loop thread) and yields
results as they finish. One broken episode is an error result, never a dead batch.

Here the "model" is a plain function standing in for one: it replays each task's
reference solution but gives up early at random, so the groups have mixed rewards and
the advantages are not all zero. Replace it with your sampler (a function of the
``PolicyContext``, or ``PolicySpec("openai", {...})`` for a vLLM / OpenAI server) and
replace ``optimizer_step`` with your trainer's update.

Rewards that are ``None`` (the verifier could not grade, or the episode failed) are left
out of the group statistics instead of being counted as 0.0: a crashed verifier says
nothing about the policy.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

from fleetenv import (
    Done,
    PolicyContext,
    RolloutResult,
    Runner,
    ToolCall,
    bundled_tasks_path,
    load_tasks,
    summarize,
)

STEPS = 2  # optimiser steps
BATCH = 4  # tasks per step
GROUP = 4  # samples per task (G)
GIVE_UP = 0.15  # chance per turn that the stand-in model stops early


def stand_in_model(context: PolicyContext) -> Any:
    """The reference solution, one call per turn, abandoned at random (thread-safe:
    ``random.random`` is safe to call from the runner's worker threads)."""
    solution = context.task.reference_solution or []
    if context.turn >= len(solution) or random.random() < GIVE_UP:
        return Done()
    call = solution[context.turn]
    return ToolCall(call.name, call.arguments)


def group_advantages(results: list[RolloutResult]) -> dict[str, list[tuple[int, float]]]:
    """Task key -> [(sample, advantage)], GRPO-style: reward minus the group's mean.

    Only graded rollouts take part; a group with a single graded sample has no baseline
    and contributes nothing (its advantage would be 0 anyway).
    """
    groups: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in results:
        if result.reward is not None:
            groups[result.task_key].append(result)
    advantages: dict[str, list[tuple[int, float]]] = {}
    for key, members in groups.items():
        if len(members) < 2:
            continue
        mean = statistics.fmean(r.reward for r in members if r.reward is not None)
        advantages[key] = [(r.sample, (r.reward or 0.0) - mean) for r in members]
    return advantages


def optimizer_step(advantages: dict[str, list[tuple[int, float]]]) -> None:
    """Where a real trainer builds its datums (tokens, logprobs, advantages) and calls
    forward_backward + optim_step. Nothing to train here."""


def main() -> int:
    rng = random.Random(0)
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use"]
    with Runner(workers=16) as runner:
        for step in range(STEPS):
            batch = rng.sample(tasks, BATCH)
            started = time.monotonic()
            results = list(runner.run(batch, stand_in_model, samples_per_task=GROUP))
            elapsed = time.monotonic() - started
            advantages = group_advantages(results)
            optimizer_step(advantages)

            summary = summarize(results, ks=(1, GROUP))
            metrics = {
                "step": step,
                "episodes": len(results),
                **summary.to_metrics(),  # reward/mean, reward/pass_at_k, signal_ratio, ...
                "train/groups_with_signal": sum(
                    any(a != 0 for _, a in adv) for adv in advantages.values()),
                "time/rollouts_s": round(elapsed, 2),
            }
            print(" ".join(f"{k}={_fmt(v)}" for k, v in metrics.items()))
            errors = [r for r in results if r.error]
            if errors:  # an infrastructure problem: say so instead of training on it
                print(f"  {len(errors)} rollout(s) failed, e.g. {errors[0].error}")
                return 1
    return 0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


if __name__ == "__main__":
    sys.exit(main())
