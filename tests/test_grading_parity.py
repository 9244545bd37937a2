"""Grading parity with the previous Fleet client (OpenEnv's ``fleet_env``), issue 13.

Every behaviour here is one its users rely on (research note ``openenv-fleet-env.md``
§6.1, §6.4, §11 #13), checked end to end on the embedded local Fleet: the verifier runs
in the local runner, faults come from the local Fleet's fault hooks, and the grade comes
back through fleet-python exactly as from Fleet.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
from _support.waiting import wait_for

import fleetenv
from fleetenv import FleetEnv, Task, bundled_tasks_path
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event
from fleetenv.core.types import AppGrade, Grade, GradeReason, GradeStatus, StopReason
from fleetenv.env.grading import grade_once
from fleetenv.env.state import EpisodeState
from fleetenv.fleet.verifier_output import (
    MAX_ACCUMULATOR_CHARS,
    accepts_conversation,
    judge_failed,
    parse_accumulators,
    parse_multi_app,
    parse_partial,
)
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASKS = fleetenv.load_tasks(bundled_tasks_path())
BASE = TASKS[0]


def task_with(verifier: str, key: str, **metadata: Any) -> Task:
    return BASE.replace(key=key, verifier=verifier, metadata={**metadata})


class Recorder:
    """An event bus whose events are kept, by kind."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.bus = EventBus(sinks=[self.events.append])

    def kinds(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.kind == kind]


def make_env(fleet: LocalFleet, task: Task, *, recorder: Recorder | None = None,
             **settings: Any) -> FleetEnv:
    kwargs = {k: settings.pop(k) for k in ("partial_reward", "episode_deadline_s")
              if k in settings}
    config = fleetenv.resolve_config(api_key=fleet.token, base_url=fleet.base_url,
                                     retry_base_s=0.05, retry_cap_s=0.1, **settings)
    events = recorder.bus if recorder else EventBus(sinks=[])
    return FleetEnv(task, config=config, events=events, **kwargs)


def finish(env: FleetEnv) -> tuple[float | None, dict[str, Any]]:
    env.reset()
    _, reward, terminated, _, info = env.step({"done": True})
    assert terminated
    return reward, info


def hits(fleet: LocalFleet, fault_id: str) -> int:
    return next((f["hits"] for f in fleet.faults.list() if f["id"] == fault_id), -1)


PASSES = "def verify(env, final_answer=None):\n    return 1.0\n"


# ------------------------------------------------------------------ 1. retries


