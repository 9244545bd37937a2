"""OpenAIChatPolicy against a stubbed chat-completions server and the REAL local Fleet.

``responses`` fakes only the third-party model server (``https://llm.example/v1``); the
local Fleet's traffic on 127.0.0.1 passes through, so every episode provisions, calls MCP
tools and is graded for real. The fake model is a script of replies consumed in order.
"""

from __future__ import annotations

import json
import logging
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import responses

import fleetenv
from fleetenv import bundled_tasks_path
from fleetenv.core.config import FleetConfig, resolve_config
from fleetenv.core.errors import (
    ConfigurationError,
    ConnectError,
    DeadlineExceeded,
    FleetEnvError,
)
from fleetenv.core.tasks import Task
from fleetenv.core.types import RolloutResult
from fleetenv.local import LocalFleet
from fleetenv.rollouts.openai_policy import OpenAIChatPolicy, normalize_assistant_message
from fleetenv.rollouts.policy_spec import PolicySpec
from fleetenv.rollouts.rollout import run_episode

BASE_URL = "https://llm.example/v1"
URL = f"{BASE_URL}/chat/completions"
KEY = "sk-test-9f3c1e7a5b2d4c6e8f0a1b3c5d7e9f11"
MODEL = "test-model"
TASKS: dict[str, Task] = {t.key: t for t in fleetenv.load_tasks(bundled_tasks_path())}


# ---------------------------------------------------------------- the fake model server

Step = dict[str, Any] | tuple[int, dict[str, str], Any] | Exception


class FakeModel:
    """Answers each POST with the next scripted step: an assistant message (200), a
    ``(status, headers, body)`` tuple, or an exception (raised as a transport failure)."""

    def __init__(self, mock: responses.RequestsMock, steps: list[Step]) -> None:
        self.steps = list(steps)
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        mock.add_callback(responses.POST, URL, callback=self._answer)

    def _answer(self, request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        self.bodies.append(json.loads(request.body or b"{}"))
        self.headers.append(dict(request.headers))
        if not self.steps:
            return 400, {}, json.dumps({"error": {"message": "fake model: script exhausted"}})
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        if isinstance(step, tuple):
            status, headers, body = step
            return status, headers, body if isinstance(body, str) else json.dumps(body)
        return 200, {}, json.dumps(completion(step))


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}


_call_ids = iter(range(10**6))


def call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{next(_call_ids)}", "type": "function",
            "function": {"name": name, "arguments": raw}}


def tool_reply(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls), "refusal": None}


def text_reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def reference_replies(task: Task) -> list[Step]:
    """One tool call per reply, replaying the task's reference solution."""
    return [tool_reply(call(c.name, dict(c.arguments))) for c in task.reference_solution or []]


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content)


def make_policy(**options: Any) -> OpenAIChatPolicy:
    options = {"base_url": BASE_URL, "api_key": KEY, "retry_base_s": 0.01,
               "retry_cap_s": 0.02, "timeout_s": 5.0, **options}
    return OpenAIChatPolicy(MODEL, **options)


@pytest.fixture
def model_server() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(passthru_prefixes=("http://127.0.0.1",),
                                assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def fleet_config(local_fleet: LocalFleet) -> FleetConfig:
    return resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)


def play(task_key: str, steps: list[Step], mock: responses.RequestsMock, config: FleetConfig,
         **options: Any) -> tuple[RolloutResult, FakeModel]:
    model = FakeModel(mock, steps)
    result = run_episode(TASKS[task_key], make_policy(**options), config=config)
    return result, model


def assert_no_key(result: RolloutResult) -> None:
    assert KEY not in json.dumps(result.to_dict())


# ---------------------------------------------------------------- full episodes

