"""Meta-tools: find tools on demand instead of listing them all in the prompt.

``search_tools``, ``get_tool_schema`` and ``list_service_tools``, answered by fleetenv
from an index of the env's tools, named as OpenEnv's ``fleet_env`` meta-tools
(docs/context-tools.md, "Meta-tools"). A tool's *service* is its server's
``_meta["service"]``, else the part of its name before ``__`` or ``.``, else every word of
its name (a service matches a word that starts with it: ``ticket`` finds ``get_ticket``).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fleetenv.mcp.tools import Tool

__all__ = ["META_TOOLS", "META_TOOL_NAMES", "MetaTools", "ToolIndex", "meta_tool_specs"]

_SEARCH_LIMIT = 25
_DESCRIPTION_CHARS = 160
_ENUM_VALUES = 6
_ENUM_CHARS = 80
_WORD = re.compile(r"[a-z0-9]+")


def _function(name: str, description: str, parameter: str,
              about: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {parameter: {"type": "string", "minLength": 1,
                                                  "description": about}},
                       "required": [parameter]}}}


#: The three meta-tools in OpenAI function format.
META_TOOLS: list[dict[str, Any]] = [
    _function("search_tools", "Search the available tools by keywords; returns matching "
              "tool names with their parameters. Call get_tool_schema for full details.",
              "query", "Keywords describing what you want to do"),
    _function("get_tool_schema", "Get the full definition (parameters, types, "
              "descriptions) of one tool by exact name", "name", "The tool's exact name"),
    _function("list_service_tools", "List every tool of one service (e.g. a resource or "
              "app name)", "service", "Service name, e.g. 'ticket'"),
]

META_TOOL_NAMES: frozenset[str] = frozenset(t["function"]["name"] for t in META_TOOLS)


def meta_tool_specs() -> list[Tool]:
    """The meta-tools as ``Tool`` objects (endpoint ``"local"``), so their arguments are
    checked like any MCP tool's."""
    return [Tool(name=t["function"]["name"], description=t["function"]["description"],
                 input_schema=copy.deepcopy(t["function"]["parameters"]), endpoint="local")
            for t in META_TOOLS]


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def service_words(tool: Tool) -> tuple[str, ...]:
    """The services ``tool`` belongs to (see the module docstring)."""
    declared = (tool.meta or {}).get("service")
    if isinstance(declared, str) and declared:
        return (declared.lower(),)
    for separator in ("__", "."):
        if separator in tool.name:
            return (tool.name.split(separator, 1)[0].lower(),)
    return tuple(_words(tool.name))


def signature(tool: Tool) -> str:
    """``name(a: string, b?: integer, c?: "x"|"y")``: one line per tool for a listing."""
    schema = tool.input_schema if isinstance(tool.input_schema, Mapping) else {}
    properties = schema.get("properties")
    required = set(schema.get("required") or ())
    params = []
    if isinstance(properties, Mapping):
        for name, prop in properties.items():
            params.append(f"{name}{'' if name in required else '?'}: {_type_of(prop)}")
    return f"{tool.name}({', '.join(params)})"


def _type_of(prop: Any) -> str:
    if not isinstance(prop, Mapping):
        return "any"
    enum = prop.get("enum")
    if isinstance(enum, list) and 0 < len(enum) <= _ENUM_VALUES:
        inline = "|".join(json.dumps(v, ensure_ascii=False) for v in enum)
        if len(inline) <= _ENUM_CHARS:
            return inline
    kind = prop.get("type")
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    if isinstance(kind, str):
        return kind
    for key in ("anyOf", "oneOf"):
        options = prop.get(key)
        if isinstance(options, list):
            return "|".join(_type_of(o) for o in options)
    return "any"


class ToolIndex:
    """The env's tools, searchable by keyword and by service."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self._services = {tool.name: service_words(tool) for tool in tools}

    def summary(self, tool: Tool) -> dict[str, str]:
        description = " ".join(tool.description.split())
        if len(description) > _DESCRIPTION_CHARS:
            description = description[:_DESCRIPTION_CHARS - 3] + "..."
        return {"name": tool.name, "signature": signature(tool), "description": description}

    def search(self, query: str, limit: int = _SEARCH_LIMIT) -> list[dict[str, str]]:
        """Tools ranked by how many query words their name (3 points each) and
        description (1 point each) contain; ties keep the listing order."""
        words = set(_words(query))
        scored = []
        for position, tool in enumerate(self.tools.values()):
            name_words = _words(tool.name)
            text = tool.description.lower()
            score = sum(3 for w in words if any(n.startswith(w) or w.startswith(n)
                                                 for n in name_words))
            score += sum(1 for w in words if w in text)
            if score:
                scored.append((-score, position, tool))
        scored.sort(key=lambda item: (item[0], item[1]))
        return [self.summary(tool) for _, _, tool in scored[:limit]]

    def services(self) -> list[str]:
        return sorted({word for words in self._services.values() for word in words})

    def list_service(self, service: str) -> list[dict[str, str]]:
        wanted = service.strip().lower()
        return [self.summary(tool) for tool in self.tools.values()
                if any(word.startswith(wanted) for word in self._services[tool.name])]

    def get_schema(self, name: str) -> dict[str, Any] | None:
        tool = self.tools.get(name)
        return None if tool is None else tool.openai()

    def close_names(self, name: str) -> list[str]:
        return difflib.get_close_matches(name, list(self.tools), n=3, cutoff=0.5)


class MetaTools:
    """Answers the meta-tools from a :class:`ToolIndex` (JSON text for the agent)."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.index = ToolIndex(tools)

    @staticmethod
    def is_meta_tool(name: str) -> bool:
        return name in META_TOOL_NAMES

    def execute(self, name: str, arguments: Mapping[str, Any]) -> str:
        index = self.index
        if name == "search_tools":
            query = str(arguments.get("query") or "")
            found = index.search(query)
            if not found:
                return json.dumps({"tools": [], "note": f"no tool matches {query!r}; try "
                                   f"other words or one of the services: "
                                   f"{', '.join(index.services())}"})
            return json.dumps({"tools": found}, ensure_ascii=False)
        if name == "get_tool_schema":
            wanted = str(arguments.get("name") or "")
            schema = index.get_schema(wanted)
            if schema is None:
                close = index.close_names(wanted)
                hint = f" Did you mean {', '.join(close)}?" if close else \
                    " Use search_tools to find tools."
                return json.dumps({"error": f"no tool named {wanted!r}.{hint}"})
            return json.dumps(schema, ensure_ascii=False)
        if name == "list_service_tools":
            service = str(arguments.get("service") or "")
            tools = index.list_service(service)
            if not tools:
                return json.dumps({"tools": [], "error": f"no service {service!r}; "
                                   f"services: {', '.join(index.services())}"})
            return json.dumps({"service": service, "tools": tools}, ensure_ascii=False)
        return json.dumps({"error": f"Unknown meta tool: {name}"})
