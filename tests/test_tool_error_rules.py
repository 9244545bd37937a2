"""Which tool results are errors: the documented rule, applied once in the episode.

Against the embedded local Fleet with a ``payloads`` app whose tools answer the way
Fleet's servers do when a request fails (``{"error": ...}``, ``{"status": "failed"}``)
and the way ordinary data looks (a record whose ``error`` is null or empty, a list of
records with a failed one), plus the rule itself on typed results.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _support.fixtures_local import toy_app
from mcp.server import MCPServer

from fleetenv import FleetEnv, Task, ToolCall
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import ToolErrorReported
from fleetenv.core.tool_results import ImageBlock, TextBlock, ToolResult
from fleetenv.local import LocalFleet
from fleetenv.local.apps.base import DbFactory
from fleetenv.mcp.error_rules import decide, fleet_rule, protocol_rule, resolve_rule

pytestmark = pytest.mark.timeout(120)


def _register(server: MCPServer, db: DbFactory) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    @server.tool()
    def quota() -> dict[str, Any]:
        """Fails the Fleet way: an error field."""
        return {"error": "quota exceeded for today", "code": 429}

    @server.tool()
    def export() -> dict[str, Any]:
        """Fails with a status and a message."""
        return {"status": "failed", "message": "the export did not finish"}

    @server.tool(structured_output=False)
    def backend() -> str:
        """Fails with status "error", as JSON text only."""
        return '{"status": "error", "detail": "backend unavailable"}'

    @server.tool()
    def denied() -> dict[str, Any]:
        """An error object with its own message."""
        return {"error": {"code": 3, "message": "not allowed for this user"}}

    @server.tool()
    def record() -> dict[str, Any]:
        """Ordinary data that has an (empty) error field."""
        return {"id": 7, "error": None, "status": "done", "note": ""}

    @server.tool()
    def empty_error() -> dict[str, Any]:
        """Ordinary data whose error field is an empty string."""
        return {"id": 8, "error": ""}

    @server.tool()
    def jobs() -> list[dict[str, Any]]:
        """A list of records, one of them failed: data, not an error."""
        return [{"id": 1, "status": "failed"}, {"id": 2, "status": "done"}]

    @server.tool()
    def refuse() -> str:
        """Fails the protocol way (isError)."""
        raise ToolError("refused: not today")


PAYLOADS_APP = toy_app("payloads", "Payloads", "Error payload shapes.", _register)
TASK = Task(key="payloads-task", prompt="Call the tools.", env_key="payloads",
            env_version="v1")

# tool -> the error the default rule reports (None: not an error)
EXPECTED: dict[str, str | None] = {
    "quota": "quota exceeded for today",
    "export": "the export did not finish",
    "backend": "backend unavailable",
    "denied": "not allowed for this user",
    "record": None,
    "empty_error": None,
    "jobs": None,
    "refuse": "Error executing tool refuse: refused: not today",  # the SDK's words
}


@pytest.fixture(scope="module")
def payloads_fleet() -> Iterator[LocalFleet]:
    with LocalFleet(apps={"payloads": PAYLOADS_APP}, verifier_workers=1,
                    browser=False) as fleet:
        yield fleet


def play(fleet: LocalFleet, rule: Any = None) -> tuple[dict[str, Any], FleetEnv, list[Any]]:
    """Call every tool once; returns {tool: observation}, the env, the events."""
    seen: list[Any] = []
    env = FleetEnv(TASK, api_key=fleet.token, base_url=fleet.base_url,
                   events=EventBus([seen.append]), tool_error_rule=rule)
    observations = {}
    with env:
        env.reset()
        for name in EXPECTED:
            observations[name] = env.step(ToolCall(name, {}))[0]
    return observations, env, seen


def test_default_rule_reads_fleet_error_payloads_and_leaves_data_alone(
        payloads_fleet: LocalFleet) -> None:
    observations, env, seen = play(payloads_fleet)
    assert {name: obs.error for name, obs in observations.items()} == EXPECTED
    for name, obs in observations.items():
        assert obs.is_error is (EXPECTED[name] is not None)
        # The agent still sees what the tool returned, not a replacement text.
        assert obs.text and not obs.text.startswith("Error:")
        assert obs.result is not None
        assert obs.result.is_error is (name == "refuse")  # the protocol's own flag, kept
    errors = [n for n, e in EXPECTED.items() if e]
    assert env.stats.tool_errors == len(errors)
    assert [e.tool_name for e in seen if isinstance(e, ToolErrorReported)] == errors
    assert [e.error for e in seen if isinstance(e, ToolErrorReported)] == \
        [EXPECTED[n] for n in errors]


def test_protocol_rule_only_trusts_is_error(payloads_fleet: LocalFleet) -> None:
    observations, env, _ = play(payloads_fleet, "protocol")
    assert [n for n, obs in observations.items() if obs.is_error] == ["refuse"]
    assert env.stats.tool_errors == 1


def test_a_callable_rule_decides(payloads_fleet: LocalFleet) -> None:
    def only_quota(result: ToolResult) -> str | None:
        return "over quota" if "quota" in result.full_text else None

    observations, _, _ = play(payloads_fleet, only_quota)
    assert {n: o.error for n, o in observations.items() if o.is_error} == {"quota": "over quota"}


def test_a_broken_callable_rule_is_a_clear_error(payloads_fleet: LocalFleet) -> None:
    def raises(result: ToolResult) -> str | None:
        raise KeyError("boom")

    def wrong_type(result: ToolResult) -> Any:
        return True

    for rule, match in ((raises, "raised KeyError on a result of 'record'"),
                        (wrong_type, "returned a bool for a result of 'record'")):
        with FleetEnv(TASK, api_key=payloads_fleet.token, base_url=payloads_fleet.base_url,
                      tool_error_rule=rule) as env:
            env.reset()
            with pytest.raises(ConfigurationError, match=match):
                env.step(ToolCall("record", {}))


def test_unknown_rule_name_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="tool_error_rule must be 'fleet' or "
                                                 "'protocol' or a callable"):
        FleetEnv(TASK, tool_error_rule="strict")
    assert resolve_rule(None) is fleet_rule and resolve_rule("protocol") is protocol_rule


# ----------------------------------------------------------------- the rule, case by case


def text(value: str) -> ToolResult:
    return ToolResult(content=(TextBlock(value),))


@pytest.mark.parametrize("payload", [
    '{"error": null}', '{"error": ""}', '{"error": "   "}', '{"error": false}',
    '{"error": 0}', '{"error": {}}', '{"error": []}', '{"status": "ok", "error": null}',
    '{"status": "done"}', '{"isError": false}', '[{"error": "x"}]', '"error"',
    'error: plain text is never parsed', '{"error": "x"',  # not valid JSON
])
def test_not_errors(payload: str) -> None:
    assert fleet_rule(text(payload)) is None


@pytest.mark.parametrize(("payload", "message"), [
    ('{"error": "boom"}', "boom"),
    ('{"error": {"detail": "deep"}}', "deep"),
    ('{"error": {"code": 5}}', '{"code": 5}'),
    ('{"error": true, "message": "said so"}', "said so"),
    ('{"error": 404}', "404"),
    ('{"isError": true}', "isError=true"),
    ('{"is_error": true, "detail": "d"}', "d"),
    ('{"status": "FAILED"}', "status=FAILED"),
    ('{"status": "failed", "error": "e"}', "e"),
    ('{"status": "error", "message": "m", "error": null}', "m"),
    ('{"status": "error", "message": "m", "error": "e"}', "e"),  # the error field first
])
def test_errors_and_their_messages(payload: str, message: str) -> None:
    assert fleet_rule(text(payload)) == message


def test_the_payload_is_the_structured_content_or_the_only_text() -> None:
    structured = ToolResult(content=(TextBlock("all good"),),
                            structured={"status": "failed", "message": "s"})
    assert fleet_rule(structured) == "s"
    several = ToolResult(content=(TextBlock('{"error": "x"}'), TextBlock("more")))
    assert fleet_rule(several) is None
    with_image = ToolResult(content=(TextBlock('{"error": "x"}'),
                                     ImageBlock(data="AAAA", mime_type="image/png")))
    assert fleet_rule(with_image) is None
    flagged = ToolResult(content=(TextBlock("nope"),), is_error=True, error_message="nope")
    assert fleet_rule(flagged) == protocol_rule(flagged) == "nope"
    assert protocol_rule(text('{"error": "x"}')) is None
    long = fleet_rule(text('{"error": "' + "x" * 5000 + '"}'))
    assert long is not None and long.endswith("[... 3000 more chars]")


def test_decide_turns_an_empty_message_into_a_default() -> None:
    assert decide(lambda r: "", text("x"), tool="t") == "the tool reported an error"
    assert decide(lambda r: None, text("x"), tool="t") is None