@pytest.mark.timeout(30)
def test_reference_replayed_one_call_per_reply_then_text_scores_1(model_server, fleet_config):
    task = TASKS["helpdesk-retag-feature-request"]
    result, model = play(task.key, [*reference_replies(task), text_reply("All done.")],
                         model_server, fleet_config, temperature=0.2, max_tokens=256)
    assert result.error is None, result.error
    assert (result.reward, result.stop_reason, result.policy) == (1.0, "agent_done",
                                                                  f"openai:{MODEL}")
    assert result.tool_calls == 2 and result.tool_errors == 0
    assert len(model.bodies) == 3
    first, second, third = model.bodies
    # Every request: the model, the options, the tools (native tool calling).
    assert {b["model"] for b in model.bodies} == {MODEL}
    assert first["temperature"] == 0.2 and first["max_tokens"] == 256
    assert first["tool_choice"] == "auto"
    names = {t["function"]["name"] for t in first["tools"]}
    assert {"get_ticket", "set_tags"} <= names and "submit_final_answer" not in names
    assert [m["role"] for m in first["messages"]] == ["user"]
    assert task.prompt in text_of(first["messages"][0])
    # The conversation grows: the assistant message as sent, then the answering tool message.
    assert [m["role"] for m in third["messages"]] == ["user", "assistant", "tool",
                                                      "assistant", "tool"]
    assistant, tool = second["messages"][1], second["messages"][2]
    assert "refusal" not in assistant and assistant["content"] is None
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert "1012" in text_of(tool)
    assert third["messages"][4]["tool_call_id"] == third["messages"][3]["tool_calls"][0]["id"]
    # The transcript is exactly the conversation plus the final reply.
    assert result.transcript[:5] == third["messages"]
    assert result.transcript[5] == {"role": "assistant", "content": "All done."}
    assert model.headers[0]["Authorization"] == f"Bearer {KEY}"
    assert_no_key(result)
    # Per reply, what a trainer filters on: why the model stopped, and the tokens.
    assert [m["finish_reason"] for m in result.turn_meta] == ["tool_calls", "tool_calls",
                                                              "stop"]
    assert result.turn_meta[0]["usage"] == {"prompt_tokens": 100, "completion_tokens": 10,
                                            "total_tokens": 110}


@pytest.mark.timeout(30)
def test_final_answer_task_takes_the_final_text_as_the_answer(model_server, fleet_config):
    task = TASKS["shop-count-shipped"]
    steps = [*reference_replies(task)[:1], text_reply("  30\n")]
    result, model = play(task.key, steps, model_server, fleet_config)
    assert result.error is None, result.error
    assert (result.reward, result.final_answer, result.stop_reason) == (1.0, "30", "agent_done")
    assert "submit_final_answer" in {t["function"]["name"] for t in model.bodies[0]["tools"]}


@pytest.mark.timeout(30)
def test_final_answer_task_takes_a_submit_final_answer_call(model_server, fleet_config):
    task = TASKS["helpdesk-busiest-agent"]
    result, model = play(task.key, reference_replies(task), model_server, fleet_config)
    assert result.error is None, result.error
    assert (result.reward, result.final_answer) == (1.0, "daniel.kim@helpdesk.example")
    assert len(model.bodies) == 2  # the submit call ended the episode: no third request


@pytest.mark.timeout(30)
def test_tool_calls_without_ids_get_one_the_tool_result_answers(model_server, fleet_config):
    # Some OpenAI-compatible servers omit the id; the API still needs one on the way back.
    nameless = {"type": "function", "function": {"name": "list_orders",
                                                 "arguments": {"status": "shipped", "limit": 1}}}
    result, model = play("shop-count-shipped", [tool_reply(nameless), text_reply("30")],
                         model_server, fleet_config)
    assert result.error is None, result.error
    assert result.reward == 1.0
    assistant, tool = model.bodies[1]["messages"][1:3]
    sent = assistant["tool_calls"][0]
    assert sent["id"].startswith("call_") and tool["tool_call_id"] == sent["id"]
    assert json.loads(sent["function"]["arguments"]) == {"status": "shipped", "limit": 1}


@pytest.mark.timeout(30)
def test_several_tool_calls_in_one_reply_run_in_order(model_server, fleet_config):
    # search, adjust, search again in ONE reply: the second search sees the new stock
    # only if the calls ran in the order the model wrote them.
    look = {"query": "KIT-114"}
    adjust = {"reason": "received", "adjustments": [{"sku": "KIT-114", "delta": 40},
                                                    {"sku": "OUT-135", "delta": 25}]}
    reply = tool_reply(call("search_products", look), call("adjust_inventory", adjust),
                       call("search_products", look))
    result, model = play("shop-receive-shipment", [reply, text_reply("Stock received.")],
                         model_server, fleet_config)
    assert result.error is None, result.error
    assert result.reward == 1.0 and result.tool_calls == 3
    sent_ids = [c["id"] for c in reply["tool_calls"]]
    answers = tool_messages(model.bodies[1])
    assert [m["tool_call_id"] for m in answers] == sent_ids
    before, after = (json.loads(text_of(answers[i])) for i in (0, 2))
    stock = [next(p for p in r["products"] if p["sku"] == "KIT-114") for r in (before, after)]
    assert stock[1]["on_hand"] == stock[0]["on_hand"] + 40


