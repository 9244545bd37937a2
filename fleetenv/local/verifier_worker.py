"""One verifier worker process: ``python -m fleetenv.local.verifier_worker``.

Verifier code is arbitrary Python sent over HTTP, so it never runs in the server. The
worker imports fleet-python once, then for each job (one JSON line in on stdin, one out)
forks a *job process* that runs the verifier and nothing else, in its own process group,
under resource limits (``Limits``), as ``nobody`` when the worker is root (``_Identity``),
in a temporary directory that is also its ``HOME``; the worker enforces the time limit and,
as a Linux child subreaper, also kills descendants that left the group. What this
isolates and what it does not: docs/local-fleet.md ("What isolates verifier code").

The protocol channel is a private duplicate of the original stdout, closed in job
processes; file descriptor 1 is pointed at stderr so that stray writes (C extensions,
``os.write(1, ...)``) cannot corrupt it. ``print`` inside a verifier is captured and
returned as ``stdout``.

The namespace is the one Fleet's runner gives verifier code (score constants, text
helpers, ``DatabaseSnapshot``/``IgnoreConfig``, ``json``, ``re``, ``string``); ``env`` is a
fleet-python sync env in URL mode on the instance's manager API, so every query goes over
HTTP as on Fleet.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import io
import json
import math
import os
import re
import select
import shutil
import signal
import string
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, TextIO

# Same clean-up fleet-python applies before exec'ing verifier code: the decorator would
# wrap the function in an object that swallows exceptions.
_STRIP_PATTERNS = (
    re.compile(r"@verifier\([^)]*\)\s*\n"),
    re.compile(r"^from fleet\.verifiers.*import.*$\n?", re.MULTILINE),
    re.compile(r"^from fleet import verifier.*$\n?", re.MULTILINE),
    re.compile(r"^import fleet\.verifiers.*$\n?", re.MULTILINE),
    re.compile(r"^import fleet$\n?", re.MULTILINE),
)

_clients: dict[tuple[str, str], Any] = {}


def _namespace() -> dict[str, Any]:
    from fleet.verifiers import local_executor as lx
    from fleet.verifiers.code import TASK_FAILED_SCORE, TASK_SUCCESSFUL_SCORE
    from fleet.verifiers.db import DatabaseSnapshot, IgnoreConfig, SnapshotDiff

    return {
        "__builtins__": __builtins__,
        "__name__": "verifier",
        "TASK_SUCCESSFUL_SCORE": TASK_SUCCESSFUL_SCORE,
        "TASK_FAILED_SCORE": TASK_FAILED_SCORE,
        "normalized_contains": lx.normalized_contains,
        "normalized_string_comparison": lx.normalized_string_comparison,
        "extract_numbers": lx.extract_numbers,
        "contains_number": lx.contains_number,
        "DatabaseSnapshot": DatabaseSnapshot,
        "IgnoreConfig": IgnoreConfig,
        "SnapshotDiff": SnapshotDiff,
        "Environment": object,
        "json": json,
        "re": re,
        "string": string,
    }


def _client(base_url: str, token: str) -> Any:
    import fleet

    key = (base_url, token)
    if key not in _clients:
        _clients[key] = fleet.Fleet(api_key=token, base_url=base_url, max_retries=0, timeout=60.0)
    return _clients[key]


def _decode_args(job: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Positional args and kwargs without the env placeholder and the env marker."""
    if job.get("args"):
        import cloudpickle

        payload = cloudpickle.loads(base64.b64decode(job["args"]))
        args, kwargs = list(payload.get("args", ())), dict(payload.get("kwargs") or {})
        if args and args[0] is None:
            args = args[1:]
    else:
        args, kwargs = list(job.get("args_array") or []), {}
    if args and isinstance(args[-1], dict) and "env" in args[-1]:
        args = args[:-1]
    return args, kwargs


