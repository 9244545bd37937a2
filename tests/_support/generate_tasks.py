"""Generate the bundled tasks, ``fleetenv/core/bundled_tasks.json``, from the sample apps.

The 25 tasks for the ``helpdesk`` and ``shop`` sample apps are not written by hand: their ids,
counts, amounts and expected stock levels are queried from the apps' deterministic seed data,
their ``verifier_func`` sources are rendered from templates, and the click coordinates of the
computer-use solutions come from driving the real UI. After changing the seed data, the UI
layout or a task below, regenerate the file (from the repository root, in the dev venv)::

    python tests/_support/generate_tasks.py

and commit the result. ``tests/test_local_tasks_generated.py`` fails whenever the committed
JSON and :func:`build_tasks` disagree. The output is deterministic: the same code and seeds
always produce the same bytes.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleetenv import bundled_tasks_path
from fleetenv.local.apps import APPS, AppSpec, DbFactory
from fleetenv.local.apps.computer import ComputerSession
from fleetenv.local.apps.grading_tasks import grading_tasks
from fleetenv.local.apps.helpdesk.ui import HelpdeskScreen
from fleetenv.local.apps.list_screen import ListDetailScreen
from fleetenv.local.apps.shop.data import order_amounts
from fleetenv.local.apps.shop.ui import ShopScreen

__all__ = ["build_seed", "build_tasks", "db_factory", "main"]

Row = tuple[Any, ...]
Call = dict[str, Any]
Task = dict[str, Any]
# ("click", hotspot target, hotspot value or None) | ("type", text) | ("key", key name)
UiStep = tuple[Any, ...]

H, S = "helpdesk", "shop"

# The parts of every verifier around its task-specific body (indented into the ``try``).
# Bodies are emitted verbatim, so bodies with lines over 100 columns carry ``noqa: E501``.
HEADER = '''def validate_task(env: Environment, final_answer: str | None = None) -> int:
    """__DOC__"""
    env.instance.load()
    seed = env.db("seed")
    current = env.db("current")
    error_accumulator = []
    success_accumulator = []
    try:
'''
FOOTER = '''
    except AssertionError as exc:
        error_accumulator.append(str(exc))
    print(">>> ERROR_ACCUMULATOR >>>")
    print(error_accumulator)
    print("<<< ERROR_ACCUMULATOR <<<")
    print(">>> SUCCESS_ACCUMULATOR >>>")
    print(success_accumulator)
    print("<<< SUCCESS_ACCUMULATOR <<<")
    if error_accumulator:
        return TASK_FAILED_SCORE
    return TASK_SUCCESSFUL_SCORE
'''
# Body prologue of question tasks: there must be a final answer (``{what}`` describes it).
ANSWER_GUARD = '''
assert final_answer, "no final answer was submitted (expected {what})"
'''
# Body epilogue of tasks that must leave the database alone.
NO_CHANGES = '''
seed.diff(current, IgnoreConfig()).expect_exactly([])
success_accumulator.append("the database is unchanged")
'''

SHOP_TS = {"orders": {"updated_at"}, "inventory": {"updated_at"}, "refunds": {"created_at"}}


def lit(value: Any) -> str:
    """repr() with sets sorted, so the generated source is stable across runs."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(lit(v) for v in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(lit(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(lit(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _block(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def verifier(
    doc: str,
    body: str,
    *,
    answer: str | None = None,
    unchanged: bool = False,
    **values: Any,
) -> str:
    """The ``verifier_func`` source: ``body`` with each ``__NAME__`` replaced by ``lit(value)``.

    ``answer`` (what the final answer should be) prepends a check that there is one;
    ``unchanged`` appends a check that the database was not modified.
    """
    parts = [_block(body)]
    if answer is not None:
        parts.insert(0, _block(ANSWER_GUARD.format(what=answer)))
    if unchanged:
        parts.append(_block(NO_CHANGES))
    text = "\n\n".join(parts)
    for name, value in values.items():
        token = f"__{name}__"
        assert token in text, token
        text = text.replace(token, lit(value))
    assert "__" not in text.replace("__cnt__", ""), text
    return HEADER.replace("__DOC__", doc) + textwrap.indent(text, " " * 8) + FOOTER


def call(name: str, **arguments: Any) -> Call:
    return {"name": name, "arguments": arguments}


def submit(answer: str) -> Call:
    return call("submit_final_answer", answer=answer)


def build_seed(path: Path, spec: AppSpec) -> None:
    """Write ``spec``'s default seed data set into a new SQLite file.

    Tests that exercise the apps without a server build their seeds with this too, so
    they check the very databases the bundled tasks were generated from.
    """
    data_key, data_version = spec.default_data
    conn = sqlite3.connect(path)
    try:
        spec.build_database(conn, data_key, data_version)
        conn.commit()
    finally:
        conn.close()


def db_factory(path: Path) -> DbFactory:
    """The host's contract: one connection per unit of work, commit or roll back, serialised.

    Like the factory fleetenv.local gives the apps, so the UI and tools run here (and in
    tests) exactly as they do behind a server.
    """
    lock = threading.Lock()

    @contextmanager
    def db() -> Iterator[sqlite3.Connection]:
        with lock:
            conn = sqlite3.connect(path)
            try:
                yield conn
                conn.commit()
            except Exception:
                conn.rollback()
                raise
            finally:
                conn.close()

    return db


