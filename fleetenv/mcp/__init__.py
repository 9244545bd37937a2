"""MCP: persistent connections, tool routing, tool schemas, typed tool results.

Importing this package is cheap: ``mcp`` and ``httpx2`` are imported when a session is
first opened.
"""

from fleetenv.core.tool_results import (
    DEFAULT_MAX_TEXT_CHARS,
    AudioBlock,
    ContentAnnotations,
    ContentBlock,
    ImageBlock,
    ResourceBlock,
    ResourceLinkBlock,
    TextBlock,
    ToolResult,
)
from fleetenv.mcp.connection import CALL_ID_META_KEY, MCPConnection
from fleetenv.mcp.http import set_handshake_limit
from fleetenv.mcp.notifications import (
    Notification,
    NotificationCallback,
    ServerLogMessage,
    ToolProgressUpdate,
    ToolsListChanged,
)
from fleetenv.mcp.resources import Resource, ResourceError, ResourceTemplate
from fleetenv.mcp.router import MODALITIES, Endpoint, ToolRouter, endpoints_for
from fleetenv.mcp.schema import to_openai_parameters
from fleetenv.mcp.tools import Tool, ToolHints

__all__ = [
    "CALL_ID_META_KEY",
    "DEFAULT_MAX_TEXT_CHARS",
    "MODALITIES",
    "AudioBlock",
    "ContentAnnotations",
    "ContentBlock",
    "Endpoint",
    "ImageBlock",
    "MCPConnection",
    "Notification",
    "NotificationCallback",
    "Resource",
    "ResourceBlock",
    "ResourceError",
    "ResourceLinkBlock",
    "ResourceTemplate",
    "ServerLogMessage",
    "TextBlock",
    "Tool",
    "ToolHints",
    "ToolProgressUpdate",
    "ToolResult",
    "ToolRouter",
    "ToolsListChanged",
    "endpoints_for",
    "set_handshake_limit",
    "to_openai_parameters",
]
