"""Self-checks of fleetenv.local's sample apps and bundled tasks, without any server.

Seeds are built into tmp_path, tools are called in-process through ``mcp.Client(server)``
with a real SQLite ``db`` factory, and every bundled task's reference solution is replayed
and graded with fleet-python's own file-mode verifier executor. The HTTP path (what Fleet
and the local host use) is covered end to end by test_local_tasks.py.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support.generate_tasks import build_seed, db_factory
from fleet.verifiers.local_executor import execute_verifier_local
from mcp import Client
from mcp.server import MCPServer

from fleetenv import bundled_tasks_path
from fleetenv.local.apps import APPS, AppSpec, DbFactory
from fleetenv.local.apps.computer import ComputerSession
from fleetenv.local.apps.helpdesk.ui import HelpdeskScreen
from fleetenv.local.apps.screen import Canvas, png_size
from fleetenv.local.apps.shop.ui import ShopScreen
from fleetenv.local.apps.toolkit import AppError
from fleetenv.local.apps.widgets import SCREEN_HEIGHT, SCREEN_WIDTH

TASKS: list[dict[str, Any]] = json.loads(bundled_tasks_path().read_text())
TASK_IDS = [t["key"] for t in TASKS]
MIN_ROWS = {"helpdesk": {"tickets": 300, "comments": 500, "customers": 100},
            "shop": {"orders": 300, "order_items": 500, "customers": 150}}  # fmt: skip
#: One unrelated write per app, to prove verifiers reject extra changes.
STRAY_WRITE = {
    "helpdesk": "UPDATE customers SET company = 'Stray Change Ltd' WHERE id = 160",
    "shop": "UPDATE customers SET city = 'Nowhere' WHERE id = 200",
}


# -- helpers ------------------------------------------------------------------------------


def dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        lines = list(conn.iterdump())
    conn.close()
    return lines


def servers(spec: AppSpec, db: DbFactory) -> tuple[MCPServer, MCPServer]:
    tools = MCPServer(f"{spec.key}-test", log_level="WARNING")
    spec.register_tools(tools, db)
    computer = MCPServer(f"{spec.key}-computer-test", log_level="WARNING")
    spec.register_computer(computer, db)
    return tools, computer


def call_all(server: MCPServer, calls: list[dict[str, Any]]) -> list[Any]:
    """Run tool calls in order through an in-process MCP client; return the results."""

    async def run() -> list[Any]:
        results = []
        async with Client(server) as client:
            await client.list_tools()
            for item in calls:
                with anyio.fail_after(10):
                    results.append(await client.call_tool(item["name"], item["arguments"]))
        return results

    return anyio.run(run)


def payload(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("seeds")
    paths = {}
    for key, spec in APPS.items():
        paths[key] = directory / f"{key}.sqlite"
        build_seed(paths[key], spec)
    return paths


@pytest.fixture
def fresh(seeds: dict[str, Path], tmp_path: Path):  # type: ignore[no-untyped-def]
    """``fresh(app) -> path`` of a new current database copied from the seed."""

    def make(app: str) -> Path:
        target = tmp_path / f"{app}-current.sqlite"
        shutil.copyfile(seeds[app], target)
        return target

    return make


# -- seed data ----------------------------------------------------------------------------


@pytest.mark.parametrize("app", sorted(APPS))
def test_seed_is_deterministic_sized_and_keyed(app: str, tmp_path: Path) -> None:
    first, second = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    build_seed(first, APPS[app])
    build_seed(second, APPS[app])
    assert dump(first) == dump(second)  # build time is measured in bench_local_start.py
    with sqlite3.connect(first) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for table in tables:
            pk = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")') if r[5]]
            assert len(pk) == 1, f"{app}.{table} needs a single-column primary key, has {pk}"
        for table, minimum in MIN_ROWS[app].items():
            (count,) = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
            assert count >= minimum, f"{app}.{table} has only {count} rows"
        assert not conn.execute("PRAGMA foreign_key_check").fetchall()
    conn.close()


@pytest.mark.parametrize("app", sorted(APPS))
def test_unknown_data_key_is_refused_with_the_available_ones(app: str) -> None:
    with sqlite3.connect(":memory:") as conn, pytest.raises(AppError, match="available"):
        APPS[app].build_database(conn, "no-such-data", "v9")


# -- MCP tools ----------------------------------------------------------------------------


def test_tools_are_typed_and_described(fresh) -> None:  # type: ignore[no-untyped-def]
    total = 0
    nested = []
    for app, spec in APPS.items():
        tools, computer = servers(spec, db_factory(fresh(app)))

        async def listing(server: MCPServer = tools) -> list[Any]:
            async with Client(server) as client:
                return list((await client.list_tools()).tools)

        listed = anyio.run(listing)
        assert len(listed) >= 6, f"{app} has only {len(listed)} tools"
        total += len(listed)
        for tool in listed:
            assert tool.description and len(tool.description) > 20, tool.name
            schema = tool.input_schema
            for name, prop in schema.get("properties", {}).items():
                assert prop.get("description"), f"{app}.{tool.name}.{name} has no description"
            if any(p.get("type") == "array" and "$ref" in p.get("items", {})
                   for p in schema.get("properties", {}).values()):  # fmt: skip
                nested.append(tool.name)
        (computer_tool,) = anyio.run(listing, computer)
        assert computer_tool.name == "computer"
        actions = computer_tool.input_schema["properties"]["action"]["enum"]
        assert set(actions) == {"screenshot", "click", "type", "key", "scroll"}
    assert total >= 12
    assert {"place_order", "adjust_inventory"} <= set(nested)


def test_helpdesk_tools_read_and_write(fresh) -> None:  # type: ignore[no-untyped-def]
    path = fresh("helpdesk")
    tools, _ = servers(APPS["helpdesk"], db_factory(path))
    search, ticket, update, again, missing, bad_tag = call_all(tools, [
        {"name": "search_tickets", "arguments": {"status": "open", "priority": "urgent"}},
        {"name": "get_ticket", "arguments": {"ticket_id": 1001}},
        {"name": "update_ticket", "arguments": {"ticket_id": 1124, "status": "pending",
                                                "assignee_email": "hana.suzuki@helpdesk.example"}},
        {"name": "update_ticket", "arguments": {"ticket_id": 1124, "status": "pending"}},
        {"name": "get_ticket", "arguments": {"ticket_id": 99}},
        {"name": "set_tags", "arguments": {"ticket_id": 1124, "add": ["nonsense"]}},
    ])  # fmt: skip
    found = payload(search)
    assert found["total"] >= len(found["tickets"]) > 0
    assert {t["priority"] for t in found["tickets"]} == {"urgent"}
    assert payload(ticket)["customer"]["email"]
    assert payload(update)["status"] == "pending"
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT status, assignee_id FROM tickets WHERE id = 1124").fetchone()
    conn.close()
    assert row == ("pending", 8)
    assert again.is_error and "nothing was changed" in again.content[0].text
    assert missing.is_error and "search_tickets" in missing.content[0].text
    assert bad_tag.is_error and "known tags" in bad_tag.content[0].text


def test_shop_order_takes_stock_and_failed_calls_roll_back(fresh) -> None:  # type: ignore[no-untyped-def]
    path = fresh("shop")
    tools, _ = servers(APPS["shop"], db_factory(path))
    before = dump(path)
    (too_many,) = call_all(
        tools,
        [
            {
                "name": "place_order",
                "arguments": {
                    "customer_email": "viktor.novak@inbox.example",
                    "items": [{"sku": "FIT-107", "quantity": 1}, {"sku": "KIT-114", "quantity": 1}],
                },
            }
        ],
    )
    assert too_many.is_error and "in stock" in too_many.content[0].text
    assert dump(path) == before, "a refused order must not leave partial writes"
    (placed,) = call_all(
        tools,
        [
            {
                "name": "place_order",
                "arguments": {
                    "customer_email": "viktor.novak@inbox.example",
                    "items": [{"sku": "FIT-107", "quantity": 3}],
                    "coupon_code": "WELCOME10",
                },
            }
        ],
    )
    order = payload(placed)
    assert order["status"] == "paid" and order["discount_cents"] == 3 * 2999 * 10 // 100
    assert order["total_cents"] == 3 * 2999 - order["discount_cents"] + order["shipping_cents"]
    refund, over = call_all(tools, [
        {"name": "refund_order", "arguments": {"order_id": order["id"], "reason": "damaged",
                                               "amount_cents": 500, "restock": True}},
        {"name": "refund_order", "arguments": {"order_id": order["id"], "reason": "damaged",
                                               "amount_cents": 10**7}},
    ])  # fmt: skip
    assert refund.is_error and "restock" in refund.content[0].text
    assert over.is_error and "still refundable" in over.content[0].text


# -- the computer tool --------------------------------------------------------------------


def screenshot(result: Any) -> bytes:
    url = payload(result)["base64_image"]
    assert url.startswith("data:image/png;base64,")
    return base64.b64decode(url.removeprefix("data:image/png;base64,"))


def test_computer_tool_returns_real_pngs_that_follow_state(fresh) -> None:  # type: ignore[no-untyped-def]
    path = fresh("helpdesk")
    _, computer = servers(APPS["helpdesk"], db_factory(path))
    session = ComputerSession(db_factory(path), HelpdeskScreen())
    row = next(s for s in session.hotspots() if s.target == "row")
    first, opened, outside, unfocused, jump = call_all(computer, [
        {"name": "computer", "arguments": {"action": "screenshot"}},
        {"name": "computer", "arguments": {"action": "click", "x": row.center[0],
                                           "y": row.center[1]}},
        {"name": "computer", "arguments": {"action": "click", "x": 5000, "y": 10}},
        {"name": "computer", "arguments": {"action": "type", "text": "hello"}},
        {"name": "computer", "arguments": {"action": "fly"}},
    ])  # fmt: skip
    before, after = screenshot(first), screenshot(opened)
    assert png_size(before) == png_size(after) == (SCREEN_WIDTH, SCREEN_HEIGHT)
    assert before != after, "opening a ticket must change the screen"
    assert outside.is_error and "outside the 800x600 screen" in outside.content[0].text
    assert unfocused.is_error and "no text field is focused" in unfocused.content[0].text
    assert jump.is_error and "screenshot" in jump.content[0].text


@pytest.mark.parametrize("app, screen", [("helpdesk", HelpdeskScreen), ("shop", ShopScreen)])
def test_ui_state_change_by_clicking(app: str, screen: type, fresh) -> None:  # type: ignore[no-untyped-def]
    # How fast a screenshot renders is measured in tests/benchmarks/bench_screenshot.py.
    path = fresh(app)
    session = ComputerSession(db_factory(path), screen())
    assert png_size(session.act("screenshot")) == (SCREEN_WIDTH, SCREEN_HEIGHT)
    before = dump(path)
    if app == "shop":  # only pending/paid orders have an enabled status button
        paid = next(s for s in session.hotspots() if s.target == "tab" and s.value == "Paid")
        session.act("click", *paid.center)
    else:
        session.act("scroll", direction="down", amount=5)
    row = next(s for s in session.hotspots() if s.target == "row")
    session.act("click", *row.center)
    target = "button:resolve" if app == "helpdesk" else "button:status"
    button = next(s for s in session.hotspots() if s.target.startswith(target))
    session.act("click", *button.center)
    assert dump(path) != before, f"clicking {button.target} must change the {app} database"
    session.act("key", key="Escape")
    assert any(s.target == "row" for s in session.hotspots()), "Escape returns to the list"
    with pytest.raises(AppError, match="unknown key"):
        session.act("key", key="F13")


def test_canvas_draws_and_encodes() -> None:
    canvas = Canvas(40, 20)
    canvas.fill(0, 0, 40, 20, (10, 20, 30))
    canvas.text(1, 1, "Hi", (255, 255, 255), (10, 20, 30), 1)
    assert canvas.pixel(39, 19) == (10, 20, 30)
    assert (255, 255, 255) in {canvas.pixel(x, y) for x in range(12) for y in range(9)}
    assert png_size(canvas.to_png()) == (40, 20)
    with pytest.raises(ValueError, match="not a PNG"):
        png_size(b"GIF89a" + bytes(30))


# -- bundled tasks --------------------------------------------------------------------------


def test_task_file_is_fleet_export_format() -> None:
    assert len(TASKS) >= 20
    assert len(set(TASK_IDS)) == len(TASK_IDS)
    modalities = {t["task_modality"] for t in TASKS}
    assert modalities == {"tool_use", "computer_use", "browser_use"}
    for task in TASKS:
        for field in ("key", "prompt", "env_id", "version", "data_id", "data_version",
                      "verifier_func", "task_modality"):  # fmt: skip
            assert task[field], f"{task['key']}: empty {field}"
        spec = APPS[task["env_id"]]
        assert task["version"] in spec.versions
        assert task["data_version"] in spec.data[task["data_id"]]
        assert task["verifier_func"].startswith("def validate_task(env: Environment, final_answer")
        solution = task["metadata"]["reference_solution"]
        names = [step["name"] for step in solution]
        answers = names[-1] == "submit_final_answer"
        assert answers == ("submit_final_answer" in task["prompt"]), task["key"]
        assert names.count("submit_final_answer") == int(answers), task["key"]
        if task["task_modality"] in ("computer_use", "browser_use"):
            assert set(names) == {"computer"}, task["key"]
        else:
            assert "computer" not in names, task["key"]
    assert sum(len(t["metadata"]["reference_solution"]) >= 5 for t in TASKS) >= 3
    assert sum("submit_final_answer" in t["prompt"] for t in TASKS) >= 5


def replay(task: dict[str, Any], current: Path) -> str | None:
    """Run a task's reference solution against ``current``; return the submitted answer."""
    tools, computer = servers(APPS[task["env_id"]], db_factory(current))
    server = tools if task["task_modality"] == "tool_use" else computer
    steps = task["metadata"]["reference_solution"]
    answer = None
    calls = []
    for step in steps:
        if step["name"] == "submit_final_answer":
            answer = step["arguments"]["answer"]
        else:
            calls.append(step)
    for step, result in zip(calls, call_all(server, calls), strict=True):
        assert not result.is_error, f"{task['key']}: {step} failed: {result.content[0].text}"
    return answer


