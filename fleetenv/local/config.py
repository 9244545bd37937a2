"""Settings of one local Fleet, what it is given (apps, a harness), and the checks that
keep it on loopback.

One frozen object carries every knob so the in-process server, the subprocess server and
the ``fleetenv serve`` command are configured the same way and cannot drift.
"""

from __future__ import annotations

import importlib
import ipaddress
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})
#: The regions fleet-python routes to Fleet (its ``fleet.config.REGION_BASE_URL``; its
#: ``staging`` there is a deployment, not a region).
FLEET_REGIONS = ("us-west-1", "us-east-1", "eu-west-2")
#: What a local Fleet serves by default: ``local`` (the default region), then Fleet's, so
#: a program that names one of Fleet's regions runs unchanged against it.
DEFAULT_REGIONS = ("local", *FLEET_REGIONS)


class LocalFleetError(RuntimeError):
    """The local Fleet could not start, stop or answer an inspection request."""


class Harness(Protocol):
    """What runs the sessions of one harness job (``fleetenv.local.jobs``), given by whoever
    builds the local Fleet from the top: the local Fleet never imports the stack."""

    def run(self, *, base_url: str, token: str, task: dict[str, Any], model: str,
            modality: str | None, max_steps: int | None) -> dict[str, Any]:
        """One session as one episode, blocking: ``{"turns", "verifier"}`` (a
        ``verifier_execution``), or ``{"turns", "error"}`` when it failed."""
        ...

    def cancel(self) -> None:
        """Close every episode of the job now (ends any tool call in flight)."""
        ...


#: Makes the harness of one job (``LocalFleet(harness=...)``).
HarnessFactory = Callable[[], Harness]


@dataclass(frozen=True)
class LocalFleetConfig:
    host: str = "127.0.0.1"
    port: int = 0
    token: str = field(default="", repr=False)  # a secret: never in reprs or logs
    log_level: str = "WARNING"
    allow_non_loopback: bool = False
    default_ttl_seconds: int = 3600
    verifier_timeout: float = 30.0
    """Upper bound (and default) of one verifier run, whatever the request asks for."""
    verifier_workers: int = 2
    """Verifier worker processes started with the server."""
    verifier_workers_max: int = 32
    """More are started on demand, one per verification in flight, up to this many."""
    instance_limit: int = 1000
    graceful_shutdown_seconds: int = 2
    """Whole seconds: uvicorn's ``timeout_graceful_shutdown`` is an ``int``."""
    runner_token: str = field(default="", repr=False)  # a secret: never in reprs or logs
    """The ``X-Runner-Token`` every instance-manager request must carry (served to API-key
    holders at ``GET /v1/runner-auth/token``); empty: the manager routes are not gated."""
    regions: tuple[str, ...] = DEFAULT_REGIONS
    """The regions creates may name, the default first; any other region is Fleet's 400
    "not supported"."""
    browser: bool = True
    """Give instances a ``cdp`` resource when a Chromium is installed (``chromium``)."""
    chromium: str | None = None
    """The Chromium executable; None: the first of ``chromium``, ``chromium-browser``,
    ``google-chrome`` on PATH."""
    require_mcp_auth: bool = False
    """Instances' MCP endpoints answer 401 without ``Authorization: Bearer <token>`` (the
    API key), as Fleet endpoints that check credentials do."""


def is_loopback_host(host: str) -> bool:
    """True when ``host`` can only be reached from this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_host(host: str, allow_non_loopback: bool) -> None:
    """Refuse to expose the local Fleet (which trusts its callers) beyond loopback by accident."""
    if is_loopback_host(host) or allow_non_loopback:
        return
    raise LocalFleetError(
        f"refusing to bind the local Fleet to non-loopback host {host!r}: it serves throwaway "
        "data with a single shared token and runs verifier code it is sent. Bind 127.0.0.1, "
        "or pass allow_non_loopback=True (CLI: --allow-non-loopback) if you really mean it."
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket with ``proto=IPPROTO_TCP``.

    asyncio only sets TCP_NODELAY on accepted sockets whose listener has
    ``proto == IPPROTO_TCP``; a plain ``socket.socket()`` leaves Nagle on and every
    response pays ~40 ms of delayed-ACK latency.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(False)
    except OSError as exc:
        sock.close()
        raise LocalFleetError(
            f"cannot bind the local Fleet to {host}:{port}: {exc}. "
            "Pick another --port (0 chooses a free one)."
        ) from exc
    return sock


def resolve_apps(apps: Mapping[str, AppSpec] | str | None) -> dict[str, AppSpec]:
    """Turn the ``apps=`` argument into a ``{env_key: AppSpec}`` dict.

    ``None`` means the bundled sample apps; a string is ``"package.module:ATTRIBUTE"``
    (the only form a subprocess server can receive).
    """
    if apps is None:
        from fleetenv.local.apps import APPS

        return dict(APPS)
    if isinstance(apps, str):
        return dict(load_by_path(apps, "apps"))
    return dict(apps)


def resolve_harness(harness: HarnessFactory | str | None) -> HarnessFactory | None:
    """The ``harness=`` argument as a factory: a string is ``"package.module:ATTRIBUTE"``
    (the only form a subprocess server can receive); ``None``: no harness jobs."""
    if isinstance(harness, str):
        factory: HarnessFactory = load_by_path(harness, "harness")
        return factory
    return harness


def load_by_path(path: str, what: str) -> Any:
    """The object ``"package.module:ATTRIBUTE"`` names (for ``what=``)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise LocalFleetError(f"{what}={path!r} must look like 'package.module:ATTRIBUTE'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise LocalFleetError(f"cannot load {what} from {path!r}: {exc}") from exc
