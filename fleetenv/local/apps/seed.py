"""What every sample app's seed builder shares: the data check and the frozen clock.

Seeds must be row-for-row identical on every machine (tasks quote ids and amounts from
them), so apps never read the wall clock: each has a frozen "now" string that tools also
stamp writes with, and seed rows are stamped relative to it in that same format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from fleetenv.local.apps.toolkit import AppError

STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""UTC timestamps as the apps store them, e.g. ``2025-06-02T09:30:00Z``."""


def stamp(moment: datetime) -> str:
    """A naive UTC ``datetime`` as the apps store it."""
    return moment.strftime(STAMP_FORMAT)


def frozen_clock(now: str) -> datetime:
    """An app's frozen ``NOW`` string as a datetime, so both forms come from one value."""
    return datetime.strptime(now, STAMP_FORMAT)


def require_data(
    app: str, data_key: str, data_version: str, known_key: str, versions: Sequence[str]
) -> None:
    """Refuse a data key/version the app cannot build, naming the ones it can."""
    if data_key != known_key or data_version not in versions:
        raise AppError(
            f"{app} has no data {data_key}:{data_version}; "
            f"available: {known_key}:{', '.join(versions)}"
        )


def unique_email(
    local: str, domain: str, used: set[str], retry_domain: Callable[[int], str] | None = None
) -> str:
    """``local@domain``, made unique against ``used`` (and added to it).

    Random names repeat, and emails are unique keys, so a taken address gets a counter
    from 2 up after ``local``; ``retry_domain(counter)`` may pick the domain of each retry.
    """
    email = f"{local}@{domain}"
    suffix = 2
    while email in used:
        email = f"{local}{suffix}@{retry_domain(suffix) if retry_domain else domain}"
        suffix += 1
    used.add(email)
    return email
