"""fleet-python's synchronous client, the one way fleetenv talks to Fleet's control plane.

Always the sync ``fleet.Fleet`` (the async ``fleet.Task`` runs ``asyncio.run`` per call),
over our own ``httpx.Client``: we can close its sockets (``Fleet`` has no close), its
transport gives every request an overall deadline
(:class:`~fleetenv.fleet.deadlines.DeadlineTransport`; callers scope each operation), and
fleet-python's own retries are off (they retry 404s and re-POST creates; ours classify
inside one budget). The client also owns its Fleet's one runner-token provider
(``runner_tokens``). Every client of the process shares one SSL context: loading the CA
bundle costs tens of milliseconds of CPU.
"""

from __future__ import annotations

import contextvars
import threading
from typing import TYPE_CHECKING, Any

import httpx

from fleetenv.core.redaction import register_secret

if TYPE_CHECKING:  # pragma: no cover
    import ssl

    import fleet
    from fleet.client import SyncEnv

    from fleetenv.fleet.manager import RunnerTokens

_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def _shared_ssl_context() -> ssl.SSLContext:
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            import httpx

            _ssl_context = httpx.create_ssl_context()
        return _ssl_context


#: The JSON body of the last error answer the calling thread's Fleet request got (reset
#: when the next request starts). fleet-python turns some answers (a 400, a 403) into
#: exceptions that keep only the message; Fleet's structured ``retryable`` flag in the
#: body is what decides whether to retry, so it is kept here for the classifier.
_last_error_body: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "fleetenv_last_fleet_error_body", default=None)


#: The ``X-Verifier-Queue-Ms`` header of the calling thread's last answer, in seconds: how
#: long a verifier run waited for a free runner, apart from its own time (the local Fleet
#: sends it; without it, None). fleet-python's verify response keeps no such field.
_last_queue_s: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "fleetenv_last_verifier_queue_s", default=None)


def last_error_body() -> Any:
    """The parsed body of the calling thread's last Fleet error answer, if any."""
    return _last_error_body.get()


def last_queue_s() -> float | None:
    """Seconds the calling thread's last verifier run waited in the runner's queue, if
    the runner said."""
    return _last_queue_s.get()


def _forget_last_answer(request: httpx.Request) -> None:
    _last_error_body.set(None)
    _last_queue_s.set(None)


def _remember_last_answer(response: httpx.Response) -> None:
    _last_queue_s.set(_queue_seconds(response.headers.get("X-Verifier-Queue-Ms")))
    if response.status_code < 400:
        return
    response.read()  # error bodies are small; fleet-python reads it right after anyway
    try:
        _last_error_body.set(response.json())
    except ValueError:
        _last_error_body.set(None)


def _queue_seconds(header: str | None) -> float | None:
    """The header's milliseconds in seconds; None when absent or not a plain count."""
    if header is None or len(header) > 12 or not header.isdecimal():
        return None
    return int(header) / 1000


class FleetClient:
    """A ``fleet.Fleet`` plus the HTTP client it owns. Thread-safe (httpx.Client is)."""

    def __init__(self, api_key: str, base_url: str, *, timeout_s: float = 60.0,
                 connect_timeout_s: float = 10.0) -> None:
        import fleet
        import httpx

        from fleetenv.fleet.deadlines import DeadlineTransport

        register_secret(api_key)  # scrubbed from whatever a server or a tool echoes
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http: httpx.Client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=DeadlineTransport(
                verify=_shared_ssl_context(),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64)),
            event_hooks={"request": [_forget_last_answer],
                         "response": [_remember_last_answer]},
        )
        self.sdk: fleet.Fleet = fleet.Fleet(
            api_key=api_key, base_url=self.base_url, httpx_client=self._http, max_retries=0,
            timeout=timeout_s,
        )
        from fleetenv.fleet.manager import PooledRunnerTokens, RefreshingRunnerTokens

        #: The ``X-Runner-Token`` source of every manager call of this client's instances.
        self.runner_tokens: RunnerTokens = RefreshingRunnerTokens(
            lambda: PooledRunnerTokens(self.sdk.client, self._http))

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"FleetClient(base_url={self.base_url!r})"


def load_resources(env: SyncEnv) -> SyncEnv:
    """Load ``env``'s resources so ``env.db()`` / ``env.state()`` / ``env.browser()`` work.

    A workaround: fleet-python >= 0.2.115 stopped loading resources in ``make()`` (its
    changelog says "on first use", but those methods raise ``KeyError`` until
    ``env.resources()`` ran). fleetenv itself never calls them (describe / query / reset
    go through :class:`~fleetenv.fleet.manager.ManagerClient`, verifiers run remotely), so
    only code that hands the SDK env to users who do needs this.
    ``tests/test_local_sdk.py`` has a test that fails once the SDK loads them itself: then
    drop this function and its callers.
    """
    env.resources()
    return env
