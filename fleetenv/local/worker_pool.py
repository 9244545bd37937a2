"""A small pool of pre-warmed verifier worker processes.

Starting a Python process and importing fleet-python costs ~0.5 s; a verification should
cost tens of milliseconds. So a few workers start with the server, each serves one job at
a time, and one that times out or dies is killed and replaced in the background. While
more jobs are in flight than there are workers, each new job starts one more (up to
``max_size``; they stay until the server stops), so a burst or a hung verifier does not
leave the others queued past their deadlines. Replies say how long their job waited for
a worker (``queue_ms``).

Workers are plain subprocesses (``python -m fleetenv.local.verifier_worker``), not
``multiprocessing`` children: spawn-mode multiprocessing re-imports the caller's
``__main__``, which would start a second local Fleet in scripts without a main guard.
They run in their own session so a terminal Ctrl-C reaches only the server, which then
stops them, and are killed as a process group. Their environment is an allow-list
(``worker_environment``). Each worker runs each job in a sandboxed process it forks,
supervises and times out (``verifier_worker``); the pool only catches a worker that stops
answering.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from fleetenv.local.verifier_worker import failure

logger = logging.getLogger("fleetenv.local")

STARTUP_TIMEOUT_SECONDS = 60.0
SUPERVISION_SLACK_SECONDS = 5.0
TERMINATE_SECONDS = 2.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


_KEEP_ENV = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SYSTEMROOT", "LD_LIBRARY_PATH",
    "PYTHONPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONIOENCODING", "PYTHONUTF8",
    "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "PYTHONNOUSERSITE", "PYTHONSAFEPATH",
    "PYTHONHASHSEED",
})


def worker_environment(home: Path, runner_token: str = "") -> dict[str, str]:
    """The whole environment of a worker: what Python needs to run, and nothing else.

    The server's environment holds API keys and tokens (``OPENAI_API_KEY``,
    ``FLEET_API_KEY``, ...) that verifier code has no business reading, so this is an
    allow-list, not a deny-list. ``HOME`` is a private directory of the pool (each job
    then gets its own temporary ``HOME`` and working directory).

    ``RUNNER_AUTH_TOKEN`` is the server's runner token, as Fleet hands it to the services
    it runs: a verifier reads state through the gated manager routes, and fleet-python
    takes the token from there instead of fetching it. (Fetching would also need the CA
    bundle of the install, which a job that runs as ``nobody`` may not be able to read.)
    """
    env = {k: v for k, v in os.environ.items() if k in _KEEP_ENV or k.startswith("LC_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
    )
    env["HOME"] = str(home)
    if runner_token:
        env["RUNNER_AUTH_TOKEN"] = runner_token
    return env


class _Worker:
    def __init__(self, pool: WorkerPool) -> None:
        env = worker_environment(pool.home, pool.runner_token)
        self.pool = pool
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetenv.local.verifier_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=pool.log_file,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        self._reader = threading.Thread(
            target=self._read, name=f"fleetenv-verifier-reader-{self.proc.pid}", daemon=True
        )
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        stdout: IO[bytes] = self.proc.stdout  # type: ignore[assignment]  # Popen(stdout=PIPE)
        for line in stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("type") == "ready":
                self.pool._idle.put(self)
            else:
                self.replies.put(message)
        stdout.close()
        self.replies.put(None)
        self.pool._on_exit(self)

    def send(self, job: dict[str, Any]) -> None:
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]  # Popen(stdin=PIPE)
        stdin.write(json.dumps(job).encode("utf-8") + b"\n")
        stdin.flush()

    def kill(self) -> None:
        # SIGTERM first: the worker then kills the job it is running (a process group of
        # its own) and the job's escaped descendants, which it alone knows, and exits.
        # SIGKILL to the worker's own group if it does not.
        if self.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=TERMINATE_SECONDS)
            except subprocess.TimeoutExpired:
                logger.warning("verifier worker %s ignored SIGTERM; killing it", self.proc.pid)
        if self.alive:  # never signal a reaped pid: it may belong to someone else by now
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("verifier worker %s did not exit after SIGKILL", self.proc.pid)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):  # already broken: the process is gone
                self.proc.stdin.close()

    def exit_description(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by signal {-code}"
        return f"exited with code {code}"


class WorkerPool:
    def __init__(self, size: int, log_path: Path, *, runner_token: str = "",
                 max_size: int = 32) -> None:
        self.size = max(1, size)
        self.max_size = max(self.size, max_size)
        self.runner_token = runner_token
        self.log_path = log_path
        self.log_file = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.home = log_path.parent / "verifier-home"
        self.home.mkdir(mode=0o700, exist_ok=True)
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: set[_Worker] = set()
        self._jobs = 0  # in flight: waiting for a worker or running on one
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._spawn_locked()

    def _spawn_locked(self) -> None:
        if self._closed:
            return
        try:
            self._workers.add(_Worker(self))
        except OSError:
            logger.exception("could not start a verifier worker")

    def _on_exit(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.discard(worker)
            replace = not self._closed
        if replace:
            self._spawn()

    def run(self, job: dict[str, Any], timeout: float,
            queued: float | None = None) -> dict[str, Any]:
        """Run one job; always returns a result dict, never hangs past the deadlines.

        The reply's ``queue_ms`` is how long the job waited for a worker, since
        ``queued`` (a ``time.monotonic()``; default: now).
        """
        queued = time.monotonic() if queued is None else queued
        with self._lock:
            self._jobs += 1
            if self._jobs > len(self._workers) and len(self._workers) < self.max_size:
                self._spawn_locked()  # one worker per job in flight, up to max_size
        try:
            worker = self._take_worker()
            waited_ms = int((time.monotonic() - queued) * 1000)
            if worker is None:
                reply = failure(
                    "VerifierUnavailable",
                    "no verifier worker became ready in time (see the worker log at "
                    f"{self.log_path}); is fleet-python importable by {sys.executable}?",
                    time.perf_counter())
            else:
                reply = self._run_on(worker, job, timeout)
            return {**reply, "queue_ms": waited_ms}
        finally:
            with self._lock:
                self._jobs -= 1

    def _take_worker(self) -> _Worker | None:
        """The next idle live worker, or None if none became ready in time."""
        wait_until = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            remaining = wait_until - time.monotonic()
            if self._closed or remaining <= 0:
                return None
            try:
                worker = self._idle.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if worker.alive:
                return worker

    def _run_on(self, worker: _Worker, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            # The worker enforces ``timeout`` on the job itself (and cleans up after it);
            # this wait only catches a worker that stopped answering.
            worker.send({**job, "timeout": timeout})
            reply = worker.replies.get(timeout=timeout + SUPERVISION_SLACK_SECONDS)
        except queue.Empty:
            worker.kill()
            return failure(
                "TimeoutError",
                f"verifier did not finish within its time limit of {timeout:g} s and was "
                "killed; look for an endless loop or a blocking call, or raise the limit",
                started)
        except OSError:  # broken pipe: it died as we handed it the job
            reply = None
        if reply is None:
            worker.kill()
            return failure(
                "VerifierCrashed",
                f"the verifier process {worker.exit_description()} while running the "
                "verifier (os._exit, a segfault or a killed interpreter); the server "
                "started a fresh worker",
                started)
        self._idle.put(worker)
        return reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers)
            self._workers.clear()
        for worker in workers:
            worker.kill()
        self.log_file.close()
