"""Building fleet-python's synchronous client, the one way fleetenv talks to Fleet's
control plane.

We always use the *sync* ``fleet.Fleet`` (never the async ``fleet.Task`` from sync code:
it runs ``asyncio.run`` per call). We pass our own ``httpx.Client`` so we can close its
sockets (``Fleet`` has no close) and bound every request, and we turn off fleet-python's
transport retries: they retry 404s, re-POST creates and cost ~3.5 s per failure, while
our provisioning retries with typed classification inside one budget.

Every request has an overall deadline, not only per-read timeouts: the client's
transport is :class:`~fleetenv.fleet.deadlines.DeadlineTransport`, and callers wrap each
operation (create, poll, delete, verify) in a ``deadline_scope`` with its own budget.
``timeout_s`` is the bound of a request made outside any scope.

Loading the CA bundle into an SSL context costs tens of milliseconds of CPU, so every
client of the process shares one context (it is immutable configuration, not state).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import ssl

    import fleet
    import httpx

_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def _shared_ssl_context() -> ssl.SSLContext:
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            import httpx

            _ssl_context = httpx.create_ssl_context()
        return _ssl_context


class FleetClient:
    """A ``fleet.Fleet`` plus the HTTP client it owns. Thread-safe (httpx.Client is)."""

    def __init__(self, api_key: str, base_url: str, *, timeout_s: float = 60.0,
                 connect_timeout_s: float = 10.0) -> None:
        import fleet
        import httpx

        from fleetenv.fleet.deadlines import DeadlineTransport

        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http: httpx.Client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=DeadlineTransport(
                verify=_shared_ssl_context(),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64)),
        )
        self.sdk: fleet.Fleet = fleet.Fleet(
            api_key=api_key, base_url=self.base_url, httpx_client=self._http, max_retries=0,
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"FleetClient(base_url={self.base_url!r})"
