"""The instance manager API (reset, describe, query) over ``requests``.

Not fleet-python's manager client: it checks no status codes and shares the control
plane's 300 s timeout. Here each call has one overall deadline (``timeouts.reset`` or
``timeouts.read``, cut as ``fleetenv.fleet.deadlines`` says) and every failure is a typed
error naming the instance.

Gated clusters answer 404 to manager requests without an ``X-Runner-Token``, which looks
exactly like a deleted instance, so every request carries the token fleet-python's
``RunnerTokenProvider`` resolves. The token is a header value only (never logged, in an
error, a repr or what the agent sees) and is registered for scrubbing.
"""

from __future__ import annotations

import json as _json
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import requests

from fleetenv.core.errors import DeadlineExceeded, FleetEnvError, InstanceGoneError
from fleetenv.core.redaction import register_secret, scrub_secrets

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = [
    "ManagerClient",
    "ManagerPool",
    "PooledRunnerTokens",
    "RefreshingRunnerTokens",
    "RunnerTokens",
    "env_runner_tokens",
]


class RunnerTokens(Protocol):
    """What ``fleet.runner_auth.RunnerTokenProvider`` offers: the token, or None."""

    def token(self) -> str | None: ...


class _NoControlPlane:
    """An auth source with no control plane: the provider reads ``RUNNER_AUTH_TOKEN`` only."""

    base_url = None

    def get_headers(self) -> dict[str, str]:
        return {}


class RefreshingRunnerTokens:
    """A token provider (fleet-python's rules), without their one sharp edge for long runs.

    ``RunnerTokenProvider`` resolves once per client and then remembers the answer,
    "no token" included: one failed fetch at the start (a control-plane blip, a timeout on
    a busy machine) would make every manager call of a long training run answer 404 on a
    gated cluster. This wrapper keeps the provider's own resolution (the environment
    variable, the fetch, its soft failure) and only replaces a provider that found no
    token: when asked again ``retry_after_s`` later, or at once through `refresh` when a
    manager answered 404 to a request that carried no token. An ungated Fleet costs one
    small GET every ``retry_after_s`` at most.
    """

    def __init__(self, make_provider: Callable[[], RunnerTokens], *,
                 retry_after_s: float = 30.0, min_refresh_s: float = 1.0) -> None:
        self._make_provider = make_provider
        self._provider = make_provider()
        self._retry_after_s = retry_after_s
        self._min_refresh_s = min_refresh_s
        self._missing_since: float | None = None
        self._refreshed_at: float | None = None
        self._lock = threading.Lock()

    def token(self) -> str | None:
        token = self._provider.token()
        if token:
            return token
        now = time.monotonic()
        with self._lock:
            if self._missing_since is None:
                self._missing_since = now
            if now - self._missing_since < self._retry_after_s:
                return None
        return self._resolve_again(now)

    def refresh(self) -> str | None:
        """Resolve again now (a manager said 404 without a token); at most once per
        ``min_refresh_s``, so a burst of 404s from really deleted instances costs one GET."""
        now = time.monotonic()
        with self._lock:
            last = self._refreshed_at
            if last is not None and now - last < self._min_refresh_s:
                return self._provider.token()
        return self._resolve_again(now)

    def _resolve_again(self, now: float) -> str | None:
        provider = self._make_provider()
        token = provider.token()  # outside the lock: it may fetch (bounded by the SDK)
        with self._lock:
            self._provider = provider
            self._refreshed_at = now
            self._missing_since = None if token else now
        return token


