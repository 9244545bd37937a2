"""Which failed instance creations are retried: the incidents of the previous client.

The previous Fleet client's newest retry tests (fleet-ai/OpenEnv,
``tests/envs/test_fleet_make_retry_classifier.py``) hold the messages of the production
incidents that zeroed whole training steps. Each is asked here of the local Fleet under
every status it could arrive with, and the decision checked through the public API (a
``FleetEnv`` reset): how many creates the local Fleet saw, and which error came back.
A unit table over ``provisioning_error`` does the same with the exceptions fleet-python
itself builds from such answers (plus 401 and 404). The decisions are the table of
docs/errors.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fleet import exceptions as fx
from fleet.base import SyncWrapper

import fleetenv
from fleetenv import FleetEnv, Session
from fleetenv.errors import PermanentProvisioningError, TransientProvisioningError
from fleetenv.events import EventBus
from fleetenv.fleet.classify import is_rate_limit, json_objects_in, provisioning_error
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(120)

TASK = fleetenv.Task(key="make-retries", prompt="p", env_key="helpdesk")

# The incident messages, verbatim from the previous client's tests.
SEED_PLACEMENT = (
    'Failed to create instance: DriverAPIError: Driver API returned 400: '
    '{"detail":{"error":"seed_placement_failed","reason":"indexer_unreachable",'
    '"message":"could not reach the seed presence indexer after retries; '
    'this is transient - retry the request","retryable":true}}'
)
BURST_CAP = "Too many in-flight instance creations for this team"
RATE_LIMIT = "Rate limit exceeded"
HEALTH = "Instance health check failed"
READ_TIMEOUT_TEXT = "Read timeout on connect"
JUDGE_TOKEN = "Invalid or missing X-Fleet-Judge-Token"
UNKNOWN_ENV_KEY = "env_key not found: nonexistent-env:v9.9.9"
NOT_RETRYABLE = 'Driver API returned 400: {"detail":{"error":"bad_request","retryable":false}}'

STATUSES = (400, 409, 429, 500, 503)
#: Retried under every status: Fleet's flag says so, or Fleet names a failure that passes.
ALWAYS = {"seed placement": SEED_PLACEMENT, "burst cap": BURST_CAP,
          "rate limit": RATE_LIMIT, "health check": HEALTH}
#: Fleet's flag says no: never retried, whatever the status.
NEVER = {"retryable false": NOT_RETRYABLE}
#: Plain text: the status decides (a timeout or lost connection is told by its type, not
#: by the word "timeout" in a 400's message).
BY_STATUS = {"'timeout' in the text": READ_TIMEOUT_TEXT, "judge token": JUDGE_TOKEN,
             "unknown env_key": UNKNOWN_ENV_KEY}
RETRIED_STATUSES = frozenset({429, 500, 503})

CASES = [
    pytest.param(message, status, (
        True if name in ALWAYS else False if name in NEVER else status in RETRIED_STATUSES),
        id=f"{name}-{status}")
    for table in (ALWAYS, NEVER, BY_STATUS) for name, message in table.items()
    for status in STATUSES
]


def fleet_python_error(status: int, message: str) -> Exception:
    """The exception fleet-python raises for Fleet's ``{"detail": message}`` answer."""
    answer = httpx.Response(status, json={"detail": message})
    try:
        SyncWrapper._handle_error_response(None, answer)  # type: ignore[arg-type]
    except Exception as exc:
        return exc
    raise AssertionError(f"fleet-python raised nothing for {status}")


@pytest.mark.parametrize(("message", "status", "retried"), CASES)
def test_each_incident_message_is_decided_the_same_under_every_status_in_the_table(
        message: str, status: int, retried: bool) -> None:
    error = provisioning_error(fleet_python_error(status, message), env="e")
    wanted = TransientProvisioningError if retried else PermanentProvisioningError
    assert isinstance(error, wanted), (status, message, error)
    assert error.retryable is retried


@pytest.mark.parametrize("message", [*ALWAYS.values(), *BY_STATUS.values(), NOT_RETRYABLE])
@pytest.mark.parametrize("status", [401, 404])
def test_a_rejected_key_and_a_404_stay_permanent_whatever_the_text_says(
        message: str, status: int) -> None:
    error = provisioning_error(fleet_python_error(status, message))
    assert isinstance(error, PermanentProvisioningError), (status, message, error)


