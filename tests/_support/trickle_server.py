"""A real HTTP server on 127.0.0.1 that never finishes answering (for deadline tests).

Modes:

* ``"trickle"``: reads the request, then sends its reply one byte every ``interval``
  seconds, forever (status line, headers, then an endless body): each byte arrives well
  within any read timeout, so only an overall deadline ends the call.
* ``"stall"``: reads the request, sends complete headers announcing a body, then sends
  nothing more and keeps the connection open.

Each connection is recorded; ``wait_closed()`` says whether the client closed it (the
server saw EOF or a reset), which is what a test checks after the client gave up.
"""

from __future__ import annotations

import select
import socket
import threading
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["TrickleServer"]


@dataclass
class Connection:
    request_line: str = ""
    closed: threading.Event = field(default_factory=threading.Event)


class TrickleServer:
    def __init__(self, mode: str = "trickle", *, interval: float = 0.2) -> None:
        if mode not in ("trickle", "stall"):
            raise ValueError(mode)
        self.mode = mode
        self.interval = interval
        self.connections: list[Connection] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accept_thread = threading.Thread(target=self._accept, daemon=True,
                                               name="trickle-accept")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> TrickleServer:
        self._accept_thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._accept_thread.join(5)
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True when every connection so far was closed by the client within ``timeout``."""
        with self._lock:
            connections = list(self.connections)
        return bool(connections) and all(c.closed.wait(timeout) for c in connections)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = Connection()
            with self._lock:
                self.connections.append(record)
            thread = threading.Thread(target=self._serve, args=(sock, record), daemon=True,
                                      name="trickle-conn")
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, record: Connection) -> None:
        try:
            if not self._read_request(sock, record):
                record.closed.set()
                return
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            if self.mode == "stall":
                sock.sendall(head + b"Content-Length: 100\r\n\r\n{")
                self._wait_for_close(sock, record, send=None)
            else:
                reply = head + b"Content-Length: 100000000\r\n\r\n{\"x\": \"" + b"x" * 10**6
                self._wait_for_close(sock, record, send=reply)
        finally:
            sock.close()

    def _read_request(self, sock: socket.socket, record: Connection) -> bool:
        data = b""
        sock.settimeout(10)
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        record.request_line = head.split(b"\r\n", 1)[0].decode()
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            body += chunk
        return True

    def _wait_for_close(self, sock: socket.socket, record: Connection,
                        send: bytes | None) -> None:
        sock.setblocking(False)
        position = 0
        while not self._stop.is_set():
            readable, _, _ = select.select([sock], [], [], self.interval)
            if readable:
                try:
                    if not sock.recv(65536):
                        break  # EOF: the client closed (or shut down) the connection
                except OSError:
                    break
                continue
            if send is not None and position < len(send):
                try:
                    sock.send(send[position:position + 1])
                except OSError:
                    break
                position += 1
        else:
            return  # server stopped: not a client close
        record.closed.set()
