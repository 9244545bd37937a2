"""What verifier code can reach on the local Fleet (issue 11/7).

Verifier code arrives over HTTP and is arbitrary Python. Each test sends real verifier
code through ``POST /v1/verifiers/execute`` (as fleet-python builds it) to a local Fleet
started with secrets in its own environment, and checks what that code sees and what is
left of it afterwards.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import io
import os
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import pytest
from _support.fixtures_local import TEST_APPS
from _support.waiting import poll_until, wait_for

from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(60)

SECRETS = {"OPENAI_API_KEY": "sk-isolation-test-secret",
           "FLEET_API_KEY": "fleet-isolation-test-secret",
           "SOME_SERVICE_TOKEN": "token-isolation-test-secret"}


def bundle_for(code: str) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("verifier.py", code)
    return buffer.getvalue(), hashlib.sha256(buffer.getvalue()).hexdigest()


def execute(fleet: LocalFleet, instance_id: str, code: str, *args: Any,
            timeout: float = 20) -> dict[str, Any]:
    """POST /v1/verifiers/execute exactly as fleet-python builds it."""
    bundle, sha = bundle_for(code)
    marker = {"env": instance_id}
    pickled = cloudpickle.dumps({"args": (None, *args, marker), "kwargs": {}})
    body = {
        "key": "isolation-test", "sha256": sha,
        "args": base64.b64encode(pickled).decode(), "args_array": [*args, marker],
        "function_name": code.split("def ", 1)[1].split("(", 1)[0],
        "timeout": timeout, "bundle": base64.b64encode(bundle).decode(),
    }
    response = httpx.post(f"{fleet.base_url}/v1/verifiers/execute", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {fleet.token}"})
    assert response.status_code == 200, response.text
    return response.json()


COUNTS_NOTES = '''
def count_notes(env):
    rows = env.db("current").query("SELECT COUNT(*) FROM notes").rows
    return rows[0][0]
'''


@pytest.fixture(scope="module")
def fleet() -> Iterator[LocalFleet]:
    saved = {name: os.environ.get(name) for name in SECRETS}
    os.environ.update(SECRETS)  # the server (and so its worker pool) starts with them
    try:
        with LocalFleet(apps=TEST_APPS, verifier_timeout=10.0, verifier_workers=1) as local:
            yield local
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def instance_id(fleet: LocalFleet) -> Iterator[str]:
    client = fleet.client()
    env = client.make("notes")
    yield env.instance_id
    env.close()
    client._httpx_client.close()


def still_serving(fleet: LocalFleet, instance_id: str) -> None:
    outcome = execute(fleet, instance_id, COUNTS_NOTES)
    assert outcome["success"] is True and outcome["result"] == 2, outcome["error"]


def test_environment_is_scrubbed(fleet: LocalFleet, instance_id: str) -> None:
    code = "import os\n\ndef look(env):\n    return dict(os.environ)\n"
    outcome = execute(fleet, instance_id, code)
    assert outcome["success"] is True, outcome["error"]
    seen: dict[str, str] = outcome["result"]
    for name, secret in SECRETS.items():
        assert name not in seen
        assert all(secret not in value for value in seen.values())
    assert not any(k.endswith(("_KEY", "_TOKEN", "_SECRET")) for k in seen
                   if k != "RUNNER_AUTH_TOKEN"), sorted(seen)
    assert "PATH" in seen
    assert seen.get("HOME") != os.environ.get("HOME")
    assert seen["HOME"].startswith(tempfile.gettempdir())


def test_cwd_and_home_are_a_fresh_temp_dir_removed_after(fleet: LocalFleet,
                                                         instance_id: str) -> None:
    code = ("import os\n\ndef where(env):\n"
            "    open('scratch.txt', 'w').write('x')\n"
            "    return [os.getcwd(), os.environ['HOME'], os.listdir('.')]\n")
    first = execute(fleet, instance_id, code)
    assert first["success"] is True, first["error"]
    cwd, home, listing = first["result"]
    assert cwd == home and listing == ["scratch.txt"]
    assert Path(cwd).parent == Path(tempfile.gettempdir()).resolve()
    assert cwd != os.getcwd()
    assert not Path(cwd).exists()  # removed when the verifier finished
    second = execute(fleet, instance_id, code)
    assert second["result"][0] != cwd


@pytest.mark.skipif(os.name != "posix" or os.getuid() != 0, reason="the server must be root")
def test_root_server_runs_verifiers_unprivileged(fleet: LocalFleet, instance_id: str) -> None:
    code = ("import os\n\ndef who(env):\n"
            "    return [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()]\n")
    outcome = execute(fleet, instance_id, code)
    assert outcome["success"] is True, outcome["error"]
    uid, euid, gid, egid, groups = outcome["result"]
    assert uid != 0 and euid != 0 and gid != 0 and egid != 0 and 0 not in groups
    # and it cannot read what only root can
    private = Path(tempfile.mkdtemp())
    try:
        secret = private / "root-only.txt"
        secret.write_text("root only")
        secret.chmod(0o600)
        reads = execute(fleet, instance_id,
                        f"def peek(env):\n    return open({str(secret)!r}).read()\n")
        assert reads["success"] is False and reads["error"]["type"] == "PermissionError"
    finally:
        shutil.rmtree(private)
    # nor the SQLite files behind the manager API (it reads them over HTTP, as on Fleet)
    pattern = str(Path(tempfile.gettempdir()) / "fleetenv-local-*" / "instances" / "**")
    assert glob.glob(pattern, recursive=True)  # as root, the test sees them
    files = execute(fleet, instance_id,
                    f"import glob\n\ndef find(env):\n"
                    f"    return glob.glob({pattern!r}, recursive=True)\n")
    assert files["success"] is True and files["result"] == [], files
    # lazily imported stdlib modules still load (the interpreter may live under /root)
    imports = execute(fleet, instance_id,
                      "def imp(env):\n    import fractions, decimal, csv\n"
                      "    return str(fractions.Fraction(1, 3))\n")
    assert imports["success"] is True and imports["result"] == "1/3", imports["error"]


def test_two_gib_allocation_fails_cleanly(fleet: LocalFleet, instance_id: str) -> None:
    code = "def hog(env):\n    block = bytearray(2 * 1024 ** 3)\n    return len(block)\n"
    outcome = execute(fleet, instance_id, code)
    assert outcome["success"] is False
    assert outcome["error"]["type"] == "MemoryError", outcome["error"]
    still_serving(fleet, instance_id)


def test_big_file_is_stopped_by_the_file_size_limit(fleet: LocalFleet,
                                                    instance_id: str) -> None:
    code = ("def fill(env):\n"
            "    chunk = b'x' * (1024 * 1024)\n"
            "    with open('big.bin', 'wb') as out:\n"
            "        for _ in range(1024):\n"
            "            out.write(chunk)\n"
            "    return 'wrote 1 GiB'\n")
    outcome = execute(fleet, instance_id, code)
    assert outcome["success"] is False, outcome["result"]
    assert outcome["error"]["type"] == "OSError", outcome["error"]
    assert "File too large" in outcome["error"]["message"]
    still_serving(fleet, instance_id)


def test_process_count_is_limited(fleet: LocalFleet, instance_id: str) -> None:
    code = ("import subprocess\n\ndef spawn(env):\n"
            "    children = []\n"
            "    try:\n"
            "        for _ in range(400):\n"
            "            children.append(subprocess.Popen(['sleep', '30']))\n"
            "    except OSError as exc:\n"
            "        return ['refused', len(children), str(exc)]\n"
            "    return ['allowed', len(children), '']\n")
    outcome = execute(fleet, instance_id, code)
    assert outcome["success"] is True, outcome["error"]
    verdict, count, _ = outcome["result"]
    assert verdict == "refused" and count < 400, outcome["result"]
    still_serving(fleet, instance_id)


@pytest.fixture
def pid_dir() -> Iterator[Path]:
    # Written by the verifier, which may run as another user: not under tmp_path (0700).
    directory = Path(tempfile.mkdtemp(prefix="fleetenv-isolation-"))
    directory.chmod(0o777)
    yield directory
    shutil.rmtree(directory)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # dead, waiting for its parent to reap it


GRANDCHILD = '''
import os, subprocess

def leave_children(env, pid_dir, hang, escape):
    child = subprocess.Popen(["sleep", "300"], start_new_session=escape)
    with open(os.path.join(pid_dir, "cwd"), "w") as out:
        out.write(os.getcwd())
    with open(os.path.join(pid_dir, "pid"), "w") as out:
        out.write(str(child.pid))
    while hang:
        pass
    return child.pid
'''


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("hang, escape", [(True, False), (False, False), (True, True),
                                          (False, True)],
                         ids=["timeout", "returned", "timeout-new-session",
                              "returned-new-session"])
def test_grandchildren_die_with_the_verifier(fleet: LocalFleet, instance_id: str,
                                             pid_dir: Path, hang: bool, escape: bool) -> None:
    outcome = execute(fleet, instance_id, GRANDCHILD, str(pid_dir), hang, escape,
                      timeout=2 if hang else 20)
    if hang:
        assert outcome["success"] is False and outcome["error"]["type"] == "TimeoutError"
    else:
        assert outcome["success"] is True, outcome["error"]
    pid = int((pid_dir / "pid").read_text())
    # Death comes with the verifier's end: no pause, only the time to be reaped.
    assert poll_until(lambda: _gone(pid), 5.0), f"grandchild {pid} outlived the verifier"
    assert not Path((pid_dir / "cwd").read_text()).exists()
    still_serving(fleet, instance_id)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("escape", [False, True], ids=["same-group", "new-session"])
def test_stopping_the_server_kills_a_running_verifier_and_its_children(
    pid_dir: Path, escape: bool
) -> None:
    outcomes: list[Any] = []
    with LocalFleet(apps=TEST_APPS, verifier_timeout=30.0, verifier_workers=1) as local:
        client = local.client()
        instance = client.make("notes").instance_id

        def run() -> None:
            try:
                outcomes.append(execute(local, instance, GRANDCHILD, str(pid_dir), True, escape))
            except (httpx.HTTPError, AssertionError) as exc:  # the server went away
                outcomes.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        pid_file = pid_dir / "pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), 20, "the grandchild")
        pid = int(pid_file.read_text())
        assert _alive(pid)
        client._httpx_client.close()
    # LocalFleet.__exit__ stopped the pool: worker, verifier and grandchild are gone.
    assert poll_until(lambda: _gone(pid), 5.0), f"grandchild {pid} outlived the server"
    assert not Path((pid_dir / "cwd").read_text()).exists()  # its temp dir is removed
    runner.join(timeout=10)


def _alive(pid: int) -> bool:
    return not _gone(pid)