def _find_function(namespace: dict[str, Any], name: str | None) -> Any:
    if name and inspect.isfunction(namespace.get(name)):
        return namespace[name]
    for value in namespace.values():
        if inspect.isfunction(value) and value.__code__.co_filename == "<string>":
            return value
    raise LookupError(f"no function {name!r} (or any function) defined in the verifier code")


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    fault = job.get("fault")
    if fault == "crash":
        os._exit(70)
    if fault == "hang":
        threading.Event().wait()
    started = time.perf_counter()
    captured = io.StringIO()
    try:
        source = job["source"]
        for pattern in _STRIP_PATTERNS:
            source = pattern.sub("", source)
        namespace = _namespace()
        with contextlib.redirect_stdout(captured):
            exec(compile(source, "<string>", "exec"), namespace)
            function = _find_function(namespace, job.get("function_name"))
            args, kwargs = _decode_args(job)
            env = _client(job["base_url"], job["token"]).instance(job["manager_url"])
            env.instance.load()
            result = function(env, *args, **kwargs)
        return {"success": True, "result": _jsonable(result), "error": None,
                "stdout": captured.getvalue(), "elapsed_ms": _ms(started)}
    except (Exception, SystemExit) as exc:
        error = {"type": type(exc).__name__, "message": str(exc),
                 "traceback": traceback.format_exc()}
        return {"success": False, "result": None, "error": error,
                "stdout": captured.getvalue(), "elapsed_ms": _ms(started)}


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


# ---------------------------------------------------------------------------- sandbox

class Limits:
    """What one job may use. Set in the job's process before verifier code runs."""

    MEMORY_HEADROOM_BYTES = 1024 ** 3
    """Address space (RLIMIT_AS) on top of what the warmed interpreter maps (~50 MB)."""
    FILE_SIZE_BYTES = 64 * 1024 ** 2
    """Largest file verifier code may write (RLIMIT_FSIZE); the write then fails."""
    EXTRA_PROCESSES = 64
    """Processes and threads (RLIMIT_NPROC) above what its user already runs."""
    OPEN_FILES = 1024
    CPU_GRACE_SECONDS = 1
    """CPU seconds (RLIMIT_CPU) beyond the job's wall-clock limit, per process."""


UNPRIVILEGED_USER = "nobody"
_NOGROUP_FALLBACK = 65534


class _Identity:
    """Who job processes run as: when the worker is root, an unprivileged user."""

    def __init__(self) -> None:
        self.drop = os.name == "posix" and os.geteuid() == 0
        self.uid = self.gid = -1
        if self.drop:
            import pwd

            try:
                entry = pwd.getpwnam(UNPRIVILEGED_USER)
                self.uid, self.gid = entry.pw_uid, entry.pw_gid
            except KeyError:
                self.uid = self.gid = _NOGROUP_FALLBACK
        # The interpreter may live where that user cannot look (pyenv under /root, mode
        # 0700). Directory descriptors opened now, as root, stay usable after the drop:
        # lookups through /proc/self/fd/N start inside the directory, so the job can
        # import from it, and from nothing else in the private parent.
        self.path_fds: dict[str, int] = {}
        if self.drop:
            for entry_path in dict.fromkeys(sys.path):
                if entry_path and os.path.isdir(entry_path):
                    with contextlib.suppress(OSError):
                        self.path_fds[entry_path] = os.open(
                            entry_path, os.O_RDONLY | os.O_DIRECTORY
                        )


