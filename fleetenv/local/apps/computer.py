"""The ``computer`` tool protocol shared by every sample app.

Fleet's computer-use environments expose one MCP tool named ``computer`` that takes an
``action`` and returns a JSON text ``{"base64_image": "data:image/png;base64,..."}``. This
module owns that protocol (argument validation, key names, coordinates, the screenshot
envelope, one lock per instance) so each app only supplies a screen
(:class:`~fleetenv.local.apps.list_screen.ListDetailScreen`): how to draw its current
state from the database and what a click, text or key does. Layouts are
fixed-size and deterministic, so a reference solution can be a list of clicks.
"""

from __future__ import annotations

import base64
import importlib
import json
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from fleetenv.local.apps.base import DbFactory
from fleetenv.local.apps.screen import Canvas
from fleetenv.local.apps.toolkit import AppError, tool_errors
from fleetenv.local.apps.widgets import SCREEN_HEIGHT, SCREEN_WIDTH, Hotspot

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server import MCPServer

    from fleetenv.local.apps.list_screen import ListDetailScreen

_KEY_SPELLINGS = {
    "Enter": ("enter", "return", "kp_enter"), "Escape": ("escape", "esc"),
    "Backspace": ("backspace",), "Tab": ("tab",), "PageDown": ("page_down", "pagedown", "next"),
    "PageUp": ("page_up", "pageup", "prior"), "Home": ("home",), "End": ("end",),
}
#: Key names accepted by ``action="key"`` (xdotool spellings and common aliases).
KEY_ALIASES = {alias: key for key, aliases in _KEY_SPELLINGS.items() for alias in aliases}


def normalise_key(key: str) -> str:
    """Map a key name to its canonical form or raise an error listing the accepted ones."""
    canonical = KEY_ALIASES.get(key.strip().lower().replace("-", "_").replace(" ", "_"))
    if canonical is None:
        accepted = ", ".join(sorted(set(KEY_ALIASES.values())))
        raise AppError(f"unknown key {key!r}; accepted keys: {accepted}")
    return canonical


class ComputerSession:
    """The state machine behind one instance's ``computer`` tool, usable without MCP.

    Tests and the tool itself call :meth:`act`; it serialises actions with a lock because
    MCPServer runs sync tools on worker threads and two clients may share an instance.
    """

    def __init__(self, db: DbFactory, screen: ListDetailScreen,
                 make_screen: Callable[[], ListDetailScreen] | None = None) -> None:
        self.db = db
        self._screen = screen
        self.make_screen = make_screen
        """Builds a fresh screen of the same app (None: this session cannot reset)."""
        self._lock = threading.Lock()
        self._hotspots: list[Hotspot] = []

    def reset_ui(self) -> None:
        """Forget the UI state (current view, focus, typed text, scroll), as a page
        reload does: the next screenshot shows the app's start screen. An episode's
        reset restores the database, and the view must not outlive it."""
        if self.make_screen is None:
            return
        with self._lock:
            self._screen = self.make_screen()
            self._hotspots = []

    def hotspots(self) -> list[Hotspot]:
        """The clickable regions of the last rendered screen (renders if none yet)."""
        with self._lock:
            if not self._hotspots:
                with self.db() as conn:
                    self._render(conn)
            return list(self._hotspots)

    def act(
        self,
        action: str,
        x: int | None = None,
        y: int | None = None,
        text: str | None = None,
        key: str | None = None,
        direction: str | None = None,
        amount: int = 3,
    ) -> bytes:
        """Apply one action and return the PNG of the resulting screen."""
        with self._lock, self.db() as conn:
            if not self._hotspots:
                self._render(conn)
            if action == "click":
                if x is None or y is None:
                    raise AppError("action 'click' needs both x and y (pixels from top-left)")
                if not (0 <= x < SCREEN_WIDTH and 0 <= y < SCREEN_HEIGHT):
                    raise AppError(
                        f"click at ({x}, {y}) is outside the {SCREEN_WIDTH}x{SCREEN_HEIGHT} "
                        "screen; take a screenshot and click inside it"
                    )
                spot = next((s for s in self._hotspots if s.contains(x, y)), None)
                if spot is not None:
                    self._screen.click(conn, spot)
            elif action == "type":
                if not text:
                    raise AppError("action 'type' needs a non-empty 'text'")
                self._screen.type_text(conn, text)
            elif action == "key":
                if not key:
                    raise AppError("action 'key' needs 'key', e.g. 'Enter' or 'Escape'")
                self._screen.key(conn, normalise_key(key))
            elif action == "scroll":
                if direction not in ("up", "down"):
                    raise AppError("action 'scroll' needs direction 'up' or 'down'")
                if amount < 1:
                    raise AppError(f"scroll amount must be at least 1, got {amount}")
                self._screen.scroll(conn, direction, amount)
            elif action != "screenshot":
                raise AppError(
                    f"unknown action {action!r}; use screenshot, click, type, key or scroll"
                )
            return self._render(conn)

    def _render(self, conn: sqlite3.Connection) -> bytes:
        canvas = Canvas(SCREEN_WIDTH, SCREEN_HEIGHT)
        self._hotspots = self._screen.render(conn, canvas)
        return canvas.to_png()