def test_transient_verifier_failures_are_retried_and_the_grade_delivered(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    """§6.1: the original retried a failed verifier execution; one 502 is no verdict."""
    local_faults.add("verifier_unavailable", status=502, times=2)
    recorder = Recorder()
    with make_env(local_fleet, task_with(PASSES, "retry-502"), recorder=recorder) as env:
        reward, info = finish(env)
        assert env.grade is not None and env.grade.attempts == 3
    assert reward == 1.0 and info["reward_status"] == "graded"
    (finished,) = recorder.kinds("verification_finished")
    assert finished.outcome == "graded" and finished.attempts == 3
    assert finished.reward == 1.0 and finished.execution_id


def test_the_grade_records_its_wait_for_a_verifier_runner_apart(
        local_fleet: LocalFleet) -> None:
    """The local Fleet says how long a run waited for a free worker; the grade, the
    episode's timings and the verification event carry it apart from the total."""
    recorder = Recorder()
    with make_env(local_fleet, task_with(PASSES, "queue-wait"), recorder=recorder) as env:
        finish(env)
        grade, timings = env.grade, env.stats.timings
    assert grade is not None and grade.graded and grade.queue_s is not None
    assert 0.0 <= grade.queue_s <= grade.seconds
    assert timings["verify_queue_s"] == grade.queue_s
    (finished,) = recorder.kinds("verification_finished")
    assert finished.queue_s == grade.queue_s and finished.duration_s == grade.seconds


def test_a_verifier_that_stays_unavailable_is_unknown_with_its_reason(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    fault = local_faults.add("verifier_unavailable", status=503)
    recorder = Recorder()
    with make_env(local_fleet, task_with(PASSES, "retry-503"), recorder=recorder) as env:
        reward, info = finish(env)
        grade = env.grade
        assert hits(local_fleet, fault) == grade.attempts == 3  # the policy's attempts
        assert "verify_queue_s" not in env.stats.timings
    assert grade.queue_s is None  # no answer said anything of a queue (as Fleet's do not)
    assert reward is None and info["reward_reason"] == "verifier_unreachable"
    assert "503" in info["verifier_error"]
    (finished,) = recorder.kinds("verification_finished")
    assert finished.outcome == "unknown" and finished.reason == "verifier_unreachable"
    assert finished.attempts == 3 and finished.error_type
    assert len(recorder.kinds("verifier_failed")) == 1


def test_the_verification_budget_bounds_the_retries(local_fleet: LocalFleet,
                                                    local_faults: Any) -> None:
    """A pause that would outlast ``timeouts.verify`` is not taken: one attempt."""
    fault = local_faults.add("verifier_unavailable", status=503)
    config = fleetenv.resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url,
                                     retry_base_s=5.0, retry_cap_s=5.0,
                                     timeouts={"verify": 2.0})
    with FleetEnv(task_with(PASSES, "retry-budget"), config=config,
                  events=EventBus(sinks=[])) as env:
        reward, info = finish(env)
        assert env.grade is not None and env.grade.attempts == 1
    assert reward is None and info["reward_reason"] == "verifier_unreachable"
    assert hits(local_fleet, fault) == 1


def test_a_verifier_that_ran_and_failed_is_not_retried(local_fleet: LocalFleet) -> None:
    raises = "def verify(env, final_answer=None):\n    raise ValueError('boom')\n"
    recorder = Recorder()
    with make_env(local_fleet, task_with(raises, "raises"), recorder=recorder) as env:
        reward, info = finish(env)
    assert reward is None and info["reward_reason"] == "verifier_error"
    (finished,) = recorder.kinds("verification_finished")
    assert finished.attempts == 1 and finished.error_type == "ValueError"


# ------------------------------------------------------------------ 2. judges

JUDGE = '''
import json

def verify(env, final_answer=None,
           conversation=None):
    messages = json.loads(conversation) if conversation else []
    said = " ".join(str(m.get("content") or "") for m in messages
                    if m.get("role") == "assistant")
    print("judge saw", len(messages), "messages")
    return 1.0 if "refund is on its way" in said else 0.0
'''
CHAT = [{"role": "user", "content": "Where is my refund?"},
        {"role": "assistant", "content": "Your refund is on its way."}]


def test_the_conversation_reaches_a_verifier_that_takes_it(local_fleet: LocalFleet) -> None:
    with make_env(local_fleet, task_with(JUDGE, "judge")) as env:
        env.reset()
        env.conversation = CHAT
        _, reward, terminated, _, info = env.step({"done": True})
    assert terminated and reward == 1.0, info["verifier_stdout"]
    assert "judge saw 2 messages" in info["verifier_stdout"]


def test_reset_clears_the_conversation(local_fleet: LocalFleet) -> None:
    with make_env(local_fleet, task_with(JUDGE, "judge-reset")) as env:
        env.reset()
        env.conversation = CHAT
        env.step({"done": True})
        env.reset()
        assert env.conversation is None
        _, reward, *_ = env.step({"done": True})
    assert reward == 0.0


def test_close_can_hand_over_the_conversation_of_an_abandoned_episode(
        local_fleet: LocalFleet) -> None:
    env = make_env(local_fleet, task_with(JUDGE, "judge-close"))
    env.reset()
    env.close(conversation=CHAT)
    assert env.grade is not None and env.grade.reward == 1.0
    assert env.stop_reason is None or env.stop_reason is StopReason.ABANDONED


def test_the_conversation_is_not_sent_to_verifiers_that_do_not_take_it(
        local_fleet: LocalFleet) -> None:
    """``**kwargs`` does not ask for the transcript, and the task metadata can refuse it."""
    catch_all = ("def verify(env, final_answer=None, **kwargs):\n"
                 "    return 0.0 if 'conversation' in kwargs else 1.0\n")
    declared_off = JUDGE.replace('return 1.0 if', 'return 0.5 if conversation is None else 0.0\n'
                                 '    return 1.0 if')
    for task, expected in ((task_with(catch_all, "kwargs"), 1.0),
                           (task_with(declared_off, "declared-off",
                                      verifier_conversation=False), 0.5)):
        with make_env(local_fleet, task) as env:
            env.reset()
            env.conversation = CHAT
            _, reward, *_ = env.step({"done": True})
        assert reward == expected, task.key


def test_metadata_can_declare_a_conversation_the_signature_hides(
        local_fleet: LocalFleet) -> None:
    hidden = ("import json\n\ndef verify(env, final_answer=None, **extra):\n"
              "    return 1.0 if 'refund' in extra.get('conversation', '') else 0.0\n")
    with make_env(local_fleet, task_with(hidden, "declared-on",
                                         verifier_conversation=True)) as env:
        env.reset()
        env.conversation = CHAT
        _, reward, *_ = env.step({"done": True})
    assert reward == 1.0


def test_a_judge_error_is_unknown_and_retried(local_fleet: LocalFleet,
                                             local_faults: Any) -> None:
    """§6.1: success + a line starting ``JUDGE ERROR:`` is no grade; it is retried."""
    local_faults.add("verifier_judge_error", times=1)
    recorder = Recorder()
    with make_env(local_fleet, task_with(PASSES, "judge-blip"), recorder=recorder) as env:
        reward, _ = finish(env)
    assert reward == 1.0
    assert recorder.kinds("verification_finished")[0].attempts == 2

    local_faults.add("verifier_judge_error", message="judge model overloaded")
    recorder = Recorder()
    with make_env(local_fleet, task_with(PASSES, "judge-down"), recorder=recorder) as env:
        reward, info = finish(env)
    assert reward is None and info["reward_reason"] == "judge_error" == GradeReason.JUDGE_ERROR
    assert info["verifier_error"] == "JUDGE ERROR: judge model overloaded"
    (finished,) = recorder.kinds("verification_finished")
    assert finished.attempts == 3 and finished.reason == "judge_error"


def test_judge_error_only_counts_at_the_start_of_a_line() -> None:
    assert judge_failed("checking\nJUDGE ERROR: timeout\n")
    assert not judge_failed("note: JUDGE ERROR: mentioned mid-line\n")
    assert not judge_failed(" JUDGE ERROR: indented\n")
    assert not judge_failed(None) and not judge_failed("")


def test_a_mid_line_judge_error_mention_is_graded(local_fleet: LocalFleet) -> None:
    mention = ("def verify(env, final_answer=None):\n"
               "    print('the rubric says: JUDGE ERROR: lines mean failure')\n"
               "    return 1.0\n")
    with make_env(local_fleet, task_with(mention, "judge-mention")) as env:
        reward, _ = finish(env)
    assert reward == 1.0


def test_a_verifier_that_returns_none_grades_one(local_fleet: LocalFleet) -> None:
    """§6.1: success + result ``None`` → 1.0, as the original graded it."""
    silent = "def verify(env, final_answer=None):\n    print('all checks passed')\n"
    with make_env(local_fleet, task_with(silent, "returns-none")) as env:
        reward, info = finish(env)
    assert reward == 1.0 and info["reward_status"] == "graded"


@pytest.mark.parametrize(("source", "expected"), [
    ("def verify(env, final_answer=None, conversation=None):\n    pass\n", True),
    ("def verify(\n    env,\n    final_answer: str | None = None,\n    conversation: str = (\n"
     "        '(x)'),\n):\n    pass\n", True),  # multi-line, parenthesised default
    ("def validate_task(env, *, conversation):\n    pass\n", True),  # keyword-only
    ("def check(env, conversation, /):\n    pass\n", False),  # cannot be passed by name
    ("def verify(env, **kwargs):\n    pass\n", False),
    ("def outer(env):\n    def verify(env, conversation=None):\n        pass\n", False),
    ("def helper(x):\n    pass\n\ndef verify(env, conversation=None):\n    pass\n", True),
    ("# conversation\ndef verify(env, convo=None):\n    'conversation'\n", False),
    ("def verify(env, conversation=None:\n", False),  # does not parse
    (None, False),
])
def test_conversation_parameter_is_read_from_the_parsed_signature(
        source: str | None, expected: bool) -> None:
    assert accepts_conversation(source) is expected


# ------------------------------------------------------------------ 3. partial rewards


def acc(errors: list[str], successes: list[str]) -> str:
    return (f">>> ERROR_ACCUMULATOR >>>\n{errors}\n<<< ERROR_ACCUMULATOR <<<\n"
            f">>> SUCCESS_ACCUMULATOR >>>\n{successes}\n<<< SUCCESS_ACCUMULATOR <<<\n")


def test_accumulators_give_successes_over_all_checks() -> None:
    """§6.4: ``n_success / (n_errors + n_success)`` from the blocks, via literal_eval."""
    assert parse_accumulators(acc(["a"], ["b", "c"])) == pytest.approx(2 / 3)
    assert parse_accumulators("noise\n" + acc([], ["ok"])) == 1.0
    only_errors = ">>> ERROR_ACCUMULATOR >>>\n['x', 'y']\n<<< ERROR_ACCUMULATOR <<<\n"
    assert parse_accumulators(only_errors) == 0.0  # a missing block counts as empty


@pytest.mark.parametrize("stdout", [
    "no blocks at all\n",
    acc([], []),  # total 0
    acc(["a"], ["b"]).replace("['b']", "[unclosed"),  # a parse error
    acc(["a"], ["b"]).replace("['b']", "{'not': 'a list'}"),
])
def test_accumulators_without_a_usable_count_give_none(stdout: str) -> None:
    """§6.4: no blocks, a total of 0, or a parse error → ``None`` (never a made-up 0)."""
    assert parse_accumulators(stdout) is None


def test_accumulator_blocks_are_found_in_linear_time() -> None:
    """Hostile stdout: a flood of unclosed block markers. A backtracking search takes
    time quadratic in them (minutes here); finding each marker once takes milliseconds."""
    flood = ">>> ERROR_ACCUMULATOR >>>\n" * 40_000
    started = time.monotonic()
    assert parse_accumulators(flood) is None
    assert parse_accumulators(flood + acc(["a"], ["b"])) is None  # the first block is unclosed
    assert time.monotonic() - started < 10  # generous: proves it does not hang


def test_an_oversized_accumulator_block_is_unreadable() -> None:
    """A block past ``MAX_ACCUMULATOR_CHARS`` is not parsed: no partial score."""
    items = ["x" * 100] * (MAX_ACCUMULATOR_CHARS // 100)
    assert parse_accumulators(acc(items, ["ok"])) is None
    assert parse_accumulators(acc(items[:100], ["ok"])) == pytest.approx(1 / 101)


def app_block(name: str, result: int, text: str) -> str:
    return f"<<< VERIFY_{name} <<<\n{text}\n>>> VERIFY_{name} >>>\nApp {name}: {result}\n"


def test_multi_app_scores_real_apps_and_excludes_trivial_passes() -> None:
    """§6.4: ``App <name>: 0|1`` + ``VERIFY_<name>`` blocks; a passed app whose success
    block only says nothing changed is trivial, out of numerator and denominator."""
    stdout = (app_block("helpdesk", 1, acc([], ["ticket resolved"]))
              + app_block("shop", 0, acc(["no refund"], []))
              + app_block("files", 1, "PASS: No filesystem changes expected")
              + app_block("mail", 1, acc([], ["NO UNEXPECTED CHANGES in the outbox"]))
              + app_block("seal", 1, acc([], ["No-unexpected-envelopes"]))
              + "Combined result: 4/5 apps passed\n")
    parsed = parse_partial(stdout)
    assert parsed.score == 0.5
    assert parsed.apps == {
        "helpdesk": AppGrade(1.0), "shop": AppGrade(0.0),
        "files": AppGrade(1.0, trivial=True), "mail": AppGrade(1.0, trivial=True),
        "seal": AppGrade(1.0, trivial=True)}


def test_multi_app_edge_cases() -> None:
    # A failed app is real even when its output says "no unexpected changes".
    failed = app_block("crm", 0, acc(["wrong owner"], ["no unexpected changes"]))
    assert parse_multi_app(failed).score == 0.0
    # An app line without a VERIFY block is a real app.
    assert parse_multi_app("App crm: 1\n").score == 1.0
    # Only trivial apps: no real app, no partial score.
    assert parse_multi_app(app_block("files", 1, "No filesystem changes")).score is None
    # "App x: 1.0" is not an app line (the original's pattern is ``\d+$``).
    assert parse_partial("App crm: 1.0\n" + acc(["a"], ["b"])).score == 0.5


# Partial rewards at the edges (issue 26, item 3): each input scored side by side with the
# previous client's parser; the decision and its reason are in docs/porting.md.


def test_partial_app_line_other_than_1_is_a_failed_app() -> None:
    """``App a: 2``: the original passes an app only on 1, so 2 is a failed real app
    (fleetenv read ``>= 1`` as a pass before). Matched: reward parity."""
    stdout = app_block("a", 2, acc([], ["did the a work"])) + app_block("b", 1, acc([], ["ok"]))
    parsed = parse_multi_app(stdout)
    assert parsed.score == 0.5
    assert parsed.apps["a"] == AppGrade(2.0) and not parsed.apps["a"].passed
    assert parse_multi_app("App a: 01\n").score == 1.0  # the original read int("01") == 1


def test_partial_app_passing_by_a_pass_no_filesystem_changes_line_is_trivial() -> None:
    """An app shown passing only by ``PASS: No filesystem changes`` without a SUCCESS
    block: the original counts it (0.5); fleetenv keeps it out (0.0), since it passed
    only because nothing changed there, the case the trivial rule exists for."""
    stdout = (app_block("crm", 0, acc(["no owner set"], []))
              + app_block("files", 1, "PASS: No filesystem changes"))
    parsed = parse_multi_app(stdout)
    assert parsed.score == 0.0
    assert parsed.apps["files"] == AppGrade(1.0, trivial=True)


def test_partial_app_listed_twice_counts_twice() -> None:
    """The same app's verdict printed twice: the original counts each line; fleetenv
    kept only the last one (a failed verdict could vanish). Matched."""
    stdout = (app_block("crm", 0, acc(["no owner set"], [])) + "App crm: 1\n"
              + app_block("mail", 1, acc([], ["reply sent"])))
    parsed = parse_multi_app(stdout)
    assert parsed.score == pytest.approx(2 / 3)
    assert parsed.apps == {"crm": AppGrade(0.0), "crm#2": AppGrade(1.0),
                           "mail": AppGrade(1.0)}


def test_partial_app_block_without_its_end_marker_is_a_real_app() -> None:
    """``<<< VERIFY_x <<<`` without ``>>> VERIFY_x >>>``: the original finds no block, so
    the app is real; fleetenv read to the end of the stdout, where another app's "no
    unexpected changes" made x trivial. Matched: an app leaves the grade only on the
    evidence of its own complete block."""
    stdout = ("<<< VERIFY_x <<<\nPASS: report written\nApp x: 1\n"
              + app_block("mail", 1, acc([], ["Verified no unexpected changes"]))
              + app_block("crm", 0, ">>> ERROR_ACCUMULATOR >>>\n['no owner']\n"
                                    "<<< ERROR_ACCUMULATOR <<<"))
    parsed = parse_multi_app(stdout)
    assert parsed.score == 0.5
    assert parsed.apps["x"] == AppGrade(1.0) and parsed.apps["mail"].trivial


def test_partial_accumulator_written_as_a_string_literal_is_unreadable() -> None:
    """``'[X] a'`` instead of ``['[X] a']``: the original counts the string's characters
    (1 / 6 here); fleetenv gives no partial score, so the strict 0.0 stands. A string is
    not a list of checks, and its length is not a score."""
    stdout = acc(["placeholder"], ["ok"]).replace("['placeholder']", "'[X] a'")
    assert parse_accumulators(stdout) is None
    assert parse_partial(stdout).score is None


def test_multi_app_parse_is_linear_in_the_stdout() -> None:
    """60 000 app lines after 2 MB of output, none with a VERIFY block: a search of the
    whole stdout per line took minutes; one pass per marker takes well under a second.
    Nested blocks are judged by lookups too, never by searching each block again."""
    stdout = "x" * 2_000_000 + "\n" + "".join(f"App app{i}: 1\n" for i in range(60_000))
    nested = ("".join(f"<<< VERIFY_n{i} <<<\n" for i in range(20_000))
              + "No unexpected changes\n"
              + "".join(f">>> VERIFY_n{i} >>>\n" for i in reversed(range(20_000)))
              + "".join(f"App n{i}: 1\n" for i in range(20_000)))
    started = time.monotonic()
    assert parse_partial(stdout).score == 1.0
    assert parse_partial(nested).score is None  # every app trivial: no real app
    assert time.monotonic() - started < 10  # generous: proves it does not hang


def test_app_lines_take_precedence_over_accumulators() -> None:
    """§6.4: if any app line is present, only the multi-app rule applies, even when it
    gives no score and the accumulators would."""
    stdout = acc(["a"], ["b", "c", "d"]) + app_block("files", 1, "No filesystem changes")
    assert parse_partial(stdout).score is None
    assert parse_partial(acc(["a"], ["b", "c", "d"])).score == 0.75


PARTIAL = '''
def verify(env, final_answer=None):
    print(">>> ERROR_ACCUMULATOR >>>")
    print(["the refund is missing"])
    print("<<< ERROR_ACCUMULATOR <<<")
    print(">>> SUCCESS_ACCUMULATOR >>>")
    print(["the order exists", "the customer was told"])
    print("<<< SUCCESS_ACCUMULATOR <<<")
    return SCORE
'''


@pytest.mark.parametrize(("score", "partial_reward", "reward"), [
    (0, True, 2 / 3),   # a failed run pays its partial score
    (0, False, 0.0),    # off: the strict score, the partial one still reported
    (1, True, 1.0),     # a pass is never lowered to its partial score
])
def test_partial_reward_replaces_only_a_zero_score(local_fleet: LocalFleet, score: int,
                                                  partial_reward: bool,
                                                  reward: float) -> None:
    task = task_with(PARTIAL.replace("SCORE", str(score)), f"partial-{score}")
    with make_env(local_fleet, task, partial_reward=partial_reward) as env:
        got, info = finish(env)
        grade = env.grade
    assert got == pytest.approx(reward)
    assert grade is not None and grade.score == score
    assert grade.partial == pytest.approx(2 / 3) and info["partial_reward"] == grade.partial
    assert info["verifier_score"] == score


def test_partial_reward_can_be_declared_by_the_task(local_fleet: LocalFleet) -> None:
    task = task_with(PARTIAL.replace("SCORE", "0"), "partial-task", partial_reward=True)
    with make_env(local_fleet, task) as env:
        assert env.options.partial_reward is True
        reward, _ = finish(env)
    assert reward == pytest.approx(2 / 3)
    with make_env(local_fleet, task, partial_reward=False) as env:
        reward, _ = finish(env)
    assert reward == 0.0


MULTI = '''
def verify(env, final_answer=None):
    print("<<< VERIFY_helpdesk <<<")
    print(">>> SUCCESS_ACCUMULATOR >>>")
    print(["ticket resolved"])
    print("<<< SUCCESS_ACCUMULATOR <<<")
    print(">>> VERIFY_helpdesk >>>")
    print("App helpdesk: 1")
    print("<<< VERIFY_shop <<<")
    print(">>> ERROR_ACCUMULATOR >>>")
    print(["no refund"])
    print("<<< ERROR_ACCUMULATOR <<<")
    print(">>> VERIFY_shop >>>")
    print("App shop: 0")
    print("<<< VERIFY_files <<<")
    print("PASS: No filesystem changes expected")
    print(">>> VERIFY_files >>>")
    print("App files: 1")
    return 0
'''


def test_multi_app_grade_reports_per_app(local_fleet: LocalFleet) -> None:
    with make_env(local_fleet, task_with(MULTI, "multi"), partial_reward=True) as env:
        reward, info = finish(env)
        grade = env.grade
    assert reward == 0.5 and grade is not None
    assert grade.apps == {"helpdesk": AppGrade(1.0), "shop": AppGrade(0.0),
                          "files": AppGrade(1.0, trivial=True)}
    assert info["app_scores"] == {"helpdesk": 1.0, "shop": 0.0, "files": 1.0}
    data = grade.to_dict()
    assert data["partial"] == 0.5 and data["score"] == 0.0
    assert data["apps"]["files"] == {"score": 1.0, "trivial": True}
    json.dumps(data)  # results files take it as it is


# ------------------------------------------------------------------ 4. grades in flight


def test_a_step_timed_out_under_the_verifier_loses_nothing(local_fleet: LocalFleet,
                                                          local_faults: Any) -> None:
    """§11 #13: the harness gives up on the final step while the verifier runs; the
    grade still lands on the env, close() waits for it, and it is reported once."""
    local_faults.add("verifier_delay", seconds=1.5, times=1)
    recorder = Recorder()
    env = make_env(local_fleet, task_with(PASSES, "in-flight-async"), recorder=recorder)

    async def harness() -> None:
        await env.reset_async()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(env.step_async({"done": True}), timeout=0.3)
        assert env.done  # the episode did end; only the step's answer was lost
        await env.close_async()

    asyncio.run(harness())
    assert env.grade is not None and env.grade.reward == 1.0 and env.reward == 1.0
    (completed,) = recorder.kinds("rollout_completed")
    assert completed.grade_status == "graded" and completed.reward == 1.0
    assert completed.reason == "agent_done"
    assert len(recorder.kinds("verification_finished")) == 1


def test_close_from_another_thread_waits_for_the_grade_in_flight(
        local_fleet: LocalFleet, local_faults: Any) -> None:
    fault = local_faults.add("verifier_delay", seconds=1.0, times=1)
    recorder = Recorder()
    env = make_env(local_fleet, task_with(PASSES, "in-flight-sync"), recorder=recorder)
    env.reset()
    step: Future[Any] = Future()

    def final_step() -> None:
        step.set_result(env.step({"done": True}))

    worker = threading.Thread(target=final_step)
    worker.start()
    # The one-shot fault is consumed (and gone from the list) when the verifier starts.
    wait_for(lambda: hits(local_fleet, fault) == -1, 30, "the verifier to start")
    env.close()  # the verifier is running now: without waiting, there would be no grade
    assert env.grade is not None and env.grade.reward == 1.0
    worker.join(30)
    assert step.result(timeout=1)[1] == 1.0  # the step got the same grade
    assert len(recorder.kinds("verification_finished")) == 1
    assert len(recorder.kinds("rollout_completed")) == 1


def test_an_episode_past_its_deadline_is_still_graded(local_fleet: LocalFleet,
                                                     local_faults: Any) -> None:
    """The episode deadline cuts the agent, not the verification (its own budget)."""
    local_faults.add("verifier_delay", seconds=0.5, times=1)
    local_faults.add("tool_delay", tool="get_ticket", seconds=5, times=1)
    with make_env(local_fleet, task_with(PASSES, "deadline"),
                  episode_deadline_s=1.0) as env:
        env.reset()
        _, reward, terminated, truncated, info = env.step(
            {"tool": "get_ticket", "params": {"ticket_id": 1124}})
    assert truncated and not terminated and info["stop_reason"] == "time_limit"
    assert reward == 1.0 and info["reward_status"] == "graded"


def busy_verifier(n: int) -> str:
    """A distinct verifier (its own source) that takes the conversation and prints big
    accumulator blocks: parsing both builds many AST nodes in the grading thread."""
    checks = "\n".join(f"    check_{i} = {{'id': {i}, 'seen': [{n}, {i}]}}" for i in range(50))
    return (f"def verify(env, final_answer=None, conversation=None):\n    # verifier {n}\n"
            f"{checks}\n"
            "    print('>>> ERROR_ACCUMULATOR >>>')\n"
            "    print([f'failed check {i}' for i in range(4000)])\n"
            "    print('<<< ERROR_ACCUMULATOR <<<')\n"
            "    print('>>> SUCCESS_ACCUMULATOR >>>')\n"
            "    print([f'passed check {i}' for i in range(4000)])\n"
            "    print('<<< SUCCESS_ACCUMULATOR <<<')\n"
            "    return 1.0\n")


def test_many_threads_grading_distinct_verifiers_at_once_lose_no_grade(
        local_fleet: LocalFleet) -> None:
    """CPython before 3.11.8 (gh-106905) fails two threads that build ASTs at once with
    ``SystemError: AST constructor recursion depth mismatch``; grading parses each
    verifier's signature and stdout, and such a failure lost the grade (``interrupted``).
    16 threads grade at once, three rounds: every grade arrives, with its partial score."""
    grades: list[Grade | None] = []
    errors: list[BaseException] = []

    def grade(n: int) -> None:
        try:
            with make_env(local_fleet, task_with(busy_verifier(n), f"busy-{n}")) as env:
                finish(env)
                grades.append(env.grade)
        except BaseException as exc:  # the test reports every failure
            errors.append(exc)

    for round_ in range(3):
        threads = [threading.Thread(target=grade, args=(100 * round_ + i,))
                   for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not errors, errors[:3]
    lost = [g for g in grades if g is None or not g.graded]
    assert not lost, [(g.reason, g.error) if g else None for g in lost[:3]]
    assert len(grades) == 48
    assert all(g is not None and g.partial == 0.5 for g in grades)


CTRL_C_SCRIPT = textwrap.dedent("""
    import os
    import fleetenv
    from fleetenv import bundled_tasks_path

    task = fleetenv.load_tasks(bundled_tasks_path())[0]
    events = []
    env = fleetenv.FleetEnv(task, api_key=os.environ["T_KEY"], base_url=os.environ["T_URL"],
                            events=fleetenv.EventBus([events.append]))
    env.reset()
    print("GRADING", flush=True)
    try:
        env.step({"done": True})               # the server holds the verifier
    except KeyboardInterrupt:
        print("REASON", env.grade and env.grade.reason, flush=True)
        print("COMPLETED", [str(e.grade_reason) for e in events
                            if e.kind == "rollout_completed"], flush=True)
    env.close()
""")


def test_ctrl_c_while_grading_records_an_interrupted_grade(local_fleet: LocalFleet,
                                                          local_faults: Any) -> None:
    """The call that computes the grade is interrupted: the grade is recorded as unknown
    (``interrupted``) and reported, so nobody waits for a grade that will not come."""
    fault = local_faults.add("verifier_delay", seconds=10, times=1)
    env = dict(os.environ, T_KEY=local_fleet.token, T_URL=local_fleet.base_url)
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("GRADING"), (line, child.stderr.read() if child.stderr else "")
        wait_for(lambda: hits(local_fleet, fault) == -1, 30, "the verifier to start")
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert "REASON interrupted" in out, (out, err)
    assert "COMPLETED ['interrupted']" in out, (out, err)


def test_a_grade_that_does_not_come_within_the_bound_is_recorded_unknown() -> None:
    """The waiting side of ``grade_once``: past ``wait_s`` the grade is recorded as
    ``grading_timeout`` and reported once; the late grade does not replace it."""
    state = EpisodeState(active=True)
    in_flight: Future[Grade] = Future()
    state.grading = in_flight  # another call is computing it
    settled: list[Grade] = []
    grade, mine = grade_once(None, BASE, None, state, wait_s=0.05,  # type: ignore[arg-type]
                             on_settled=settled.append)
    assert mine and grade.reason is GradeReason.GRADING_TIMEOUT and grade.reward is None
    assert settled == [grade] and state.grade is grade
    again, mine_again = grade_once(None, BASE, None, state,  # type: ignore[arg-type]
                                   on_settled=settled.append)
    assert again is grade and not mine_again and settled == [grade]


def test_grade_status_vocabulary_is_stable() -> None:
    assert GradeStatus.GRADED == "graded"
    assert {"judge_error", "interrupted", "grading_timeout"} <= set(GradeReason.values())


# ------------------------------------------------------------------ 6. bundled grading tasks

BUNDLED = {t.key: t for t in TASKS}


def play(env: FleetEnv, task: Task, *, skip: tuple[str, ...] = (),
         answer: str | None = None) -> tuple[float | None, dict[str, Any]]:
    """Replay the task's reference solution minus the tools in ``skip``; end with
    ``answer`` (or the reference's own answer), else with Done."""
    env.reset()
    assert task.reference_solution
    for call in task.reference_solution:
        if call.name == "submit_final_answer":
            answer = answer if answer is not None else str(call.arguments["answer"])
        elif call.name not in skip:
            _, _, _, _, info = env.step({"tool": call.name, "params": dict(call.arguments)})
            assert not info.get("tool_error"), info
    final = {"tool": "submit_final_answer", "params": {"answer": answer}} if answer else {
        "done": True}
    _, reward, terminated, _, info = env.step(final)
    assert terminated
    return reward, info


def test_bundled_judge_task_grades_what_the_agent_told_the_customer(
        local_fleet: LocalFleet) -> None:
    task = BUNDLED["helpdesk-judge-tell-customer"]
    assert accepts_conversation(task.verifier)
    with make_env(local_fleet, task) as env:
        assert play(env, task)[0] == 1.0  # the reference solution's final answer says it
        reward, info = play(env, task, answer="Done.")
        assert reward == 0.0, info["verifier_stdout"]
        env.reset()  # the transcript, not the final answer, says it this time
        for call in task.reference_solution or []:
            if call.name != "submit_final_answer":
                env.step({"tool": call.name, "params": dict(call.arguments)})
        env.conversation = [{"role": "user", "content": task.prompt},
                            {"role": "assistant",
                             "content": "Hi Nina, ticket #1080 is resolved now."}]
        _, reward, *_ = env.step({"tool": "submit_final_answer", "params": {"answer": "Done."}})
    assert reward == 1.0


def test_bundled_partial_task_pays_for_the_checks_that_pass(local_fleet: LocalFleet) -> None:
    task = BUNDLED["helpdesk-partial-escalation"]
    assert task.metadata["partial_reward"] is True
    with make_env(local_fleet, task) as env:
        assert play(env, task)[0] == 1.0
        reward, _ = play(env, task, skip=("set_tags",))  # 3 of its 4 checks pass
        grade = env.grade
    assert reward == 0.75 and grade is not None
    assert grade.score == 0.0 and grade.partial == 0.75 and not grade.apps
    with make_env(local_fleet, task, partial_reward=False) as env:
        assert play(env, task, skip=("set_tags",))[0] == 0.0


def test_bundled_multi_app_task_grades_per_app(local_fleet: LocalFleet) -> None:
    task = BUNDLED["helpdesk-multi-app-billing-reply"]
    with make_env(local_fleet, task) as env:
        assert play(env, task)[0] == 1.0
        assert env.grade is not None and env.grade.partial == 1.0
        reward, _ = play(env, task, skip=("add_comment",))  # the ticket, not the reply
        grade = env.grade
    assert reward == 0.0 and grade is not None and grade.score == 0.0
    assert grade.apps == {"helpdesk": AppGrade(1.0), "outbox": AppGrade(0.0),
                          "files": AppGrade(1.0, trivial=True)}
    assert grade.partial == 0.5
    with make_env(local_fleet, task, partial_reward=True) as env:
        assert play(env, task, skip=("add_comment",))[0] == 0.5
