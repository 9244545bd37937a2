"""The bundled tasks that exercise the grading paths of Fleet's verifiers (docs/grading.md).

Three helpdesk tasks, each graded the way a family of real Fleet verifiers grades: a
*judge* with a ``conversation`` parameter (a fixed rubric instead of an LLM, so it is
deterministic), a *partial* one with four checks in the ``ERROR_ACCUMULATOR`` /
``SUCCESS_ACCUMULATOR`` blocks, and a *multi-app* one (``App <name>: 0|1`` lines, ``VERIFY_``
blocks). The local Fleet serves one app per instance (fleet-python's ``env.app(name)``
addresses apps by host path, which its per-instance URLs do not model), so that task's
apps are parts of the helpdesk instance: ``helpdesk``, ``outbox`` and a trivial ``files``.

``tests/_support/generate_tasks.py`` appends these to the bundled tasks
(``fleetenv.bundled_tasks_path()``); the values they quote are read from the seed data
there and passed in as ``query``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["grading_tasks"]

Query = Callable[[str, str, Sequence[Any]], Any]

_ACCUMULATORS = '''
    print(">>> ERROR_ACCUMULATOR >>>")
    print(error_accumulator)
    print("<<< ERROR_ACCUMULATOR <<<")
    print(">>> SUCCESS_ACCUMULATOR >>>")
    print(success_accumulator)
    print("<<< SUCCESS_ACCUMULATOR <<<")'''

JUDGE = '''def validate_task(env: Environment, final_answer: str | None = None,
                  conversation: str | None = None) -> int:
    """The ticket is resolved and the agent told the customer so (a rubric judge)."""
    env.instance.load()
    seed = env.db("seed")
    current = env.db("current")
    error_accumulator = []
    success_accumulator = []
    row = current.table("tickets").eq("id", __TID__).first()
    if row is not None and row["status"] == "resolved":
        success_accumulator.append("ticket __TID__ is resolved")
    else:
        error_accumulator.append("ticket __TID__ is not resolved")
    messages = json.loads(conversation) if isinstance(conversation, str) else (conversation or [])
    said = [final_answer or ""]
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            said.append(str(content or ""))
    told = " ".join(said)
    if "__TID__" in told and normalized_contains("resolved", told):
        success_accumulator.append("the customer was told that ticket __TID__ is resolved")
    else:
        error_accumulator.append(
            "the agent never told the customer that ticket __TID__ is resolved")
    try:
        seed.diff(current, IgnoreConfig(table_fields={"tickets": {"updated_at", "resolved_at"}})
                  ).expect_exactly([{"type": "modify", "table": "tickets", "pk": __TID__,
                                     "resulting_fields": [("status", "resolved")],
                                     "no_other_changes": True}])
        success_accumulator.append("nothing else changed")
    except AssertionError as exc:
        error_accumulator.append(f"unexpected changes: {exc}")
''' + _ACCUMULATORS + '''
    return TASK_FAILED_SCORE if error_accumulator else TASK_SUCCESSFUL_SCORE
'''

PARTIAL = '''def validate_task(env: Environment, final_answer: str | None = None) -> int:
    """Four independent checks of the escalation; each one counts for partial credit."""
    env.instance.load()
    seed = env.db("seed")
    current = env.db("current")
    error_accumulator = []
    success_accumulator = []

    def check(passed, success, failure):
        if passed:
            success_accumulator.append(success)
        else:
            error_accumulator.append(failure)

    row = current.table("tickets").eq("id", __TID__).first()
    check(row["priority"] == "urgent", "priority is urgent",
          f"priority is {row['priority']}, expected urgent")
    check(row["assignee_id"] == __AGENT__, "assigned to agent __AGENT__",
          f"assigned to {row['assignee_id']}, expected __AGENT__")
    links = current.table("ticket_tags").eq("ticket_id", __TID__).all()
    check(__TAG__ in [r["tag_id"] for r in links], "tagged escalated",
          "the escalated tag is missing")
    seed_links = {r["id"] for r in seed.table("ticket_tags").eq("ticket_id", __TID__).all()}
    expected = [{"type": "modify", "table": "tickets", "pk": __TID__,
                 "resulting_fields": [("priority", "urgent"), ("assignee_id", __AGENT__)],
                 "no_other_changes": True}]
    for link in links:
        if link["id"] not in seed_links:
            expected.append({"type": "insert", "table": "ticket_tags", "pk": link["id"],
                             "fields": [("id", link["id"]), ("ticket_id", __TID__),
                                        ("tag_id", __TAG__)]})
    try:
        ignore = IgnoreConfig(table_fields={"tickets": {"updated_at"}})
        seed.diff(current, ignore).expect_exactly(expected)
        success_accumulator.append("nothing else changed")
    except AssertionError as exc:
        error_accumulator.append(f"unexpected changes: {exc}")
''' + _ACCUMULATORS + '''
    return TASK_FAILED_SCORE if error_accumulator else TASK_SUCCESSFUL_SCORE
'''

MULTI_APP = '''def validate_task(env: Environment, final_answer: str | None = None) -> int:
    """Combined verifier: the ticket app and the customer's outbox must both pass."""
    env.instance.load()
    seed = env.db("seed")
    current = env.db("current")

    def verify_helpdesk():
        error_accumulator = []
        success_accumulator = []
        row = current.table("tickets").eq("id", __TID__).first()
        if row["status"] == "pending":
            success_accumulator.append("ticket __TID__ is pending")
        else:
            error_accumulator.append(f"ticket __TID__ is {row['status']}, expected pending")
        try:  # this app's tables: everything but the outbox (comments)
            ignore = IgnoreConfig(tables={"comments"}, table_fields={"tickets": {"updated_at"}})
            seed.diff(current, ignore).expect_exactly([
                {"type": "modify", "table": "tickets", "pk": __TID__,
                 "resulting_fields": [("status", "pending")], "no_other_changes": True}])
            success_accumulator.append("nothing else changed in the helpdesk")
        except AssertionError as exc:
            error_accumulator.append(f"unexpected helpdesk changes: {exc}")
