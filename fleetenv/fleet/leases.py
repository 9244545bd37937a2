"""Browser leases: the remote browser a ``browser_use`` episode acts through.

A ``browser_use`` episode runs a standard instance plus a browser lease. The lease is a
resource like an instance: created (with the instance's host allowed) after the instance,
navigated to the app's web UI, health-checked by polling for a valid screenshot, then its
MCP endpoint serves the episode's ``computer`` tool; it is deleted on every exit path
(it sits in the session's registry, so ``close()``, ``with``-exit, Ctrl-C, ``atexit``
and SIGTERM all delete it, and ``fleetenv sweep --tag`` finds leftovers by run tag).

Rules:

* the lease API is at ``FLEET_BROWSER_API_URL`` when set, else at the session's Fleet
  (the embedded local Fleet serves it too);
* the credential is ``FLEET_BROWSER_API_KEY`` when set (sent as a bearer token), else the
  session's own Fleet credentials; the lease's MCP endpoint gets the same credential,
  never the Fleet key of another host (``endpoints_for`` rule);
* readiness is a bounded poll with backoff for a screenshot that is a real image of at
  least ``min_screenshot_bytes``; no fixed sleeps;
* a failed delete raises (the registry keeps the lease and retries at close and exit).

Wire format (OpenEnv's ``fleet_env`` client's; not checked against Fleet itself):
``POST /v1/browser {"ttl_seconds", "allowed_hosts", "run_id"}`` answers
``{"lease_id", "browser_id", "mcp_url", "cdp_url", "stream_url", "host_domain"}``;
``DELETE /v1/browser/{lease_id}``; ``GET /v1/browser?run_id=&status=`` lists leases.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx

from fleetenv.core.errors import (
    FleetEnvError,
    PermanentProvisioningError,
    TransientProvisioningError,
)
from fleetenv.core.redaction import register_secret
from fleetenv.core.retry import Backoff, Deadline, RetryPolicy

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.session import Session

__all__ = [
    "LEASE_API_KEY_ENV",
    "LEASE_API_URL_ENV",
    "BrowserLease",
    "LeaseClient",
    "screenshot_bytes",
    "sweep_leases",
    "wait_until_ready",
]

logger = logging.getLogger("fleetenv.leases")

#: Where the browser-lease API is, when it is not the session's Fleet.
LEASE_API_URL_ENV = "FLEET_BROWSER_API_URL"
#: A separate credential for the browser-lease API (default: the session's credentials).
LEASE_API_KEY_ENV = "FLEET_BROWSER_API_KEY"
#: A screenshot smaller than this (decoded bytes) is a blank or half-drawn page.
MIN_SCREENSHOT_BYTES = 4096
_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"


@dataclass
class BrowserLease:
    """A live browser lease. ``headers`` (its credential) never show in reprs."""

    lease_id: str
    mcp_url: str
    browser_id: str | None = None
    cdp_url: str | None = None
    stream_url: str | None = None
    host_domain: str | None = None
    run_tag: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    deleted: bool = False


def _status_error(action: str, response: httpx.Response, **context: Any) -> FleetEnvError:
    try:
        said = response.json().get("detail", response.text)
    except ValueError:
        said = response.text[:300]
    status = response.status_code
    message = f"{action} failed with HTTP {status}: {said}"
    if status in (408, 429) or status >= 500:
        return TransientProvisioningError(message, http_status=status, **context)
    hint = ("check FLEET_BROWSER_API_KEY / FLEET_API_KEY" if status in (401, 403)
            else "check FLEET_BROWSER_API_URL" if status in (404, 405, 501) else None)
    return PermanentProvisioningError(message, hint=hint, http_status=status, **context)


class LeaseClient:
    """Blocking client of the browser-lease API. Runs in the caller's thread (never on
    fleetenv's loop); every request has a timeout; a fresh connection per operation, so
    a delete at interpreter exit needs nothing that may be closed already."""

    def __init__(self, base_url: str, headers: Mapping[str, str], *,
                 retry: RetryPolicy | None = None, timeout_s: float = 60.0,
                 connect_timeout_s: float = 10.0, delete_timeout_s: float = 10.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise FleetEnvError(f"the browser-lease API URL {base_url!r} is not http(s)",
                                hint=f"set {LEASE_API_URL_ENV} to e.g. https://host")
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        self.retry = retry or RetryPolicy(base_s=0.5, cap_s=5.0, budget_s=60.0)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.delete_timeout_s = delete_timeout_s
        #: Run tags under which a create may have made a lease we never heard of (its
        #: answer was lost: a timeout, a dropped connection, Ctrl-C); see `sweep_unsure`.
        self._unsure_tags: set[str] = set()

    def __repr__(self) -> str:
        return f"LeaseClient(base_url={self.base_url!r})"

    @classmethod
    def configured(cls, fleet_base_url: str, fleet_headers: Mapping[str, str], *,
                   retry: RetryPolicy | None = None,
                   connect_timeout_s: float = 10.0) -> LeaseClient:
        """The client for a session: ``FLEET_BROWSER_API_URL`` / ``_KEY`` when set, else
        the session's Fleet and credentials."""
        url = os.environ.get(LEASE_API_URL_ENV, "").strip() or fleet_base_url
        key = os.environ.get(LEASE_API_KEY_ENV, "").strip()
        register_secret(key)  # scrubbed from whatever the browser API or a tool echoes
        headers = {"Authorization": f"Bearer {key}"} if key else dict(fleet_headers)
        return cls(url, headers, retry=retry, connect_timeout_s=connect_timeout_s)

    def _http(self, timeout_s: float) -> httpx.Client:
        return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=self.connect_timeout_s),
                            headers=self._headers)

    def create(self, allowed_hosts: Sequence[str], *, ttl_seconds: int | None,
               run_tag: str | None, task: str | None = None) -> BrowserLease:
        """Create a lease whose browser may reach ``allowed_hosts``. Retries only what
        never created one (connect failures) or what the API refused as busy (429, 503);
        a lease created behind a lost answer carries ``run_tag``, for the sweep."""
        body = {"ttl_seconds": ttl_seconds, "allowed_hosts": list(allowed_hosts),
                "run_id": run_tag}
        context: dict[str, Any] = {"task": task, "endpoint": f"{self.base_url}/v1/browser"}

        def attempt() -> BrowserLease:
            try:
                with self._http(self.timeout_s) as http:
                    response = http.post(f"{self.base_url}/v1/browser", json=body)
            except httpx.ConnectError as exc:
                raise TransientProvisioningError(
                    f"could not reach the browser-lease API: {exc}", **context) from exc
            except httpx.HTTPError as exc:  # may have created one: not retried
                raise TransientProvisioningError(
                    f"creating a browser lease failed: {type(exc).__name__}: {exc}",
                    retryable=False, hint=f"leftovers: fleetenv sweep --tag {run_tag}",
                    **context) from exc
            if response.status_code != 200:
                error = _status_error("creating a browser lease", response, **context)
                error.retryable = response.status_code in (429, 503)
                raise error
            return self._lease(response, run_tag, context)

        try:
            return self.retry.call(attempt)
        except BaseException as exc:
            if run_tag is not None and _may_have_created(exc):
                self._unsure_tags.add(run_tag)
            raise

    def sweep_unsure(self) -> list[str]:
        """Delete the running leases of every tag under which a create's answer was lost
        (a registry sweeper: session close, exit, SIGTERM). Sends nothing otherwise."""
        swept: list[str] = []
        for tag in sorted(self._unsure_tags):
            swept += self.sweep_tag(tag)
            self._unsure_tags.discard(tag)
        return swept

    def _lease(self, response: httpx.Response, run_tag: str | None,
               context: dict[str, Any]) -> BrowserLease:
        try:
            data = response.json()
            lease_id, mcp_url = data["lease_id"], data["mcp_url"]
            if not isinstance(lease_id, str) or not isinstance(mcp_url, str):
                raise TypeError("lease_id and mcp_url must be strings")
        except (ValueError, KeyError, TypeError) as exc:
            raise PermanentProvisioningError(
                f"the browser-lease API answered something that is not a lease: {exc}",
                hint=f"check {LEASE_API_URL_ENV}", **context) from exc
        return BrowserLease(
            lease_id=lease_id, mcp_url=mcp_url, browser_id=data.get("browser_id"),
            cdp_url=data.get("cdp_url"), stream_url=data.get("stream_url"),
            host_domain=data.get("host_domain"), run_tag=run_tag,
            headers=self.mcp_headers(mcp_url))

    def mcp_headers(self, mcp_url: str) -> dict[str, str]:
        """The credential for a lease's MCP endpoint: this API's, and only when the
        endpoint is on the API's own host (a key never travels to another host)."""
        same_host = urlsplit(mcp_url).netloc == urlsplit(self.base_url).netloc
        return dict(self._headers) if same_host else {}

    def delete(self, lease: BrowserLease) -> None:
        """Delete ``lease`` (idempotent: an unknown or stopped lease counts as deleted).
        Raises ``FleetEnvError`` when it could not be deleted (with the sweep command)."""
        if lease.deleted:
            return
        context = {"lease": lease.lease_id}
        hint = (f"fleetenv deletes it again at close and exit; or run `fleetenv sweep --tag "
                f"{lease.run_tag}`" if lease.run_tag else "its TTL reaps it")

        def attempt() -> None:
            url = f"{self.base_url}/v1/browser/{quote(lease.lease_id, safe='')}"
            try:
                with self._http(self.delete_timeout_s) as http:
                    response = http.delete(url)
            except httpx.HTTPError as exc:
                raise FleetEnvError(f"could not delete browser lease {lease.lease_id}: "
                                    f"{type(exc).__name__}: {exc}", hint=hint,
                                    retryable=True, **context) from exc
            if response.status_code in (200, 202, 204, 404, 410):
                return
            error = _status_error(f"deleting browser lease {lease.lease_id}", response,
                                  **context)
            raise FleetEnvError(error.message, hint=hint, retryable=error.retryable,
                                **context)

        self.retry.with_budget(self.delete_timeout_s, max_attempts=4).call(attempt)
        lease.deleted = True

    def running(self, run_tag: str) -> list[str]:
        """The ids of the running leases tagged ``run_tag``."""
        with self._http(self.timeout_s) as http:
            response = http.get(f"{self.base_url}/v1/browser",
                                params={"run_id": run_tag, "status": "running"})
        if response.status_code != 200:
            raise _status_error("listing browser leases", response, run_tag=run_tag)
        return [str(item["lease_id"]) for item in response.json()
                if item.get("run_id") == run_tag and item.get("status", "running") == "running"]

    def sweep_tag(self, run_tag: str, *, dry_run: bool = False) -> list[str]:
        """Delete every running lease tagged ``run_tag`` (``dry_run``: only list them)."""
        found = self.running(run_tag)
        if dry_run:
            return found
        deleted = []
        for lease_id in found:
            try:
                self.delete(BrowserLease(lease_id=lease_id, mcp_url="", run_tag=run_tag))
            except FleetEnvError as exc:
                logger.warning("sweep could not delete browser lease %s: %s", lease_id, exc)
                continue
            deleted.append(lease_id)
        return deleted