def _proc_files(leaf: str) -> dict[int, str] | None:
    """``{pid: text of /proc/<pid>/<leaf>}`` of every process; None without /proc (macOS)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    texts = {}
    for name in names:
        if name.isdigit():
            with contextlib.suppress(OSError), open(
                    f"/proc/{name}/{leaf}", encoding="ascii", errors="replace") as file:
                texts[int(name)] = file.read()
    return texts


def _tasks_of(uid: int) -> int | None:
    """Processes and threads of ``uid`` (what RLIMIT_NPROC counts), from /proc."""
    statuses = _proc_files("status")
    if statuses is None:
        return None  # the count, and so the limit, is unknown
    count = 0
    for text in statuses.values():
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _vm_size() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 256 * 1024 ** 2


def _set_limits(identity: _Identity, timeout: float) -> None:
    import resource

    def lower(which: int, value: int) -> None:
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    cpu = math.ceil(timeout) + Limits.CPU_GRACE_SECONDS
    _soft, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    if cpu_hard == resource.RLIM_INFINITY or cpu_hard > cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    lower(resource.RLIMIT_AS, _vm_size() + Limits.MEMORY_HEADROOM_BYTES)
    lower(resource.RLIMIT_FSIZE, Limits.FILE_SIZE_BYTES)
    lower(resource.RLIMIT_CORE, 0)
    lower(resource.RLIMIT_NOFILE, Limits.OPEN_FILES)
    running = _tasks_of(identity.uid if identity.drop else os.getuid())
    if running is not None and hasattr(resource, "RLIMIT_NPROC"):
        # Counted per user, not per job: what the user already runs, plus the headroom.
        lower(resource.RLIMIT_NPROC, running + Limits.EXTRA_PROCESSES)


def _drop_privileges(identity: _Identity) -> None:
    os.setgroups([])
    os.setgid(identity.gid)
    os.setuid(identity.uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise PermissionError("could not drop root privileges for verifier code")
    # Point import paths the dropped user cannot search at the descriptors opened as root.
    remap: dict[str, str] = {}
    for entry_path, fd in identity.path_fds.items():
        if not os.access(entry_path, os.R_OK | os.X_OK):
            remap[entry_path] = f"/proc/self/fd/{fd}"
    if not remap:
        return

    def moved(path: str) -> str:
        for old, new in remap.items():
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old):]
        return path

    sys.path[:] = [moved(entry) for entry in sys.path]
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [moved(entry) for entry in search]


def _enter_sandbox(job: dict[str, Any], identity: _Identity, workdir: str) -> None:
    """In the job's process, before any verifier code: limits, user, cwd, environment."""
    with contextlib.suppress(OSError):  # the worker may already have done it
        os.setpgid(0, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-big write fails with EFBIG
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if _channel_fd is not None:  # verifier code must not be able to forge a reply
        os.close(_channel_fd)
    _set_limits(identity, float(job.get("timeout") or 30.0))
    if identity.drop:
        _drop_privileges(identity)
    os.chdir(workdir)
    os.environ["HOME"] = workdir
    os.environ["TMPDIR"] = workdir
    tempfile.tempdir = None


def _job_child(job: dict[str, Any], identity: _Identity, workdir: str, write_fd: int) -> None:
    """Body of the forked job process; never returns."""
    code = 71
    try:
        _enter_sandbox(job, identity, workdir)
        reply = run_job(job)
        data = json.dumps(reply).encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]
        code = 0
    except Exception:  # the sandbox or the reply failed: say why in the worker log
        traceback.print_exc()
    finally:
        os._exit(code)


def _children_of(parent: int) -> list[int]:
    found = []
    for pid, stat in (_proc_files("stat") or {}).items():
        fields = stat.rpartition(")")[2].split()  # after "(comm)": state, ppid, ...
        if ")" in stat and len(fields) > 1 and int(fields[1]) == parent:
            found.append(pid)
    return found


