"""Fault injection: what can go wrong on purpose, and where.

The registry lives on the server's event loop and is only touched from it (the admin
route adds and clears faults), so it needs no locks. Each fault has a kind, optional
selectors and a budget: ``times=None`` applies until cleared, ``times=N`` to the next N
matching events. The kinds and their effects are listed in docs/local-fleet.md; ``KINDS``
below is the single source of truth the admin route checks.
"""

from __future__ import annotations

import fnmatch
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

# kind -> parameters it accepts besides the common ones (times)
KINDS: dict[str, frozenset[str]] = {
    "http_error": frozenset({"route", "method", "instance", "status", "message"}),
    "http_delay": frozenset({"route", "method", "instance", "seconds"}),
    "http_hang": frozenset({"route", "method", "instance"}),
    "drop_connection": frozenset({"route", "method", "instance"}),
    "tool_delay": frozenset({"instance", "tool", "seconds"}),
    "tool_hang": frozenset({"instance", "tool"}),
    "tool_error": frozenset({"instance", "tool", "message"}),
    "tool_output": frozenset({"instance", "tool", "payload", "size"}),
    "session_loss": frozenset({"instance", "route"}),
    # MCP servers that restart, start slowly, or pace handshakes (fleetenv.local.mcp_host)
    "mcp_restart": frozenset({"instance", "route", "payload"}),
    "mcp_starting": frozenset({"instance", "route", "seconds"}),
    "mcp_handshake_delay": frozenset({"instance", "route", "seconds"}),
    "create_error": frozenset({"status", "message", "retryable"}),
    "create_failed": frozenset({"message"}),
    "create_reply": frozenset({"seconds", "payload"}),
    "verifier_crash": frozenset({"instance", "key"}),
    "verifier_hang": frozenset({"instance", "key"}),
    # Verifier execution that fails transiently or slowly (fleetenv.local.verification)
    "verifier_unavailable": frozenset({"instance", "key", "status", "message"}),
    "verifier_delay": frozenset({"instance", "key", "seconds"}),
    "verifier_judge_error": frozenset({"instance", "key", "message"}),
}
#: What a ``tool_output`` fault appends to the tool's real result: ``huge`` is ``size``
#: bytes of text; ``binary`` is ``size`` bytes that are not UTF-8, as a blob resource plus
#: the text a careless server would make of them.
OUTPUT_PAYLOADS = ("huge", "binary")
#: What a ``create_reply`` fault does to the answer of a create that *succeeded*:
#: ``delay`` holds it ``seconds``; ``malformed`` answers 200 with a body that is not JSON.
CREATE_REPLY_PAYLOADS = ("delay", "malformed")
#: How the instance's MCP servers answer a session id they forgot after an ``mcp_restart``
#: (each as a real server does; see ``fleetenv.local.mcp_host.RESTART_ANSWERS``).
MCP_RESTART_PAYLOADS = ("python", "typescript", "everything", "gateway")
_PAYLOADS = {"tool_output": OUTPUT_PAYLOADS, "create_reply": CREATE_REPLY_PAYLOADS,
             "mcp_restart": MCP_RESTART_PAYLOADS}
_SELECTORS = ("instance", "tool", "route", "method", "key")


@dataclass(eq=False)
class Fault:
    id: str
    kind: str
    times: int | None = None
    instance: str | None = None
    tool: str | None = None
    route: str | None = None
    method: str | None = None
    key: str | None = None
    seconds: float | None = None
    status: int | None = None
    message: str | None = None
    payload: str | None = None
    size: int | None = None
    #: ``create_error`` only: answer Fleet's structured ``{"detail": {"message": ...,
    #: "retryable": ...}}`` body, which overrides what the status alone would say.
    retryable: bool | None = None
    hits: int = 0
    #: ``mcp_handshake_delay``: handshakes it holds now, and the most it held at once.
    active: int = 0
    peak: int | None = None
    #: When it was added (``mcp_starting`` answers 503 for ``seconds`` from then on).
    added_at: float = field(default_factory=time.monotonic, repr=False)
    released: anyio.Event = field(default_factory=anyio.Event, repr=False)

    def matches(self, **target: str | None) -> bool:
        for name in _SELECTORS:
            wanted = getattr(self, name)
            if wanted is None:
                continue
            actual = target.get(name)
            if actual is None:
                return False
            if name == "route":
                if not fnmatch.fnmatchcase(actual, wanted):
                    return False
            elif name == "method":
                if actual.upper() != wanted.upper():
                    return False
            elif actual != wanted:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        out = {
            name: getattr(self, name)
            for name in ("id", "kind", "times", *_SELECTORS, "seconds", "status", "message",
                         "payload", "size", "retryable", "peak")
        }
        out["hits"] = self.hits
        return {k: v for k, v in out.items() if v is not None}


