"""The runner-token gate of Fleet's instance-manager routes, on the local Fleet (issue 14).

Gated Fleet clusters answer 404 to ``/api/v1/env/*`` requests without ``X-Runner-Token``
(fleet-python's ``fleet/runner_auth.py``); the local Fleet gates the same way by default,
so every test that touches a manager route goes through the gate. Here: the gate itself,
fleetenv's manager client through it (reset, describe_db, query_db), an ungated Fleet
(fleet-python's soft failure), and the token never reaching the agent or the logs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import fleet
import httpx
import pytest
from _support.fixtures_local import TEST_APPS
from fleet.runner_auth import RunnerTokenProvider

from fleetenv import bundled_tasks_path
from fleetenv.core.config import resolve_config
from fleetenv.core.errors import FleetEnvError, InstanceGoneError
from fleetenv.core.event_bus import EventBus
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task
from fleetenv.env.fleet_env import FleetEnv
from fleetenv.fleet.client import FleetClient
from fleetenv.fleet.manager import ManagerClient, ManagerPool, PooledRunnerTokens
from fleetenv.local import LocalFleet
from fleetenv.rollouts.policy import ScriptedPolicy
from fleetenv.rollouts.rollout import run_episode

pytestmark = pytest.mark.timeout(60)


def _tool_use_task() -> Task:
    return next(t for t in load_tasks(bundled_tasks_path()) if t.modality == "tool_use")


@pytest.fixture
def notes_env(notes_client: Any) -> Iterator[Any]:
    env = notes_client.make("notes")
    yield env
    env.close()


def test_manager_routes_answer_404_without_the_token(notes_fleet: LocalFleet,
                                                     notes_env: Any) -> None:
    token = notes_fleet.runner_token()
    assert token
    url = f"{notes_env.manager_url}/resources"
    for headers in ({}, {"X-Runner-Token": "wrong"}, {"X-Runner-Token": ""}):
        refused = httpx.get(url, headers=headers, timeout=5)
        # exactly what a gated router answers: nothing says "token", as on Fleet
        assert (refused.status_code, refused.json()) == (404, {"detail": "Not Found"})
    assert httpx.get(url, headers={"X-Runner-Token": token}, timeout=5).status_code == 200
    # only the manager routes: the control plane and MCP are not behind this gate
    bearer = {"Authorization": f"Bearer {notes_fleet.token}"}
    assert httpx.get(f"{notes_fleet.base_url}/v1/env/instances/{notes_env.instance_id}",
                     headers=bearer, timeout=5).status_code == 200
    assert httpx.post(f"{notes_env.urls.root}mcp", json={}, timeout=5).status_code != 404
    # the token is served to API-key holders only
    anonymous = httpx.get(f"{notes_fleet.base_url}/v1/runner-auth/token", timeout=5)
    assert anonymous.status_code == 401 and token not in anonymous.text


def test_fleet_python_resolves_and_sends_the_token(notes_fleet: LocalFleet, notes_env: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert {r.name for r in notes_env.resources()} >= {"current", "seed"}
    assert notes_env.reset(seed=42).success
    # RUNNER_AUTH_TOKEN wins over the fetch (fleet-python's order); a wrong one is refused
    monkeypatch.setenv("RUNNER_AUTH_TOKEN", "not-the-token")
    stale = notes_fleet.client().instance(notes_env.instance_id)
    with pytest.raises(fleet.exceptions.FleetEnvironmentError, match="404"):
        stale.resources()


def test_fleetenv_resets_and_queries_through_the_gate(local_fleet: LocalFleet) -> None:
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with FleetEnv(_tool_use_task(), config=config) as env:
        env.reset()
        first = env.instance_id
        env.reset()
        env.reset(seed=7)
        # a 404 from the gate would have been "instance gone" and replaced the instance
        assert env.instance_id == first
        tables = env.describe_db()["tables"]
        assert tables
        name = tables[0]["name"]
        answer = env.query_db(f'SELECT COUNT(*) FROM "{name}"')
        assert answer["success"] is True and answer["rows"]
    created = [i for i in local_fleet.instances() if i["instance_id"] == first]
    # the first reset() got a fresh instance; the next two reset it through the manager
    assert [r["seed"] for r in created[0]["resets"]] == [None, 7]


def test_a_failed_first_token_fetch_is_not_remembered(local_fleet: LocalFleet,
                                                      local_faults: Any) -> None:
    """fleet-python caches "no token" for the client's life; one blip at the start of a
    run must not turn every later manager call into a 404."""
    local_faults.add("http_error", route="/v1/runner-auth/token", status=503, times=1)
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    with FleetEnv(_tool_use_task(), config=config) as env:
        env.reset()
        first = env.instance_id
        env.reset()  # the manager's reset: 404 without a token, a fresh fetch, sent again
        assert env.instance_id == first
        assert env.describe_db()["tables"]
    created = [i for i in local_fleet.instances() if i["instance_id"] == first]
    assert [r["seed"] for r in created[0]["resets"]] == [None]  # it ran exactly once


def test_a_session_fetches_the_token_over_its_own_pool(local_fleet: LocalFleet,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """fleet-python's provider builds an HTTP client, and an SSL context (about 20 ms of
    CPU), per fetch: every new session paid it once."""
    expected = local_fleet.runner_token()
    client = FleetClient(local_fleet.token, local_fleet.base_url)
    built: list[object] = []
    real_init = httpx.Client.__init__

    def spy(self: httpx.Client, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "__init__", spy)
    try:
        assert expected and client.runner_tokens.token() == expected
        assert client.runner_tokens.token() == expected  # kept: fetched once
    finally:
        client.close()
    assert built == []
    monkeypatch.setenv("RUNNER_AUTH_TOKEN", " from-the-environment ")
    assert PooledRunnerTokens(client.sdk.client, client._http).token() == "from-the-environment"


def test_an_ungated_fleet_works_without_a_token() -> None:
    with LocalFleet(apps=TEST_APPS, verifier_workers=1, runner_token_gate=False) as local:
        assert local.runner_token() is None  # the token route answers 404: soft, no header
        client = local.client()
        env = client.make("notes")
        try:
            assert {r.name for r in env.resources()} >= {"current", "seed"}
            assert httpx.get(f"{env.manager_url}/resources", timeout=5).status_code == 200
            pool = ManagerPool()
            try:
                manager = ManagerClient(env.manager_url, pool=pool, instance_id=env.instance_id,
                                        runner_tokens=RunnerTokenProvider(client.client))
                assert manager.reset(seed=1)["success"] is True
                assert manager.describe_db()["tables"]
            finally:
                pool.close()
        finally:
            env.close()


def test_a_missing_token_is_not_mistaken_for_a_gone_instance(notes_fleet: LocalFleet,
                                                             notes_env: Any) -> None:
    pool = ManagerPool()
    try:
        # no control plane to ask and no RUNNER_AUTH_TOKEN: no header is sent
        bare = ManagerClient(notes_env.manager_url, pool=pool,
                             instance_id=notes_env.instance_id)
        with pytest.raises(FleetEnvError) as refused:
            bare.describe_db()
        assert not isinstance(refused.value, InstanceGoneError)
        assert "X-Runner-Token" in str(refused.value) and "RUNNER_AUTH_TOKEN" in str(
            refused.value)
        # with the token, a really stopped instance is still "gone"
        token = notes_fleet.runner_token()
        assert token
        gated = ManagerClient(notes_env.manager_url, pool=pool,
                              instance_id=notes_env.instance_id,
                              runner_tokens=RunnerTokenProvider(notes_fleet.client().client))
        assert gated.describe_db()["success"] is True
        assert token not in repr(gated) and token not in repr(refused.value)
        notes_fleet.faults.expire(notes_env.instance_id)
        with pytest.raises(InstanceGoneError):
            gated.describe_db()
    finally:
        pool.close()


def test_the_token_never_reaches_the_agent_or_the_logs(local_fleet: LocalFleet,
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    token = local_fleet.runner_token()
    assert token
    caplog.set_level(logging.DEBUG)
    events: list[Any] = []
    config = resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url)
    task = _tool_use_task()
    result = run_episode(task, ScriptedPolicy.reference(), config=config,
                         events=EventBus(sinks=[events.append]))
    assert result.error is None, result.error
    assert result.reward == 1.0  # a whole episode: resets, tools, verifier
    with FleetEnv(task, config=config) as env:
        observation, info = env.reset()
        env.describe_db()
        seen = [repr(observation), repr(info), repr(env), repr(env.session),
                repr(env.session.client), str(env.tools), str(env.openai_tools)]
    seen += [repr(result.to_dict()), *(repr(e) for e in events), caplog.text]
    leaks = [text[:200] for text in seen if token in text]
    assert not leaks
    assert caplog.records and events  # the checks looked at something