@pytest.mark.timeout(30)
def test_a_reply_without_tool_calls_ends_the_episode(model_server, fleet_config):
    result, model = play("shop-create-summer-coupon", [text_reply("I would rather not.")],
                         model_server, fleet_config)
    assert result.error is None, result.error
    assert result.stop_reason == "agent_done" and result.tool_calls == 0
    assert result.graded and result.reward == 0.0  # graded: the coupon was never created
    assert len(model.bodies) == 1


@pytest.mark.timeout(30)
def test_malformed_tool_arguments_become_tool_errors_the_model_reads(model_server,
                                                                     fleet_config):
    task = TASKS["helpdesk-retag-feature-request"]
    broken = call("get_ticket", '{"ticket_id": 1012')      # invalid JSON (cut off)
    not_object = call("get_ticket", "[1012]")               # valid JSON, not an object
    steps = [tool_reply(broken, not_object), *reference_replies(task), text_reply("Done.")]
    result, model = play(task.key, steps, model_server, fleet_config)
    assert result.error is None, result.error
    assert result.reward == 1.0 and result.stop_reason == "agent_done"
    assert result.tool_errors == 2
    # The next request answers both calls with the error text.
    answers = {m["tool_call_id"]: text_of(m) for m in tool_messages(model.bodies[1])}
    assert "not valid JSON" in answers[broken["id"]]
    assert "must be a JSON object" in answers[not_object["id"]]
    # The broken arguments are recorded exactly as the model wrote them.
    recorded = result.transcript[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in recorded] == ['{"ticket_id": 1012', "[1012]"]


@pytest.mark.timeout(30)
def test_computer_use_screenshots_are_sent_as_image_url_parts(model_server, fleet_config):
    task = TASKS["shop-ui-refund-and-restock"]
    result, model = play(task.key, [*reference_replies(task), text_reply("Refunded.")],
                         model_server, fleet_config)
    assert result.error is None, result.error
    assert result.reward == 1.0
    first = model.bodies[0]
    assert [t["function"]["name"] for t in first["tools"]] == ["computer"]
    opening = first["messages"][0]["content"]
    assert opening[0]["type"] == "text"
    assert any(p["type"] == "image_url"
               and p["image_url"]["url"].startswith("data:image/png;base64,") for p in opening)
    # After the screenshot call: a tool message answering it, then the image in a user message.
    after = model.bodies[1]["messages"]
    assert after[2]["role"] == "tool"
    assert after[2]["tool_call_id"] == after[1]["tool_calls"][0]["id"]
    assert after[3]["role"] == "user"
    assert any(p["type"] == "image_url" for p in after[3]["content"])


# ---------------------------------------------------------------- retries and errors

@pytest.mark.timeout(30)
def test_429_and_500_are_retried_then_the_episode_succeeds(model_server, fleet_config):
    task = TASKS["shop-create-summer-coupon"]
    steps: list[Step] = [
        (429, {"Retry-After": "0"}, {"error": {"message": "Rate limit reached"}}),
        (500, {}, {"error": {"message": "internal error"}}),
        *reference_replies(task),
        (503, {}, "<html>Service Unavailable</html>"),
        text_reply("Created."),
    ]
    model = FakeModel(model_server, steps)
    policy = make_policy()
    result = run_episode(task, policy, config=fleet_config)
    assert result.error is None, result.error
    assert result.reward == 1.0
    assert len(model.bodies) == 5
    # A retry resends the same request, not a shortened or duplicated conversation.
    assert model.bodies[0] == model.bodies[1] == model.bodies[2]
    assert model.bodies[3] == model.bodies[4]
    assert policy.stats() == {"requests": 5, "retries": 3, "failures": 0,
                              "prompt_tokens": 200, "completion_tokens": 20}


def test_retry_after_is_honoured_over_the_backoff(model_server):
    FakeModel(model_server, [(429, {"Retry-After": "0"}, {}),
                             (429, {"retry-after-ms": "10"}, {}), text_reply("hi")])
    policy = make_policy(retry_base_s=5.0, retry_cap_s=5.0)  # backoff alone would wait >= 5 s
    started = time.monotonic()
    assert policy.complete([{"role": "user", "content": "hello"}])["content"] == "hi"
    # Behaviour, not speed: the waits were the servers' 0 s and 10 ms, not the >= 5 s
    # backoff (the call itself takes a few ms; 2 s is a generous margin).
    assert time.monotonic() - started < 2.0


