"""``fleetenv report``: the HTML report and the comparison of two runs, on results of real
runs against the local Fleet, rendered in a real headless Chromium driven over CDP.

The runs: the reference policy (passes) and a failing policy that plants markup in a tool
call's name, in a real tool result (``create_ticket`` echoes its subject) and in its final
answer; a computer-use task brings real screenshots into the transcripts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _support.browser import Page, chromium_page

from fleetenv import bundled_tasks_path
from fleetenv.cli.main import main
from fleetenv.core.config import resolve_config
from fleetenv.core.event_bus import EventBus
from fleetenv.core.event_sinks import JsonlSink
from fleetenv.core.task_files import load_tasks
from fleetenv.core.types import FinalAnswer, ToolCall
from fleetenv.local import LocalFleet
from fleetenv.reports import compare_runs, load_run, render_html
from fleetenv.rollouts.policy import PolicyContext, Reply, ScriptedPolicy
from fleetenv.rollouts.results import ResultsWriter, read_manifest
from fleetenv.rollouts.runner import Runner

pytestmark = pytest.mark.timeout(120)

TASKS = ("helpdesk-count-unassigned-open", "helpdesk-assign-api-ticket", "shop-count-shipped",
         "helpdesk-ui-reply-and-resolve")
SAMPLES = 2
#: Markup a hostile transcript carries; none of it may run or become an element.
EVIL_TOOL = '<img src=x onerror="window.__pwned=1">'
EVIL_SUBJECT = "<script>window.__pwned=2</script>"
EVIL_ANSWER = "</pre><script>window.__pwned=3</script>"


def failing_policy(context: PolicyContext) -> Reply:
    """Calls a tool that does not exist, then one whose result echoes markup, then answers
    wrong: every episode is graded 0 (or fails on a tool error)."""
    if context.turn == 0:
        return Reply.from_actions([ToolCall(EVIL_TOOL, {"q": EVIL_SUBJECT})])
    if context.turn == 1 and context.task.env_key == "helpdesk":
        return Reply.from_actions([ToolCall("create_ticket", {
            "customer_email": "xena.foster@juniperretail.com", "subject": EVIL_SUBJECT,
            "description": EVIL_TOOL})])
    return Reply.from_actions([FinalAnswer(EVIL_ANSWER)])


@dataclass
class Runs:
    good: Path
    bad: Path
    good_events: Path


@pytest.fixture(scope="module")
def runs(local_fleet: LocalFleet, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Two real runs of the same tasks: the reference policy, then the failing one."""
    folder = tmp_path_factory.mktemp("runs")
    tasks = [t for t in load_tasks(bundled_tasks_path()) if t.key in TASKS]
    assert len(tasks) == len(TASKS)
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    paths = Runs(folder / "good.jsonl", folder / "bad.jsonl", folder / "good.events.jsonl")
    for path, policy, events in ((paths.good, ScriptedPolicy.reference(), paths.good_events),
                                 (paths.bad, failing_policy, None)):
        sink = JsonlSink(events) if events else None
        bus = EventBus(sinks=[sink]) if sink else None
        try:
            with (Runner(workers=2, config=config, progress=False, events=bus) as runner,
                  ResultsWriter(path, manifest={"policy": path.stem}) as writer):
                for result in runner.run(tasks, policy, samples_per_task=SAMPLES):
                    writer.write(result)
        finally:
            if sink:
                sink.close()
    return paths


# ---------------------------------------------------------------------- a real browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Page]:
    with chromium_page("test_report_html") as page:
        yield page