class PooledRunnerTokens:
    """The runner token resolved by fleet-python's rules (``RunnerTokenProvider``:
    ``RUNNER_AUTH_TOKEN``, else one GET of the control plane's token route with the
    client's credentials; any failure is "no token"; the answer is kept), over the
    client's own pool. fleet-python's provider makes a client per fetch, and with it an
    SSL context: about 20 ms of CPU for every new session."""

    def __init__(self, auth: Any, http: httpx.Client) -> None:
        self._auth = auth  # fleet-python's wrapper: ``base_url`` and ``get_headers()``
        self._http = http
        self._token: str | None = None
        self._resolved = False
        self._lock = threading.Lock()

    def token(self) -> str | None:
        if not self._resolved:
            with self._lock:
                if not self._resolved:
                    self._token = self._resolve()
                    self._resolved = True
        return self._token

    def _resolve(self) -> str | None:
        from fleet import runner_auth

        token = (os.environ.get("RUNNER_AUTH_TOKEN") or "").strip()
        if token:
            return token
        base_url = getattr(self._auth, "base_url", None)
        try:
            headers = self._auth.get_headers()
        except Exception:
            return None
        # no credential, no fetch (a 401 would be remembered as "no token")
        if not base_url or not any(headers.get(name) for name in _CREDENTIAL_HEADERS):
            return None
        try:
            response = self._http.get(f"{str(base_url).rstrip('/')}{runner_auth.TOKEN_PATH}",
                                      headers=headers, timeout=_TOKEN_FETCH_S)
            payload = response.json() if response.status_code == 200 else None
        except Exception:  # soft, as fleet-python's: an ungated Fleet has no such route
            return None
        found = payload.get("token") if isinstance(payload, dict) else None
        if not isinstance(found, str):
            return None
        return found.strip() or None


_CREDENTIAL_HEADERS = ("Authorization", "X-JWT-Token")  # fleet-python's runner_auth
_TOKEN_FETCH_S = 10.0


def env_runner_tokens() -> RunnerTokens:
    """fleet-python's provider, resolving the token from ``RUNNER_AUTH_TOKEN`` alone."""
    from fleet.runner_auth import RunnerTokenProvider

    provider: RunnerTokens = RunnerTokenProvider(_NoControlPlane())
    return provider