#: The headers of fleet-python's requests that carry the session's credentials.
_CREDENTIAL_HEADERS = ("Authorization", "X-JWT-Token", "X-Team-ID")


def for_session(session: Session) -> LeaseClient:
    """The lease client of ``session``'s Fleet, with its credentials (or the
    ``FLEET_BROWSER_API_*`` overrides)."""
    headers: dict[str, str] = session.client.sdk.client.get_headers()
    return LeaseClient.configured(
        session.base_url, {k: v for k, v in headers.items() if k in _CREDENTIAL_HEADERS},
        retry=session.retry.with_budget(session.config.timeouts.connect * 6),
        connect_timeout_s=session.config.timeouts.connect)


def sweep_leases(session: Session, run_tag: str, *, dry_run: bool = False) -> list[str]:
    """``fleetenv sweep --tag``'s lease half: delete (or list) the running browser leases
    tagged ``run_tag``. A Fleet without the lease API has none: nothing, with a log line."""
    try:
        return for_session(session).sweep_tag(run_tag, dry_run=dry_run)
    except PermanentProvisioningError as exc:
        logger.info("no browser leases swept: %s", exc)
        return []


def _may_have_created(exc: BaseException) -> bool:
    """False only when the create provably made nothing: the API never got it (connect
    failure) or answered with a status."""
    if isinstance(exc, FleetEnvError):
        return "http_status" not in exc.context and not isinstance(exc.__cause__,
                                                                   httpx.ConnectError)
    return True  # interrupted (Ctrl-C, cancellation) while the request was out


