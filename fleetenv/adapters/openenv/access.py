"""Who may use the OpenEnv server: the Host, Origin and token checks of every request.

Any web page open in the user's browser can reach a server on loopback (a WebSocket is
not held back by the same-origin policy, and a name rebound to 127.0.0.1 is even
same-origin). So :class:`AccessGuard` checks every HTTP request and WebSocket handshake,
before it is accepted: ``Host`` names this server (any ``Host`` with a token: a rebound
page cannot know it), ``Origin`` is absent, the server's own or allowed, and the token is
sent as HTTP Basic auth, the form OpenEnv's URL-only clients use (:func:`url_with_token`).
A refusal is 403 or 401 with a JSON ``detail`` saying what to do
(docs/openenv-server.md#who-can-connect).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import ipaddress
import json
import logging
import secrets
from collections.abc import Iterable
from urllib.parse import quote, urlsplit, urlunsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from fleetenv.core.errors import ConfigurationError

__all__ = ["TOKEN_ENV", "AccessGuard", "AccessRules", "new_token", "url_with_token"]

_log = logging.getLogger("fleetenv.openenv.server")

#: The environment variable ``fleetenv serve openenv`` reads its token from.
TOKEN_ENV = "FLEETENV_OPENENV_TOKEN"
#: The user name :func:`url_with_token` puts in the URL (the server ignores it).
TOKEN_USER = "fleetenv"
_MIN_TOKEN_CHARS = 16
#: Longer Authorization values are refused unread (a Basic token is ~30 characters).
_MAX_AUTH_CHARS = 1024
#: How much of a refused Host or Origin the answer repeats.
_SHOWN_CHARS = 100


def new_token() -> str:
    """A random token (32 URL-safe characters: no percent-encoding needed in a URL)."""
    return secrets.token_urlsafe(24)


def url_with_token(url: str, token: str) -> str:
    """``url`` with the token as its userinfo password, the form OpenEnv's clients send."""
    parts = urlsplit(url)
    netloc = f"{TOKEN_USER}:{quote(token, safe='')}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclasses.dataclass(frozen=True)
class AccessRules:
    """``allowed_origins``: origins (``scheme://host[:port]``) whose pages may use the
    server besides its own; ``token``: the password clients must send, or ``None``."""

    allowed_origins: frozenset[str] = frozenset()
    token: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def build(cls, allowed_origins: Iterable[str] = (),
              token: str | None = None) -> AccessRules:
        origins = set()
        for origin in allowed_origins:
            normal = _origin(origin.strip().removesuffix("/"))  # a pasted URL's slash
            if normal is None:
                raise ConfigurationError(
                    f"allowed origin {origin[:_SHOWN_CHARS]!r} is not an origin",
                    hint="write scheme://host[:port], as a browser sends it, e.g. "
                         "http://localhost:3000")
            origins.add(normal)
        if token is not None and not (
                len(token) >= _MIN_TOKEN_CHARS and token.isascii() and token.isprintable()
                and " " not in token):
            raise ConfigurationError(
                f"the OpenEnv server's token must be at least {_MIN_TOKEN_CHARS} printable "
                "ASCII characters without spaces", hint="use --token auto for a random one")
        return cls(allowed_origins=frozenset(origins), token=token)


