"""Chaos suite: many episodes through the runner while faults are injected at random.

    python tests/chaos/run.py --episodes 500 --workers 32 --fault-rate 0.15 --seed 7

Episodes replay the bundled tasks' reference solutions against a ``LocalFleet`` running in
a separate process. Each episode draws (seeded) either no fault or one of:

=================  ===========================================================  ==========
fault              how it is injected                                           expected
=================  ===========================================================  ==========
create_transient   next instance create answers 503                             retried
create_permanent   next instance create answers 400 "Environment ... not found" typed error
control_429        next create answers 429 (rate limit)                         retried
control_5xx        next create answers 502                                      retried
manager_5xx        the instance's manager API answers 503 while it is graded    reward None
tool_hang          one tool call of the episode hangs past the tool timeout     tool error
drop_connection    one tool call's connection is closed without an answer       tool error
session_loss       the server forgets the episode's MCP session                 solved
verifier_crash     the verifier's worker process dies                           reward None
verifier_hang      the verifier hangs past its time limit                       reward None
expire             the instance expires mid-episode                             truncated
policy_raises      the policy raises mid-episode                                typed error
=================  ===========================================================  ==========

Create faults have no instance to aim at, so they hit whichever create comes next; the
others are injected by the episode's own policy, aimed at its own instance, at a random
turn. Then it checks, and prints:

- every episode returned a result (a reward, or a typed error with a reason) within its
  deadline;
- live instances at the end = 0 (asked of the control plane);
- threads left in this process besides the event-loop thread = 0 (compared with the
  threads alive before the run);
- tool calls the server executed more than once for one logical call = 0;
- rollouts started = rollouts completed (by reason);
- wrong rewards = 0: every episode that ended normally with no tool error and a graded
  verdict scored 1.0, and no episode whose verifier was broken got a number.

The LAST line is JSON with those figures. Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.core.event_bus import EventBus
from fleetenv.core.types import RolloutResult
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import PolicyContext, Reply, ScriptedPolicy
from fleetenv.rollouts.runner import Runner

CREATE_FAULTS = ("create_transient", "create_permanent", "control_429", "control_5xx")
TURN_FAULTS = ("tool_hang", "drop_connection", "session_loss", "expire", "policy_raises")
GRADE_FAULTS = ("manager_5xx", "verifier_crash", "verifier_hang")
FAULTS = CREATE_FAULTS + TURN_FAULTS + GRADE_FAULTS

TOOL_TIMEOUT_S = 2.0
# The server's limit on one verifier run, which a hung verifier runs into. Correct
# verifiers here take ~25 ms of CPU, but their queries wait on the busy server: on a
# loaded 2-core machine their own run took up to ~4 s (p50 1.5 s), and 3 s killed some.
VERIFIER_TIMEOUT_S = 10.0
EPISODE_DEADLINE_S = 60.0
PROVISION_BUDGET_S = 30.0
# The verifier runs after the episode deadline at the latest, then MCP close and delete.
DEADLINE_S = EPISODE_DEADLINE_S + VERIFIER_TIMEOUT_S + 15.0


class PolicyFault(RuntimeError):
    """The chaos policy failing on purpose."""


@dataclass
class Plan:
    """What happens to one episode."""

    index: int
    task: fleetenv.Task
    fault: str | None
    turn: int = 0
    injected: bool = False
    notes: list[str] = field(default_factory=list)


class ChaosPolicy:
    """Replays the reference solution; injects its planned fault at its planned turn."""

    def __init__(self, plan: Plan, fleet: LocalFleet) -> None:
        self.plan = plan
        self.fleet = fleet
        self.reference = ScriptedPolicy.reference()

    def act(self, context: PolicyContext) -> Reply:
        plan, fault = self.plan, self.plan.fault
        # Grade faults go in before the last reference call: a final-answer task ends
        # with that call, so there is no later turn to inject them at.
        last_call = max(0, len(context.task.reference_solution or ()) - 1)
        turn_fault = fault in TURN_FAULTS and context.turn == plan.turn
        grade_fault = fault in GRADE_FAULTS and context.turn == last_call
        if (turn_fault or grade_fault) and not plan.injected:
            plan.injected = True
            self._inject(fault, context.instance_id)
        return self.reference.act(context)

    def _inject(self, fault: str | None, instance: str | None) -> None:
        faults = self.fleet.faults
        if fault == "policy_raises":
            raise PolicyFault("the chaos policy failed on purpose")
        if fault == "tool_hang":
            faults.add("tool_hang", instance=instance, times=1)
        elif fault == "drop_connection":
            faults.add("drop_connection", instance=instance, route="*/mcp*", method="POST",
                       times=1)
        elif fault == "session_loss":
            faults.add("session_loss", instance=instance, times=1)
        elif fault == "expire":
            faults.expire(str(instance))
        elif fault == "manager_5xx":
            faults.add("http_error", instance=instance, route="*/api/v1/env/*", status=503)
        elif fault == "verifier_crash":
            faults.add("verifier_crash", instance=instance)
        elif fault == "verifier_hang":
            faults.add("verifier_hang", instance=instance)


def inject_create_fault(fleet: LocalFleet, fault: str) -> None:
    route = "/v1/env/instances"
    if fault == "create_transient":
        fleet.faults.add("create_error", status=503, times=1)
    elif fault == "create_permanent":
        fleet.faults.add("create_error", status=400, times=1,
                         message="Environment 'chaos' not found")
    elif fault == "control_429":
        fleet.faults.add("http_error", route=route, method="POST", status=429, times=1)
    elif fault == "control_5xx":
        fleet.faults.add("http_error", route=route, method="POST", status=502, times=1)


def plan_episodes(count: int, fault_rate: float, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    tasks = fleetenv.load_tasks(bundled_tasks_path())
    plans = []
    for index in range(count):
        task = tasks[index % len(tasks)]
        fault = rng.choice(FAULTS) if rng.random() < fault_rate else None
        turns = len(task.reference_solution or ())
        plans.append(Plan(index, task, fault, turn=rng.randrange(max(1, turns))))
    return plans


def wrong_reward(plan: Plan, result: RolloutResult) -> str | None:
    """Why this result's reward is wrong, or None."""
    if plan.fault in ("verifier_crash", "verifier_hang", "manager_5xx") and plan.injected:
        if result.grade_status == "graded":
            return f"broken verifier ({plan.fault}) still gave reward {result.reward}"
        return None
    clean = (result.error is None and result.stop_reason == "agent_done"
             and result.tool_errors == 0 and result.grade_status == "graded")
    if clean and result.reward != 1.0:
        return f"reference solution ran fully but was graded {result.reward}"
    if plan.fault is None and result.error is None and not result.passed:
        # no fault planned; only an untargeted create fault may have hit it
        return (f"no fault planned, yet stop={result.stop_reason} "
                f"grade={result.grade_status} reward={result.reward}")
    return None


