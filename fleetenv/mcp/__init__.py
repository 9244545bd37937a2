"""MCP: persistent connections, tool routing, tool schemas, typed tool results."""
