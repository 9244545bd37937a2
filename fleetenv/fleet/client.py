"""Building fleet-python's synchronous client, the one way fleetenv talks to Fleet's
control plane.

We always use the *sync* ``fleet.Fleet`` (never the async ``fleet.Task`` from sync code:
it runs ``asyncio.run`` per call). We pass our own ``httpx.Client`` so we can close its
sockets (``Fleet`` has no close) and bound every request, and we turn off fleet-python's
transport retries: they retry 404s, re-POST creates and cost ~3.5 s per failure, while
our provisioning retries with typed classification inside one budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import fleet
    import httpx


class FleetClient:
    """A ``fleet.Fleet`` plus the HTTP client it owns. Thread-safe (httpx.Client is)."""

    def __init__(self, api_key: str, base_url: str, *, timeout: float = 60.0,
                 connect_timeout: float = 10.0) -> None:
        import fleet
        import httpx

        self.base_url = base_url.rstrip("/")
        self._http: httpx.Client = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self.sdk: fleet.Fleet = fleet.Fleet(
            api_key=api_key, base_url=self.base_url, httpx_client=self._http, max_retries=0,
            timeout=timeout,
        )

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"FleetClient(base_url={self.base_url!r})"