def screenshot_bytes(content: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The image of a ``computer`` result rendered as OpenAI content parts (the first
    ``data:`` image URL, decoded), or ``None`` when it has none or it does not decode."""
    for part in content:
        if part.get("type") != "image_url":
            continue
        url = str((part.get("image_url") or {}).get("url", ""))
        head, _, data = url.partition(",")
        if not head.startswith("data:image/") or ";base64" not in head:
            continue
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            return None
    return None


def _valid(image: bytes | None, min_bytes: int) -> bool:
    return image is not None and len(image) >= min_bytes and image.startswith((_PNG, _JPEG))


def wait_until_ready(lease: BrowserLease, app_url: str, *, budget_s: float,
                     connect_timeout_s: float, call_timeout_s: float,
                     min_screenshot_bytes: int = MIN_SCREENSHOT_BYTES,
                     task: str | None = None) -> bytes:
    """Navigate the lease's browser to ``app_url`` and poll (backoff, within
    ``budget_s``) until a screenshot is a real image; return it. Raises
    ``TransientProvisioningError`` naming the last problem when it never becomes one,
    and ``PermanentProvisioningError`` when the browser refuses the navigation."""
    from fleetenv.mcp.router import Endpoint, ToolRouter

    deadline = Deadline(budget_s)
    context: dict[str, Any] = {"task": task, "lease": lease.lease_id}
    router = ToolRouter([Endpoint(lease.mcp_url, required=True, headers=lease.headers)],
                        connect_timeout_s=connect_timeout_s, call_timeout_s=call_timeout_s,
                        retry=RetryPolicy(base_s=0.1, cap_s=2.0, budget_s=budget_s))
    try:
        router.open()
        navigated = router.call("computer", {"action": "navigate", "url": app_url},
                                timeout_s=deadline.cap(call_timeout_s))
        if navigated.is_error:
            raise PermanentProvisioningError(
                f"the browser lease could not open {app_url}: {navigated.error_message}",
                hint="the lease must allow the instance's host", **context)
        poll = Backoff(base=0.1, cap=2.0)
        problem = "no screenshot yet"
        attempt = 0
        while True:
            shot = router.call("computer", {"action": "screenshot"},
                               timeout_s=max(deadline.cap(call_timeout_s), 0.5))
            image = None if shot.is_error else screenshot_bytes(shot.to_openai_content(None))
            if _valid(image, min_screenshot_bytes):
                assert image is not None
                return image
            problem = (f"screenshot failed: {shot.error_message}" if shot.is_error
                       else "screenshot has no image" if image is None
                       else f"screenshot is blank or not an image ({len(image)} bytes)")
            delay = poll.delay(attempt)
            if deadline.expired() or (deadline.remaining() or 0.0) <= delay:
                raise TransientProvisioningError(
                    f"the browser lease never showed {app_url} within {budget_s:.0f} s "
                    f"({problem})", **context)
            time.sleep(delay)  # a bounded poll with backoff, not a settle delay
            attempt += 1
    finally:
        router.close()
