"""MCP requests to instances carry the API key, as the previous Fleet client's did.

The local Fleet can require it (``LocalFleet(require_mcp_auth=True)``): its instances'
MCP endpoints then answer 401 without ``Authorization: Bearer <API key>``. An episode
sends the credentials fleet-python itself sends to Fleet; a connection without them
fails at once with a `ConnectError` that names the endpoint and says to check the key;
the key never shows in errors, reprs or logs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import fleetenv
from fleetenv import FleetEnv, Session, bundled_tasks_path
from fleetenv.core.errors import ConnectError
from fleetenv.events import EventBus
from fleetenv.local import LocalFleet
from fleetenv.mcp import Endpoint, MCPConnection, ToolRouter
from fleetenv.mcp.router import endpoints_for

pytestmark = pytest.mark.timeout(120)

TASK = next(t for t in fleetenv.load_tasks(bundled_tasks_path()) if t.modality == "tool_use")


@pytest.fixture(scope="module")
def auth_fleet() -> Iterator[LocalFleet]:
    with LocalFleet(require_mcp_auth=True, verifier_workers=1) as fleet:
        yield fleet


@pytest.fixture
def mcp_url(auth_fleet: LocalFleet) -> Iterator[str]:
    """The app-tools endpoint of a fresh instance on the fleet that requires the key."""
    client = auth_fleet.client()
    instance = client.make(TASK.env_key)
    try:
        yield f"{instance.urls.root}mcp"
    finally:
        instance.close()
        client._httpx_client.close()


def test_an_episode_sends_the_api_key_to_the_mcp_endpoints(
    auth_fleet: LocalFleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    session = Session(api_key=auth_fleet.token, base_url=auth_fleet.base_url,
                      events=EventBus(sinks=[]))
    with session, FleetEnv(TASK, session=session) as env:
        observation, _ = env.reset()
        assert observation.tools, "the tools were listed through the authorized session"
        shown = [repr(env), repr(env._toolbox.router), str(observation)]
    assert not any(auth_fleet.token in text for text in shown)
    assert auth_fleet.token not in caplog.text, "the key is never logged"


def test_without_the_key_the_open_fails_at_once_naming_the_endpoint(mcp_url: str) -> None:
    with pytest.raises(ConnectError) as info:
        MCPConnection(mcp_url).open()
    error = info.value
    assert error.context == {"endpoint": mcp_url, "http_status": "401"}
    assert error.retryable is False, "asking again with the same credentials cannot help"
    assert "refused the credentials (HTTP 401)" in str(error)
    assert error.hint is not None and "API key" in error.hint


def test_a_wrong_key_is_refused_and_never_shown(
    mcp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "wrong-key-7f3a9c"
    connection = MCPConnection(mcp_url, headers={"Authorization": f"Bearer {secret}"})
    router = ToolRouter([Endpoint(mcp_url, headers={"Authorization": f"Bearer {secret}"})])
    with pytest.raises(ConnectError) as info:
        connection.open()
    with pytest.raises(ConnectError) as routed:
        router.open()
    texts: list[Any] = [str(info.value), repr(info.value), str(routed.value), repr(connection),
                        repr(router), repr(router.endpoints), caplog.text]
    assert info.value.context["http_status"] == "401"
    assert not any(secret in text for text in texts)


def test_with_the_key_a_plain_connection_works(auth_fleet: LocalFleet, mcp_url: str) -> None:
    headers = {"Authorization": f"Bearer {auth_fleet.token}"}
    with MCPConnection(mcp_url, headers=headers) as connection:
        names = [tool.name for tool in connection.open().list_tools()]
        assert names
        assert auth_fleet.token not in repr(connection)


def test_the_key_goes_only_to_the_instances_own_endpoints() -> None:
    """A browser lease served from another host has its own credential; the Fleet API
    key must not travel there (the previous client sent it to the lease too)."""
    root, key = "https://inst-1.fleet.example/", {"Authorization": "Bearer k"}
    own = endpoints_for(root, "browser_use", f"{root}api/v1/mcp", headers=key)
    elsewhere = endpoints_for(root, "browser_use", "https://lease.browsers.example/mcp",
                              headers=key)
    assert own[0].headers == key and elsewhere[0].headers is None
    assert all(e.headers == key for e in endpoints_for(root, "tool_use", headers=key))