def screenshot_payload(png: bytes) -> str:
    """Fleet's computer-tool result: JSON text with a ``data:`` URL under ``base64_image``."""
    encoded = base64.b64encode(png).decode("ascii")
    return json.dumps({"base64_image": f"data:image/png;base64,{encoded}"})


#: The computer session behind each server's ``computer`` tool, so the host can reset
#: the UI with the episode and open browser leases on the same app (weak: a stopped
#: instance's server and session go away with it).
_SESSIONS: weakref.WeakKeyDictionary[MCPServer, ComputerSession] = weakref.WeakKeyDictionary()


def computer_session(server: MCPServer) -> ComputerSession | None:
    """The session of the ``computer`` tool registered on ``server``, if any (apps that
    draw their own ``computer`` tool have none)."""
    return _SESSIONS.get(server)


def register_computer_tool(server: MCPServer, db: DbFactory,
                           make_screen: Callable[[], ListDetailScreen], app_name: str) -> None:
    """Add the ``computer`` tool for one instance."""
    session = ComputerSession(db, make_screen(), make_screen)
    _SESSIONS[server] = session

    def computer(
        action: Annotated[
            Literal["screenshot", "click", "type", "key", "scroll"],
            Field(description="What to do. Every action returns a screenshot afterwards."),
        ],
        x: Annotated[int | None, Field(description="click: pixels from the left edge (0-799).",
                                       ge=0)] = None,
        y: Annotated[int | None, Field(description="click: pixels from the top edge (0-599).",
                                       ge=0)] = None,
        text: Annotated[str | None,
                        Field(description="type: text typed into the focused field.")] = None,
        key: Annotated[str | None, Field(
            description="key: Enter, Escape, Backspace, Tab, PageUp, PageDown, Home, End.",
        )] = None,
        direction: Annotated[Literal["up", "down"] | None,
                             Field(description="scroll: direction.")] = None,
        amount: Annotated[int, Field(description="scroll: rows to move.", ge=1, le=50)] = 3,
    ) -> str:
        with tool_errors():
            png = session.act(action, x, y, text, key, direction, amount)
        return screenshot_payload(png)

    computer.__doc__ = (
        f"Operate the {app_name} web UI on an {SCREEN_WIDTH}x{SCREEN_HEIGHT} screen. "
        "Take a screenshot first, then click buttons, table rows and text fields at pixel "
        "coordinates, type into the focused field, press keys or scroll. Returns "
        '{"base64_image": "data:image/png;base64,..."} showing the screen after the action.'
    )
    server.add_tool(computer, name="computer", structured_output=False)


def lazy_computer(app_name: str, screen: str) -> Callable[[MCPServer, DbFactory], None]:
    """An :attr:`AppSpec.register_computer` showing ``screen`` (``"module:Class"``).

    The screen class is imported when the first instance registers its ``computer`` tool,
    so listing or seeding apps never loads their UI and drawing code. ``app_name`` is what
    the tool's description calls the UI.
    """
    module_name, _, class_name = screen.partition(":")

    def register_computer(server: MCPServer, db: DbFactory) -> None:
        make_screen = getattr(importlib.import_module(module_name), class_name)
        register_computer_tool(server, db, make_screen, app_name)

    return register_computer