class _Generator:
    """The seed databases (built in ``workdir``) and the tasks collected so far."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._dbs: dict[str, sqlite3.Connection] = {}
        self.tasks: list[Task] = []
        for key, spec in APPS.items():
            path = workdir / f"{key}.db"
            build_seed(path, spec)
            self._dbs[key] = sqlite3.connect(path)

    def close(self) -> None:
        for conn in self._dbs.values():
            conn.close()

    def q(self, app: str, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return self._dbs[app].execute(sql, args).fetchall()

    def q1(self, app: str, sql: str, args: Sequence[Any] = ()) -> Row:
        rows = self.q(app, sql, args)
        assert len(rows) == 1, (sql, rows)
        return rows[0]

    def order_lines(self, order_id: int) -> list[Row]:
        """``(product_id, quantity, unit_price_cents)`` of a shop order's lines."""
        return self.q(S, "SELECT product_id, quantity, unit_price_cents FROM order_items "
                         "WHERE order_id = ? ORDER BY id", [order_id])

    def stock(self, product_id: int) -> int:
        """A shop product's seeded on-hand stock."""
        return self.q1(S, "SELECT on_hand FROM inventory WHERE product_id = ?", [product_id])[0]

    def task(
        self,
        key: str,
        app: str,
        prompt: str,
        doc: str,
        body: str,
        solution: list[Call],
        *,
        modality: str = "tool_use",
        answer: str | None = None,
        unchanged: bool = False,
        **values: Any,
    ) -> None:
        """Add a task (Fleet export format) against ``app``'s default version and seed."""
        spec = APPS[app]
        data_key, data_version = spec.default_data
        self.tasks.append({
            "key": key,
            "prompt": " ".join(prompt.split()),
            "env_id": app,
            "version": spec.default_version,
            "data_id": data_key,
            "data_version": data_version,
            "task_modality": modality,
            "verifier_func": verifier(doc, body, answer=answer, unchanged=unchanged, **values),
            "metadata": {"reference_solution": solution},
        })

    def ui_script(
        self, app: str, screen: Callable[[], ListDetailScreen], steps: Sequence[UiStep]
    ) -> list[Call]:
        """Drive the UI on a scratch copy to turn (target, value) clicks into coordinates."""
        path = self._workdir / f"ui-{app}.db"
        shutil.copyfile(self._workdir / f"{app}.db", path)
        session = ComputerSession(db_factory(path), screen())
        calls = [call("computer", action="screenshot")]
        session.act("screenshot")
        for step in steps:
            if step[0] == "click":
                _, target, value = step
                spot = next(s for s in session.hotspots() if s.target == target
                            and (value is None or s.value == value))
                x, y = spot.center
                calls.append(call("computer", action="click", x=x, y=y))
                session.act("click", x, y)
            elif step[0] == "type":
                calls.append(call("computer", action="type", text=step[1]))
                session.act("type", text=step[1])
            elif step[0] == "key":
                calls.append(call("computer", action="key", key=step[1]))
                session.act("key", key=step[1])
        return calls


def build_tasks() -> list[Task]:
    """Every bundled task, in file order, built against fresh seed databases."""
    with tempfile.TemporaryDirectory(prefix="fleetenv-tasks-") as workdir:
        gen = _Generator(Path(workdir))
        try:
            _helpdesk_tasks(gen)
            _shop_tasks(gen)
            gen.tasks.extend(grading_tasks(gen.q1, _grading_base()))
        finally:
            gen.close()
    keys = [t["key"] for t in gen.tasks]
    assert len(keys) == len(set(keys)), "task keys must be unique"
    return gen.tasks


def _grading_base() -> Task:
    """The env and data fields of the grading tasks (``fleetenv.local.apps.grading_tasks``)."""
    spec = APPS[H]
    data_key, data_version = spec.default_data
    return {"env_id": H, "version": spec.default_version, "data_id": data_key,
            "data_version": data_version}


def main() -> None:
    """Rewrite the bundled tasks file."""
    bundled_tasks_path().write_text(json.dumps(build_tasks(), indent=2) + "\n")


