"""What an MCP failure means: never sent, may have run, session lost, or cannot connect.

The ``mcp`` client reports transport trouble as JSON-RPC error codes, anyio stream
errors, httpx2 errors and exception groups around them; each is turned here, once, on
types and codes, into one of those four answers, because each allows a different action
(docs/mcp.md, "What is retried"): only a request that was provably never sent
(`NeverSent`) may be sent again; read-only work is repeated after a lost session
(`session_lost`); a call that may have run (`ToolCallMayHaveRunError`) never is.

``mcp``, ``httpx2`` and ``anyio`` are imported inside the functions: ``import fleetenv``
must stay cheap.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import NoReturn

from fleetenv import runtime
from fleetenv.core.errors import (
    ConnectError,
    DeadlineExceeded,
    FleetEnvError,
    ToolCallMayHaveRunError,
    ToolError,
)
from fleetenv.core.tool_results import ToolResult

__all__ = [
    "RETRYABLE_HTTP_STATUSES",
    "SESSION_GONE_STATUSES",
    "NeverSent",
    "QuietEndedSessions",
    "SessionGone",
    "SessionWatch",
    "call_failed",
    "connect_error",
    "gave_up",
    "listing_failed",
    "over_limit",
    "session_gone_answer",
    "session_lost",
    "too_large",
]

# JSON-RPC error codes the MCP client uses for transport conditions (mcp_types.jsonrpc).
PARSE_ERROR = -32700
CONNECTION_CLOSED = -32000
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


class SessionGone(Exception):
    """A read-only request failed because the session is gone: open a new one, ask again."""


# ---------------------------------------------------------------------- session gone

#: HTTP statuses with which servers answer a request whose session id they do not know.
#: The MCP spec says 404; gateways in front of a deleted instance say 404 or 410; the
#: official reference server (``@modelcontextprotocol/server-everything``) says 400.
SESSION_GONE_STATUSES = frozenset({400, 404, 410})
# A 400 is also the answer to a malformed request, so it only counts when its body is
# about the session. Bodies seen: server-everything "Bad Request: No valid session ID
# provided"; the TypeScript SDK's transport "Bad Request: Mcp-Session-Id header is
# required" / "Session not found"; Python mcp "Session not found".
_LOST_SESSION_400 = re.compile(
    r"session.{0,40}(not found|no valid|invalid|unknown|expired|terminated|does not exist|"
    r"required|missing)|(no valid|invalid|unknown|expired|missing).{0,20}session",
    re.IGNORECASE | re.DOTALL,
)
_BODY_SHOWN = 160


def session_gone_answer(status: int, body: str) -> str | None:
    """Why an HTTP ``status`` + ``body`` answer to a request that CARRIED a session id
    means the server no longer knows that session (``None``: it does not mean that).

    Status and body both count, because the ``mcp`` client reduces most of these
    answers to one code: server-everything's 400 has no JSON-RPC id, so the client only
    says -32603 "Server returned an error response", exactly as for a gateway's 502;
    the TypeScript SDK's 404 comes as -32001, the code of a client-side timeout.

    * 404 (any body): the spec's answer for an unknown or terminated session, and a
      gateway's for an instance that is gone.
    * 410 (any body): a gateway's answer for an instance that was deleted.
    * 400 only when the body is about the session (see ``_LOST_SESSION_400``).

    Every one of them is given before the request is dispatched to a tool: servers look
    the session up first, and a gateway that answers never forwarded the request.
    """
    text = " ".join(body.split())
    shown = text if len(text) <= _BODY_SHOWN else text[:_BODY_SHOWN] + "..."
    if status in (404, 410) or (status == 400 and _LOST_SESSION_400.search(text)):
        return f"HTTP {status}: {shown}" if shown else f"HTTP {status}"
    return None


@dataclass(eq=False)
class SessionWatch:
    """What the HTTP layer saw of one session: the first answer saying the server no
    longer knows it (``gone``), and which tool calls were turned away that way.

    The HTTP client's response hook fills it in (``fleetenv.mcp.http``) before the
    ``mcp`` client turns the answer into an error, so the code that sees the error can
    decide per call: a call listed here provably did not run.
    """

    gone: str | None = None
    _turned_away: dict[str, str] = field(default_factory=dict, repr=False)

    def record(self, reason: str, call_id: str | None) -> None:
        """The server answered ``reason`` to a request (a tool call if ``call_id``)."""
        if self.gone is None:
            self.gone = reason
        if call_id is not None:
            self._turned_away[call_id] = reason

    def turned_away(self, call_id: str | None) -> str | None:
        """Why the call ``call_id`` was refused before it ran (``None``: it was not)."""
        return None if call_id is None else self._turned_away.get(call_id)


# ---------------------------------------------------------------------- too large

# How the transport says a JSON reply is over the message limit (`too_large`); mcp passes
# it on inside its parse error for the request, where `over_limit` finds it again.
_OVER_LIMIT = re.compile(r"the server's reply is over the [0-9]+ (MiB|KiB|bytes) limit of "
                         r"one MCP message[^\n]*")


def too_large(limit: int, announced: int | None) -> str:
    """What fleetenv's transport says of a JSON reply over ``limit`` bytes (``announced``:
    its Content-Length, if it had one)."""
    size = f" (it announced {announced} bytes)" if announced is not None else ""
    return f"the server's reply is over the {_size(limit)} limit of one MCP message{size}"


def over_limit(exc: BaseException) -> str | None:
    """`too_large`'s words when ``exc`` is mcp's report of a reply the transport cut at
    the message limit (``None``: it is not)."""
    from mcp import MCPError

    if not isinstance(exc, MCPError) or exc.code != PARSE_ERROR:
        return None
    found = _OVER_LIMIT.search(exc.message)
    return found.group(0) if found is not None else None


def _size(size: int) -> str:
    for unit, name in ((1024 * 1024, "MiB"), (1024, "KiB")):
        if size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} bytes"


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
    over = over_limit(leaf)
    if over is not None:
        return ConnectError(f"opening the MCP session failed: {over}", endpoint=endpoint,
                            retryable=False, hint="its tool list is too large for one MCP "
                            "message; check the server")
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
    """The client's own words for HTTP 404 on a request that carried a session id (the
    status-and-body check in `SessionWatch` also covers servers that answer otherwise)."""
    from mcp import MCPError

    return (
        isinstance(leaf, MCPError)
        and leaf.code == INVALID_REQUEST
        and leaf.message in SESSION_GONE_MESSAGES
    )


def listing_failed(exc: Exception, *, what: str, endpoint: str, timeout_s: float) -> NoReturn:
    """Raise the typed error for a read-only request (``what``) that failed with ``exc``
    (``TimeoutError``: its deadline passed) on a session that is still there: never a
    bare ``MCPError``."""
    from mcp import MCPError

    if isinstance(exc, TimeoutError):
        raise DeadlineExceeded(
            f"{what} got no answer within {timeout_s:g} s", endpoint=endpoint,
            hint="the server may be overloaded; retry later or raise the read timeout",
        ) from exc
    if isinstance(exc, MCPError):
        detail = over_limit(exc) or f"the server answered MCP error {exc.code}: {exc.message}"
        raise ToolError(
            f"{what} failed: {detail}",
            endpoint=endpoint, retryable=exc.code in (CONNECTION_CLOSED, INTERNAL_ERROR),
            hint="check that the environment instance is healthy",
        ) from exc
    raise exc


# ---------------------------------------------------------------------- one tool call


def call_failed(exc: Exception, *, tool: str, endpoint: str, timeout_s: float) -> ToolResult:
    """What a ``tools/call`` that raised ``exc`` means.

    Returns an error `ToolResult` when the server answered (the agent sees it like any
    tool error). Raises `NeverSent` when the request provably did not reach the tool,
    `DeadlineExceeded` when no answer came before its deadline (``TimeoutError``; the
    session survives), and `ToolCallMayHaveRunError` when the request may have run.
    Anything else is re-raised.
    """
    import anyio
    from mcp import MCPError

    if isinstance(exc, TimeoutError):
        raise DeadlineExceeded(
            f"tool call got no answer within {timeout_s:g} s",
            tool=tool,
            endpoint=endpoint,
            hint="the tool may still have run: check the environment state before "
            "calling it again, or pass a larger timeout_s",
        ) from exc
    if isinstance(exc, MCPError):
        code, message = exc.code, exc.message
        over = over_limit(exc)
        if over is not None:  # the tool ran; its answer was not read
            return ToolResult.error(f"the result of {tool!r} was not read: {over}. "
                                    "Ask the tool for less (a narrower query, one page).")
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
    """Drops mcp's warning when the DELETE that ends a session answers 404, 410 or 400.

    That answer means the server already ended the session (the instance was deleted or
    expired, or the server forgot it: server-everything says 400 for an unknown session,
    see `session_gone_answer`): the outcome the DELETE asked for. Closing the
    sessions of a finished episode hits it routinely; other failures still warn.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(f"Session termination failed: {status}")
                       for status in SESSION_GONE_STATUSES)

    @classmethod
    def install(cls, target: logging.Logger) -> None:
        """Add the filter to ``target`` once."""
        if not any(isinstance(f, cls) for f in target.filters):
            target.addFilter(cls())
