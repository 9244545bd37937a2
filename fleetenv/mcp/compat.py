"""Every difference between the ``mcp`` 2.x releases fleetenv supports, in one place.

fleetenv declares ``mcp>=2.0,<3`` (``verifiers`` 0.4 pins ``mcp==2.0.0``). The 2.x
releases share the API fleetenv uses but differ in a few signatures and behaviours; code
elsewhere asks this module instead of checking versions. Each difference is detected from
the installed package, by feature where it has a public marker (a keyword argument), else
by version: `MCPFeatures` lists them, docs/platforms.md says what each means on an older
release. Importing this module is cheap: ``mcp`` and ``httpx2`` load on the first call.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import re
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "MIN_MCP_VERSION",
    "MCPFeatures",
    "check_supported",
    "effective_message_limit",
    "features",
    "streamable_http_client",
]

#: The oldest ``mcp`` release fleetenv supports (the lower bound of ``mcp>=2.0,<3``).
MIN_MCP_VERSION = (2, 0, 0)

_HIDES_CRASH_TEXT_SINCE = (2, 1)
_BOOLEAN_SUBSCHEMAS_SINCE = (2, 1)
_DROPS_NEWER_FIELDS_SINCE = (2, 1)
_SAME_ORIGIN_REDIRECTS_SINCE = (2, 2)
_LOCAL_SCHEMA_REFS_SINCE = (2, 2)


@dataclass(frozen=True)
class MCPFeatures:
    """What the installed ``mcp`` can do, where 2.x releases differ.

    Every flag is ``True`` on the newest release. ``sse_event_limit`` is the largest
    message (one SSE event) the client accepts when fleetenv cannot set its own limit
    (``None``: no limit).
    """

    version: str
    #: ``streamable_http_client(max_sse_event_size=)`` exists (2.3): fleetenv sets its
    #: own message limit. Before, the ``httpx2`` default (``sse_event_limit``) applies.
    message_limit_settable: bool
    sse_event_limit: int | None
    #: ``MCPServer`` reports a crashing tool as ``Error executing tool <name>`` only (2.1).
    hides_crash_text: bool
    #: Tool input schemas may use boolean property schemas (``"x": true``) (2.1).
    boolean_subschemas: bool
    #: Result fields of a newer protocol revision than the negotiated one are dropped (2.1).
    drops_newer_fields: bool
    #: The client follows same-origin redirects itself (2.2). Before, it follows what its
    #: HTTP client follows, and fleetenv's follows none: a redirect is never followed
    #: to another origin with the endpoint's headers (which may carry credentials).
    same_origin_redirects: bool
    #: ``$ref`` in an output schema resolves within the schema only, never remotely (2.2).
    local_schema_refs: bool

    @property
    def degraded(self) -> tuple[str, ...]:
        """One line per feature the installed release lacks (empty on the newest)."""
        lines = []
        if not self.message_limit_settable:
            limit = "no limit" if self.sse_event_limit is None else _mib(self.sse_event_limit)
            lines.append(f"MCP messages are limited to {limit} (mcp>=2.3 lets fleetenv "
                         "accept larger tool results)")
        if not self.hides_crash_text:
            lines.append("the local Fleet's MCP servers send a crashing tool's exception "
                         "text to the client (mcp>=2.1 keeps it on the server)")
        if not self.boolean_subschemas:
            lines.append("tools/list fails on a tool whose input schema has a boolean "
                         "property schema (mcp>=2.1 accepts it)")
        if not self.drops_newer_fields:
            lines.append("result fields of a newer MCP protocol revision are validated "
                         "(mcp>=2.1 drops them)")
        if not self.same_origin_redirects:
            lines.append("an MCP endpoint that redirects fails to connect (mcp>=2.2 "
                         "follows same-origin redirects)")
        if not self.local_schema_refs:
            lines.append("a $ref in a tool's output schema may be fetched over the network "
                         "(mcp>=2.2 resolves it within the schema only)")
        return tuple(lines)


@functools.cache
def features() -> MCPFeatures:
    """The features of the installed ``mcp`` (detected once, on first use).

    The first call reads package metadata and imports ``mcp``'s client: make it off the
    event loop (fleetenv's connections do, with their other imports).

    Raises `RuntimeError` naming the installed version when it is older than
    `MIN_MCP_VERSION` or not a 2.x release, with what to install instead.
    """
    version = importlib.metadata.version("mcp")
    parsed = check_supported(version)
    from mcp.client import streamable_http

    settable = "max_sse_event_size" in inspect.signature(
        streamable_http.streamable_http_client).parameters
    return MCPFeatures(
        version=version,
        message_limit_settable=settable,
        sse_event_limit=None if settable else _httpx2_event_limit(),
        hides_crash_text=parsed[:2] >= _HIDES_CRASH_TEXT_SINCE,
        boolean_subschemas=(_parse(importlib.metadata.version("mcp-types"))[:2]
                            >= _BOOLEAN_SUBSCHEMAS_SINCE),
        drops_newer_fields=parsed[:2] >= _DROPS_NEWER_FIELDS_SINCE,
        same_origin_redirects=parsed[:2] >= _SAME_ORIGIN_REDIRECTS_SINCE,
        local_schema_refs=parsed[:2] >= _LOCAL_SCHEMA_REFS_SINCE,
    )


def streamable_http_client(
    url: str, *, http_client: httpx2.AsyncClient, max_message_bytes: int
) -> AbstractAsyncContextManager[Any]:
    """``mcp.client.streamable_http.streamable_http_client`` on every 2.x release.

    ``max_message_bytes`` is passed on where the release accepts it (2.3); before, the
    client keeps the ``httpx2`` default (see `effective_message_limit`). The context
    yields ``(read_stream, write_stream)`` on every release.
    """
    from mcp.client.streamable_http import streamable_http_client as open_client

    options: dict[str, Any] = {}
    if features().message_limit_settable:
        options["max_sse_event_size"] = max_message_bytes
    return open_client(url, http_client=http_client, **options)


def effective_message_limit(requested: int) -> int | None:
    """The largest MCP message the client accepts when fleetenv asks for ``requested``
    (``None``: no limit). Differs from ``requested`` only on mcp<2.3."""
    found = features()
    return requested if found.message_limit_settable else found.sse_event_limit


def check_supported(version: str) -> tuple[int, int, int]:
    """``version`` of ``mcp`` as numbers, or `RuntimeError` if fleetenv does not support it.

    A 1.x release has another client API (``streamablehttp_client``, camelCase
    attributes); a 3.x one is untested. The error says what to install.
    """
    parsed = _parse(version)
    if parsed < MIN_MCP_VERSION or parsed[0] != MIN_MCP_VERSION[0]:
        raise RuntimeError(
            f"fleetenv needs mcp>=2.0,<3, but mcp {version} is installed; "
            "try: pip install 'mcp>=2.0,<3'"
        )
    return parsed


# ---------------------------------------------------------------------- helpers


def _parse(version: str) -> tuple[int, int, int]:
    """``"2.3.0"`` -> ``(2, 3, 0)``; pre-release and local parts are ignored."""
    numbers = [int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3]]
    numbers += [0] * (3 - len(numbers))
    return numbers[0], numbers[1], numbers[2]


def _httpx2_event_limit() -> int | None:
    """The default size limit of one SSE event in the installed ``httpx2`` (``None``:
    none), which is what mcp<2.3 parses every SSE response with."""
    import httpx2

    parameter = inspect.signature(httpx2.EventSource).parameters.get("max_event_size")
    if parameter is None or not isinstance(parameter.default, int):
        return None
    return parameter.default


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"