def _helpdesk_tasks(g: _Generator) -> None:
    """Add the helpdesk tasks, in the order they appear in the bundled tasks file."""
    daniel = g.q1(H, "SELECT id, name, email FROM agents WHERE name = 'Daniel Kim'")
    tid, subject = g.q(H, "SELECT id, subject FROM tickets WHERE status = 'open' AND priority = "
                          "'normal' AND assignee_id IS NULL AND subject LIKE 'API returns%' "
                          "ORDER BY id")[0]
    g.task(
        "helpdesk-assign-api-ticket", H,
        f"""Ticket #{tid} ("{subject}") is unassigned. Assign it to the technical lead
        {daniel[1]} ({daniel[2]}) and raise its priority to high. Do not change anything else.""",
        "Ticket assigned to the technical lead with priority high, nothing else changed.",
        """
        row = current.table("tickets").eq("id", __TID__).first()
        assert row is not None, "ticket __TID__ is missing"
        assert row["assignee_id"] == __AGENT__, f"ticket assigned to {row['assignee_id']}, expected __AGENT__"
        assert row["priority"] == "high", f"priority is {row['priority']}, expected high"
        seed.diff(current, IgnoreConfig(table_fields={"tickets": {"updated_at"}})).expect_exactly([
            {"type": "modify", "table": "tickets", "pk": __TID__,
             "resulting_fields": [("assignee_id", __AGENT__), ("priority", "high")],
             "no_other_changes": True},
        ])
        success_accumulator.append("ticket __TID__ assigned to agent __AGENT__ with priority high")
        """,  # noqa: E501
        [call("get_ticket", ticket_id=tid), call("list_agents", team="technical"),
         call("update_ticket", ticket_id=tid, assignee_email=daniel[2], priority="high")],
        TID=tid, AGENT=daniel[0],
    )

    cust = g.q1(H, "SELECT id, name, email FROM customers "
                   "WHERE email = 'leo.nguyen@granitelegal.com'")
    sofia = g.q1(H, "SELECT id, name, email FROM agents WHERE name = 'Sofia Marquez'")
    new_subject = "Payroll export fails with error 504"
    g.task(
        "helpdesk-create-phone-ticket", H,
        f"""{cust[1]} ({cust[2]}) just phoned support: every payroll export since this morning fails
        with a 504 gateway timeout error. Log it as a new ticket for this customer with the subject
        exactly "{new_subject}", a short description that mentions the 504 error, priority urgent,
        channel phone, the tags "bug" and "data-export", and assign it to {sofia[1]}
        ({sofia[2]}).""",
        "Exactly one new urgent phone ticket with the right customer, assignee and two tags.",
        """
        seed_max = seed.table("tickets").sort("id", desc=True).first()["id"]
        new = current.table("tickets").gt("id", seed_max).all()
        assert len(new) == 1, f"expected exactly one new ticket, found {len(new)}"
        ticket = new[0]
        assert normalized_contains("504", ticket["description"]), "the description does not mention the 504 error"
        wanted_tags = sorted(r["id"] for r in current.table("tags").in_("name", ["bug", "data-export"]).all())
        links = current.table("ticket_tags").eq("ticket_id", ticket["id"]).all()
        assert sorted(r["tag_id"] for r in links) == wanted_tags, f"ticket tags are {links}, expected bug and data-export"
        expected = [{
            "type": "insert", "table": "tickets", "pk": ticket["id"],
            "fields": [("id", ticket["id"]), ("subject", __SUBJECT__), ("description", ...),
                       ("customer_id", __CUSTOMER__), ("assignee_id", __AGENT__), ("status", "open"),
                       ("priority", "urgent"), ("channel", "phone"), ("resolved_at", None)],
        }]
        for link in links:
            expected.append({"type": "insert", "table": "ticket_tags", "pk": link["id"],
                             "fields": [("id", link["id"]), ("ticket_id", ticket["id"]), ("tag_id", ...)]})
        seed.diff(current, IgnoreConfig(table_fields={"tickets": {"created_at", "updated_at"}})).expect_exactly(expected)
        success_accumulator.append(f"ticket {ticket['id']} created as requested")
        """,  # noqa: E501
        [call("find_customers", query=cust[1]),
         call("create_ticket", customer_email=cust[2], subject=new_subject,
              description="Every payroll export since this morning fails with a 504 gateway "
                          "timeout.",
              priority="urgent", channel="phone", tags=["bug", "data-export"],
              assignee_email=sofia[2])],
        SUBJECT=new_subject, CUSTOMER=cust[0], AGENT=sofia[0],
    )

    (unassigned,) = g.q1(H, "SELECT COUNT(*) FROM tickets WHERE status = 'open' "
                            "AND assignee_id IS NULL")
    g.task(
        "helpdesk-count-unassigned-open", H,
        """How many tickets are in status "open" (not pending) and have no assignee? Do not change
        anything. Give the number with submit_final_answer.""",
        "The answer is the number of unassigned open tickets and nothing changed.",
        """
        numbers = extract_numbers(final_answer)
        assert contains_number(final_answer, __COUNT__), f"answer {final_answer!r} does not contain __COUNT__"
        assert len(numbers) <= 2, f"answer {final_answer!r} lists too many numbers"
        success_accumulator.append("correct count __COUNT__")
        """,  # noqa: E501
        [call("search_tickets", status="open", unassigned=True, limit=1), submit(str(unassigned))],
        COUNT=unassigned,
        answer="a number", unchanged=True,
    )

    busiest = g.q(H, """SELECT a.email, COUNT(t.id) FROM agents a JOIN tickets t
                     ON t.assignee_id = a.id WHERE t.status IN ('open', 'pending')
                     AND a.active = 1 GROUP BY a.id ORDER BY 2 DESC""")
    assert busiest[0][1] > busiest[1][1]
    g.task(
        "helpdesk-busiest-agent", H,
        """Which active support agent currently has the most tickets assigned that are open or
        pending? Reply with that agent's email address using submit_final_answer.""",
        "The answer names the busiest agent's email and nothing changed.",
        """
        assert normalized_contains(__EMAIL__, final_answer), f"answer {final_answer!r} does not name __EMAIL__"
        others = [r["email"] for r in current.table("agents").neq("email", __EMAIL__).all()]
        named = [e for e in others if normalized_contains(e, final_answer)]
        assert not named, f"answer also names other agents: {named}"
        success_accumulator.append("busiest agent identified")
        """,  # noqa: E501
        [call("list_agents"), submit(busiest[0][0])],
        EMAIL=busiest[0][0],
        answer="an email address", unchanged=True,
    )

    zoe = g.q1(H, "SELECT id, name, email FROM customers WHERE email = 'zoe.ito@acmelogistics.com'")
    zoe_pending = [r[0] for r in g.q(H, "SELECT id FROM tickets WHERE customer_id = ? AND status = "
                                      "'pending' ORDER BY id", [zoe[0]])]
    alex = g.q1(H, "SELECT id, name, email FROM agents WHERE id = 1")
    reply = "Glad this is sorted - closing the loop."
    g.task(
        "helpdesk-resolve-customer-pending", H,
        f"""Customer {zoe[1]} ({zoe[2]}) confirmed that all of her issues are fixed. For each of
        her tickets that is currently in status "pending", post a public (not internal) reply as
        {alex[1]} ({alex[2]}) with exactly the text "{reply}", then set the ticket's status to
        resolved. Leave her other tickets alone.""",
        "Each pending ticket of the customer got the reply and is resolved; nothing else changed.",
        """
        expected = []
        for ticket_id in __TICKETS__:
            row = current.table("tickets").eq("id", ticket_id).first()
            assert row is not None and row["status"] == "resolved", f"ticket {ticket_id} is not resolved"
            assert row["resolved_at"] is not None, f"ticket {ticket_id} has no resolved_at"
            expected.append({"type": "modify", "table": "tickets", "pk": ticket_id,
                             "resulting_fields": [("status", "resolved")], "no_other_changes": True})
        seed_max = seed.table("comments").sort("id", desc=True).first()["id"]
        new = current.table("comments").gt("id", seed_max).all()
        got = sorted(c["ticket_id"] for c in new)
        assert got == sorted(__TICKETS__), f"expected one reply on each of __TICKETS__, got replies on {got}"
        for comment in new:
            assert normalized_contains(__REPLY__, comment["body"]), f"reply text is {comment['body']!r}"
            expected.append({"type": "insert", "table": "comments", "pk": comment["id"],
                             "fields": [("id", comment["id"]), ("ticket_id", comment["ticket_id"]),
                                        ("author_type", "agent"), ("author_id", __AGENT__),
                                        ("body", ...), ("internal", 0)]})
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append("pending tickets answered and resolved")
        """,  # noqa: E501
        [call("search_tickets", customer_email=zoe[2], status="pending")]
        + [c for t in zoe_pending for c in (
            call("add_comment", ticket_id=t, body=reply, author_email=alex[2]),
            call("update_ticket", ticket_id=t, status="resolved"))],
        TICKETS=zoe_pending, REPLY=reply, AGENT=alex[0],
        IGNORE={"tickets": {"updated_at", "resolved_at"}, "comments": {"created_at"}},
    )

    bug_tid, bug_subject = g.q(H, """SELECT t.id, t.subject FROM tickets t JOIN ticket_tags tt
        ON tt.ticket_id = t.id JOIN tags g ON g.id = tt.tag_id WHERE t.status = 'open'
        AND t.subject LIKE 'Dashboard%' GROUP BY t.id HAVING group_concat(g.name) = 'bug'
        ORDER BY t.id""")[0]
    (bug_link,) = g.q1(H, "SELECT tt.id FROM ticket_tags tt JOIN tags g ON g.id = tt.tag_id WHERE "
                        "tt.ticket_id = ? AND g.name = 'bug'", [bug_tid])
    (fr_tag,) = g.q1(H, "SELECT id FROM tags WHERE name = 'feature-request'")
    g.task(
        "helpdesk-retag-feature-request", H,
        f"""Ticket #{bug_tid} ("{bug_subject}") turned out to be a feature request, not a bug.
        Replace its "bug" tag with the "feature-request" tag. Change nothing else.""",
        "The bug tag link is gone and a feature-request link exists; nothing else changed.",
        """
        links = current.table("ticket_tags").eq("ticket_id", __TID__).all()
        assert [r["tag_id"] for r in links] == [__TAG__], f"ticket __TID__ now has tag ids {[r['tag_id'] for r in links]}"
        seed.diff(current, IgnoreConfig()).expect_exactly([
            {"type": "delete", "table": "ticket_tags", "pk": __LINK__},
            {"type": "insert", "table": "ticket_tags", "pk": links[0]["id"],
             "fields": [("id", links[0]["id"]), ("ticket_id", __TID__), ("tag_id", __TAG__)]},
        ])
        success_accumulator.append("tag replaced")
        """,  # noqa: E501
        [call("get_ticket", ticket_id=bug_tid),
         call("set_tags", ticket_id=bug_tid, add=["feature-request"], remove=["bug"])],
        TID=bug_tid, TAG=fr_tag, LINK=bug_link,
    )

    who = g.q1(H, "SELECT c.email, c.company FROM tickets t JOIN customers c "
                  "ON c.id = t.customer_id WHERE t.id = 1225")
    g.task(
        "helpdesk-who-filed-ticket", H,
        """Who filed ticket #1225? Submit the customer's email address and the name of their
        company with submit_final_answer.""",
        "The answer has the right email and company and nothing changed.",
        """
        assert normalized_contains(__EMAIL__, final_answer), f"answer {final_answer!r} lacks the email"
        assert normalized_contains(__COMPANY__, final_answer), f"answer {final_answer!r} lacks the company"
        success_accumulator.append("customer identified")
        """,  # noqa: E501
        [call("get_ticket", ticket_id=1225), submit(f"{who[0]} ({who[1]})")],
        EMAIL=who[0], COMPANY=who[1],
        answer="an email and a company", unchanged=True,
    )

    aisha = g.q1(H, "SELECT id, name, email FROM agents WHERE name = 'Aisha Bello'")
    noah = g.q1(H, "SELECT id, name, email FROM agents WHERE name = 'Noah Fischer'")
    elena = g.q1(H, "SELECT id, name, email FROM agents WHERE name = 'Elena Petrova'")
    aisha_open = [r[0] for r in g.q(H, "SELECT id FROM tickets WHERE assignee_id = ? AND status IN "
                                     "('open', 'pending') ORDER BY id", [aisha[0]])]
    note = "Reassigned from Aisha Bello."
    g.task(
        "helpdesk-reassign-departing-agent", H,
        f"""{aisha[1]} ({aisha[2]}) is going on leave. Reassign every ticket assigned to her that
        is open or pending to {noah[1]} ({noah[2]}), and on each of those tickets add an internal
        note (internal=true) written by the team lead {elena[1]} ({elena[2]}) with exactly the
        text "{note}". Do not touch her resolved or closed tickets.""",
        "Every open/pending ticket of the departing agent moved and carries the internal note.",
        """
        expected = []
        for ticket_id in __TICKETS__:
            expected.append({"type": "modify", "table": "tickets", "pk": ticket_id,
                             "resulting_fields": [("assignee_id", __TO__)], "no_other_changes": True})
        left = int(current.table("tickets").eq("assignee_id", __FROM__).in_("status", ["open", "pending"]).count())
        assert left == 0, f"{left} open or pending tickets are still assigned to agent __FROM__"
        seed_max = seed.table("comments").sort("id", desc=True).first()["id"]
        new = current.table("comments").gt("id", seed_max).all()
        got = sorted(c["ticket_id"] for c in new)
        assert got == sorted(__TICKETS__), f"expected one note on each of __TICKETS__, got {got}"
        for comment in new:
            assert normalized_contains(__NOTE__, comment["body"]), f"note text is {comment['body']!r}"
            expected.append({"type": "insert", "table": "comments", "pk": comment["id"],
                             "fields": [("id", comment["id"]), ("ticket_id", comment["ticket_id"]),
                                        ("author_type", "agent"), ("author_id", __LEAD__),
                                        ("body", ...), ("internal", 1)]})
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append("tickets reassigned with internal notes")
        """,  # noqa: E501
        [call("search_tickets", assignee_email=aisha[2], status="open"),
         call("search_tickets", assignee_email=aisha[2], status="pending")]
        + [c for t in aisha_open for c in (
            call("update_ticket", ticket_id=t, assignee_email=noah[2]),
            call("add_comment", ticket_id=t, body=note, author_email=elena[2], internal=True))],
        TICKETS=aisha_open, TO=noah[0], FROM=aisha[0], NOTE=note, LEAD=elena[0],
        IGNORE={"tickets": {"updated_at"}, "comments": {"created_at"}},
    )

    oldest = g.q(H, "SELECT id FROM tickets WHERE status = 'open' AND priority = 'urgent' AND "
                  "assignee_id IS NULL ORDER BY created_at, id")
    oldest_id = oldest[0][0]
    take = "Taking this one - Elena."
    g.task(
        "helpdesk-take-oldest-urgent", H,
        f"""Find the oldest ticket (by creation time) that is open, has priority urgent and has no
        assignee. Assign it to {elena[1]} ({elena[2]}), set its status to pending, and add an
        internal note (internal=true) from her with exactly the text "{take}".""",
        "The oldest unassigned urgent open ticket is taken by the lead, pending, with a note.",
        """
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly([
            {"type": "modify", "table": "tickets", "pk": __TID__,
             "resulting_fields": [("assignee_id", __LEAD__), ("status", "pending")],
             "no_other_changes": True},
            {"type": "insert", "table": "comments",
             "pk": current.table("comments").sort("id", desc=True).first()["id"],
             "fields": [("id", ...), ("ticket_id", __TID__), ("author_type", "agent"),
                        ("author_id", __LEAD__), ("body", ...), ("internal", 1)]},
        ])
        note = current.table("comments").eq("ticket_id", __TID__).sort("id", desc=True).first()
        assert normalized_contains(__NOTE__, note["body"]), f"note text is {note['body']!r}"
        success_accumulator.append("oldest urgent ticket taken")
        """,
        [call("search_tickets", status="open", priority="urgent", unassigned=True, sort="oldest",
              limit=5),
         call("update_ticket", ticket_id=oldest_id, assignee_email=elena[2], status="pending"),
         call("add_comment", ticket_id=oldest_id, body=take, author_email=elena[2], internal=True)],
        TID=oldest_id, LEAD=elena[0], NOTE=take,
        IGNORE={"tickets": {"updated_at"}, "comments": {"created_at"}},
    )

    ui_tid = g.q(H, "SELECT id FROM tickets WHERE status = 'open' "
                    "AND subject LIKE 'Export to CSV%' ORDER BY id")[0][0]
    ui_reply = "We have fixed the export; please try again."
    g.task(
        "helpdesk-ui-reply-and-resolve", H,
        f"""Use the helpdesk web UI (the computer tool). Open ticket #{ui_tid}, post the reply
        "{ui_reply}" to the customer, and then mark the ticket as resolved.""",
        "The ticket is resolved and has the reply from the signed-in agent.",
        """
        row = current.table("tickets").eq("id", __TID__).first()
        assert row is not None and row["status"] == "resolved", "ticket __TID__ is not resolved"
        seed_max = seed.table("comments").sort("id", desc=True).first()["id"]
        new = current.table("comments").gt("id", seed_max).all()
        assert len(new) == 1, f"expected one new reply, found {len(new)}"
        assert normalized_contains(__REPLY__, new[0]["body"]), f"reply text is {new[0]['body']!r}"
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly([
            {"type": "modify", "table": "tickets", "pk": __TID__,
             "resulting_fields": [("status", "resolved")], "no_other_changes": True},
            {"type": "insert", "table": "comments", "pk": new[0]["id"],
             "fields": [("id", new[0]["id"]), ("ticket_id", __TID__), ("author_type", "agent"),
                        ("author_id", 1), ("body", ...), ("internal", 0)]},
        ])
        success_accumulator.append("ticket answered and resolved in the UI")
        """,
        g.ui_script(H, HelpdeskScreen, [
            ("click", "field:search", None), ("type", str(ui_tid)), ("key", "Enter"),
            ("click", "row", ui_tid), ("click", "field:reply", None), ("type", ui_reply),
            ("click", "button:post", None), ("click", "button:resolve", None)]),
        modality="computer_use",
        TID=ui_tid, REPLY=ui_reply,
        IGNORE={"tickets": {"updated_at", "resolved_at"}, "comments": {"created_at"}},
    )

    # browser_use: the same web UI, in a browser lease the episode opens next to the instance.
    web_tid = g.q(H, "SELECT id FROM tickets WHERE status = 'open' "
                     "AND subject NOT LIKE 'Export to CSV%' ORDER BY id")[0][0]
    g.task(
        "helpdesk-browser-resolve-ticket", H,
        f"""Use the helpdesk web app in the browser (the computer tool). Find ticket
        #{web_tid} and mark it as resolved. Change nothing else.""",
        "The ticket is resolved from the web UI and nothing else changed.",
        """
        row = current.table("tickets").eq("id", __TID__).first()
        assert row is not None and row["status"] == "resolved", "ticket __TID__ is not resolved"
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly([
            {"type": "modify", "table": "tickets", "pk": __TID__,
             "resulting_fields": [("status", "resolved")], "no_other_changes": True},
        ])
        success_accumulator.append("ticket resolved in the browser")
        """,
        g.ui_script(H, HelpdeskScreen, [
            ("click", "field:search", None), ("type", str(web_tid)), ("key", "Enter"),
            ("click", "row", web_tid), ("click", "button:resolve", None)]),
        modality="browser_use",
        TID=web_tid, IGNORE={"tickets": {"updated_at", "resolved_at"}},
    )

    (company_total,) = g.q1(H, "SELECT COUNT(*) FROM tickets t JOIN customers c ON c.id = "
                               "t.customer_id WHERE c.company = 'Redwood Clinics'")
    g.task(
        "helpdesk-company-ticket-total", H,
        """How many tickets in total (any status) have been filed by people who work at Redwood
        Clinics? Submit the number with submit_final_answer.""",
        "The answer is the company's ticket total and nothing changed.",
        """
        assert contains_number(final_answer, __COUNT__), f"answer {final_answer!r} does not contain __COUNT__"
        assert len(extract_numbers(final_answer)) <= 2, f"answer {final_answer!r} lists too many numbers"
        success_accumulator.append("correct total __COUNT__")
        """,  # noqa: E501
        [call("find_customers", query="Redwood Clinics", limit=50), submit(str(company_total))],
        COUNT=company_total,
        answer="a number", unchanged=True,
    )