def test_retries_are_logged_without_the_key(model_server, caplog):
    echo = {"error": {"message": f"Rate limit reached for key {KEY}"}}
    FakeModel(model_server, [(429, {"Retry-After": "0"}, echo), text_reply("hi")])
    with caplog.at_level(logging.WARNING, logger="fleetenv.rollouts"):
        make_policy().complete([{"role": "user", "content": "hello"}])
    assert "retry 1/4" in caplog.text and "Rate limit reached" in caplog.text
    assert KEY not in caplog.text


def test_retries_stop_at_max_retries_with_a_clear_error(model_server):
    model = FakeModel(model_server, [(502, {}, "bad gateway")] * 5)
    with pytest.raises(FleetEnvError) as info:
        make_policy(max_retries=2).complete([{"role": "user", "content": "hi"}])
    assert len(model.bodies) == 3
    text = str(info.value)
    assert "HTTP 502" in text and "bad gateway" in text and "gave up after 3 attempts" in text
    assert MODEL in text and URL in text


@pytest.mark.timeout(30)
def test_400_fails_the_rollout_clearly_without_retrying(model_server, fleet_config,
                                                        local_fleet):
    message = "\"auto\" tool choice requires --enable-auto-tool-choice to be set"
    result, model = play("shop-create-summer-coupon",
                         [(400, {}, {"object": "error", "message": message, "code": 400})],
                         model_server, fleet_config)
    assert len(model.bodies) == 1
    assert result.stop_reason == "error" and result.reward is None
    assert result.error is not None and result.error["type"] == "FleetEnvError"
    for part in (MODEL, URL, "HTTP 400", "--enable-auto-tool-choice"):
        assert part in result.error["message"]
    assert result.instance_id is not None
    statuses = {i["instance_id"]: i["status"] for i in local_fleet.instances()}
    assert statuses[result.instance_id] == "stopped"  # the failed rollout deleted its instance
    assert_no_key(result)


@pytest.mark.parametrize("status", [401, 404])
def test_bad_key_or_model_is_a_configuration_error_without_the_key(model_server, status):
    # Some servers echo the key they were given; it must not travel any further.
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": status}}
    model = FakeModel(model_server, [(status, {}, echo)])
    with pytest.raises(ConfigurationError) as info:
        make_policy().complete([{"role": "user", "content": "hi"}])
    assert len(model.bodies) == 1
    text = str(info.value) + repr(info.value) + info.value.message
    assert KEY not in text
    assert f"HTTP {status}" in text or str(status) in text
    assert "Incorrect API key provided" in text and MODEL in text and URL in text


@pytest.mark.timeout(30)
def test_the_key_never_reaches_the_rollout_result(model_server, fleet_config):
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}"}}
    result, model = play("shop-create-summer-coupon", [(401, {}, echo)], model_server,
                         fleet_config)
    assert model.headers[0]["Authorization"] == f"Bearer {KEY}"  # it was sent, though
    assert result.error is not None and result.error["type"] == "ConfigurationError"
    assert "Incorrect API key provided" in result.error["message"]
    assert_no_key(result)


def test_a_timeout_then_success_is_retried(model_server):
    model = FakeModel(model_server, [requests.exceptions.ReadTimeout("read timed out"),
                                     requests.exceptions.ConnectionError("reset by peer"),
                                     text_reply("hello")])
    policy = make_policy()
    assert policy.complete([{"role": "user", "content": "hi"}])["content"] == "hello"
    assert len(model.bodies) == 3 and policy.stats()["retries"] == 2


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A real TCP server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1", accepted
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
        for conn in accepted:
            conn.close()


@pytest.mark.timeout(15)
def test_a_server_that_never_answers_times_out_retries_and_fails_clearly(silent_server):
    base_url, accepted = silent_server
    policy = OpenAIChatPolicy(MODEL, base_url=base_url, timeout_s=0.3, max_retries=2,
                              retry_base_s=0.01, retry_cap_s=0.02)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        policy.complete([{"role": "user", "content": "hi"}])
    elapsed = time.monotonic() - started
    # Three real 0.3 s timeouts were waited (the lower bound is behaviour); the upper one
    # is a hang bound with ~5x margin, not a speed claim.
    assert 0.9 <= elapsed < 5.0
    assert len(accepted) == 3
    text = str(info.value)
    assert "did not answer within 0.3 s" in text and "gave up after 3 attempts" in text
    assert MODEL in text and f"{base_url}/chat/completions" in text
    policy.close()