class AccessGuard:
    """ASGI middleware applying :class:`AccessRules` to HTTP and WebSocket scopes."""

    def __init__(self, app: ASGIApp, rules: AccessRules) -> None:
        self.app = app
        self._origins = rules.allowed_origins
        self._token = rules.token.encode() if rules.token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, summary, reason = refusal
        _log.info("refused %s %s: %s", scope["type"], scope.get("path"), summary)
        await _refuse(scope, receive, send, status, reason)

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """``(status, summary, reason)`` when the request may not go on, else ``None``."""
        headers: dict[bytes, list[bytes]] = {}
        for name, value in scope.get("headers", ()):
            if name in (b"host", b"origin", b"authorization"):
                headers.setdefault(name, []).append(value)
        repeated = [name.decode() for name, values in headers.items() if len(values) > 1]
        if repeated:
            listed = ", ".join(repeated)
            return 400, f"repeated {listed}", f"repeated header(s): {listed}"
        host, origin, authorization = (
            headers[name][0].decode("latin-1") if name in headers else None
            for name in (b"host", b"origin", b"authorization"))
        if self._token is None and not _names_this_server(host, scope):
            return 403, f"Host {_shown(host)}", (
                f"Host {_shown(host)} does not name this server ({_bound(scope)}): refused, "
                "as a web page on a rebound DNS name would be. Connect to the address the "
                "server prints (on loopback, localhost works too); behind a proxy or a port "
                "mapping, start the server with a token (--token auto)")
        if origin is not None and not self._origin_ok(origin, host, scope):
            return 403, f"Origin {_shown(origin)}", (
                f"Origin {_shown(origin)} is not this server's: web pages of other sites "
                "may not use it (clients that are not browsers send no Origin). To let that "
                f"site's pages in, start the server with --allow-origin {_shown(origin)}")
        # No WWW-Authenticate on the 401: a browser must not prompt its user for it.
        if self._token is not None and not _token_ok(authorization, self._token):
            return 401, "no valid token", (
                "this OpenEnv server needs its token: put it in the base URL as "
                "http://fleetenv:TOKEN@host:port (OpenEnv's clients send it as HTTP Basic "
                "auth), or send 'Authorization: Basic' with any user name and the token")
        return None

    def _origin_ok(self, origin: str, host: str | None, scope: Scope) -> bool:
        normal = _origin(origin)
        if normal is None:
            return False  # "null" (a sandboxed or file:// page), or garbage
        if normal in self._origins:
            return True
        secure = scope.get("scheme") in ("https", "wss")
        own = _origin(f"{'https' if secure else 'http'}://{host}") if host else None
        return normal == own


def _token_ok(authorization: str | None, token: bytes) -> bool:
    """Whether ``authorization`` is Basic auth (any user) whose password is ``token``."""
    if authorization is None or len(authorization) > _MAX_AUTH_CHARS:
        return False
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    _, colon, password = decoded.partition(b":")
    return bool(colon) and hmac.compare_digest(password, token)


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int,
                  reason: str) -> None:
    body = json.dumps({"detail": reason}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await receive()  # the handshake's websocket.connect; the socket is never accepted
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # servers without the denial extension answer a close before accept with 403
        await send({"type": "websocket.close", "code": 1008})


def _names_this_server(host: str | None, scope: Scope) -> bool:
    """Whether ``Host`` names the address the connection arrived on (any loopback name
    for a loopback address, or a Unix socket)."""
    server = scope.get("server")
    named = _authority(host, _default_port(scope)) if host else None
    if server is None or named is None:
        return False
    name, port = named
    bound_host, bound_port = str(server[0]), server[1]
    if bound_port is not None and port != bound_port:
        return False
    if _same_address(name, bound_host):
        return True
    local = bound_port is None or _is_loopback(bound_host)
    return local and (name == "localhost" or _is_loopback(name))


def _bound(scope: Scope) -> str:
    server = scope.get("server")
    if server is None:
        return "unknown address"
    host, port = str(server[0]), server[1]
    return (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")


def _default_port(scope: Scope) -> int:
    return 443 if scope.get("scheme") in ("https", "wss") else 80


def _origin(text: str) -> str | None:
    """``scheme://host:port`` (lower case, explicit port) or ``None`` if not an origin."""
    scheme, sep, authority = text.strip().lower().partition("://")
    if not sep or not scheme[:1].isalpha() or not all(
            c.isascii() and (c.isalnum() or c in "+.-") for c in scheme) or any(
            c in authority for c in "/?#@\\"):
        return None
    default = {"http": 80, "https": 443}.get(scheme)
    named = _authority(authority, default)
    if named is None:
        return None
    name, port = named
    shown = f"[{name}]" if ":" in name else name
    return f"{scheme}://{shown}" + (f":{port}" if port is not None else "")


def _authority(text: str, default_port: int | None) -> tuple[str, int | None] | None:
    """``(host, port)`` from ``host[:port]`` / ``[v6][:port]``, lower case; ``None`` if
    malformed."""
    text = text.strip().lower()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or _ip(name) is None:
            return None
    else:
        name, colon, port_text = text.partition(":")
        rest = colon + port_text
    if not name or ":" in rest[1:]:
        return None
    if not rest:
        return name, default_port
    digits = rest[1:]
    if rest[0] != ":" or not (digits.isascii() and digits.isdigit()) or len(digits) > 5:
        return None
    port = int(digits)
    return (name, port) if port <= 65535 else None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _is_loopback(text: str) -> bool:
    address = _ip(text)
    return address is not None and address.is_loopback


def _same_address(name: str, bound: str) -> bool:
    a, b = _ip(name), _ip(bound)
    return a == b if a is not None and b is not None else name == bound.lower()


def _shown(value: str | None) -> str:
    return "(none)" if value is None else repr(value[:_SHOWN_CHARS])
