"""A real headless Chromium tab for tests, driven over CDP.

Debian's ``chromium`` (``.ci/run`` installs it) started by fleetenv's own launcher
(:class:`fleetenv.local.cdp.Browser`: headless, throwaway profile, killed with its process
group); tests skip where it is missing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleetenv.local.cdp import Browser


class Page:
    """One Chromium tab over CDP: navigate, evaluate, and every console error it logged."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._id = 0
        self.errors: list[str] = []
        self._events: list[dict[str, Any]] = []
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.send(method)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        ident = self._id
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=20))
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._note(message)

    def _note(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        self._events.append(message)
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning",
                                                                           "assert"):
            self.errors.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            self.errors.append(f"exception: {params.get('exceptionDetails')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") in ("error",
                                                                             "warning"):
            self.errors.append(f"log: {params['entry'].get('text')}")

    def open(self, path: Path) -> None:
        self.navigate(path.resolve().as_uri())

    def navigate(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self._events.clear()
        self.send("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._note(json.loads(self._ws.recv(timeout=30)))

    def eval(self, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                          awaitPromise=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")


@contextmanager
def chromium_page(owner: str) -> Iterator[Page]:
    """A tab of a fresh headless Chromium, stopped on exit; skips without Chromium."""
    from websockets.sync.client import connect

    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    chromium = Browser(executable, owner=owner)
    try:
        anyio.run(chromium.start, 1280, 900)
        described = anyio.run(chromium.describe)
        with connect(described["cdp_page_url"], max_size=None, open_timeout=10) as ws:
            yield Page(ws)
    finally:
        chromium.stop()
