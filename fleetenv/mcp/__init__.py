"""MCP: persistent connections, tool routing, tool schemas, typed tool results.

Importing this package is cheap: ``mcp`` and ``httpx2`` are imported when a session is
first opened.
"""

from fleetenv.mcp.connection import CALL_ID_META_KEY, MCPConnection
from fleetenv.mcp.results import (
    DEFAULT_MAX_TEXT_CHARS,
    AudioBlock,
    ContentBlock,
    ImageBlock,
    ResourceBlock,
    ResourceLinkBlock,
    TextBlock,
    ToolResult,
)
from fleetenv.mcp.router import MODALITIES, Endpoint, ToolRouter, endpoints_for
from fleetenv.mcp.schema import to_openai_parameters
from fleetenv.mcp.tools import Tool, ToolHints

__all__ = [
    "CALL_ID_META_KEY",
    "DEFAULT_MAX_TEXT_CHARS",
    "MODALITIES",
    "AudioBlock",
    "ContentBlock",
    "Endpoint",
    "ImageBlock",
    "MCPConnection",
    "ResourceBlock",
    "ResourceLinkBlock",
    "TextBlock",
    "Tool",
    "ToolHints",
    "ToolResult",
    "ToolRouter",
    "endpoints_for",
    "to_openai_parameters",
]
