"""Translate fleet-python and HTTP-client exceptions into fleetenv's errors.

The decision "retry or give up" is made here, once, on exception *types* and HTTP
status codes that fleet-python sets, never on substrings of messages: the previous
Fleet client's substring classifier missed every kind of incident that mattered
(rate limits, burst caps, ``"retryable": true`` bodies).
"""

from __future__ import annotations

from typing import Any

from fleetenv.core.errors import (
    FleetEnvError,
    PermanentProvisioningError,
    ProvisioningError,
    TransientProvisioningError,
)
from fleetenv.core.redaction import redact, scrub_exception

#: HTTP statuses after which the same request may succeed later.
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def provisioning_error(exc: Exception, **context: Any) -> ProvisioningError:
    """Map an exception raised by ``fleet.Fleet.make`` (or a readiness poll) to our errors.

    Auth, unknown environment / version, permission and other 4xx answers are permanent:
    retrying them only burns the budget (and, at scale, "10k bad requests"). Rate limits,
    instance-limit answers, 5xx, timeouts and connection failures are transient.
    """
    from fleet import exceptions as fx  # imported lazily: fleet-python costs ~0.4 s

    name = type(exc).__name__
    detail = error_detail(exc)
    if isinstance(exc, fx.FleetAuthenticationError):
        return PermanentProvisioningError(
            f"Fleet rejected the API key (401): {detail}",
            hint="check FLEET_API_KEY (or the api_key argument) and FLEET_BASE_URL",
            **context,
        )
    if isinstance(exc, fx.FleetRegionError):
        return _region_error(exc, detail, context)
    if isinstance(exc, fx.FleetVersionNotFoundError | fx.FleetEnvironmentNotFoundError):
        return PermanentProvisioningError(
            f"Fleet does not know this environment or version: {detail}",
            hint="check the task's env_key/env_version (and data_key/data_version); "
            "`fleetenv tools ENV_KEY` lists what the environment offers",
            **context,
        )
    if isinstance(exc, fx.FleetInstanceLimitError | fx.FleetRateLimitError):
        return TransientProvisioningError(
            f"Fleet is limiting instance creation ({name}): {detail}",
            hint="lower max_creating / workers, or wait for running instances to finish",
            **context,
        )
    if isinstance(exc, fx.FleetTimeoutError):
        return TransientProvisioningError(f"Fleet timed out: {detail}", **context)
    says = _body_says_retryable(exc)
    if says is True:  # Fleet's own verdict beats the status code (some 4xx are blips)
        status = getattr(exc, "status_code", None)
        return TransientProvisioningError(
            f"Fleet answered {status} and says the request may be retried: {detail}",
            **context)
    if says is False and isinstance(exc, fx.FleetAPIError):
        return PermanentProvisioningError(
            f"Fleet refused the request and says not to retry ({exc.status_code}): {detail}",
            hint="check the task's environment, version and data keys", **context)
    if isinstance(exc, fx.FleetAPIError):
        status = exc.status_code
        if status is None or status in TRANSIENT_STATUSES:
            # status None = the request never got an HTTP answer (connection failure).
            what = "could not be reached" if status is None else f"answered {status}"
            return TransientProvisioningError(f"Fleet {what}: {detail}", **context)
        return PermanentProvisioningError(
            f"Fleet refused the request ({status}): {detail}",
            hint="check the task's environment, version and data keys",
            **context,
        )
    if _is_transport_error(exc):
        return TransientProvisioningError(f"Fleet could not be reached ({name}): {detail}",
                                          **context)
    if isinstance(exc, FleetEnvError):
        return ProvisioningError(str(exc), **context)
    return PermanentProvisioningError(
        f"provisioning failed with an unexpected {name}: {detail}",
        hint="run with --debug / DEBUG logging for the traceback and report it",
        **context,
    )


def _region_error(exc: Any, detail: str, context: dict[str, Any]) -> ProvisioningError:
    """Fleet does not serve the region: permanent, and the error names the ones it does
    (fleet-python parses them from Fleet's "Please use [...]" into ``supported_regions``)."""
    valid = [str(r) for r in getattr(exc, "supported_regions", None) or [] if r]
    region = getattr(exc, "region", None)
    where = f"region {region!r}" if region else "the requested region"
    listed = (f"valid regions: {', '.join(valid)}" if valid
              else "Fleet did not list the valid ones (fleet.Fleet().list_regions() does)")
    return PermanentProvisioningError(
        f"Fleet does not serve {where}; {listed} ({detail})",
        hint="set the region to one of the valid regions, or leave it unset for Fleet's "
        "default", **context)


def _body_says_retryable(exc: BaseException) -> bool | None:
    """The ``retryable`` flag of Fleet's structured error body, if it has one.

    Read from the parsed body fleet-python keeps (``response_data``), never from the
    message text: ``{"retryable": true}`` or ``{"detail": {"retryable": true, ...}}``.
    """
    data = getattr(exc, "response_data", None) or _last_body()
    for holder in (data, data.get("detail") if isinstance(data, dict) else None):
        if isinstance(holder, dict) and isinstance(holder.get("retryable"), bool):
            return bool(holder["retryable"])
    return None


def _last_body() -> Any:
    from fleetenv.fleet.client import last_error_body

    return last_error_body()


def is_rate_limit(exc: BaseException) -> bool:
    """Did Fleet ask the API key to slow down (429, instance limit, rate limit)?"""
    from fleet import exceptions as fx

    if isinstance(exc, fx.FleetInstanceLimitError | fx.FleetRateLimitError):
        return True
    return isinstance(exc, fx.FleetAPIError) and exc.status_code == 429


def _is_transport_error(exc: BaseException) -> bool:
    """True for connection-level failures of httpx or requests (no HTTP answer)."""
    import httpx
    import requests

    return isinstance(exc, httpx.TransportError | requests.ConnectionError | requests.Timeout)


def error_detail(exc: BaseException, limit: int = 300) -> str:
    """The message of an SDK or transport error, for ours: redacted, then cut (in that
    order, so a cut cannot leave half a key). ``exc`` is scrubbed in place too, as it
    becomes the ``__cause__`` of the error we raise."""
    scrub_exception(exc)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return redact(str(message))[:limit]
