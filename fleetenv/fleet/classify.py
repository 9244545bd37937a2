"""Translate fleet-python and HTTP-client exceptions into fleetenv's errors.

Whether a failed create is retried is decided here, once, in this order:

1. **What the request is**: a key Fleet rejects (401), a 404, an environment, version
   or region Fleet does not know: permanent, whatever else the answer says.
2. **Fleet's own ``retryable`` flag**, wherever Fleet put it: in its structured error
   body, or in a JSON object inside the message (Fleet wraps driver errors as
   ``Failed to create instance: DriverAPIError: Driver API returned 400: {"detail":
   {..., "retryable": true}}``). ``true``: retried; ``false``: permanent.
3. **A failure Fleet names as passing** (:data:`TRANSIENT_MARKERS`, Fleet's messages
   verbatim in ``tests/test_fidelity_make_retries.py``): retried, under any status.
4. **The type and status** fleet-python gives the answer: rate and instance limits, 5xx,
   408/425/429, timeouts and lost connections are retried; other 4xx are permanent.

Nothing else in a message counts: broad substrings such as "connection" or "timeout" also
match unrelated 400s; timeouts and connection failures are recognised by their exception
types instead.

Each of Fleet's messages, decided under each status: docs/errors.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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

#: Failures Fleet names that pass, matched case-insensitively in the error's message (and
#: the error code of a structured body): a seed placement the driver could not make, the
#: team's burst cap, Fleet's rate limiter, an instance that failed its health check.
TRANSIENT_MARKERS = (
    "seed_placement_failed",
    "too many in-flight instance creations",
    "rate limit exceeded",
    "health check failed",
)
#: Of those, the ones that ask the whole API key to slow down.
_RATE_MARKERS = ("too many in-flight instance creations", "rate limit exceeded")
#: How much of a message is searched (hostile text: bounded, one linear pass).
_MAX_SCANNED = 16_384
#: An embedded JSON object nested deeper than this is not parsed.
_MAX_DEPTH = 16


def provisioning_error(exc: Exception, **context: Any) -> ProvisioningError:
    """Map an exception raised by ``fleet.Fleet.make`` (or a readiness poll) to our errors,
    in the order of the module docstring: transient (retried within the provisioning
    budget) or permanent (raised at once)."""
    from fleet import exceptions as fx  # imported lazily: fleet-python costs ~0.4 s

    name = type(exc).__name__
    text = _text_of(exc)  # read before error_detail() scrubs and cuts it
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
    status = getattr(exc, "status_code", None)
    if isinstance(exc, fx.FleetAPIError) and status == 404:  # no such route or resource
        return PermanentProvisioningError(
            f"Fleet refused the request (404): {detail}",
            hint="check the task's environment, version and data keys, and FLEET_BASE_URL",
            **context)
    answered = "could not be reached" if status is None else f"answered {status}"
    says = fleet_says_retryable(exc, text)
    if says is True:  # Fleet's own verdict beats the status code (some 4xx are blips)
        return TransientProvisioningError(
            f"Fleet {answered} and says the request may be retried: {detail}", **context)
    if says is False and isinstance(exc, fx.FleetAPIError):
        return PermanentProvisioningError(
            f"Fleet refused the request and says not to retry ({status}): {detail}",
            hint="check the task's environment, version and data keys", **context)
    marker = transient_marker(exc, text)
    if marker is not None:
        return TransientProvisioningError(
            f"Fleet {answered} with a failure that passes ({marker!r}): {detail}",
            **context)
    if isinstance(exc, fx.FleetInstanceLimitError | fx.FleetRateLimitError):
        return TransientProvisioningError(
            f"Fleet is limiting instance creation ({name}): {detail}",
            hint="lower max_creating / workers, or wait for running instances to finish",
            **context,
        )
    if isinstance(exc, fx.FleetTimeoutError):
        return TransientProvisioningError(f"Fleet timed out: {detail}", **context)
    if isinstance(exc, fx.FleetAPIError):
        if status is None or status in TRANSIENT_STATUSES:
            # status None = the request never got an HTTP answer (connection failure).
            return TransientProvisioningError(f"Fleet {answered}: {detail}", **context)
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


def fleet_says_retryable(exc: BaseException, text: str | None = None) -> bool | None:
    """Fleet's own ``retryable`` flag for this failure, if it gave one.

    First the structured body fleet-python keeps (``response_data``; for the answers it
    keeps only the message of, the body :mod:`fleetenv.fleet.client` remembered):
    ``{"retryable": ...}`` or ``{"detail": {"retryable": ...}}``. Then the JSON objects
    embedded in the message, outermost first, in the same two places.
    """
    found = _flag_in(getattr(exc, "response_data", None) or _last_body())
    if found is not None:
        return found
    for embedded in json_objects_in(_text_of(exc) if text is None else text):
        found = _flag_in(embedded)
        if found is not None:
            return found
    return None


def transient_marker(exc: BaseException, text: str | None = None) -> str | None:
    """The first of :data:`TRANSIENT_MARKERS` in the message (or in the error code of
    Fleet's structured body), if any."""
    words = [_text_of(exc) if text is None else text]
    body = getattr(exc, "response_data", None) or _last_body()
    for holder in _holders(body):
        words += [str(holder.get(k)) for k in ("error", "error_type", "code") if holder.get(k)]
    lowered = " ".join(words).lower()
    return next((m for m in TRANSIENT_MARKERS if m in lowered), None)


def json_objects_in(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects written inside ``text`` (outermost ones, in order).

    Hostile text: one pass over at most :data:`_MAX_SCANNED` characters finds each
    top-level ``{...}`` span (braces balanced outside strings), and each span is parsed
    once, so the work is linear; a span nested deeper than :data:`_MAX_DEPTH` or that is
    not JSON is skipped.
    """
    text = text[:_MAX_SCANNED]
    depth = deepest = 0
    start = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"' and depth:
            in_string = True
        elif char == "{":
            if depth == 0:
                start, deepest = index, 0
            depth += 1
            deepest = max(deepest, depth)
        elif char == "}" and depth:
            depth -= 1
            if depth == 0 and deepest <= _MAX_DEPTH:
                try:
                    value = json.loads(text[start:index + 1])
                except ValueError:
                    continue
                if isinstance(value, dict):
                    yield value


def _holders(data: Any) -> list[dict[str, Any]]:
    """Where Fleet puts its error fields: the body itself, or its ``detail`` object."""
    if not isinstance(data, dict):
        return []
    detail = data.get("detail")
    return [data, detail] if isinstance(detail, dict) else [data]


def _flag_in(data: Any) -> bool | None:
    for holder in _holders(data):
        if isinstance(holder.get("retryable"), bool):
            return bool(holder["retryable"])
    return None


def _text_of(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return (message if isinstance(message, str) else str(exc))[:_MAX_SCANNED]


def _last_body() -> Any:
    from fleetenv.fleet.client import last_error_body

    return last_error_body()


def is_rate_limit(exc: BaseException) -> bool:
    """Did Fleet ask the API key to slow down (429, instance limit, rate limit, the team's
    burst cap: under whatever status the phrase arrives)?"""
    from fleet import exceptions as fx

    if isinstance(exc, fx.FleetInstanceLimitError | fx.FleetRateLimitError):
        return True
    if isinstance(exc, fx.FleetAPIError) and exc.status_code == 429:
        return True
    text = _text_of(exc).lower()
    return any(marker in text for marker in _RATE_MARKERS)


def never_sent(exc: BaseException) -> bool:
    """True when the request provably never reached the server (its connection failed),
    so it cannot have had an effect there."""
    import httpx

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, httpx.ConnectError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def request_error(exc: Exception, what: str, error_cls: type[FleetEnvError], *,
                  hint: str | None = None, **context: Any) -> FleetEnvError:
    """A failed control-plane request other than a create (see `provisioning_error`) as
    ``error_cls`` naming ``what``: retryable on 429, 408/425/5xx, timeouts and lost
    connections, by type and status only; ``hint`` says what to try when Fleet refused it.
    The ``status`` context is the HTTP status, or ``connect`` when the request never left
    (`never_sent`)."""
    from fleet import exceptions as fx

    detail = error_detail(exc)
    if isinstance(exc, fx.FleetAuthenticationError):
        return error_cls(f"{what}: Fleet rejected the API key (401): {detail}",
                         hint="check FLEET_API_KEY and FLEET_BASE_URL", status=401, **context)
    if never_sent(exc):
        return error_cls(f"{what}: Fleet could not be reached: {detail}", retryable=True,
                         status="connect", **context)
    if isinstance(exc, fx.FleetRateLimitError):
        return error_cls(f"{what}: Fleet is rate limiting: {detail}", retryable=True,
                         status=429, **context)
    if isinstance(exc, fx.FleetTimeoutError) or _is_transport_error(exc):
        return error_cls(f"{what}: the request failed ({type(exc).__name__}): {detail}",
                         retryable=True, **context)
    if isinstance(exc, fx.FleetAPIError):
        status = exc.status_code
        if status is None or status in TRANSIENT_STATUSES:
            answered = "no answer" if status is None else f"Fleet answered {status}"
            return error_cls(f"{what}: {answered}: {detail}", retryable=True, status=status,
                             **context)
        return error_cls(f"{what}: Fleet refused the request ({status}): {detail}",
                         hint=hint, status=status, **context)
    if isinstance(exc, ValueError):  # pydantic's ValidationError is one
        return error_cls(f"{what}: Fleet's answer is not what fleet-python expects: "
                         f"{detail}", hint="upgrade fleetenv / fleet-python", **context)
    return error_cls(f"{what} failed with an unexpected {type(exc).__name__}: {detail}",
                     **context)


def is_gone(exc: BaseException) -> bool:
    """Did Fleet answer that the instance does not exist (any more)?"""
    from fleet import exceptions as fx

    return isinstance(exc, fx.FleetAPIError) and exc.status_code in (404, 410)


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