def _report(runs: Runs, tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "report.html"
    assert main(["report", str(runs.good), *args, "--html", str(out)]) == 0
    return out


def _report_file(results: Path, tmp_path: Path) -> str:
    out = tmp_path / f"{results.stem}.html"
    assert main(["report", str(results), "--html", str(out)]) == 0
    return out.read_text()


def _visible(page: Page) -> int:
    return int(page.eval("document.querySelectorAll('details.episode:not([hidden])').length"))


def _choose(page: Page, select: str, value: str) -> None:
    page.eval(f"(() => {{ const s = document.getElementById({json.dumps(select)}); "
              f"s.value = {json.dumps(value)}; "
              "s.dispatchEvent(new Event('change')); })()")


# ---------------------------------------------------------------------- the tests


def test_report_page_shows_the_run_and_filters_by_task_and_outcome(
        runs: Runs, browser: Page, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    combined = tmp_path / "both.jsonl"
    combined.write_text(runs.good.read_text() + runs.bad.read_text())
    out = tmp_path / "report.html"
    assert main(["report", str(combined), "--html", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "helpdesk-ui-reply-and-resolve" in printed  # the per-task table
    assert f"HTML report: {out}" in printed
    run = load_run(combined)
    outcomes = run.outcomes()
    total = len(TASKS) * SAMPLES * 2
    assert outcomes["passed"] == len(TASKS) * SAMPLES
    assert outcomes["failed"] == len(TASKS) * SAMPLES  # graded 0, not errors

    browser.open(out)
    assert browser.errors == []
    assert browser.eval("document.querySelectorAll('details.episode').length") == total
    assert browser.eval("document.getElementById('count-episodes').textContent") == str(total)
    assert browser.eval("document.getElementById('count-passed').textContent") == str(
        outcomes["passed"])
    assert browser.eval("document.querySelectorAll('#tasks tr.task-row').length") == len(TASKS)
    assert browser.eval("document.querySelectorAll('figure.plot svg').length") >= 3
    assert _visible(browser) == total

    _choose(browser, "filter-outcome", "passed")
    assert _visible(browser) == outcomes["passed"]
    assert browser.eval("document.getElementById('shown-count').textContent") == str(
        outcomes["passed"])
    _choose(browser, "filter-task", "shop-count-shipped")
    assert _visible(browser) == SAMPLES
    assert browser.eval("document.getElementById('shown-count').textContent") == str(SAMPLES)
    _choose(browser, "filter-outcome", "failed")
    assert _visible(browser) == SAMPLES
    _choose(browser, "filter-outcome", "error")
    assert _visible(browser) == 0
    _choose(browser, "filter-outcome", "")
    _choose(browser, "filter-task", "")
    assert _visible(browser) == total
    # Clicking a row of the task table shows that task's episodes.
    browser.eval("document.querySelector('tr.task-row[data-task=\"helpdesk-assign-api-"
                 "ticket\"]').click()")
    assert _visible(browser) == 2 * SAMPLES
    assert browser.eval("document.getElementById('filter-task').value") == (
        "helpdesk-assign-api-ticket")
    assert browser.errors == []


def test_transcripts_show_screenshots_and_verifier_output(
        runs: Runs, browser: Page, tmp_path: Path) -> None:
    out = _report(runs, tmp_path)
    browser.open(out)
    assert browser.errors == []
    # The computer-use task's screenshots are inline images that decoded.
    shots = browser.eval("Array.from(document.querySelectorAll('img.shot'))"
                         ".map(i => [i.decode ? 1 : 0, i.src.slice(0, 22)])")
    assert shots and all(src == "data:image/png;base64," for _, src in shots)
    widths = browser.eval("Promise.all(Array.from(document.querySelectorAll('img.shot'))"
                          ".slice(0, 3).map(i => { i.loading = 'eager'; "
                          "return i.decode().then(() => i.naturalWidth); }))")
    assert widths and all(w > 100 for w in widths)
    text = browser.eval("document.body.textContent")
    assert "SUCCESS_ACCUMULATOR" in text  # the verifier's output
    assert "tool result · get_ticket" in text
    # Per-tool latencies come from the results' tool timings...
    assert "Tool latency per tool (p50)" in text
    # ...or from the events file when it is given.
    out = _report(runs, tmp_path, "--events", str(runs.good_events))
    browser.open(out)
    assert "Tool latency per tool (p50)" in browser.eval("document.body.textContent")
    assert browser.errors == []


def test_tool_latencies_come_from_the_results_and_old_files_say_what_to_do(
        runs: Runs, tmp_path: Path) -> None:
    from fleetenv.reports.data import load_run
    from fleetenv.rollouts.results import read_results

    results = read_results(runs.good)
    for result in results:  # one timing per call sent, in order, each answered
        assert len(result.tool_timings) == result.tool_calls > 0
        assert {t["outcome"] for t in result.tool_timings} == {"ok"}
        assert all(t["seconds"] > 0 for t in result.tool_timings)
    run = load_run(runs.good)
    assert run.latency_source == "results"
    # Every call sent is timed (a local tool such as submit_final_answer is not sent).
    assert sum(len(t.latencies_s) for t in run.tools) == sum(r.tool_calls for r in results)
    # A file written before tool timings existed: no chart, and the way to get one.
    old = tmp_path / "old.jsonl"
    lines = [json.loads(line) for line in runs.good.read_text().splitlines() if line]
    for line in lines:
        line.pop("tool_timings", None)
    old.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert load_run(old).latency_source is None
    page = _report_file(old, tmp_path)
    assert "has no tool timings" in page and "--events EVENTS.jsonl" in page


def test_markup_in_transcripts_is_shown_as_text_and_never_runs(
        runs: Runs, browser: Page, tmp_path: Path) -> None:
    out = tmp_path / "bad.html"
    assert main(["report", str(runs.bad), "--html", str(out)]) == 0
    html = out.read_text()
    # The transcript did carry the markup, in a tool call, a real tool result and an answer.
    raw = runs.bad.read_text()
    assert json.dumps(EVIL_SUBJECT)[1:-1] in raw and "create_ticket" in raw
    assert html.count("<script") == 1  # the page's own script, nothing else
    assert EVIL_SUBJECT not in html and EVIL_TOOL not in html
    assert "&lt;script&gt;window.__pwned=2&lt;/script&gt;" in html
    # Nothing is fetched: no remote URL anywhere but the SVG namespace.
    assert re.findall(r"https?://[^\s\"'<>]+", html) == (
        ["http://www.w3.org/2000/svg"] * html.count('xmlns="http://www.w3.org/2000/svg"'))
    browser.open(out)
    assert browser.errors == []
    assert browser.eval("typeof window.__pwned") == "undefined"
    assert browser.eval("document.scripts.length") == 1
    assert browser.eval("document.querySelectorAll('[onerror], main img:not(.shot)').length") == 0
    browser.eval("document.querySelectorAll('details.episode').forEach(d => d.open = true)")
    text = browser.eval("document.body.innerText")
    assert EVIL_SUBJECT in text and EVIL_ANSWER in text and EVIL_TOOL in text
    assert browser.eval("typeof window.__pwned") == "undefined"


def test_report_of_an_unparseable_image_url_embeds_nothing() -> None:
    from fleetenv.core.types import RolloutResult
    from fleetenv.reports.data import RunData, TaskStats

    urls = ("https://example.invalid/x.png", 'data:image/png;base64,AA" onerror="x',
            "data:image/svg+xml;base64,PHN2Zz4=")
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    result = RolloutResult(task_key="t", env_key="e:v1",
                           transcript=[{"role": "user", "content": parts}])
    html = render_html(RunData(path=Path("r.jsonl"), results=[result],
                               tasks=[TaskStats.of("t", [result])]))
    assert "<img" not in html
    assert html.count("[image not embedded:") == 3


def test_compare_two_runs_task_by_task(
        runs: Runs, browser: Page, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(runs.good), str(runs.bad)]) == 0
    text = capsys.readouterr().out
    for key in TASKS:
        line = next(line for line in text.splitlines() if line.startswith(key))
        assert line.endswith("new failure"), line
        assert "-100 pt" in line and "-1.000" in line
    assert f"{len(TASKS)} new failure" in text
    # Both files carry a manifest; the field that differs is named.
    assert "warning: policy differs: A good, B bad" in text

    assert main(["report", str(runs.bad), str(runs.good), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdicts"] == {"fixed": len(TASKS)}
    assert {t["pass_rate_delta"] for t in data["tasks"]} == {1.0}

    out = tmp_path / "compare.html"
    assert main(["report", str(runs.good), str(runs.bad), "--html", str(out)]) == 0
    browser.open(out)
    assert browser.errors == []
    assert browser.eval("document.querySelectorAll('#compare tr[data-verdict=\"new failure\"]')"
                        ".length") == len(TASKS)
    assert browser.eval("document.getElementById('count-new-failure').textContent") == str(
        len(TASKS))


def test_compare_says_what_changed_between_similar_runs(runs: Runs, tmp_path: Path) -> None:
    good = load_run(runs.good)
    # Half the samples of one task fail in B: that task got worse, the rest stayed.
    lines = runs.good.read_text().splitlines()
    worse = []
    dropped = False
    for line in lines:
        data = json.loads(line)
        if data.get("task_key") == TASKS[0] and not dropped:
            data["reward"], dropped = 0.0, True
        worse.append(json.dumps(data))
    # B in the layout of a version 2 file: its manifest is its first line.
    manifest = read_manifest(runs.good)
    assert manifest is not None and good.manifest == manifest
    other = tmp_path / "worse.jsonl"
    other.write_text("\n".join([json.dumps(manifest), *worse]) + "\n")
    comparison = compare_runs(good, load_run(other))
    verdicts = {t.task_key: t.verdict for t in comparison.tasks}
    assert verdicts[TASKS[0]] == "worse"
    assert {verdicts[k] for k in TASKS[1:]} == {"same"}
    assert comparison.tasks[0].task_key == TASKS[0]  # worst news first
    assert comparison.warnings == []  # same manifest: comparable


def test_report_refuses_three_files_and_stray_events(runs: Runs,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(runs.good), str(runs.good), str(runs.good)]) != 0
    assert "one results file or two" in capsys.readouterr().err
    assert main(["report", str(runs.good), "--events", str(runs.good_events),
                 "--events", str(runs.good_events)]) != 0
    assert "--events" in capsys.readouterr().err


def test_screenshots_past_the_image_budget_become_notes(runs: Runs, tmp_path: Path) -> None:
    """A computer-use run holds hundreds of MB of screenshots; the page embeds at most
    ``--max-image-mb`` of them, in episode order, and says how many it left out."""
    from fleetenv.rollouts.results import read_results

    urls = [part["image_url"]["url"] for r in read_results(runs.good) for m in r.transcript
            if isinstance(m.get("content"), list) for part in m["content"]
            if part.get("type") == "image_url"]
    assert len(urls) >= 2
    out = tmp_path / "budget.html"
    budget_mb = (len(urls[0]) + 1) / 1e6  # room for the first screenshot only
    assert main(["report", str(runs.good), "--html", str(out),
                 "--max-image-mb", repr(budget_mb)]) == 0
    page = out.read_text()
    assert page.count('<img class="shot"') == 1
    assert f"{len(urls) - 1} screenshot(s) not embedded" in page
    assert page.count("[screenshot not embedded") == len(urls) - 1
    assert main(["report", str(runs.good), "--html", str(out), "--max-image-mb", "0"]) == 0
    assert '<img class="shot"' not in out.read_text()
    default = _report_file(runs.good, tmp_path)  # 50 MB: all of this small run
    assert default.count('<img class="shot"') == len(urls)
    assert "not embedded" not in default
