"""The one retry policy: what it retries, how long it waits, when it gives up."""

from __future__ import annotations

import random

import pytest

from fleetenv.core.retry import MIN_ATTEMPT_S, Deadline, RetryPolicy
from fleetenv.errors import ConnectError, PermanentProvisioningError, ProvisioningError


def fast_policy(**kwargs: object) -> RetryPolicy:
    return RetryPolicy(base_s=0.001, cap_s=0.002, rng=random.Random(1), **kwargs)  # type: ignore[arg-type]


def test_retryable_errors_are_retried_until_success() -> None:
    calls: list[int] = []
    seen: list[tuple[int, float]] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectError("refused")
        return "ok"

    result = fast_policy(budget_s=5).call(flaky, on_retry=lambda n, d, e: seen.append((n, d)))
    assert result == "ok" and len(calls) == 3
    assert [n for n, _ in seen] == [1, 2] and all(0.0005 <= d <= 0.002 for _, d in seen)


def test_non_retryable_errors_are_raised_at_once_as_themselves() -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise PermanentProvisioningError("unknown env")

    with pytest.raises(PermanentProvisioningError):
        fast_policy(budget_s=5).call(broken, give_up=lambda e, n: ProvisioningError("x"))
    assert calls == [1]


def test_attempts_and_budget_bound_the_retries() -> None:
    calls: list[int] = []

    def always() -> None:
        calls.append(1)
        raise ConnectError("refused")

    with pytest.raises(ProvisioningError, match="gave up after 4"):
        fast_policy(budget_s=5, max_attempts=4).call(
            always, give_up=lambda e, n: ProvisioningError(f"gave up after {n}"))
    assert len(calls) == 4
    calls.clear()
    with pytest.raises(ConnectError):  # no give_up: the last error itself
        RetryPolicy(base_s=1.0, cap_s=1.0, budget_s=0.1).call(always)
    assert calls == [1]  # a 0.5-1 s pause cannot fit in a 0.1 s budget: no retry


def test_async_twin_follows_the_same_rules() -> None:
    import anyio

    calls: list[int] = []

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 2:
            raise ConnectError("refused")
        return 7

    async def main() -> int:
        return await fast_policy(budget_s=5).acall(flaky)

    assert anyio.run(main) == 7 and len(calls) == 2


def test_deadline_caps_and_expires() -> None:
    assert Deadline(None).remaining() is None and not Deadline(None).expired()
    deadline = Deadline(0.0)
    assert deadline.expired() and deadline.cap(5.0) == 0.0


def test_no_attempt_is_started_with_a_sliver_of_the_budget_left() -> None:
    # A pause that would end a hair before the budget does leaves the next attempt no
    # time: it would only fail on the deadline and hide the real error. No retry then.
    policy = RetryPolicy(base_s=0.1, cap_s=0.1, budget_s=None, rng=random.Random(0))
    longest = 0.1  # the first pause is at most cap_s, whatever the jitter
    assert policy.next_delay(1, Deadline(MIN_ATTEMPT_S / 2)) is None
    assert policy.next_delay(1, Deadline(longest + MIN_ATTEMPT_S * 4)) is not None


def test_a_deadline_extended_for_queueing_stops_at_its_limit() -> None:
    budget, limit = Deadline(1.0), Deadline(1.5)
    budget.extend(10.0, limit=limit)
    remaining, ceiling = budget.remaining(), limit.remaining()
    assert remaining is not None and ceiling is not None
    assert abs(remaining - ceiling) < 0.05  # moved to the limit, not 10 s later
    unbounded = Deadline(None)
    unbounded.extend(5.0)
    assert unbounded.remaining() is None