def _shop_tasks(g: _Generator) -> None:
    """Add the shop tasks, in the order they appear in the bundled tasks file."""
    refund_oid, refund_total = g.q(S, """SELECT o.id, o.total_cents FROM orders o WHERE o.status =
        'delivered' AND (SELECT COUNT(*) FROM order_items WHERE order_id = o.id) = 2 AND NOT EXISTS
        (SELECT 1 FROM refunds WHERE order_id = o.id) ORDER BY o.id""")[0]
    restock = {p: g.stock(p) + qty for p, qty, _ in g.order_lines(refund_oid)}
    g.task(
        "shop-refund-returned-order", S,
        f"""Order #{refund_oid} came back unopened. Refund it in full with the reason
        "customer_request" and put all of its items back in stock.""",
        "The order is refunded in full with restock, stock levels went up, nothing else changed.",
        """
        refunds = current.table("refunds").eq("order_id", __OID__).all()
        assert len(refunds) == 1, f"expected one refund on order __OID__, found {len(refunds)}"
        expected = [
            {"type": "modify", "table": "orders", "pk": __OID__,
             "resulting_fields": [("status", "refunded")], "no_other_changes": True},
            {"type": "insert", "table": "refunds", "pk": refunds[0]["id"],
             "fields": [("id", refunds[0]["id"]), ("order_id", __OID__), ("amount_cents", __TOTAL__),
                        ("reason", "customer_request"), ("restocked", 1), ("note", ...)]},
        ]
        for product_id, on_hand in __STOCK__.items():
            expected.append({"type": "modify", "table": "inventory", "pk": product_id,
                             "resulting_fields": [("on_hand", on_hand)], "no_other_changes": True})
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append("order refunded and restocked")
        """,  # noqa: E501
        [call("get_order", order_id=refund_oid),
         call("refund_order", order_id=refund_oid, reason="customer_request", restock=True)],
        OID=refund_oid, TOTAL=refund_total, STOCK=restock, IGNORE=SHOP_TS,
    )

    buyer = g.q(S, "SELECT id, name, email FROM customers WHERE loyalty_tier = 'gold' "
                   "ORDER BY id")[0]
    mat = g.q1(S, "SELECT id, sku, price_cents FROM products WHERE name = 'Yoga Mat'")
    roller = g.q1(S, "SELECT id, sku, price_cents FROM products WHERE name = 'Foam Roller'")
    (coupon_id, coupon_pct, coupon_used) = g.q1(S, "SELECT id, percent_off, times_used "
                                                   "FROM coupons WHERE code = 'SUMMER5'")
    subtotal = 2 * mat[2] + roller[2]
    discount, shipping, total = order_amounts(subtotal, coupon_pct, "standard")
    g.task(
        "shop-place-order-with-coupon", S,
        f"""Place an order for {buyer[1]} ({buyer[2]}): two Yoga Mats and one Foam Roller, with
        standard shipping and the coupon code SUMMER5. Look up the products' SKUs first.""",
        "One new paid order with the right lines, prices and coupon; stock and coupon use updated.",
        """
        seed_max = seed.table("orders").sort("id", desc=True).first()["id"]
        new = current.table("orders").gt("id", seed_max).all()
        assert len(new) == 1, f"expected exactly one new order, found {len(new)}"
        order = new[0]
        lines = current.table("order_items").eq("order_id", order["id"]).all()
        got = sorted((r["product_id"], r["quantity"]) for r in lines)
        assert got == __LINES__, f"order lines are {got}, expected __LINES__"
        expected = [{"type": "insert", "table": "orders", "pk": order["id"],
                     "fields": [("id", order["id"]), ("customer_id", __CUSTOMER__), ("status", "paid"),
                                ("placed_at", ...), ("shipping_method", "standard"),
                                ("subtotal_cents", __SUBTOTAL__), ("discount_cents", __DISCOUNT__),
                                ("shipping_cents", __SHIPPING__), ("total_cents", __TOTAL__),
                                ("coupon_code", "SUMMER5")]}]
        for line in lines:
            expected.append({"type": "insert", "table": "order_items", "pk": line["id"],
                             "fields": [("id", line["id"]), ("order_id", order["id"]),
                                        ("product_id", line["product_id"]),
                                        ("quantity", line["quantity"]), ("unit_price_cents", ...)]})
        for product_id, on_hand in __STOCK__.items():
            expected.append({"type": "modify", "table": "inventory", "pk": product_id,
                             "resulting_fields": [("on_hand", on_hand)], "no_other_changes": True})
        expected.append({"type": "modify", "table": "coupons", "pk": __COUPON__,
                         "resulting_fields": [("times_used", __USED__)], "no_other_changes": True})
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append(f"order {order['id']} placed correctly")
        """,  # noqa: E501
        [call("find_customers", query=buyer[2]),
         call("search_products", query="Yoga Mat"), call("search_products", query="Foam Roller"),
         call("place_order", customer_email=buyer[2],
              items=[{"sku": mat[1], "quantity": 2}, {"sku": roller[1], "quantity": 1}],
              coupon_code="SUMMER5", shipping_method="standard")],
        LINES=sorted([(mat[0], 2), (roller[0], 1)]), CUSTOMER=buyer[0], SUBTOTAL=subtotal,
        DISCOUNT=discount, SHIPPING=shipping, TOTAL=total,
        STOCK={mat[0]: g.stock(mat[0]) - 2, roller[0]: g.stock(roller[0]) - 1},
        COUPON=coupon_id, USED=coupon_used + 1,
        IGNORE={"orders": {"updated_at"}, "inventory": {"updated_at"}},
    )

    (shipped,) = g.q1(S, "SELECT COUNT(*) FROM orders WHERE status = 'shipped'")
    g.task(
        "shop-count-shipped", S,
        """How many orders are currently in status "shipped" (on their way, not yet delivered)?
        Answer with submit_final_answer.""",
        "The answer is the number of shipped orders and nothing changed.",
        """
        assert contains_number(final_answer, __COUNT__), f"answer {final_answer!r} does not contain __COUNT__"
        assert len(extract_numbers(final_answer)) <= 2, f"answer {final_answer!r} lists too many numbers"
        success_accumulator.append("correct count __COUNT__")
        """,  # noqa: E501
        [call("list_orders", status="shipped", limit=1), submit(str(shipped))],
        COUNT=shipped,
        answer="a number", unchanged=True,
    )

    summary = g.q(S, """SELECT c.email, COUNT(*), MAX(o.total_cents) FROM orders o JOIN customers c
        ON c.id = o.customer_id GROUP BY c.id HAVING COUNT(*) >= 4 ORDER BY c.id""")[0]
    (top_order,) = g.q1(S, "SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id "
                           "WHERE c.email = ? AND o.total_cents = ?", [summary[0], summary[2]])
    g.task(
        "shop-customer-order-summary", S,
        f"""For the customer with email {summary[0]}: how many orders have they placed (any status),
        and what is the order number of their most expensive order? Submit both with
        submit_final_answer.""",
        "The answer has the order count and the most expensive order's number; nothing changed.",
        """
        assert contains_number(final_answer, __COUNT__), f"answer {final_answer!r} lacks the count __COUNT__"
        assert contains_number(final_answer, __ORDER__), f"answer {final_answer!r} lacks order __ORDER__"
        assert len(extract_numbers(final_answer)) <= 4, f"answer {final_answer!r} lists too many numbers"
        success_accumulator.append("order summary correct")
        """,  # noqa: E501
        [call("list_orders", customer_email=summary[0], sort="total_desc"),
         submit(f"{summary[1]} orders; the most expensive is order #{top_order}")],
        COUNT=summary[1], ORDER=top_order,
        answer="a count and an order number", unchanged=True,
    )

    (next_coupon,) = g.q1(S, "SELECT MAX(id) + 1 FROM coupons")
    g.task(
        "shop-create-summer-coupon", S,
        """Create a new coupon with the code SUMMER25: 25 percent off, valid through 2025-08-31,
        usable at most 250 times.""",
        "Exactly the requested coupon exists and nothing else changed.",
        """
        seed.diff(current, IgnoreConfig()).expect_exactly([
            {"type": "insert", "table": "coupons", "pk": __ID__,
             "fields": [("id", __ID__), ("code", "SUMMER25"), ("percent_off", 25), ("active", 1),
                        ("expires_on", "2025-08-31"), ("max_uses", 250), ("times_used", 0)]},
        ])
        success_accumulator.append("coupon created")
        """,
        [call("create_coupon", code="SUMMER25", percent_off=25, expires_on="2025-08-31",
              max_uses=250)],
        ID=next_coupon,
    )

    cancel_oid = g.q(S, "SELECT id FROM orders WHERE status = 'paid' ORDER BY placed_at, id")[0][0]
    cancel_customer = g.q1(S, "SELECT c.name FROM orders o JOIN customers c "
                              "ON c.id = o.customer_id WHERE o.id = ?", [cancel_oid])[0]
    g.task(
        "shop-cancel-paid-order", S,
        f"""{cancel_customer} asked us to cancel order #{cancel_oid} before it ships. Cancel it
        (its items must go back in stock).""",
        "The order is cancelled and its units are back in stock; nothing else changed.",
        """
        expected = [{"type": "modify", "table": "orders", "pk": __OID__,
                     "resulting_fields": [("status", "cancelled")], "no_other_changes": True}]
        for product_id, on_hand in __STOCK__.items():
            expected.append({"type": "modify", "table": "inventory", "pk": product_id,
                             "resulting_fields": [("on_hand", on_hand)], "no_other_changes": True})
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append("order cancelled and restocked")
        """,
        [call("get_order", order_id=cancel_oid),
         call("update_order_status", order_id=cancel_oid, status="cancelled")],
        OID=cancel_oid, STOCK={p: g.stock(p) + qty for p, qty, _ in g.order_lines(cancel_oid)},
        IGNORE=SHOP_TS,
    )

    skillet = g.q1(S, "SELECT id, sku FROM products WHERE name = 'Cast Iron Skillet'")
    headlamp = g.q1(S, "SELECT id, sku FROM products WHERE name = 'Headlamp'")
    g.task(
        "shop-receive-shipment", S,
        """A supplier delivery just arrived with 40 Cast Iron Skillets and 25 Headlamps. Record it
        in the inventory as received stock.""",
        "Both products' on-hand stock went up by the delivered amounts and nothing else changed.",
        """
        expected = []
        for product_id, on_hand in __STOCK__.items():
            expected.append({"type": "modify", "table": "inventory", "pk": product_id,
                             "resulting_fields": [("on_hand", on_hand)], "no_other_changes": True})
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append("stock received")
        """,
        [call("search_products", query="Skillet"), call("search_products", query="Headlamp"),
         call("adjust_inventory", reason="received",
              adjustments=[{"sku": skillet[1], "delta": 40}, {"sku": headlamp[1], "delta": 25}])],
        STOCK={skillet[0]: g.stock(skillet[0]) + 40, headlamp[0]: g.stock(headlamp[0]) + 25},
        IGNORE={"inventory": {"updated_at"}},
    )

    low = [r[0] for r in g.q(S, "SELECT p.sku FROM products p JOIN inventory v "
                                "ON v.product_id = p.id WHERE p.active = 1 "
                                "AND v.on_hand < v.reorder_level ORDER BY p.sku")]
    g.task(
        "shop-low-stock-report", S,
        """List the SKUs of all active (not discontinued) products whose on-hand stock is below
        their reorder level. Submit the SKUs, separated by commas, with submit_final_answer.""",
        "The answer lists exactly the low-stock SKUs and nothing changed.",
        """
        mentioned = sorted(set(re.findall(r"[A-Z]{3}-[0-9]{3}", final_answer.upper())))
        assert mentioned == __SKUS__, f"answer lists {mentioned}, expected __SKUS__"
        success_accumulator.append("low-stock SKUs correct")
        """,
        [call("search_products", sort="stock_asc", limit=60), submit(", ".join(low))],
        SKUS=low,
        answer="a list of SKUs", unchanged=True,
    )

    partial = g.q(S, """SELECT o.id, c.name, p.name, i.unit_price_cents FROM orders o
        JOIN customers c ON c.id = o.customer_id JOIN order_items i ON i.order_id = o.id
        JOIN products p ON p.id = i.product_id WHERE o.status = 'delivered'
        AND (SELECT COUNT(*) FROM order_items WHERE order_id = o.id) = 3
        AND NOT EXISTS (SELECT 1 FROM refunds WHERE order_id = o.id) ORDER BY o.id DESC, i.id""")[0]
    p_oid, p_customer, p_product, p_price = partial
    g.task(
        "shop-partial-refund-damaged-item", S,
        f"""{p_customer} reports that the {p_product} in order #{p_oid} arrived damaged; the rest of
        the order is fine. Refund exactly the price of one {p_product} with the reason "damaged",
        without restocking anything. The order itself must stay as it is.""",
        "One partial refund of the item's unit price; the order row and stock are unchanged.",
        """
        refunds = current.table("refunds").eq("order_id", __OID__).all()
        assert len(refunds) == 1, f"expected one refund on order __OID__, found {len(refunds)}"
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly([
            {"type": "insert", "table": "refunds", "pk": refunds[0]["id"],
             "fields": [("id", refunds[0]["id"]), ("order_id", __OID__), ("amount_cents", __AMOUNT__),
                        ("reason", "damaged"), ("restocked", 0), ("note", ...)]},
        ])
        success_accumulator.append("partial refund recorded")
        """,  # noqa: E501
        [call("get_order", order_id=p_oid),
         call("refund_order", order_id=p_oid, reason="damaged", amount_cents=p_price,
              note=f"Damaged {p_product}")],
        OID=p_oid, AMOUNT=p_price, IGNORE=SHOP_TS,
    )

    ui_oid, ui_total = g.q(S, """SELECT o.id, o.total_cents FROM orders o WHERE o.status = 'shipped'
        AND NOT EXISTS (SELECT 1 FROM refunds WHERE order_id = o.id) ORDER BY o.id""")[0]
    g.task(
        "shop-ui-refund-and-restock", S,
        f"""Use the shop admin web UI (the computer tool). Order #{ui_oid} was lost in transit and
        the carrier returned what was left to our warehouse: refund the order in full and put its
        items back in stock.""",
        "The order is refunded in full from the UI with restock; nothing else changed.",
        """
        refunds = current.table("refunds").eq("order_id", __OID__).all()
        assert len(refunds) == 1, f"expected one refund on order __OID__, found {len(refunds)}"
        expected = [
            {"type": "modify", "table": "orders", "pk": __OID__,
             "resulting_fields": [("status", "refunded")], "no_other_changes": True},
            {"type": "insert", "table": "refunds", "pk": refunds[0]["id"],
             "fields": [("id", refunds[0]["id"]), ("order_id", __OID__), ("amount_cents", __TOTAL__),
                        ("reason", ...), ("restocked", 1), ("note", ...)]},
        ]
        for product_id, on_hand in __STOCK__.items():
            expected.append({"type": "modify", "table": "inventory", "pk": product_id,
                             "resulting_fields": [("on_hand", on_hand)], "no_other_changes": True})
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append("order refunded and restocked in the UI")
        """,  # noqa: E501
        g.ui_script(S, ShopScreen, [
            ("click", "field:search", None), ("type", str(ui_oid)), ("key", "Enter"),
            ("click", "row", ui_oid), ("click", "button:refund", "restock")]),
        modality="computer_use",
        OID=ui_oid, TOTAL=ui_total,
        STOCK={p: g.stock(p) + qty for p, qty, _ in g.order_lines(ui_oid)},
        IGNORE=SHOP_TS,
    )

    to_ship = [r[0] for r in g.q(S, "SELECT id FROM orders WHERE status = 'paid' AND placed_at < "
                                  "'2025-06-01' ORDER BY id")]
    g.task(
        "shop-ship-old-paid-orders", S,
        """Every order that is currently "paid" and was placed before 2025-06-01 has been handed to
        the carrier today. Mark each of them as shipped. Leave newer paid orders alone.""",
        "Exactly the old paid orders are shipped; nothing else changed.",
        """
        expected = [{"type": "modify", "table": "orders", "pk": order_id,
                     "resulting_fields": [("status", "shipped")], "no_other_changes": True}
                    for order_id in __ORDERS__]
        seed.diff(current, IgnoreConfig(table_fields=__IGNORE__)).expect_exactly(expected)
        success_accumulator.append(f"{len(__ORDERS__)} orders shipped")
        """,
        [call("list_orders", status="paid", placed_to="2025-05-31", limit=50)]
        + [call("update_order_status", order_id=o, status="shipped") for o in to_ship],
        ORDERS=to_ship, IGNORE={"orders": {"updated_at"}},
    )


if __name__ == "__main__":
    main()