def stray_threads(before: set[threading.Thread]) -> list[str]:
    """Threads alive now that were not before the run, besides the runtime's (its loop,
    the idle threads of its bounded pool).

    In a fresh ``python tests/chaos/run.py`` process ``before`` is just the main thread;
    under pytest it also holds the threads of other tests' fixtures.
    """
    return sorted(t.name for t in threading.enumerate()
                  if t.is_alive() and t not in before and t.name != "fleetenv-loop"
                  and not t.name.startswith("fleetenv-io_"))


def settle(check: Callable[[], list[str]], seconds: float = 10.0) -> list[str]:
    """Poll ``check`` with backoff until it returns nothing or time runs out."""
    deadline, delay = time.monotonic() + seconds, 0.05
    found = check()
    while found and time.monotonic() < deadline:
        time.sleep(delay)  # polling for idle worker threads to exit, with backoff
        delay = min(delay * 2, 1.0)
        found = check()
    return found


def run_chaos(episodes: int, workers: int, fault_rate: float, seed: int,
              *, log: Callable[[str], None] = print) -> dict[str, Any]:
    plans = plan_episodes(episodes, fault_rate, seed)
    threads_before = set(threading.enumerate())
    bus = EventBus(sinks=[])
    started = time.monotonic()
    with LocalFleet(in_process=False, verifier_timeout=VERIFIER_TIMEOUT_S,
                    verifier_workers=2) as fleet:
        config = fleetenv.resolve_config(
            api_key=fleet.token, base_url=fleet.base_url, retry_base_s=0.2, retry_cap_s=2.0,
            timeouts={"call": TOOL_TIMEOUT_S, "episode": EPISODE_DEADLINE_S,
                      "provision": PROVISION_BUDGET_S,
                      # The client's verifier budget covers the server's own limit plus
                      # queueing while the server starts workers beyond its first 2 for
                      # the load; a verifier that hangs is cut by the server at
                      # VERIFIER_TIMEOUT_S.
                      "verify": VERIFIER_TIMEOUT_S + 30.0})
        results: dict[int, RolloutResult] = {}
        with Runner(workers=workers, config=config, events=bus, progress=False) as runner:
            futures = {}
            for plan in plans:
                if plan.fault in CREATE_FAULTS:
                    inject_create_fault(fleet, plan.fault)
                futures[runner.submit(plan.task, ChaosPolicy(plan, fleet),
                                      sample=plan.index)] = plan
            for future, plan in futures.items():
                results[plan.index] = future.result(timeout=DEADLINE_S * 4)
        fleet.faults.clear()
        leaked = [i["instance_id"] for i in fleet.instances(status="running")]
        duplicates = {cid: seen for cid, seen in fleet.tool_calls_by_call_id().items()
                      if seen["count"] > 1}
    elapsed = time.monotonic() - started
    strays = settle(lambda: stray_threads(threads_before))
    report = bus.report()
    wrong = {}
    for plan in plans:
        why = wrong_reward(plan, results[plan.index])
        if why:
            wrong[plan.index] = f"{plan.task.key} (fault {plan.fault}): {why}"
    durations = [r.timings.get("total_s", 0.0) for r in results.values()]
    queued = [r.timings.get("verify_queue_s", 0.0) for r in results.values()]
    late = [i for i, r in results.items() if r.timings.get("total_s", 0.0) > DEADLINE_S]
    unaccounted = abs(report.started - report.completed) + len(report.violations)

    faults = collections.Counter(p.fault or "none" for p in plans)
    outcomes = collections.Counter(
        (p.fault or "none", results[p.index].stop_reason or "?") for p in plans)
    log(f"{'fault':<18}{'episodes':>9}  outcomes (stop reason: count)")
    for fault, count in sorted(faults.items()):
        detail = ", ".join(f"{stop}: {n}" for (f, stop), n in sorted(outcomes.items())
                           if f == fault)
        log(f"{fault:<18}{count:>9}  {detail}")
    log(f"completed by reason: {dict(sorted(report.by_reason.items()))}")
    log(f"wall time {elapsed:.1f} s; slowest episode {max(durations):.2f} s "
        f"(deadline {DEADLINE_S:.0f} s); longest wait for a verifier {max(queued):.2f} s")
    for line in list(wrong.values())[:10]:
        log(f"WRONG: {line}")
    if leaked:
        log(f"LEAKED: {leaked[:10]}")
    if strays:
        log(f"STRAY THREADS: {strays}")
    if duplicates:
        log(f"DUPLICATE CALLS: {list(duplicates.items())[:5]}")
    return {
        "episodes": episodes, "results": len(results), "leaked_instances": len(leaked),
        "stray_threads": len(strays), "duplicate_tool_calls": len(duplicates),
        "unaccounted": unaccounted, "wrong_rewards": len(wrong), "late_episodes": len(late),
        "max_episode_s": round(max(durations), 2), "deadline_s": DEADLINE_S,
        "wall_s": round(elapsed, 1), "seed": seed,
    }


def passed(summary: dict[str, Any]) -> bool:
    return (summary["results"] == summary["episodes"] and summary["leaked_instances"] == 0
            and summary["stray_threads"] == 0 and summary["duplicate_tool_calls"] == 0
            and summary["unaccounted"] == 0 and summary["wrong_rewards"] == 0
            and summary["late_episodes"] == 0)


def main() -> int:
    parser = argparse.ArgumentParser(description="fleetenv chaos suite")
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--fault-rate", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    summary = run_chaos(args.episodes, args.workers, args.fault_rate, args.seed)
    print(json.dumps(summary))
    return 0 if passed(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
