"""Real MCP servers for tests and benchmarks: builders plus thread and subprocess runners.

The servers speak streamable HTTP through uvicorn on 127.0.0.1, exactly as a Fleet
environment does. `CallLog` records every ``tools/call`` with the ``fleetenv/call_id``
from its ``_meta`` (so a test can prove that no logical call ran twice) and every HTTP
request line (so a test can see a session terminated with DELETE).

Run as a script (``python mcp_servers.py [--kind echo|full] [--port N]``) it serves in the
foreground and prints ``PORT <n>`` once it accepts connections; `ServerProcess` uses that.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import uvicorn
from mcp import types
from mcp.server import MCPServer
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, Image
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Audio
from pydantic import BaseModel, Field

__all__ = [
    "CallLog",
    "ServerProcess",
    "ServerThread",
    "bind_socket",
    "build_echo_server",
    "build_full_server",
    "build_paginated_server",
    "tiny_png",
    "tiny_wav",
    "wrap_app",
]

HOST = "127.0.0.1"
_STARTUP_DEADLINE_S = 15.0


# ---------------------------------------------------------------------------- payloads


def tiny_png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    """A valid PNG of ``width`` x ``height`` pixels."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        return struct.pack(">I", len(data)) + tag + data + crc

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def tiny_wav(samples: int = 8) -> bytes:
    """A valid 8-bit mono WAV of silence."""
    data = b"\x80" * samples
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 8000, 1, 8)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


# ---------------------------------------------------------------------------- recording


@dataclass
class CallLog:
    """What a test server saw: tool calls with their call ids, and HTTP requests."""

    calls: list[tuple[str, str | None]] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record_call(self, tool: str, meta: Any) -> None:
        call_id = None
        if meta is not None:
            extra = meta.model_extra if hasattr(meta, "model_extra") else meta
            if isinstance(extra, dict):
                call_id = extra.get("fleetenv/call_id")
        with self.lock:
            self.calls.append((tool, call_id))

    def call_ids(self, tool: str | None = None) -> list[str | None]:
        with self.lock:
            return [cid for name, cid in self.calls if tool is None or name == tool]

    def count(self, method: str) -> int:
        with self.lock:
            return sum(1 for m, _ in self.requests if m == method)


class _RequestRecorder:
    """ASGI middleware that appends (method, path) of every HTTP request to a CallLog."""

    def __init__(self, app: Any, log: CallLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            with self.log.lock:
                self.log.requests.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------------- schemas


class Address(BaseModel):
    street: str
    zip_code: str | None = Field(default=None, description="postal code, if known")


class TreeNode(BaseModel):
    label: str
    children: list[TreeNode] = []


class Point(BaseModel):
    x: float
    y: float


class Weather(BaseModel):
    city: str
    celsius: float


# ---------------------------------------------------------------------------- servers


def build_echo_server(log: CallLog | None = None) -> MCPServer:
    """A server with one trivial ``echo`` tool (benchmarks)."""
    server = MCPServer("fleetenv-echo", version="0.0.1", log_level="WARNING")

    @server.tool()
    def echo(text: str, ctx: Context) -> str:
        """Return the text unchanged."""
        if log is not None:
            log.record_call("echo", ctx.request_context.meta)
        return text

    return server


def build_full_server(log: CallLog | None = None) -> MCPServer:
    """A server with one tool per content / error / schema case the client must handle."""
    server = MCPServer("fleetenv-test", version="0.0.1", log_level="WARNING")
    calls = log if log is not None else CallLog()

    def record(name: str, ctx: Context) -> None:
        calls.record_call(name, ctx.request_context.meta)

    @server.tool()
    def echo(text: str, ctx: Context) -> str:
        """Return the text unchanged."""
        record("echo", ctx)
        return text

    @server.tool(structured_output=False)
    def json_text(ctx: Context) -> str:
        """A JSON object as text."""
        record("json_text", ctx)
        return '{"a": 1, "b": [true, null]}'

    @server.tool(structured_output=False)
    def literal_text(value: str, ctx: Context) -> str:
        """Return ``value`` as the only text block (e.g. "null", "0", "")."""
        record("literal_text", ctx)
        return value

    @server.tool(structured_output=False)
    def several_texts(ctx: Context) -> list[str]:
        """Three text blocks."""
        record("several_texts", ctx)
        return ["first", "second", "third"]

    @server.tool()
    def image(ctx: Context) -> Image:
        """A 2x2 PNG."""
        record("image", ctx)
        return Image(data=tiny_png(), format="png")

    @server.tool(structured_output=False)
    def mixed(ctx: Context) -> list[Any]:
        """Text, image, text: the order must survive."""
        record("mixed", ctx)
        return ["before", Image(data=tiny_png(), format="png"), "after"]

    @server.tool()
    def audio(ctx: Context) -> Audio:
        """A short WAV."""
        record("audio", ctx)
        return Audio(data=tiny_wav(), format="wav")

    @server.tool(structured_output=False)
    def embedded_resource(ctx: Context) -> list[Any]:
        """A text resource and a binary resource."""
        record("embedded_resource", ctx)
        return [
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="file:///notes.txt", mime_type="text/plain", text="resource body"
                ),
            ),
            types.EmbeddedResource(
                type="resource",
                resource=types.BlobResourceContents(
                    uri="file:///blob.bin",
                    mime_type="application/octet-stream",
                    blob=base64.b64encode(b"\x00\x01\x02\x03").decode(),
                ),
            ),
        ]

    @server.tool(structured_output=False)
    def resource_link(ctx: Context) -> list[Any]:
        """A link to a resource."""
        record("resource_link", ctx)
        return [
            types.ResourceLink(
                type="resource_link",
                uri="file:///report.pdf",
                name="report",
                description="the monthly report",
                mime_type="application/pdf",
            )
        ]

    @server.tool()
    def weather(city: str, ctx: Context) -> Weather:
        """Structured output (with an output schema)."""
        record("weather", ctx)
        return Weather(city=city, celsius=21.5)

    @server.tool()
    def fail(message: str, ctx: Context) -> str:
        """Report a tool error with a chosen message (isError=true)."""
        record("fail", ctx)
        raise ToolError(message)

    @server.tool()
    def boom(ctx: Context) -> str:
        """Raise an unexpected exception."""
        record("boom", ctx)
        raise RuntimeError("kaboom")

    @server.tool()
    async def sleepy(seconds: float, ctx: Context) -> str:
        """Sleep, then answer."""
        record("sleepy", ctx)
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(structured_output=False)
    def screenshot_json(mode: Literal["raw", "data_url", "no_image", "extra"], ctx: Context) -> str:
        """Fleet's screenshot convention: a JSON text with a ``base64_image`` key."""
        record("screenshot_json", ctx)
        encoded = base64.b64encode(tiny_png()).decode()
        import json

        if mode == "raw":
            return json.dumps({"base64_image": encoded})
        if mode == "data_url":
            return json.dumps({"base64_image": f"data:image/png;base64,{encoded}"})
        if mode == "no_image":
            return json.dumps({"base64_image": None})
        return json.dumps({"base64_image": encoded, "status": "ok"})

    @server.tool(structured_output=False)
    def big_text(chars: int, ctx: Context) -> str:
        """A long text."""
        record("big_text", ctx)
        return "x" * chars

    @server.tool()
    def schema_cases(
        address: Address,
        tree: TreeNode,
        shape: Point | str,
        note: str | None = None,
        count: int | None = 3,
    ) -> str:
        """Nested models ($defs), a recursive model, a union and nullables."""
        return "ok"

    @server.tool()
    def no_description(x: int) -> int:
        return x

    return server