@pytest.mark.timeout(15)
def test_an_unreachable_server_is_a_connect_error_after_retries():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    policy = OpenAIChatPolicy(MODEL, base_url=f"http://127.0.0.1:{port}/v1", timeout_s=2.0,
                              max_retries=1, retry_base_s=0.01, retry_cap_s=0.02)
    with pytest.raises(ConnectError, match="could not reach the model server"):
        policy.complete([{"role": "user", "content": "hi"}])
    assert policy.stats()["requests"] == 2 and policy.stats()["failures"] == 1


@pytest.mark.parametrize("body, expected", [
    ("<html>not json</html>", "not JSON"),
    ({"object": "chat.completion", "choices": []}, r"no choices\[0\]\.message"),
])
def test_a_malformed_answer_is_a_clear_error(model_server, body, expected):
    FakeModel(model_server, [(200, {}, body)])
    with pytest.raises(FleetEnvError, match=expected):
        make_policy().complete([{"role": "user", "content": "hi"}])


# ---------------------------------------------------------------- construction and shape

def test_a_remote_server_without_a_key_fails_at_construction(monkeypatch):
    monkeypatch.delenv("MY_LLM_KEY", raising=False)
    with pytest.raises(ConfigurationError) as info:
        OpenAIChatPolicy(MODEL, base_url=BASE_URL, api_key_env="MY_LLM_KEY")
    assert "MY_LLM_KEY" in str(info.value) and "llm.example" in str(info.value)


def test_the_key_comes_from_the_named_env_var_and_stays_out_of_repr(monkeypatch,
                                                                    model_server):
    monkeypatch.setenv("MY_LLM_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", BASE_URL + "/")
    policy = OpenAIChatPolicy(MODEL, api_key_env="MY_LLM_KEY")
    assert policy.base_url == BASE_URL
    assert repr(policy) == f"OpenAIChatPolicy(model='{MODEL}', base_url='{BASE_URL}')"
    assert KEY not in repr(policy) and KEY not in str(vars(policy))
    model = FakeModel(model_server, [text_reply("ok")])
    policy.complete([{"role": "user", "content": "hi"}])
    assert model.headers[0]["Authorization"] == f"Bearer {KEY}"


def test_a_loopback_server_needs_no_key(monkeypatch, model_server):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = "http://localhost:8000/v1"
    model_server.add(responses.POST, f"{url}/chat/completions", json=completion(
        text_reply("local")))
    policy = OpenAIChatPolicy(MODEL, base_url=url)
    assert policy.complete([{"role": "user", "content": "hi"}])["content"] == "local"
    assert "Authorization" not in model_server.calls[0].request.headers


@pytest.mark.parametrize("options, expected", [
    ({"base_url": "llm.example/v1"}, "not an http"),
    ({"base_url": "https://llm.example/v1?api-key=x"}, "query string"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"max_retries": -1}, "max_retries"),
])
def test_bad_options_fail_at_construction(options, expected):
    with pytest.raises(ConfigurationError, match=expected) as info:
        OpenAIChatPolicy(MODEL, **{"api_key": KEY, **options})
    assert KEY not in str(info.value)


def test_the_policy_spec_builds_it_and_it_pickles(model_server):
    spec = PolicySpec("openai", {"model": MODEL, "base_url": BASE_URL + "/chat/completions",
                                 "api_key": KEY, "tool_choice": None,
                                 "extra_body": {"top_p": 0.9}})
    assert spec.describe() == f"openai:{MODEL}"
    policy = pickle.loads(pickle.dumps(spec)).build()
    assert isinstance(policy, OpenAIChatPolicy)
    assert policy.describe() == f"openai:{MODEL}" and policy.url == URL
    copy = pickle.loads(pickle.dumps(policy))  # e.g. shipped to a process-pool worker
    model = FakeModel(model_server, [text_reply("a"), text_reply("b")])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    policy.complete([{"role": "user", "content": "hi"}], tools)
    copy.complete([{"role": "user", "content": "hi"}], tools)
    for body in model.bodies:
        assert body["top_p"] == 0.9 and body["tools"] == tools and "tool_choice" not in body
    assert model.headers[1]["Authorization"] == f"Bearer {KEY}"