def _kill_leftovers(job_pid: int) -> None:
    """Kill the job's process group, then every orphan this subreaper has inherited."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job_pid, signal.SIGKILL)
    for _ in range(100):  # each round kills one generation of escaped descendants
        _reap_zombies()
        orphans = _children_of(os.getpid()) if _SUBREAPER else []
        if not orphans:
            return
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # an escapee may lead a group of its own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in orphans:  # only those just killed: waiting on a live one would hang
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _reap_zombies() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:  # an old kernel
        return None
    return fd


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        return f"was killed by signal {signum} ({name})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def failure(kind: str, message: str, started: float) -> dict[str, Any]:
    """The reply for a job that produced none (also the pool's, for a silent worker);
    ``started`` is a ``time.perf_counter()``."""
    return {"success": False, "result": None, "stdout": "",
            "error": {"type": kind, "message": message, "traceback": None},
            "elapsed_ms": _ms(started)}


def supervise(job: dict[str, Any], identity: _Identity) -> dict[str, Any]:
    """Run one job in a fresh sandboxed child; always returns a reply."""
    global _current_job, _current_workdir
    started = time.perf_counter()
    timeout = float(job.get("timeout") or 30.0)
    # Built once here (~30 ms) and inherited by every job; if it fails, the job's own
    # attempt reports why.
    with contextlib.suppress(Exception):
        _client(job["base_url"], job["token"])
    workdir = _current_workdir = tempfile.mkdtemp(prefix="fleetenv-verifier-")
    if identity.drop:
        os.chown(workdir, identity.uid, identity.gid)
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (read_fd, write_fd):
            os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
        _current_workdir = None
        return failure("VerifierUnavailable",
                        f"could not start a process for the verifier: {exc}", started)
    if pid == 0:
        os.close(read_fd)
        _job_child(job, identity, workdir, write_fd)
    _current_job = pid
    os.close(write_fd)
    with contextlib.suppress(OSError):  # the child does it too; whoever comes first
        os.setpgid(pid, pid)
    chunks: list[bytes] = []
    status: int | None = None
    timed_out = False
    deadline = time.monotonic() + timeout
    parent = os.getppid()
    watch = [read_fd]
    exited = _pidfd(pid)  # readable once the job process ends (Linux), else polled
    if exited is not None:
        watch.append(exited)
    try:
        while status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(watch, [], [], min(remaining, 0.25))
            if os.getppid() != parent:  # the server is gone: do not linger
                _abandon_job()
            if read_fd in ready:
                chunk = os.read(read_fd, 1 << 16)
                if chunk:
                    chunks.append(chunk)
                    continue
                watch.remove(read_fd)  # the reply is complete; the exit follows
            done, waited = os.waitpid(pid, os.WNOHANG)
            if done:
                status = waited
                if read_fd in watch:  # a descendant may hold the pipe open: take what is there
                    os.set_blocking(read_fd, False)
                    with contextlib.suppress(BlockingIOError):
                        while chunk := os.read(read_fd, 1 << 16):
                            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if exited is not None:
            os.close(exited)
        if status is None:  # timed out (or the worker itself failed): stop it now
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            _pid, status = os.waitpid(pid, 0)
        _kill_leftovers(pid)
        _current_job = None
        shutil.rmtree(workdir, ignore_errors=True)
        _current_workdir = None
    if timed_out:
        return failure(
            "TimeoutError",
            f"verifier did not finish within its time limit of {timeout:g} s and was "
            "killed with its child processes; look for an endless loop or a blocking "
            "call, or raise the limit", started)
    try:
        reply: dict[str, Any] = json.loads(b"".join(chunks))
        return reply
    except ValueError:
        how = _describe(status)
        return failure(
            "VerifierCrashed",
            f"the verifier process {how} while running the verifier (os._exit, a "
            "segfault, a resource limit or a killed interpreter); the server keeps "
            "serving", started)


# ---------------------------------------------------------------------------- main

_channel_fd: int | None = None
_SUBREAPER = False
_current_job: int | None = None
_current_workdir: str | None = None


def _abandon_job() -> None:
    """Kill the running job, its descendants and its directory; then exit."""
    if _current_job is not None:
        _kill_leftovers(_current_job)
    if _current_workdir is not None:
        shutil.rmtree(_current_workdir, ignore_errors=True)
    os._exit(0)


def _become_subreaper() -> bool:
    """Linux: orphaned descendants (even ones that left the job's session) become ours."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    pr_set_child_subreaper = 36
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _send(channel: TextIO, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def main() -> int:
    global _channel_fd, _SUBREAPER
    _channel_fd = os.dup(1)
    channel = os.fdopen(_channel_fd, "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _namespace()  # warm up: imports fleet-python and the DSL once
    import cloudpickle  # noqa: F401  # warm up: the jobs unpickle their arguments

    _SUBREAPER = _become_subreaper()
    # SIGTERM from the pool (a stop or an unanswered job): take the job down with us.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: _abandon_job())
    identity = _Identity()
    _send(channel, {"type": "ready", "pid": os.getpid(), "drops_to": identity.uid,
                    "subreaper": _SUBREAPER})
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = supervise(json.loads(line), identity)
        reply["type"] = "result"
        _send(channel, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
