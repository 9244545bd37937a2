"""Run the local Fleet's ASGI app under uvicorn in a daemon thread of this process.

uvicorn is configured explicitly (h11, asyncio, no log config) so nothing about the
caller's process changes: no signal handlers (it skips them off the main thread), no
``dictConfig`` (which would close every existing logging handler), no root logger.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from fleetenv.local.asgi import LocalFleetApp
from fleetenv.local.config import HarnessFactory, LocalFleetConfig, LocalFleetError, bind_socket
from fleetenv.local.state import LocalFleetState

if TYPE_CHECKING:  # pragma: no cover - annotation only; the apps package loads every app
    from fleetenv.local.apps.base import AppSpec

_QUIET_LOGGERS = ("fleetenv.local", "uvicorn.error", "uvicorn.access", "mcp.server")


def quiet_loggers(level: str) -> None:
    """Set our own and our servers' loggers, never the root logger, never over a choice."""
    for name in _QUIET_LOGGERS:
        log = logging.getLogger(name)
        if log.level == logging.NOTSET:
            log.setLevel(level.upper())


class ServerThread:
    """One uvicorn server on a pre-bound socket, started and stopped from any thread."""

    def __init__(self, config: LocalFleetConfig, apps: dict[str, AppSpec],
                 harness: HarnessFactory | None = None) -> None:
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="fleetenv-local-"))
        # A caller that never stops us still gets its temporary files removed at exit.
        weakref.finalize(self, shutil.rmtree, self.workdir, True)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        try:
            self._sock = bind_socket(config.host, config.port)
            port = self._sock.getsockname()[1]
            url_host = f"[{config.host}]" if ":" in config.host else config.host
            self.base_url = f"http://{url_host}:{port}"
            self.state = LocalFleetState(config, apps, self.workdir, harness)
            self.state.base_url = self.base_url
            self.app = LocalFleetApp(self.state)
            self.server = uvicorn.Server(uvicorn.Config(
                self.app,
                log_config=None,
                log_level=None,
                access_log=False,
                lifespan="on",
                http="h11",
                loop="asyncio",
                proxy_headers=False,
                server_header=False,
                timeout_graceful_shutdown=config.graceful_shutdown_seconds,
            ))
        except BaseException:
            self._cleanup_files()
            raise

    def start(self, timeout: float) -> None:
        self._thread = threading.Thread(
            target=self._run, name="fleetenv-local-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        pause = 0.001
        while not self.server.started:
            if not self._thread.is_alive():
                self._cleanup_files()
                raise LocalFleetError(f"the local Fleet server failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise LocalFleetError(f"the local Fleet did not start within {timeout:g} s")
            time.sleep(pause)  # polling a flag with backoff and a deadline
            pause = min(pause * 2, 0.05)

    def _run(self) -> None:
        try:
            assert self._sock is not None, "__init__ binds the socket before a thread can start"
            self.server.run(sockets=[self._sock])
        except Exception as exc:  # reported by start()/stop(); the thread just ends
            self._error = exc

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 15.0) -> None:
        loop = self.state.loop
        if self.alive and loop is not None and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self.state.drain(), loop)
            try:
                future.result(timeout=10)
            except Exception:  # shutdown continues; uvicorn's own timeout still bounds it
                logging.getLogger("fleetenv.local").exception("draining the local Fleet failed")
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.server.force_exit = True
                self._thread.join(5)
        self._cleanup_files()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _cleanup_files(self) -> None:
        if self._sock is not None:
            self._sock.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