def build_paginated_server(n_tools: int = 25, page_size: int = 10) -> Server[Any]:
    """A low-level server whose ``tools/list`` is split into pages (MCPServer never pages)."""
    names = [f"tool_{i:03d}" for i in range(n_tools)]

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + page_size
        page = [
            types.Tool(
                name=name,
                description=f"tool number {name[-3:]}",
                input_schema={"type": "object", "properties": {}},
            )
            for name in names[start:end]
        ]
        return types.ListToolsResult(
            tools=page, next_cursor=str(end) if end < len(names) else None
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])

    return Server(
        "fleetenv-paginated", version="0.0.1", on_list_tools=list_tools, on_call_tool=call_tool
    )


# ---------------------------------------------------------------------------- runners


def bind_socket(port: int = 0) -> socket.socket:
    """A listening-ready socket on 127.0.0.1.

    ``IPPROTO_TCP`` matters: asyncio sets TCP_NODELAY only on sockets whose proto says
    TCP, and with Nagle every response costs ~40 ms more.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    return sock


def _config(app: Any) -> uvicorn.Config:
    # timeout_graceful_shutdown: an open client GET stream would block shutdown forever.
    return uvicorn.Config(
        app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
    )


def wrap_app(server: MCPServer | Server[Any], log: CallLog | None) -> Any:
    """The streamable-HTTP ASGI app of ``server``, recording requests into ``log``."""
    app = server.streamable_http_app()
    return _RequestRecorder(app, log) if log is not None else app


class ServerThread:
    """uvicorn serving ``app`` on 127.0.0.1 in a daemon thread (the port is known at once)."""

    def __init__(self, app: Any, *, port: int = 0, path: str = "/mcp") -> None:
        self.sock = bind_socket(port)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}{path}"
        self.server = uvicorn.Server(_config(app))
        self.thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": [self.sock]},
            daemon=True,
            name=f"mcp-test-server-{self.port}",
        )

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self.thread.start()
        _poll(lambda: self.server.started, lambda: self.thread.is_alive(), "server thread")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def _poll(ready: Any, alive: Any, what: str, deadline_s: float = _STARTUP_DEADLINE_S) -> None:
    """Wait for ``ready()`` with backoff; fail if ``alive()`` turns false or time runs out."""
    deadline = time.monotonic() + deadline_s
    delay = 0.002
    while not ready():
        if not alive():
            raise RuntimeError(f"{what} died during startup")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {deadline_s} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class ServerProcess:
    """This module run as a script in a child process (keeps the server off our GIL)."""

    def __init__(self, kind: str = "echo") -> None:
        self.kind = kind
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.url = ""

    def __enter__(self) -> ServerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--kind", self.kind],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the child prints PORT only once it listens
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"server process did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://{HOST}:{self.port}/mcp"
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def _serve_forever(kind: str, port: int) -> None:
    server = build_echo_server() if kind == "echo" else build_full_server()
    sock = bind_socket(port)
    uv = uvicorn.Server(_config(server.streamable_http_app()))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    _poll(lambda: uv.started, thread.is_alive, "server")
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        pass
    uv.should_exit = True
    thread.join(5)



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=("echo", "full"), default="echo")
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    _serve_forever(options.kind, options.port)