def test_timeouts_and_lost_connections_are_retried_by_their_type() -> None:
    for exc in (fx.FleetTimeoutError("Request timed out: read"),
                httpx.ReadTimeout("Read timeout on connect"),
                httpx.ConnectError("connection refused"),
                fx.FleetAPIError("Request failed: [Errno 111] Connection refused")):
        assert isinstance(provisioning_error(exc), TransientProvisioningError), exc


def test_burst_cap_and_rate_limit_slow_the_whole_key_under_any_status() -> None:
    for status in STATUSES:
        assert is_rate_limit(fleet_python_error(status, BURST_CAP)), status
        assert is_rate_limit(fleet_python_error(status, RATE_LIMIT)), status
        assert not is_rate_limit(fleet_python_error(400, HEALTH))


def test_the_flag_is_read_wherever_fleet_put_it_and_the_first_one_counts() -> None:
    structured = fx.FleetAPIError("x", status_code=400, response_data={
        "detail": {"error": "x", "message": "m", "retryable": True}})
    assert isinstance(provisioning_error(structured), TransientProvisioningError)
    # A structured flag beats one in the message; braces inside strings do not confuse it.
    both = fx.FleetAPIError('wrapped: {"note": "a } {", "retryable": true}', status_code=503,
                            response_data={"retryable": False})
    assert isinstance(provisioning_error(both), PermanentProvisioningError)
    text = ('prose {not json} then {"detail": {"retryable": false}} and '
            '{"retryable": true}')
    assert [o for o in json_objects_in(text)] == [{"detail": {"retryable": False}},
                                                  {"retryable": True}]
    assert isinstance(provisioning_error(fleet_python_error(400, text)),
                      PermanentProvisioningError)  # the first flag found decides


def test_hostile_messages_are_read_in_bounded_linear_time() -> None:
    hostile = ['{"a":' * 200_000, "{" * 1_000_000, '"' * 1_000_000,
               '{"a": "' + "\\" * 500_000, "[" * 100_000 + "{}",
               '{"n": ' + "9" * 5_000 + ', "retryable": true}',
               '{"a": ' * 40 + '{"retryable": true}' + "}" * 40]
    started = time.monotonic()
    for text in hostile:  # none holds a flag that can be read: the status decides
        error = provisioning_error(fleet_python_error(400, text))
        assert isinstance(error, PermanentProvisioningError), text[:40]
    assert time.monotonic() - started < 30, "a hostile message must not stall the decision"
    # Only the first 16 KiB are read: a flag past them does not count.
    late = "x" * 20_000 + '{"retryable": true}'
    assert isinstance(provisioning_error(fleet_python_error(400, late)),
                      PermanentProvisioningError)


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def session(local_fleet: LocalFleet) -> Iterator[Session]:
    config = fleetenv.resolve_config(api_key=local_fleet.token, base_url=local_fleet.base_url,
                                     timeouts={"provision": 0.6}, retry_base_s=0.05,
                                     retry_cap_s=0.1)
    with Session(config=config, events=EventBus(sinks=[])) as owned:
        yield owned


@pytest.mark.parametrize(("message", "status", "retried"), CASES)
def test_the_local_fleet_answering_each_incident_is_retried_or_not_as_the_table_says(
        session: Session, local_faults: Any, message: str, status: int,
        retried: bool) -> None:
    fault = local_faults.add("create_error", status=status, message=message)
    with (FleetEnv(TASK, session=session) as env,
          pytest.raises((TransientProvisioningError, PermanentProvisioningError)) as info):
        env.reset()
    creates = next(f["hits"] for f in local_faults.list() if f["id"] == fault)
    if retried:
        assert isinstance(info.value, TransientProvisioningError), info.value
        assert "provisioning budget" in str(info.value) and creates >= 2, (creates, info.value)
    else:
        assert isinstance(info.value, PermanentProvisioningError), info.value
        assert creates == 1, f"{creates} creates for a permanent failure"