def test_threads_share_one_policy(model_server):
    model = FakeModel(model_server, [text_reply(str(i)) for i in range(8)])
    policy = make_policy()
    results: list[str] = []
    lock = threading.Lock()

    def ask() -> None:
        answer = policy.complete([{"role": "user", "content": "hi"}])["content"]
        with lock:
            results.append(answer)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(results) == [str(i) for i in range(8)] and len(model.bodies) == 8
    policy.close()
    FakeModel(model_server, [text_reply("after close")])
    assert policy.complete([{"role": "user", "content": "hi"}])["content"] == "after close"


def test_normalize_assistant_message_touches_only_what_the_api_needs():
    raw = {"role": None, "content": None, "refusal": None, "function_call": None,
           "reasoning_content": "thinking...",
           "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}},
                          {"id": "call_x", "type": "function",
                           "function": {"name": "g", "arguments": "{bad"}}]}
    out = normalize_assistant_message(raw)
    assert out["role"] == "assistant" and out["content"] is None
    assert out["reasoning_content"] == "thinking..."
    assert "refusal" not in out and "function_call" not in out
    first, second = out["tool_calls"]
    assert first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert second == raw["tool_calls"][1]  # broken arguments are kept as written
    assert "tool_calls" not in normalize_assistant_message({"content": "x", "tool_calls": []})


# ---------------------------------------------------------------- seed, logprobs, preflight

def test_seed_is_sent_and_logprobs_come_back_in_the_meta(model_server):
    fake = FakeModel(model_server, [])
    logprobs = {"content": [{"token": "hi", "logprob": -0.1, "top_logprobs": []}]}
    body = completion(text_reply("hi"))
    body["choices"][0]["logprobs"] = logprobs
    fake.steps = [(200, {}, body), text_reply("again")]
    policy = make_policy(seed=11, extra_body={"logprobs": True})
    _, meta = policy._chat([{"role": "user", "content": "x"}], None)
    assert meta["logprobs"] == logprobs
    _, meta = policy._chat([{"role": "user", "content": "x"}], None)
    assert "logprobs" not in meta  # the server sent none: nothing made up
    assert [b["seed"] for b in fake.bodies] == [11, 11]
    assert all(b["logprobs"] is True for b in fake.bodies)


def test_preflight_on_a_dead_port_fails_at_once_with_the_reason_only():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    policy = OpenAIChatPolicy(MODEL, base_url=f"http://127.0.0.1:{port}/v1", max_retries=4)
    with pytest.raises(ConnectError) as info:
        policy.preflight(timeout_s=5.0)
    text = str(info.value)
    assert "could not reach the model server: [Errno" in text and "refused" in text
    assert "HTTPConnectionPool" not in text and "urllib3" not in text
    assert policy.stats()["requests"] == 1  # no retries


def test_preflight_asks_for_one_token_and_passes_on_busy_answers(model_server):
    fake = FakeModel(model_server, [text_reply("OK"),
                                    (503, {}, {"error": {"message": "warming up"}}),
                                    (429, {}, {"error": {"message": "slow down"}})])
    policy = make_policy(temperature=0.2)
    for _ in range(3):
        policy.preflight()  # 200, then 503 and 429: the run's own retries handle those
    assert [b["max_tokens"] for b in fake.bodies] == [1, 1, 1]
    assert fake.bodies[0]["temperature"] == 0.2 and "tools" not in fake.bodies[0]


@pytest.mark.parametrize("status", [401, 404])
def test_preflight_raises_a_refusal_once(model_server, status):
    fake = FakeModel(model_server, [(status, {}, {"error": {"message": "no"}})] * 3)
    with pytest.raises(ConfigurationError, match=f"{status}"):
        make_policy().preflight()
    assert len(fake.bodies) == 1


def test_preflight_retries_once_without_max_tokens_when_the_server_rejects_it(model_server):
    fake = FakeModel(model_server, [
        (400, {}, {"error": {"message": "Unsupported parameter: 'max_tokens'"}}),
        text_reply("OK")])
    make_policy().preflight()
    assert ["max_tokens" in b for b in fake.bodies] == [True, False]
    fake.steps = [(400, {}, {"error": {"message": "bad max_tokens"}})]
    with pytest.raises(FleetEnvError, match="HTTP 400"):  # the user's own max_tokens: as is
        make_policy(max_tokens=5).preflight()
    assert fake.bodies[-1]["max_tokens"] == 5 and len(fake.bodies) == 3