class ManagerPool:
    """The keep-alive ``requests`` pools of one session's manager-API traffic.

    ``requests.Session`` is not documented as thread-safe, so each thread that talks to
    a manager API gets its own (keep-alive per instance host within it); the pool
    remembers them all so ``close()`` releases every socket.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sessions: list[requests.Session] = []
        self._closed = False

    def get(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            from fleetenv.fleet.deadlines import DeadlineAdapter

            session = requests.Session()
            session.mount("http://", DeadlineAdapter())
            session.mount("https://", DeadlineAdapter())
            with self._lock:
                if self._closed:
                    session.close()
                    raise FleetEnvError("the session is closed",
                                        hint="create a new fleetenv.Session")
                self._sessions.append(session)
            self._local.session = session
        return session

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()


class ManagerClient:
    """Calls one instance's manager API (``{root}api/v1/env``).

    ``runner_tokens``: where the ``X-Runner-Token`` comes from, normally the session's
    :attr:`FleetClient.runner_tokens <fleetenv.fleet.client.FleetClient.runner_tokens>`
    (one resolution per client); default: ``RUNNER_AUTH_TOKEN`` only.
    """

    def __init__(self, manager_url: str, *, pool: ManagerPool, instance_id: str | None = None,
                 timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 runner_tokens: RunnerTokens | None = None) -> None:
        self.manager_url = manager_url.rstrip("/")
        self.instance_id = instance_id
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._pool = pool
        self._runner_tokens = runner_tokens if runner_tokens is not None else env_runner_tokens()

    def __repr__(self) -> str:
        return f"ManagerClient({self.manager_url!r}, instance_id={self.instance_id!r})"

    def reset(self, *, seed: int | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
        """Restore the seed state. Raises on failure: a silently dirty instance would make
        every later reward wrong."""
        body = self._request("POST", "/reset", json={"seed": seed, "timestamp": None},
                             timeout_s=timeout_s, what="reset")
        if isinstance(body, dict) and body.get("success") is False:
            raise FleetEnvError(
                f"manager reset reported failure: {body.get('message') or body}",
                hint="start the episode on a fresh instance",
                instance=self.instance_id, endpoint=f"{self.manager_url}/reset",
            )
        return body if isinstance(body, dict) else {"result": body}

    def describe_db(self, name: str = "current") -> dict[str, Any]:
        """Tables and columns of one SQLite resource (``current`` or ``seed``)."""
        return self._object(self._request("GET", f"/resources/sqlite/{name}/describe",
                                          timeout_s=self.timeout_s,
                                          what=f"describe {name} db"), f"describe {name} db")

    def query_db(self, sql: str, args: list[Any] | None = None, *, name: str = "current",
                 read_only: bool = True) -> dict[str, Any]:
        """Run SQL on a SQLite resource; read-only unless asked (the server enforces it)."""
        body = self._request(
            "POST", f"/resources/sqlite/{name}/query",
            json={"query": sql, "args": args, "read_only": read_only},
            timeout_s=self.timeout_s, what=f"query {name} db",
        )
        if isinstance(body, dict) and body.get("success") is False:
            raise FleetEnvError(
                f"query failed: {body.get('error') or body.get('message')}",
                hint="check the SQL against describe_db(); writes need read_only=False",
                instance=self.instance_id,
            )
        return self._object(body, f"query {name} db")

    def _headers(self) -> dict[str, str]:
        """The runner-token header, when there is a token (soft: none on ungated Fleets)."""
        from fleet.runner_auth import RUNNER_TOKEN_HEADER

        token = self._runner_tokens.token()
        if not token:
            return {}
        register_secret(token)  # the first request that carries it: scrubbed from now on
        return {RUNNER_TOKEN_HEADER: token}

    def _refreshed_token(self) -> bool:
        refresh = getattr(self._runner_tokens, "refresh", None)
        return bool(refresh()) if refresh is not None else False

    def _object(self, body: Any, what: str) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise FleetEnvError(f"manager {what} answered {type(body).__name__}, not an object",
                                instance=self.instance_id, endpoint=self.manager_url)
        return body

    def _request(self, method: str, path: str, *, timeout_s: float, what: str,
                 json: Any = None) -> Any:
        from fleetenv.fleet.deadlines import deadline_scope

        url = f"{self.manager_url}{path}"
        context: dict[str, Any] = {"instance": self.instance_id, "endpoint": url}
        late = DeadlineExceeded(f"manager {what} did not finish within {timeout_s:g} s",
                                hint="the manager accepted the request but did not answer "
                                "in time; start the episode on a fresh instance",
                                **context)
        headers = self._headers()
        try:
            with deadline_scope(timeout_s, what=f"manager {what}", **context):
                timeout = (min(self.connect_timeout_s, timeout_s), timeout_s)
                response = self._pool.get().request(method, url, json=json, timeout=timeout,
                                                    headers=headers)
                try:
                    status, content = response.status_code, response.content
                finally:
                    response.close()
        except DeadlineExceeded as exc:
            if exc.abandoned:
                raise  # given up on purpose (a cancelled run, exit): say so, not "late"
            raise late from exc
        except requests.Timeout as exc:
            raise late from exc
        except requests.ConnectionError as exc:
            raise InstanceGoneError(f"manager {what} could not connect: {exc}",
                                    **context) from exc
        if status == 404 and not headers and self._refreshed_token():
            # The gate turned the request away before it ran; with a token now, send it
            # once more.
            return self._request(method, path, timeout_s=timeout_s, what=what, json=json)
        text = content.decode("utf-8", "replace")
        if status == 404 and not headers:
            # Without a runner token, a gated router's 404 hides a live instance.
            raise FleetEnvError(
                f"manager {what} answered 404 and no X-Runner-Token was sent: the instance "
                "may be gone, or this Fleet gates instance routes on a runner token",
                hint="set RUNNER_AUTH_TOKEN, or use an API key that may read "
                "/v1/runner-auth/token on this Fleet", **context)
        if status in (404, 410):
            raise InstanceGoneError(
                f"manager {what}: instance not found ({status})", **context)
        # Server text is scrubbed before it is cut (half a key would not be found later).
        if status >= 400:
            raise FleetEnvError(f"manager {what} answered {status}: "
                                f"{scrub_secrets(text)[:200]}", **context)
        try:
            return _json.loads(content)
        except ValueError as exc:
            raise FleetEnvError(f"manager {what} answered non-JSON: "
                                f"{scrub_secrets(text)[:200]}", **context) from exc
