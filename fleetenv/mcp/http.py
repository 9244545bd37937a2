"""HTTP clients for MCP traffic (httpx2), used on the loop thread only, and the pacing of
session setups.

Each MCP connection gets its own ``httpx2.AsyncClient`` and small unbounded pool, and all
of them share ONE SSL context per runtime generation, built off the loop; why (measured):
docs/mcp.md ("HTTP clients"). Each client's transport is `fleetenv.mcp.keepalive`'s;
proxies from the environment are honoured (``trust_env``, httpx2's default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from fleetenv import runtime
from fleetenv.core.errors import ConfigurationError, ConnectError
from fleetenv.core.retry import Deadline
from fleetenv.mcp import failures, keepalive
from fleetenv.mcp.keepalive import keep_alive_transport

if TYPE_CHECKING:
    import ssl

    import anyio
    import httpx2

__all__ = ["connection_client", "handshake_limit", "handshake_slot", "set_handshake_limit"]

#: Environment variable that sets how many MCP session setups may run at once.
HANDSHAKES_ENV = "FLEETENV_MCP_MAX_HANDSHAKES"

_ssl_context: ssl.SSLContext | None = None
_ssl_generation = -1
_ssl_building: tuple[int, asyncio.Future[ssl.SSLContext]] | None = None

# The transport's own bounds, for its background work that no operation waits for any
# more (a request body still being written, a reply nobody reads): every request a
# caller waits for is bounded by its operation's deadline, on the loop.
_WRITE_TIMEOUT_S = 30.0
_POOL_TIMEOUT_S = 30.0
_KEEPALIVE_PER_CONNECTION = 8
# An error body longer than this is not read to classify it (real ones are tiny).
_MAX_ERROR_BODY = 64 * 1024
# Every tools/call carries a fresh id under this `_meta` key, so a server (our local one in
# particular) can prove that no logical call was executed twice.
CALL_ID_META_KEY = "fleetenv/call_id"


def _build_ssl_context() -> ssl.SSLContext:
    import httpx2

    return httpx2.create_ssl_context()


async def _shared_ssl_context() -> ssl.SSLContext:
    global _ssl_context, _ssl_generation, _ssl_building
    generation = runtime.current().generation
    if _ssl_context is not None and _ssl_generation == generation:
        return _ssl_context
    if _ssl_building is None or _ssl_building[0] != generation:
        # Loading the CA bundle takes tens of ms of CPU: do it on the runtime's pool so
        # the loop keeps serving other sessions meanwhile, once: every session that
        # starts before it is done awaits the same build.
        _ssl_building = (generation, asyncio.ensure_future(
            runtime.current().run_blocking(_build_ssl_context)))
    building = _ssl_building
    try:
        built = await asyncio.shield(building[1])  # a cancelled waiter leaves it to others
    except Exception:
        if _ssl_building is building:
            _ssl_building = None  # the next session tries again
        raise
    _ssl_context, _ssl_generation = built, generation
    return built


async def connection_client(
    *,
    headers: Mapping[str, str] | None,
    connect_timeout_s: float,
    read_timeout_s: float,
    on_response: list[int] | None = None,
    watch: failures.SessionWatch | None = None,
    max_reply_bytes: int | None = None,
) -> httpx2.AsyncClient:
    """A client with its own pool for one MCP connection. Loop thread only.

    ``read_timeout_s`` bounds the silence on one HTTP response (an SSE tool reply or the
    session's GET stream). ``on_response``, if given, collects the status code of every
    error response, so a failed connect can tell "no MCP here" (404/405) from a broken
    server. ``watch``, if given, learns of every answer saying the server no longer
    knows the session, and which tool call it turned away (see
    `failures.session_gone_answer`): the ``mcp`` client keeps neither the status nor the
    body. ``max_reply_bytes``, if given, caps every POST or DELETE reply but an SSE stream
    (`fleetenv.mcp.keepalive`), whose events ``mcp`` caps one by one. The caller closes
    the client (which closes its pool).
    """
    import httpx2

    context = await _shared_ssl_context()

    async def _record(response: httpx2.Response) -> None:
        status = response.status_code
        if on_response is not None and status >= 400:
            on_response.append(status)
        if (watch is not None and status in failures.SESSION_GONE_STATUSES
                and "mcp-session-id" in response.request.headers):
            reason = failures.session_gone_answer(status, await _error_body(response))
            if reason is not None:
                watch.record(reason, _call_id(response.request))

    return httpx2.AsyncClient(
        headers=dict(headers) if headers else None,
        timeout=httpx2.Timeout(
            connect=connect_timeout_s,
            read=read_timeout_s,
            write=_WRITE_TIMEOUT_S,
            pool=_POOL_TIMEOUT_S,
        ),
        transport=keep_alive_transport(httpx2.AsyncHTTPTransport(
            verify=context,
            limits=httpx2.Limits(max_connections=None,
                                 max_keepalive_connections=_KEEPALIVE_PER_CONNECTION,
                                 keepalive_expiry=keepalive.IDLE_S),
        ), limit=max_reply_bytes),
        event_hooks={"response": [_record]},
    )


async def _error_body(response: httpx2.Response) -> str:
    """The (small) body of an error response, read once: the ``mcp`` client reads the
    same cached bytes afterwards. A large or unreadable body counts as empty."""
    import httpx2

    length = response.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > _MAX_ERROR_BODY):
        return ""
    try:
        raw = await response.aread()
    except (httpx2.HTTPError, httpx2.StreamError):  # broken, or over the reply limit
        return ""
    return raw[:_MAX_ERROR_BODY].decode("utf-8", errors="replace")


def _call_id(request: httpx2.Request) -> str | None:
    """fleetenv's call id of a ``tools/call`` request (``None`` for anything else)."""
    import httpx2

    try:
        message: Any = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError):
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    value = meta.get(CALL_ID_META_KEY) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------------- handshake pacing
#
# Setups queue for a process-wide number of slots: 64-256 episodes handshaking at once on
# a small machine would all hit their connect timeouts (docs/mcp.md, "What is retried").


