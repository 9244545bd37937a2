"""Overall deadlines for every non-MCP network call (control plane, manager API, verifier).

A per-read timeout is not a deadline: a server that answers one byte every 0.2 s, or
sends its headers and stalls, holds a call with only per-read timeouts forever. So every
call runs inside a :func:`deadline_scope` (one per operation: a create, a readiness poll,
a delete with its retries, a manager call, a verification with its retries); when its
time is up the call ends in :class:`DeadlineExceeded` naming what was being done and
where, whatever layer the socket was blocked under. The scope lives in a ``ContextVar``:
it reaches the socket reads of that call in the caller's thread, and only those.

One mechanism per HTTP stack:

* **httpx (fleet-python)**: :class:`DeadlineTransport` wraps httpcore's network backend,
  so each socket operation's timeout is the time left (no timer, no thread; a verifier
  allowed 300 s is not cut at the client's read timeout); a request outside any scope
  gets a scope of its own read timeout. The error is not an ``httpx`` one on purpose:
  fleet-python would turn it into ``FleetTimeoutError`` and drop the detail.
* **requests (manager API)**: ``http.client`` has no per-read hook, so a timer on the
  runtime's loop shuts down (``SHUT_RDWR``) the sockets of the connections attached to
  the scope at its deadline. Connections attach when they send a request and detach when
  they go back to the pool, under the scope's lock, so the timer never touches a
  connection another request has taken.

A scope's exit turns any exception raised after it fired into its ``DeadlineExceeded``,
so no wrapper in between can hide it; scopes nest, and an inner one never outlives the
outer one. At interpreter exit, and for a cancelled ``Runner``'s own calls
(``calls_owner``), calls still out get `EXIT_GRACE_S`, then are abandoned (`abandon_calls`).

Not covered: MCP (``fleetenv.mcp`` has its own deadlines), HTTP proxies taken from the
environment (httpx builds its own transports for those), and a TLS handshake on the
``requests`` path (bounded per read by the connect timeout only).
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  # its exit hook must exist before ours
import contextlib
import contextvars
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import httpcore
import httpx
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from fleetenv import runtime
from fleetenv.core.errors import DeadlineExceeded, FleetEnvError, ProvisioningError
from fleetenv.core.retry import Deadline

__all__ = [
    "EXIT_GRACE_S",
    "DeadlineAdapter",
    "DeadlineScope",
    "DeadlineTransport",
    "ProvisioningDeadlineExceeded",
    "abandon_calls",
    "calls_owner",
    "current_scope",
    "deadline_scope",
]


class ProvisioningDeadlineExceeded(DeadlineExceeded, ProvisioningError):
    """A create or readiness poll ran past its deadline. Also a ``ProvisioningError``,
    so provisioning's own error handling passes it through unchanged."""


logger = logging.getLogger("fleetenv.fleet")
_T = TypeVar("_T")

_current: contextvars.ContextVar[DeadlineScope | None] = contextvars.ContextVar(
    "fleetenv_deadline_scope", default=None)


#: Who the calls made in this context belong to (a Runner's cancel token), so that
#: `abandon_calls(owner=...)` gives up one run's calls and no one else's.
calls_owner: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "fleetenv_calls_owner", default=None)


def current_scope() -> DeadlineScope | None:
    """The deadline scope the calling thread is inside, if any."""
    return _current.get()


