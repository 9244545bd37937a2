"""Every non-MCP network path has an overall deadline that holds under a trickling server.

Each test points one path (create, readiness poll, delete, manager reset / describe /
query, verification) at a real socket server that answers one byte every 0.2 s forever,
or sends headers and stalls, and checks that the call ends with ``DeadlineExceeded``
within its budget plus slack (a hang bound, not a speed claim) and that the server saw
the connection closed. Without overall deadlines each of these hangs (per-read timeouts
never fire); the pytest timeout ends such a run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from _support.trickle_server import TrickleServer

from fleetenv.core.retry import Deadline
from fleetenv.errors import DeadlineExceeded, ProvisioningError
from fleetenv.fleet.manager import ManagerClient, ManagerPool

pytestmark = pytest.mark.timeout(30)

BUDGET = 1.5
SLACK = 3.0  # generous: a hang bound on a loaded CI box, not a speed claim

VERIFIER = "def validate_task(env, final_answer=None):\n    return 1.0\n"


@pytest.fixture(params=["trickle", "stall"])
def server(request: pytest.FixtureRequest) -> Iterator[TrickleServer]:
    with TrickleServer(request.param) as srv:
        yield srv


def _timed(fn: Any) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        fn()
    except Exception as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def _assert_deadline(error: BaseException | None, seconds: float, what: str) -> None:
    assert isinstance(error, DeadlineExceeded), repr(error)
    assert what in str(error), str(error)
    assert seconds < BUDGET + SLACK, f"took {seconds:.1f} s for a {BUDGET} s budget"


# ------------------------------------------------------------------ control plane


@pytest.fixture
def session(server: TrickleServer) -> Iterator[Any]:
    from fleetenv.fleet.session import Session

    with Session(api_key="test-key", base_url=server.url, timeouts={"provision": BUDGET},
                 retry_base_s=0.05, retry_cap_s=0.1) as s:
        yield s
        # close() would sweep the uncertain create's tag / retry the failed delete
        # against the trickling server
        # (bounded by the client's 60 s default): not what these tests measure.
        s.provisioner._unsure_tags.clear()
        s.provisioner._failed_deletes.clear()


def test_create_has_an_overall_deadline(server: TrickleServer, session: Any) -> None:
    from fleetenv.fleet.provisioning import ProvisionRequest

    provisioner = session.provisioner
    request = ProvisionRequest(env_key="demo", env_version="1", task_key="t-1")
    error, seconds = _timed(lambda: provisioner.provision(request))
    _assert_deadline(error, seconds, "creating an instance of demo:1")
    assert isinstance(error, ProvisioningError)
    assert error.context["task"] == "t-1"
    assert "POST" in error.context["endpoint"] and "/v1/env/instances" in error.context[
        "endpoint"]
    assert error.retryable is False  # the budget is spent: nothing left to retry in
    assert server.wait_closed()
    # It may have created an instance server-side: the tag is kept for sweeping.
    assert session.run_tag in provisioner._unsure_tags
    assert session.live_instance_ids() == []


def test_readiness_poll_has_an_overall_deadline(server: TrickleServer, session: Any) -> None:
    from fleetenv.fleet.provisioning import ProvisionRequest

    provisioner = session.provisioner
    pending = SimpleNamespace(status="pending", instance_id="inst-9")
    error, seconds = _timed(lambda: provisioner._wait_until_running(
        pending, Deadline(BUDGET), ProvisionRequest(env_key="demo")))
    _assert_deadline(error, seconds, "polling instance inst-9")
    assert isinstance(error, ProvisioningError)
    assert error.context["instance"] == "inst-9"
    assert server.wait_closed()


def test_delete_has_an_overall_deadline(server: TrickleServer, session: Any) -> None:
    from fleetenv.fleet.provisioning import Instance

    provisioner = session.provisioner
    provisioner.delete_timeout_s = BUDGET
    instance = Instance(instance_id="inst-7", env_key="demo", root_url="", manager_url="",
                        env=None)  # type: ignore[arg-type]
    error, seconds = _timed(lambda: provisioner.delete(instance))
    _assert_deadline(error, seconds, "deleting instance inst-7")
    assert error is not None and error.retryable is True  # a delete is idempotent
    assert "DELETE" in error.context["endpoint"]  # type: ignore[attr-defined]
    assert server.wait_closed()


def test_a_request_outside_any_scope_is_bounded_by_its_timeout(
        server: TrickleServer) -> None:
    """fleet-python calls fleetenv does not wrap (``env.resources()``, a sweep's list)
    still get an overall bound: the client's timeout, for the whole request."""
    from fleetenv.fleet.client import FleetClient

    client = FleetClient("test-key", server.url, timeout_s=BUDGET, connect_timeout_s=1.0)
    try:
        error, seconds = _timed(lambda: client.sdk.instance("inst-1"))
        _assert_deadline(error, seconds, "HTTP GET")
    finally:
        client.close()
    assert server.wait_closed()


def test_other_requests_on_the_pool_are_unaffected(server: TrickleServer) -> None:
    """While one request trickles into its deadline, others on the same client work."""
    import http.server

    from fleetenv.fleet.client import FleetClient
    from fleetenv.fleet.deadlines import deadline_scope

    class Quick(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    quick = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quick)
    threading.Thread(target=quick.serve_forever, daemon=True).start()
    client = FleetClient("test-key", server.url, timeout_s=30.0)
    results: list[object] = []

    def slow() -> None:
        try:
            with deadline_scope(BUDGET, what="the slow one"):
                client._http.get(f"{server.url}/slow")
        except Exception as exc:
            results.append(exc)

    try:
        thread = threading.Thread(target=slow)
        thread.start()
        answers = [client._http.get(f"http://127.0.0.1:{quick.server_port}/").json()
                   for _ in range(20)]
        thread.join(BUDGET + SLACK)
        assert not thread.is_alive()
    finally:
        client.close()
        quick.shutdown()
        quick.server_close()
    assert answers == [{"ok": True}] * 20
    assert len(results) == 1 and isinstance(results[0], DeadlineExceeded)
    assert server.wait_closed()


# ------------------------------------------------------------------ manager API


@pytest.fixture
def manager(server: TrickleServer) -> Iterator[ManagerClient]:
    pool = ManagerPool()
    try:
        yield ManagerClient(f"{server.url}/api/v1/env", pool=pool, instance_id="inst-3",
                            timeout_s=BUDGET)
    finally:
        pool.close()


def test_manager_reset_has_an_overall_deadline(server: TrickleServer,
                                               manager: ManagerClient) -> None:
    error, seconds = _timed(lambda: manager.reset(seed=1, timeout_s=BUDGET))
    _assert_deadline(error, seconds, "manager reset")
    assert error.context["instance"] == "inst-3"  # type: ignore[union-attr]
    assert server.wait_closed()


def test_manager_query_has_an_overall_deadline(server: TrickleServer,
                                               manager: ManagerClient) -> None:
    error, seconds = _timed(lambda: manager.query_db("SELECT 1"))
    _assert_deadline(error, seconds, "manager query current db")
    assert server.wait_closed()


def test_manager_describe_has_an_overall_deadline(server: TrickleServer,
                                                  manager: ManagerClient) -> None:
    error, seconds = _timed(lambda: manager.describe_db())
    _assert_deadline(error, seconds, "manager describe current db")
    assert server.wait_closed()


# ------------------------------------------------------------------ verifier


def test_verifier_has_an_overall_deadline(server: TrickleServer) -> None:
    from fleetenv.core.retry import RetryPolicy
    from fleetenv.core.types import GradeReason
    from fleetenv.fleet.client import FleetClient
    from fleetenv.fleet.verifier import verify

    # verify_detailed sends /v1/verifiers/check and /execute to the control plane.
    client = FleetClient("test-key", server.url, timeout_s=60.0)
    try:
        env = client.sdk.instance(f"{server.url}/api/v1/env")  # URL mode: no request
        started = time.monotonic()
        grade = verify(env=env, task_key="t-v", prompt="p", env_key="demo", env_version="1",
                       verifier_code=VERIFIER,
                       retry=RetryPolicy(base_s=0.05, cap_s=0.1, budget_s=BUDGET,
                                         max_attempts=3))
        seconds = time.monotonic() - started
    finally:
        client.close()
    assert grade.reward is None
    assert grade.reason is GradeReason.VERIFIER_UNREACHABLE
    assert grade.error is not None and grade.error.startswith("DeadlineExceeded"), grade.error
    assert "verifying task t-v" in grade.error
    assert seconds < BUDGET + SLACK
    assert server.wait_closed()


def test_verifier_timeout_below_60_s_is_the_real_bound() -> None:
    """No 60 s floor any more: the configured value is what bounds a verification."""
    from fleetenv.core.config import resolve_config

    config = resolve_config(api_key="k", base_url="http://127.0.0.1:9",
                            timeouts={"verify": 2.5})
    assert config.timeouts.verify == 2.5
    from fleetenv.fleet.session import Session

    with Session(config) as s:
        assert s.verifier_retry().budget_s == 2.5


# ------------------------------------------------------------------ the mechanism


def test_a_scope_never_touches_a_connection_returned_to_the_pool() -> None:
    """The watchdog shuts down only sockets attached to its scope; a connection handed
    back to the pool is detached first."""
    from fleetenv.fleet.deadlines import DeadlineScope

    scope = DeadlineScope(0.0, what="x")
    shut: list[str] = []

    class Sock:
        def shutdown(self, how: int) -> None:
            shut.append("shutdown")

    class Conn:
        sock = Sock()

    scope.attach(Conn())  # already expired: shut down at once
    assert shut == ["shutdown"]
    assert scope.fired
    other = DeadlineScope(60.0, what="y")
    conn2 = Conn()
    other.attach(conn2)
    other.detach(conn2)
    other.expire()
    assert shut == ["shutdown"]
    other.close()


def test_concurrent_threads_have_separate_scopes(server: TrickleServer) -> None:
    """A scope is per thread: a thread without one is bounded by its own timeout only."""
    from fleetenv.fleet.deadlines import current_scope, deadline_scope

    seen: list[object] = []
    with deadline_scope(5.0, what="outer"):
        thread = threading.Thread(target=lambda: seen.append(current_scope()))
        thread.start()
        thread.join()
    assert seen == [None]


# ------------------------------------------------------------------ abandoning calls


def _started(server: TrickleServer, count: int) -> None:
    """Wait (polling, bounded) until the server holds ``count`` requests."""
    deadline = time.monotonic() + 10
    while sum(bool(c.request_line) for c in list(server.connections)) < count:
        assert time.monotonic() < deadline, "the requests never reached the server"
        time.sleep(0.01)


def test_abandoned_calls_end_at_once_and_only_the_owners() -> None:
    """A call that never answers (the server holds it) is given up by `abandon_calls`
    long before its budget: the one owned by the run that gave up, not another's; the
    error says it was abandoned and is not retried (one create sent, not a second)."""
    import contextvars

    from fleetenv.fleet.deadlines import abandon_calls, calls_owner
    from fleetenv.fleet.provisioning import ProvisionRequest
    from fleetenv.fleet.session import Session

    run_a, run_b = object(), object()
    outcomes: dict[str, tuple[BaseException | None, float]] = {}
    with TrickleServer("stall") as server, \
            Session(api_key="test-key", base_url=server.url, timeouts={"provision": 120},
                    retry_base_s=0.05, retry_cap_s=0.1) as session:
        pool = ManagerPool()
        manager = ManagerClient(f"{server.url}/api/v1/env", pool=pool, instance_id="inst-3",
                                timeout_s=120)
        calls = {
            "create": (run_a, lambda: session.provisioner.provision(
                ProvisionRequest(env_key="demo", env_version="1", task_key="t-1"))),
            "reset": (run_b, lambda: manager.reset(seed=1, timeout_s=120)),
        }

        def run(name: str) -> None:
            owner, call = calls[name]
            context = contextvars.copy_context()
            context.run(calls_owner.set, owner)
            outcomes[name] = context.run(_timed, call)

        threads = {name: threading.Thread(target=run, args=(name,), daemon=True)
                   for name in calls}
        for thread in threads.values():
            thread.start()
        try:
            _started(server, 2)
            assert abandon_calls("run A stopped", grace_s=0.2, owner=run_a) == 1
            threads["create"].join(SLACK)
            assert not threads["create"].is_alive()
            assert threads["reset"].is_alive()  # run B's call is untouched
            assert abandon_calls("exiting", grace_s=0) == 1
            threads["reset"].join(SLACK)
            assert not threads["reset"].is_alive()
        finally:
            pool.close()
            session.provisioner._unsure_tags.clear()
        assert server.wait_closed()
        created = [c for c in server.connections if "/v1/env/instances" in c.request_line]
    for name, reason in (("create", "run A stopped"), ("reset", "exiting")):
        error, seconds = outcomes[name]
        assert isinstance(error, DeadlineExceeded), (name, repr(error))
        assert f"was abandoned: {reason}" in str(error)
        assert error.retryable is False and error.abandoned
        assert seconds < 60, (name, seconds)  # not the 120 s budget
    assert len(created) == 1  # never retried
