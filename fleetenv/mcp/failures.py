"""What an MCP failure means: never sent, may have run, session lost, or cannot connect.

The ``mcp`` client reports transport trouble as JSON-RPC error codes, anyio stream
errors, httpx2 errors and exception groups around them. Each of those has to be turned
into one of four answers, because each answer allows a different action:

* **cannot connect** (`connect_error`): opening a session failed, so nothing with an
  effect was sent. The `ConnectError` names the endpoint and says, in ``retryable``,
  whether a server that is still starting could explain it (refused, 502/503/504, a
  handshake cut short) or whether trying again cannot help (404/405 "no MCP here",
  401/403 "bad credentials").
* **never sent** (`NeverSent`): a request provably did not reach a tool (the write
  stream was closed, or the server answered HTTP 404 "session not found", which it
  checks before dispatching anything). Only such a call may be sent again.
* **may have run** (`ToolCallMayHaveRunError`): the request may have reached the tool
  (the connection dropped mid-call, a gateway answered an HTTP error). It is never
  replayed: a second booking is worse than a failed step.
* **session lost** (`session_lost`): the session is useless now; the next operation
  opens a new one, and read-only work (listing tools) may simply be repeated.

These decisions are made here once, on types and codes, so that the connection code
reads as the operations it performs and every retry in fleetenv (`RetryPolicy`) can
trust ``err.retryable`` instead of matching messages again.

``mcp``, ``httpx2`` and ``anyio`` are imported inside the functions: they are only
called once a session exists, and ``import fleetenv`` must stay cheap.
"""

from __future__ import annotations

import logging

from fleetenv import runtime
from fleetenv.core.errors import (
    ConnectError,
    DeadlineExceeded,
    FleetEnvError,
    ToolCallMayHaveRunError,
)
from fleetenv.mcp.results import ToolResult

__all__ = [
    "RETRYABLE_HTTP_STATUSES",
    "NeverSent",
    "QuietEndedSessions",
    "call_failed",
    "connect_error",
    "gave_up",
    "session_lost",
]

# JSON-RPC error codes the MCP client uses for transport conditions (mcp_types.jsonrpc).
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
# Messages the client gives an HTTP 404 on a request that carried a session id.
SESSION_GONE_MESSAGES = frozenset({"Session not found", "Session terminated"})
# The client's stand-in for a non-JSON HTTP error response (e.g. a 502 from a gateway).
HTTP_ERROR_MESSAGE = "Server returned an error response"

#: HTTP answers to session setup that a server (or its gateway) gives while it starts or
#: is briefly overloaded. Any other error status will not change by asking again.
RETRYABLE_HTTP_STATUSES = frozenset({408, 429, 502, 503, 504})


class NeverSent(Exception):
    """The request provably did not reach the tool, so it may be sent again."""


# ---------------------------------------------------------------------- cannot connect


