"""MCP resources: what a server lists (`Resource`, `ResourceTemplate`) and reading them
(docs/mcp.md).

The typed values and the protocol steps on an open ``ClientSession`` (every page,
bounded; errors as fleetenv errors); `MCPConnection` and `ToolRouter` own the sessions
and the reconnects. A read returns `ResourceBlock` values, the blocks a tool result
embeds. A server without the ``resources`` capability has none: listing returns ``[]``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from fleetenv.core.errors import DeadlineExceeded, ResourceError
from fleetenv.core.tool_results import ContentAnnotations, ResourceBlock, read_resource_block
from fleetenv.mcp import failures

if TYPE_CHECKING:
    from mcp import ClientSession

__all__ = [
    "Resource",
    "ResourceError",
    "ResourceTemplate",
    "list_all_resource_templates",
    "list_all_resources",
    "list_pages",
    "read_contents",
    "request_failed",
]

# A server that keeps returning cursors cannot hold a listing forever.
MAX_LIST_PAGES = 1000
# JSON-RPC codes: the server does not implement the method / resource not found (MCP).
_METHOD_NOT_FOUND = -32601
_RESOURCE_NOT_FOUND = -32002


def _listed(item: Any, endpoint: str) -> dict[str, Any]:
    """The fields an ``mcp.types`` resource and resource template share."""
    return {"name": item.name, "endpoint": endpoint, "title": item.title,
            "description": item.description, "mime_type": item.mime_type,
            "annotations": ContentAnnotations.from_mcp(item.annotations),
            "meta": dict(item.meta) if item.meta else None}


@dataclass(frozen=True)
class Resource:
    """One resource a server lists, and the endpoint that serves it (``size`` in bytes)."""

    uri: str
    name: str
    endpoint: str = ""
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    annotations: ContentAnnotations | None = None
    meta: dict[str, Any] | None = None

    @classmethod
    def from_mcp(cls, resource: Any, endpoint: str) -> Resource:
        """From an ``mcp.types.Resource`` listed by ``endpoint``."""
        return cls(uri=str(resource.uri), size=resource.size, **_listed(resource, endpoint))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``None`` fields left out)."""
        return _to_dict(self)


@dataclass(frozen=True)
class ResourceTemplate:
    """A family of resources addressed by an RFC 6570 ``uri_template`` (fill it, then read)."""

    uri_template: str
    name: str
    endpoint: str = ""
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    annotations: ContentAnnotations | None = None
    meta: dict[str, Any] | None = None

    @classmethod
    def from_mcp(cls, template: Any, endpoint: str) -> ResourceTemplate:
        """From an ``mcp.types.ResourceTemplate`` listed by ``endpoint``."""
        return cls(uri_template=str(template.uri_template), **_listed(template, endpoint))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``None`` fields left out)."""
        return _to_dict(self)


def _to_dict(item: Resource | ResourceTemplate) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in vars(item).items():
        if value is None:
            continue
        out[key] = value.to_dict() if isinstance(value, ContentAnnotations) else value
    return out


# ---------------------------------------------------------------------- protocol steps


def has_resources(session: ClientSession) -> bool:
    """Did the server declare the ``resources`` capability in its handshake?"""
    capabilities = session.server_capabilities
    return capabilities is not None and capabilities.resources is not None


async def list_pages(fetch: Callable[..., Awaitable[Any]], items: str) -> list[Any]:
    """Every item over all pages of ``fetch`` (a ``ClientSession.list_*`` method),
    following ``nextCursor`` (bounded, loop-safe)."""
    from mcp.types import PaginatedRequestParams

    collected: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_LIST_PAGES):
        page = await fetch(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        collected.extend(getattr(page, items))
        cursor = page.next_cursor
        if not cursor or cursor in seen:
            break
        seen.add(cursor)
    return collected


async def list_all_resources(session: ClientSession, endpoint: str) -> list[Resource]:
    """All resources of the session's server (``[]`` if it has no resources capability)."""
    if not has_resources(session):
        return []
    raw = await list_pages(session.list_resources, "resources")
    return [Resource.from_mcp(item, endpoint) for item in raw]


async def list_all_resource_templates(
    session: ClientSession, endpoint: str
) -> list[ResourceTemplate]:
    """All resource templates (``[]`` without the resources capability)."""
    if not has_resources(session):
        return []
    raw = await list_pages(session.list_resource_templates, "resource_templates")
    return [ResourceTemplate.from_mcp(item, endpoint) for item in raw]


async def read_contents(session: ClientSession, uri: str) -> tuple[ResourceBlock, ...]:
    """``resources/read`` of ``uri``: its contents, one block per item, in order."""
    result = await session.read_resource(uri)
    contents = getattr(result, "contents", None)
    if contents is None:  # an answer that is not a ReadResourceResult (input required)
        raise ResourceError(
            f"the server did not return the contents of {uri!r}",
            uri=uri,
            hint="this server needs client input to read it, which fleetenv does not give",
        )
    return tuple(read_resource_block(item) for item in contents)


def request_failed(
    exc: Exception, *, doing: str, endpoint: str, timeout_s: float, uri: str | None = None
) -> NoReturn:
    """Raise what a resource request that raised ``exc`` (and is not a lost session) means.

    A request that got no answer in time becomes `DeadlineExceeded`; an error the server
    answered becomes `ResourceError` naming the endpoint (and URI); anything else is
    raised unchanged.
    """
    from mcp import MCPError

    if isinstance(exc, TimeoutError):
        raise DeadlineExceeded(f"{doing} got no answer within {timeout_s:g} s",
                               endpoint=endpoint, uri=uri,
                               hint="pass a larger read_timeout_s") from exc
    if not isinstance(exc, MCPError):
        raise exc
    if exc.code == _RESOURCE_NOT_FOUND:
        hint = "list_resources() and list_resource_templates() show what this server has"
    elif exc.code == _METHOD_NOT_FOUND:
        hint = "this server does not serve resources"
    else:
        hint = None
    detail = failures.over_limit(exc) or exc.message
    raise ResourceError(f"{doing} failed: {detail}", endpoint=endpoint, uri=uri,
                        mcp_error=exc.code, hint=hint) from exc


def is_not_implemented(exc: BaseException) -> bool:
    """Did the server answer "method not found" (it has no resources after all)?"""
    from mcp import MCPError

    return isinstance(exc, MCPError) and exc.code == _METHOD_NOT_FOUND