def grade(task: dict[str, Any], seed: Path, current: Path, answer: str | None) -> Any:
    outcome = execute_verifier_local(task["verifier_func"], str(seed), str(current), answer)
    assert outcome["success"], f"{task['key']} verifier crashed: {outcome['error']}"
    return outcome


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_reference_solution_scores_one_and_nothing_scores_zero(
    task: dict[str, Any], seeds: dict[str, Path], fresh
) -> None:  # type: ignore[no-untyped-def]
    seed = seeds[task["env_id"]]
    untouched = fresh(task["env_id"])
    idle = grade(task, seed, untouched, None)
    assert idle["result"] == 0, f"{task['key']} passes without any action:\n{idle['stdout']}"

    current = untouched
    answer = replay(task, current)
    done = grade(task, seed, current, answer)
    assert done["result"] == 1, f"{task['key']} reference solution fails:\n{done['stdout']}"
    assert ">>> SUCCESS_ACCUMULATOR >>>" in done["stdout"]

    if answer is not None:
        wrong = grade(task, seed, current, "I could not find it.")
        assert wrong["result"] == 0, f"{task['key']} accepts a wrong answer"
    with sqlite3.connect(current) as conn:
        conn.execute(STRAY_WRITE[task["env_id"]])
    conn.close()
    stray = grade(task, seed, current, answer)
    assert stray["result"] == 0, f"{task['key']} accepts an unrelated extra change"
