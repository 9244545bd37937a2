"""What an MCP server tells us unasked: tool list changes, log messages, tool progress.

`MCPConnection` turns each notification into one small frozen value below and hands it
to its ``on_notification`` callback (docs/mcp.md); this layer knows no events, episodes
or rollout ids. The callback runs on the fleetenv loop thread, in the session's receive
path: an exception it raises is logged and dropped, never raised into the session.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Notification",
    "NotificationCallback",
    "ServerLogMessage",
    "ToolProgressUpdate",
    "ToolsListChanged",
    "deliver",
    "from_server",
    "progress_relay",
]

logger = logging.getLogger("fleetenv.mcp")


@dataclass(frozen=True)
class ToolsListChanged:
    """The server at ``endpoint`` says its tool list changed (list again to see it)."""

    endpoint: str


@dataclass(frozen=True)
class ServerLogMessage:
    """A log message the server sent (``notifications/message``).

    ``level`` is the syslog-style MCP level (``debug`` ... ``emergency``), ``logger``
    the server's logger name if it gave one, ``data`` any JSON value (often a string).
    """

    endpoint: str
    level: str
    logger: str | None
    data: Any


@dataclass(frozen=True)
class ToolProgressUpdate:
    """Progress of a running call of ``tool`` (``notifications/progress``).

    ``progress`` grows with every update; ``total`` is what it counts up to, if known.
    """

    endpoint: str
    tool: str
    progress: float
    total: float | None
    message: str | None


Notification = ToolsListChanged | ServerLogMessage | ToolProgressUpdate
#: The callback type of ``MCPConnection(on_notification=...)``.
NotificationCallback = Callable[[Notification], None]


def deliver(callback: NotificationCallback, notification: Notification) -> None:
    """Call ``callback``; an exception it raises is logged, never propagated."""
    try:
        callback(notification)
    except Exception:
        logger.exception("the on_notification callback raised on %r; ignored", notification)


def from_server(message: Any, endpoint: str) -> Notification | None:
    """The `Notification` for an incoming ``mcp.types`` server notification, or ``None``
    for kinds this layer does not surface (resource updates, cancellations, ...)."""
    import mcp.types as types

    if isinstance(message, types.ToolListChangedNotification):
        return ToolsListChanged(endpoint)
    if isinstance(message, types.LoggingMessageNotification):
        params = message.params
        return ServerLogMessage(endpoint, str(params.level), params.logger, params.data)
    return None


def progress_relay(
    callback: NotificationCallback, endpoint: str, tool: str
) -> Callable[[float, float | None, str | None], Awaitable[None]]:
    """A ``progress_callback`` for ``ClientSession.call_tool`` reporting on ``tool``."""

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        deliver(callback, ToolProgressUpdate(endpoint, tool, progress, total, message))

    return on_progress