def connect_error(
    exc: BaseException, *, endpoint: str, statuses: list[int], timeout_s: float
) -> BaseException:
    """Turn a failure to open a session into a `ConnectError` naming the endpoint.

    ``statuses`` are the HTTP error statuses seen while opening (the first one is the
    server's answer to the handshake). Anything that is not a connection problem (a
    bug) is returned as itself, unwrapped from its exception group, to surface as is.
    """
    import anyio
    import httpx2
    from mcp import MCPError

    leaf = runtime.unwrap_group(exc)
    status = statuses[0] if statuses else None
    if isinstance(leaf, TimeoutError):
        return ConnectError(
            f"no MCP session within {timeout_s:g} s",
            endpoint=endpoint,
            hint="the environment may still be starting or overloaded; retry later or "
            "raise connect_timeout_s",
        )
    if _is_session_gone(leaf):
        # The handshake worked, then the server forgot the new session (it restarted).
        # No http_status here: a 404 in the context would read as "no MCP server".
        return ConnectError(
            f"the MCP server forgot the session while it was being set up ({leaf})",
            endpoint=endpoint,
            hint="the environment may be restarting; retry later",
        )
    if status in (404, 405):
        return ConnectError(
            f"no MCP server at this URL (HTTP {status})",
            endpoint=endpoint,
            http_status=status,
            retryable=False,
            hint="check the URL path (e.g. '/mcp' vs '/api/v1/mcp')",
        )
    if status in (401, 403):
        return ConnectError(
            f"the MCP server refused the credentials (HTTP {status})",
            endpoint=endpoint,
            http_status=status,
            retryable=False,
            hint="check the API key or token configured for this endpoint",
        )
    # From here on, an HTTP error status decides; without one, the connection itself
    # failed (refused, reset, closed early), which a starting server explains.
    transient = status is None or status in RETRYABLE_HTTP_STATUSES
    if isinstance(leaf, httpx2.HTTPError | OSError):
        return ConnectError(
            f"cannot connect to the MCP server: {type(leaf).__name__}: {leaf}",
            endpoint=endpoint,
            http_status=status,
            retryable=transient,
            hint="check that the environment instance is running and the URL is right",
        )
    if isinstance(leaf, MCPError):
        # Without an HTTP status the server itself answered the handshake with an error
        # (e.g. an unsupported protocol version): asking again gets the same answer,
        # unless the connection closed before any answer came.
        retryable = transient and (status is not None or leaf.code == CONNECTION_CLOSED)
        status_text = f"HTTP {status}, " if status is not None else ""
        return ConnectError(
            f"the MCP handshake failed ({status_text}error {leaf.code}: {leaf.message})",
            endpoint=endpoint,
            http_status=status,
            retryable=retryable,
            hint="the environment may still be starting; retry later"
            if retryable
            else "check that the URL is an MCP streamable-HTTP endpoint",
        )
    if isinstance(leaf, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        return ConnectError(
            f"the MCP connection closed during the handshake ({type(leaf).__name__})",
            endpoint=endpoint,
            http_status=status,
            retryable=transient,
            hint="check that the environment instance is running",
        )
    return leaf  # not a connection problem: a bug, let it surface as itself


def gave_up(doing: str, last: Exception, attempts: int, *, endpoint: str) -> ConnectError:
    """The error for ``doing`` when retries of ``last`` ran out (budget or attempts)."""
    if isinstance(last, FleetEnvError):
        detail, hint = last.message, last.hint
        status = last.context.get("http_status")
    else:
        detail, hint, status = f"{type(last).__name__}: {last}", None, None
    tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    return ConnectError(
        f"{doing} failed after {tries}: {detail}",
        endpoint=endpoint,
        http_status=status,
        hint=hint or "check that the environment instance is still running",
    )


# ---------------------------------------------------------------------- session lost


def session_lost(exc: BaseException) -> bool:
    """Does ``exc`` say the session is gone (so a read-only request may be repeated)?"""
    import anyio
    from mcp import MCPError

    leaf = runtime.unwrap_group(exc)
    if isinstance(leaf, MCPError):
        return leaf.code == CONNECTION_CLOSED or _is_session_gone(leaf)
    return isinstance(leaf, anyio.ClosedResourceError | anyio.BrokenResourceError)


def _is_session_gone(leaf: BaseException) -> bool:
    """HTTP 404 on a request that carried a session id: the server no longer knows it."""
    from mcp import MCPError

    return (
        isinstance(leaf, MCPError)
        and leaf.code == INVALID_REQUEST
        and leaf.message in SESSION_GONE_MESSAGES
    )


# ---------------------------------------------------------------------- one tool call


def call_failed(exc: Exception, *, tool: str, endpoint: str, timeout_s: float) -> ToolResult:
    """What a ``tools/call`` that raised ``exc`` means.

    Returns an error `ToolResult` when the server answered (the agent sees it like any
    tool error). Raises `NeverSent` when the request provably did not reach the tool,
    `DeadlineExceeded` when no answer came in time (the session survives), and
    `ToolCallMayHaveRunError` when the request may have run. Anything else is re-raised.
    """
    import anyio
    from mcp import MCPError

    if isinstance(exc, MCPError):
        code, message = exc.code, exc.message
        if code == REQUEST_TIMEOUT:
            raise DeadlineExceeded(
                f"tool call got no answer within {timeout_s:g} s",
                tool=tool,
                endpoint=endpoint,
                hint="the tool may still have run: check the environment state before "
                "calling it again, or pass a larger timeout_s",
            ) from exc
        if _is_session_gone(exc):
            # The server's session manager checks the session id before any request
            # reaches a handler, so the tool did not run.
            raise NeverSent(message) from exc
        if code == CONNECTION_CLOSED or (code == INTERNAL_ERROR and message == HTTP_ERROR_MESSAGE):
            raise ToolCallMayHaveRunError(
                f"tool call failed after it may have reached the server ({message})",
                tool=tool,
                endpoint=endpoint,
            ) from exc
        return ToolResult.error(f"MCP error {code} from the server: {message}")
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        # The session's write stream was already closed: the request never left.
        raise NeverSent(repr(exc)) from exc
    if isinstance(exc, RuntimeError):
        text = str(exc)
        if "structured content" in text or "Invalid schema for tool" in text:
            # The tool ran, but its output does not match its declared output schema.
            return ToolResult.error(f"tool {tool!r} returned invalid output: {text}")
    raise exc


# ---------------------------------------------------------------------- logging


class QuietEndedSessions(logging.Filter):
    """Drops mcp's warning when the DELETE that ends a session answers 404 or 410.

    That answer means the server already ended the session (the instance was deleted or
    expired, or the server forgot it): the outcome the DELETE asked for. Closing the
    sessions of a finished episode hits it routinely; other failures still warn.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not message.startswith(("Session termination failed: 404",
                                       "Session termination failed: 410"))

    @classmethod
    def install(cls, target: logging.Logger) -> None:
        """Add the filter to ``target`` once."""
        if not any(isinstance(f, cls) for f in target.filters):
            target.addFilter(cls())