class DeadlineScope:
    """One operation's deadline: when it ends, what it was, and the error to raise."""

    def __init__(self, seconds: float, *, what: str, retryable: bool = False,
                 error_cls: type[DeadlineExceeded] = DeadlineExceeded,
                 hint: str | None = None, parent: DeadlineScope | None = None,
                 **context: Any) -> None:
        self.seconds = seconds
        self.what = what
        self.retryable = retryable
        self.error_cls = error_cls
        self.hint = hint
        self.context = {k: v for k, v in context.items() if v is not None}
        end = time.monotonic() + max(0.0, seconds)
        self.end: float = min(end, parent.end) if parent is not None else end
        self.endpoint: str | None = None
        self.fired = False
        self._error: DeadlineExceeded | None = None
        self._lock = threading.Lock()
        self._conns: set[Any] = set()
        self._streams: set[httpcore.NetworkStream] = set()  # httpx reads under way
        self._armed = False
        self._disarm: Callable[[], None] | None = None  # cancels the timer of `_arm`
        self.abandoned = False
        self.owner: object | None = None

    def __repr__(self) -> str:
        return f"DeadlineScope({self.what!r}, {self.remaining():.2f} s left)"

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def error(self) -> DeadlineExceeded:
        """Mark the scope as fired and return its (one) ``DeadlineExceeded``."""
        with self._lock:
            self.fired = True
            if self._error is None:
                self._error = self._new_error(
                    f"{self.what} did not finish within its {self.seconds:g} s deadline",
                    hint=self.hint or "the server accepted the request but did not answer "
                    "in time; retry later or raise the timeout",
                    retryable=self.retryable)
            return self._error

    def abandon(self, reason: str) -> None:
        """Give the operation up now (a cancelled run past its grace, interpreter exit):
        mark the scope fired with an error that names ``reason`` and is never retried,
        and shut down the sockets it is blocked on, so the call returns at once instead
        of at its deadline."""
        with self._lock:
            if not self.fired:
                self.abandoned = self.fired = True
                self._error = self._new_error(
                    f"{self.what} was abandoned: {reason}",
                    hint="nothing to fix: it was stopped on purpose", retryable=False)
                self._error.abandoned = True
            for conn in self._conns:
                _shutdown(conn)
            for stream in self._streams:
                _shutdown_stream(stream)

    def _new_error(self, message: str, *, hint: str, retryable: bool) -> DeadlineExceeded:
        """This scope's error class with its context (and the endpoint, once known)."""
        context = dict(self.context)
        if self.endpoint and "endpoint" not in context:
            context["endpoint"] = self.endpoint
        return self.error_cls(message, hint=hint, retryable=retryable, **context)

    def cap(self, timeout: float | None) -> tuple[float, bool]:
        """``timeout`` shortened to the time left, and whether the deadline is the
        binding limit. Raises this scope's error when no time is left."""
        left = self.end - time.monotonic()
        if left <= 0 or self.abandoned:
            raise self.error()
        if timeout is None or left <= timeout:
            return left, True
        return timeout, False

    # -- the requests path: connections attached to this scope, shut down on expiry

    def attach(self, conn: Any) -> None:
        previous = getattr(conn, "_fleetenv_scope", None)
        if previous is not None and previous is not self:
            previous.detach(conn)
        with self._lock:
            expired = self.fired = self.fired or self.end <= time.monotonic()
            self._conns.add(conn)
            conn._fleetenv_scope = self
            arm = not self._armed
            self._armed = True
        if expired:
            _shutdown(conn)
        elif arm:
            self._arm()

    def _arm(self) -> None:
        """Have the runtime's loop `expire` this scope at its end."""
        try:
            disarm = runtime.current().call_at(self.end, self.expire)
        except FleetEnvError as exc:  # interpreter exit: each read stays bounded by its timeout
            logger.debug("%s: no deadline timer (%s)", self.what, exc)
            return
        with self._lock:
            late, self._disarm = not self._armed, disarm
        if late:  # closed meanwhile
            disarm()

    def detach(self, conn: Any) -> None:
        with self._lock:
            self._conns.discard(conn)
            if getattr(conn, "_fleetenv_scope", None) is self:
                conn._fleetenv_scope = None

    def expire(self) -> None:
        """The timer's action (on the loop): mark fired and shut down the attached
        sockets. Never blocks: the lock guards set operations only."""
        with self._lock:
            conns = list(self._conns)
            self.fired = True
            # Shut down under the lock: a detach (pool put-back, close) cannot run in
            # between, so no socket that has left this scope is touched.
            for conn in conns:
                _shutdown(conn)

    # -- the httpx path: the streams a read or write is blocked on, for `abandon`

    @contextlib.contextmanager
    def blocking_on(self, stream: httpcore.NetworkStream) -> Iterator[None]:
        with self._lock:
            if self.abandoned:
                raise self.error()
            self._streams.add(stream)
        try:
            yield
        finally:
            with self._lock:
                self._streams.discard(stream)

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                if getattr(conn, "_fleetenv_scope", None) is self:
                    conn._fleetenv_scope = None
            self._conns.clear()
            self._armed = False
            disarm, self._disarm = self._disarm, None
        if disarm is not None:
            disarm()