class FaultError(ValueError):
    """A fault spec that cannot be applied (unknown kind, wrong parameter...)."""


class FaultRegistry:
    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._hanging: set[Fault] = set()
        self._ids = itertools.count(1)
        self.stopping = False

    def add(self, spec: dict[str, Any]) -> Fault:
        spec = dict(spec)
        kind = spec.pop("kind", None)
        if kind not in KINDS:
            raise FaultError(f"unknown fault kind {kind!r}; known kinds: {sorted(KINDS)}")
        times = spec.pop("times", None)
        unknown = set(spec) - KINDS[kind]
        if unknown:
            raise FaultError(
                f"fault kind {kind!r} does not take {sorted(unknown)}; "
                f"it takes {[*sorted(KINDS[kind]), 'times']}"
            )
        if times is not None and (not isinstance(times, int) or times < 1):
            raise FaultError(f"times must be a positive integer or None, not {times!r}")
        seconds = spec.get("seconds")
        if kind.endswith("_delay") and (not isinstance(seconds, (int, float)) or seconds < 0):
            raise FaultError(f"fault kind {kind!r} needs seconds >= 0, got {seconds!r}")
        status = spec.get("status")
        if status is not None and (not isinstance(status, int) or not 400 <= status <= 599):
            raise FaultError(f"status must be an HTTP error code (400-599), not {status!r}")
        if kind == "mcp_restart":
            spec.setdefault("payload", "python")
        if kind in _PAYLOADS and spec.get("payload") not in _PAYLOADS[kind]:
            raise FaultError(f"{kind} needs payload in {_PAYLOADS[kind]}, "
                             f"got {spec.get('payload')!r}")
        if kind == "tool_output":
            size = spec.setdefault("size", 1_000_000)
            if not isinstance(size, int) or not 0 < size <= 200_000_000:
                raise FaultError(f"size must be 1..200_000_000 bytes, not {size!r}")
        if kind == "create_reply" and spec["payload"] == "delay" and (
                not isinstance(seconds, (int, float)) or seconds < 0):
            raise FaultError(f"create_reply delay needs seconds >= 0, got {seconds!r}")
        if kind == "mcp_starting" and (not isinstance(seconds, (int, float)) or seconds < 0):
            raise FaultError(f"mcp_starting needs seconds >= 0, got {seconds!r}")
        if "retryable" in spec and not isinstance(spec["retryable"], bool):
            raise FaultError(f"retryable must be true or false, not {spec['retryable']!r}")
        if kind in ("http_error", "create_error", "verifier_unavailable") and status is None:
            spec["status"] = 503
        fault = Fault(id=f"fault-{next(self._ids)}", kind=kind, times=times, **spec)
        self._faults.append(fault)
        return fault

    def take(self, kinds: tuple[str, ...] | str, **target: str | None) -> Fault | None:
        """Consume one use of the oldest matching fault of one of ``kinds``, if any."""
        if isinstance(kinds, str):
            kinds = (kinds,)
        for fault in self._faults:
            if fault.kind in kinds and fault.matches(**target):
                fault.hits += 1
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def remove(self, fault_id: str) -> bool:
        for fault in self._faults:
            if fault.id == fault_id:
                self._faults.remove(fault)
                fault.released.set()
                return True
        return False

    def clear(self) -> int:
        count = len(self._faults)
        for fault in [*self._faults, *self._hanging]:
            fault.released.set()
        self._faults.clear()
        return count

    def list(self) -> list[dict[str, Any]]:
        return [fault.to_dict() for fault in self._faults]

    async def hang(self, fault: Fault) -> bool:
        """Hold the caller until the fault is cleared (True) or the server stops (False).

        A one-shot hang is already gone from the registry when it fires; ``clear()``
        (of everything) or shutdown still releases it.
        """
        self._hanging.add(fault)
        try:
            await fault.released.wait()
        finally:
            self._hanging.discard(fault)
        return not self.stopping

    def release_all(self, *, stopping: bool) -> None:
        """Wake every held request; at shutdown they give up instead of proceeding."""
        self.stopping = self.stopping or stopping
        for fault in [*self._faults, *self._hanging]:
            fault.released.set()