''' + _ACCUMULATORS.replace("\n    ", "\n        ") + '''
        return 0 if error_accumulator else 1

    def verify_outbox():
        error_accumulator = []
        success_accumulator = []
        seed_max = seed.table("comments").sort("id", desc=True).first()["id"]
        new = current.table("comments").gt("id", seed_max).all()
        replies = [c for c in new if c["ticket_id"] == __TID__ and not c["internal"]
                   and c["author_id"] == __AGENT__ and normalized_contains(__REPLY__, c["body"])]
        if len(replies) == 1 and len(new) == 1:
            success_accumulator.append("the customer got the reply")
        else:
            error_accumulator.append(
                f"expected one public reply from agent __AGENT__, new comments: {new}")
''' + _ACCUMULATORS.replace("\n    ", "\n        ") + '''
        return 0 if error_accumulator else 1

    def verify_files():
        print("PASS: [C] No filesystem changes expected for this task")
        return 1

    total = 0
    for name, check in (("helpdesk", verify_helpdesk), ("outbox", verify_outbox),
                        ("files", verify_files)):
        try:
            print(f"<<< VERIFY_{name} <<<")
            result = check()
            print(f">>> VERIFY_{name} >>>")
            total += result
            print(f"App {name}: {result}")
        except Exception as exc:
            print(f"Error in app {name}: {exc}")
    print(f"Combined result: {total}/3 apps passed")
    return 1 if total == 3 else 0
'''


def _render(source: str, **values: Any) -> str:
    for name, value in values.items():
        token = f"__{name}__"
        assert token in source, token
        source = source.replace(token, repr(value) if isinstance(value, str) else str(value))
    return source


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def grading_tasks(query: Query, base: dict[str, Any]) -> list[dict[str, Any]]:
    """The three tasks, as Fleet export dicts. ``query(app, sql, args)`` returns one row
    from the seed data; ``base`` holds the helpdesk fields every task shares (env and
    data keys and versions)."""
    def task(key: str, prompt: str, verifier: str, solution: list[dict[str, Any]],
             **metadata: Any) -> dict[str, Any]:
        return {"key": key, "prompt": " ".join(prompt.split()), **base,
                "task_modality": "tool_use", "verifier_func": verifier,
                "metadata": {"reference_solution": solution, **metadata}}

    tid, subject = query("helpdesk", "SELECT id, subject FROM tickets WHERE subject = "
                         "'Cannot log in after password reset' AND status = 'open' "
                         "AND priority = 'low' ORDER BY id LIMIT 1", ())
    judge = task(
        "helpdesk-judge-tell-customer",
        f"""Ticket #{tid} ("{subject}") is fixed. Set its status to resolved, then tell the
        customer that ticket #{tid} is resolved: your final answer (submit_final_answer) is
        the message they will read.""",
        _render(JUDGE, TID=tid),
        [_call("get_ticket", ticket_id=tid),
         _call("update_ticket", ticket_id=tid, status="resolved"),
         _call("submit_final_answer",
               answer=f"Good news: ticket #{tid} is resolved. You can log in again.")],
    )

    tid, subject = query("helpdesk", "SELECT id, subject FROM tickets WHERE subject LIKE "
                         "'Mobile app crashes%' AND status = 'open' AND priority = 'low' "
                         "ORDER BY id LIMIT 1", ())
    agent, email = query("helpdesk", "SELECT id, email FROM agents WHERE name = "
                         "'Hana Suzuki'", ())
    (tag,) = query("helpdesk", "SELECT id FROM tags WHERE name = 'escalated'", ())
    partial = task(
        "helpdesk-partial-escalation",
        f"""Escalate ticket #{tid} ("{subject}"): raise its priority to urgent, assign it to
        Hana Suzuki ({email}) and add the tag "escalated". Change nothing else.""",
        _render(PARTIAL, TID=tid, AGENT=agent, TAG=tag),
        [_call("get_ticket", ticket_id=tid),
         _call("update_ticket", ticket_id=tid, priority="urgent", assignee_email=email),
         _call("set_tags", ticket_id=tid, add=["escalated"])],
        partial_reward=True,
    )

    tid, subject, agent = query("helpdesk", "SELECT id, subject, assignee_id FROM tickets "
                                "WHERE subject = 'Charged twice for the May invoice' AND "
                                "status = 'open' AND priority = 'low' ORDER BY id LIMIT 1", ())
    name, email = query("helpdesk", "SELECT name, email FROM agents WHERE id = ?", (agent,))
    reply = "We have refunded the duplicate charge; it shows within 5 business days."
    multi = task(
        "helpdesk-multi-app-billing-reply",
        f"""Ticket #{tid} ("{subject}"): post a public reply to the customer as {name}
        ({email}) with exactly the text "{reply}", and set the ticket's status to pending
        while we wait for their confirmation. Change nothing else on the ticket.""",
        _render(MULTI_APP, TID=tid, AGENT=agent, REPLY=reply),
        [_call("get_ticket", ticket_id=tid),
         _call("add_comment", ticket_id=tid, body=reply, author_email=email),
         _call("update_ticket", ticket_id=tid, status="pending")],
        apps=["helpdesk", "outbox", "files"],
    )
    return [judge, partial, multi]