def _default_handshakes() -> int:
    raw = os.environ.get(HANDSHAKES_ENV)
    if raw is None:
        return max(4, min(32, 8 * (os.cpu_count() or 2)))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(
            f"{HANDSHAKES_ENV}={raw!r} is not a positive whole number",
            field=HANDSHAKES_ENV, hint="e.g. 16; it caps MCP session setups in flight at once",
        )
    return value


_handshakes: int | None = None
_limiter: anyio.CapacityLimiter | None = None
_limiter_generation = -1


def handshake_limit() -> int:
    """How many MCP session setups may run at once in this process."""
    global _handshakes
    if _handshakes is None:
        _handshakes = _default_handshakes()
    return _handshakes


def set_handshake_limit(limit: int) -> None:
    """Allow ``limit`` simultaneous MCP session setups (default: 8 per CPU, 4 to 32, or
    ``$FLEETENV_MCP_MAX_HANDSHAKES``). Takes effect for setups that start afterwards."""
    global _handshakes
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"handshake limit must be a positive int, not {limit!r}",
                                 hint="e.g. set_handshake_limit(16)")
    _handshakes = limit


@contextlib.asynccontextmanager
async def handshake_slot(endpoint: str, deadline: Deadline) -> AsyncIterator[None]:
    """Hold one session-setup slot (loop thread only). Raises `ConnectError` naming
    ``endpoint`` when ``deadline`` ends before a slot is free."""
    import anyio

    global _limiter, _limiter_generation
    limit = handshake_limit()
    if _limiter is None or _limiter_generation != runtime.current().generation:
        _limiter, _limiter_generation = anyio.CapacityLimiter(limit), runtime.current().generation
    elif _limiter.total_tokens != limit:
        _limiter.total_tokens = limit
    limiter = _limiter
    remaining = deadline.remaining()
    with anyio.move_on_after(remaining if remaining is not None else float("inf")) as scope:
        await limiter.acquire()
    if not scope.cancelled_caught:
        try:
            yield
        finally:
            limiter.release()
        return
    raise ConnectError(
        f"no MCP session setup could start within the budget: {limiter.borrowed_tokens} "
        f"setups were in flight and {limiter.statistics().tasks_waiting} waiting "
        f"(limit {limit})",
        endpoint=endpoint, retryable=True,
        hint=f"open fewer environments at once, raise the budget, or raise {HANDSHAKES_ENV}",
    )