def _shutdown(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _shutdown_stream(stream: httpcore.NetworkStream) -> None:
    sock = stream.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


# ---------------------------------------------------------------- interpreter exit

#: How long interpreter exit lets calls still out (a create, a delete, a verification)
#: finish before it abandons them. A create that answers within it leaves an instance
#: that the exit-time cleanup deletes; one that never answers no longer holds the exit
#: for its whole budget (600 s by default).
EXIT_GRACE_S = 10.0

_live: set[DeadlineScope] = set()  # the scopes of `deadline_scope` blocks under way
_live_changed = threading.Condition()


def abandon_calls(reason: str, *, grace_s: float = EXIT_GRACE_S,
                  owner: object | None = None) -> int:
    """Wait up to ``grace_s`` for the calls under way to end, then abandon the rest
    (`DeadlineScope.abandon`); returns how many were abandoned. Every thread's calls,
    or only those made under ``calls_owner`` = ``owner``."""
    def under_way() -> list[DeadlineScope]:
        return [scope for scope in _live if owner is None or scope.owner is owner]

    end = time.monotonic() + grace_s
    with _live_changed:
        while under_way() and (left := end - time.monotonic()) > 0:
            _live_changed.wait(left)
        stuck = under_way()
    for scope in stuck:
        logger.warning("%s: abandoned (%s)", scope.what, reason)
        scope.abandon(reason)
    return len(stuck)


def _abandon_at_exit() -> None:
    """Runs before interpreter exit joins worker threads (``threading``'s exit hooks,
    which run before ``concurrent.futures`` joins its pools): a worker blocked on a
    call that never answers would otherwise hold the exit until that call's deadline."""
    if _live:
        abandon_calls("the interpreter is exiting")


# Registered after concurrent.futures' own hook (imported above), so it runs first:
# threading runs its exit hooks in reverse order.
_register_exit_hook = getattr(threading, "_register_atexit", None)
if _register_exit_hook is not None:
    _register_exit_hook(_abandon_at_exit)


@contextlib.contextmanager
def deadline_scope(budget: float | Deadline | None, *, what: str, retryable: bool = False,
                   error_cls: type[DeadlineExceeded] = DeadlineExceeded,
                   hint: str | None = None, **context: Any) -> Iterator[DeadlineScope | None]:
    """Run the body with an overall deadline on every HTTP call it makes.

    ``budget``: seconds, a shared :class:`~fleetenv.core.retry.Deadline` (its remaining
    time), or ``None`` (no scope; the body runs as is). Raises ``error_cls`` (a
    ``DeadlineExceeded``) naming ``what`` and ``context`` if the deadline passes while the
    body waits on the network, even if something in between wrapped the error.
    """
    if isinstance(budget, Deadline):
        seconds = budget.remaining()
        total = budget.seconds if budget.seconds is not None else seconds
    else:
        seconds = total = budget
    if seconds is None:
        yield None
        return
    parent = _current.get()
    scope = DeadlineScope(seconds, what=what, retryable=retryable, error_cls=error_cls,
                          hint=hint, parent=parent, **context)
    scope.seconds = total if total is not None else seconds
    scope.owner = calls_owner.get()
    token = _current.set(scope)
    with _live_changed:
        _live.add(scope)
    try:
        yield scope
    except Exception as exc:
        if scope.fired:
            error = scope.error()
            if exc is error:
                raise
            raise error from exc
        raise
    finally:
        _current.reset(token)
        scope.close()
        with _live_changed:
            _live.discard(scope)
            _live_changed.notify_all()
    if scope.fired:  # e.g. a shut-down socket that looked like a clean end of body
        raise scope.error()


@contextlib.contextmanager
def _activated(scope: DeadlineScope | None) -> Iterator[None]:
    token = _current.set(scope)
    try:
        yield
    finally:
        _current.reset(token)


# ---------------------------------------------------------------- httpx / httpcore


def _capped(call: Callable[[float | None], _T], timeout: float | None,
            timed_out: type[Exception], stream: httpcore.NetworkStream | None = None) -> _T:
    """``call(limit)`` with ``timeout`` capped by the current scope; the scope's error
    when the cap is what ran out (``timed_out``). ``stream``: what `abandon` may shut."""
    scope = _current.get()
    if scope is None:
        return call(timeout)
    limit, binding = scope.cap(timeout)
    try:
        if stream is None:
            return call(limit)
        with scope.blocking_on(stream):
            return call(limit)
    except timed_out:
        if binding:
            raise scope.error() from None
        raise


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation is capped by the current scope."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return _capped(lambda limit: self._inner.read(max_bytes, limit), timeout,
                       httpcore.ReadTimeout, self._inner)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _capped(lambda limit: self._inner.write(buffer, limit), timeout,
                httpcore.WriteTimeout, self._inner)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(_capped(
            lambda limit: self._inner.start_tls(ssl_context, server_hostname, limit),
            timeout, httpcore.ConnectTimeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(_capped(
            lambda limit: self._inner.connect_tcp(host, port, limit, local_address,
                                                  socket_options),
            timeout, httpcore.ConnectTimeout))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None,
                            ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, timeout,
                                                               socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _ScopedByteStream(httpx.SyncByteStream):
    """A response body read under the scope of the request that produced it."""

    def __init__(self, inner: httpx.SyncByteStream, scope: DeadlineScope) -> None:
        self._inner = inner
        self._scope = scope

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        while True:
            with _activated(self._scope):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        self._inner.close()


class DeadlineTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose requests all have an overall deadline.

    Inside a :func:`deadline_scope` the scope is the bound; outside, each request gets
    one of its own read timeout (so ``timeout=60`` means 60 s for the whole request).
    """

    def __init__(self, *, verify: Any = True, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits()
        super().__init__(verify=verify, limits=limits)
        ssl_context = (verify if isinstance(verify, ssl.SSLContext)
                       else httpx.create_ssl_context(verify=verify))
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(httpcore.SyncBackend()),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = dict(request.extensions.get("timeout") or {})
        endpoint = f"{request.method} {request.url.copy_with(query=None)}"
        scope = _current.get()
        if scope is None:  # an implicit scope: the request's own read timeout, overall
            budget = timeouts.get("read")
            if budget is None:
                return super().handle_request(request)
            scope = DeadlineScope(float(budget), what=f"HTTP {endpoint}",
                                  endpoint=endpoint)
        else:
            scope.endpoint = endpoint
        left = scope.remaining()
        for key in ("read", "write", "pool"):
            timeouts[key] = left
        connect = timeouts.get("connect")
        timeouts["connect"] = left if connect is None else min(float(connect), left)
        request.extensions = {**request.extensions, "timeout": timeouts}
        with _activated(scope):
            response = super().handle_request(request)
        if isinstance(response.stream, httpx.SyncByteStream):
            response.stream = _ScopedByteStream(response.stream, scope)
        return response


# ---------------------------------------------------------------- requests / urllib3


class _ScopedConnectionMixin:
    """Attaches the connection to the calling thread's scope while it serves a request."""

    def connect(self) -> None:
        self._attach()
        super().connect()  # type: ignore[misc]  # a mixin: urllib3 is next in the MRO

    def request(self, *args: Any, **kwargs: Any) -> None:
        self._attach()
        super().request(*args, **kwargs)  # type: ignore[misc]  # as connect()

    def close(self) -> None:
        self._detach()
        super().close()  # type: ignore[misc]  # as connect()

    def _attach(self) -> None:
        scope = _current.get()
        if scope is not None:
            scope.attach(self)
        else:
            self._detach()

    def _detach(self) -> None:
        scope: DeadlineScope | None = getattr(self, "_fleetenv_scope", None)
        if scope is not None:
            scope.detach(self)


class _HTTPConnection(_ScopedConnectionMixin, HTTPConnection):
    pass


class _HTTPSConnection(_ScopedConnectionMixin, HTTPSConnection):
    pass


class _DetachingPoolMixin:
    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            conn._detach()  # back in the pool: no scope may touch it any more
        super()._put_conn(conn)  # type: ignore[misc]  # a mixin: urllib3 is next in the MRO


class _HTTPPool(_DetachingPoolMixin, HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(_DetachingPoolMixin, HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class DeadlineAdapter(HTTPAdapter):
    """A ``requests`` adapter whose connections the current deadline scope can cut."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
