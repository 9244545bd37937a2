"""How fast the embedded local Fleet is ready to serve, from a cold interpreter.

Measured in the same run, each in a fresh ``python -c`` process, alternating rounds:

(a) ``import fleetenv.local`` + ``LocalFleet().start()`` + the first answered control-plane
    request (the issue's target: under 2 s);
(b) the floor for any Python ASGI server here: import uvicorn and starlette and answer one
    request from a one-route app on the same kind of socket.

Also the seed-database build time per sample app (in process, best of 5), and, warm
and in process, how long provisioning one instance takes per bundled app: (c)
fleet-python's ``client.make(app)`` until it returns a running instance, against (d) the
floor of any control-plane request, ``client.instance(id)`` (one GET) with the same client,
interleaved, medians over ``--makes`` rounds (the tests used to assert (c) < 5 s).

Prints a table; the LAST line is JSON:
``{"cold_start_s": ..., "asgi_floor_s": ..., "ratio_vs_floor": ..., "seed_build_ms": {...},
"make_ms": {...}, "control_get_ms": ..., "make_ratio_vs_get": {...}}``.

    python tests/benchmarks/bench_local_start.py [--rounds 5] [--makes 10]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCAL_FLEET = """
import http.client, time
t0 = time.perf_counter()
from fleetenv.local import LocalFleet
with LocalFleet() as local:
    port = int(local.base_url.rsplit(':', 1)[1])
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=10)
    conn.request('GET', '/v1/env/', headers={'Authorization': 'Bearer ' + local.token})
    assert conn.getresponse().status == 200
    print(time.perf_counter() - t0)
"""

ASGI_FLOOR = """
import http.client, socket, threading, time
t0 = time.perf_counter()
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
app = Starlette(routes=[Route('/v1/env/', lambda request: JSONResponse([]))])
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(('127.0.0.1', 0))
server = uvicorn.Server(uvicorn.Config(app, log_level='warning'))
threading.Thread(target=server.run, kwargs={'sockets': [sock]}, daemon=True).start()
while not server.started:
    time.sleep(0.002)
conn = http.client.HTTPConnection('127.0.0.1', sock.getsockname()[1], timeout=10)
conn.request('GET', '/v1/env/')
assert conn.getresponse().status == 200
print(time.perf_counter() - t0)
server.should_exit = True
"""


def run_probe(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip().splitlines()
    return float(out[-1])


def seed_build_ms() -> dict[str, float]:
    from fleetenv.local.apps import APPS

    timings = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, spec in sorted(APPS.items()):
            best = float("inf")
            for attempt in range(5):
                path = Path(tmp) / f"{key}-{attempt}.sqlite"
                with sqlite3.connect(path) as conn:
                    started = time.perf_counter()
                    spec.build_database(conn, *spec.default_data)
                    best = min(best, time.perf_counter() - started)
                conn.close()
            timings[key] = round(best * 1000, 1)
    return timings


def provisioning_ms(rounds: int) -> tuple[dict[str, float], float]:
    """Median ms of (c) ``client.make(app)`` per bundled app and of (d) one control GET."""
    from fleetenv.local import LocalFleet

    makes: dict[str, list[float]] = {}
    gets: list[float] = []
    with LocalFleet() as local:
        client = local.client()
        apps = sorted(env.env_key for env in client.list_envs())
        for app in apps:  # warm up every app's first-instance path once
            client.make(app).close()
        for _ in range(rounds):
            for app in apps:
                started = time.perf_counter()
                env = client.make(app)
                makes.setdefault(app, []).append(time.perf_counter() - started)
                assert env.status == "running", env.status
                started = time.perf_counter()
                client.instance(env.instance_id)
                gets.append(time.perf_counter() - started)
                env.close()
        client._httpx_client.close()
    return ({app: round(statistics.median(v) * 1000, 1) for app, v in makes.items()},
            round(statistics.median(gets) * 1000, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--makes", type=int, default=10, help="rounds of (c)/(d)")
    args = parser.parse_args()
    run_probe(LOCAL_FLEET)  # warm the OS file cache and .pyc files once
    local, floor = [], []
    for _ in range(args.rounds):  # alternate, so machine noise hits both alike
        local.append(run_probe(LOCAL_FLEET))
        floor.append(run_probe(ASGI_FLOOR))
    cold, base = statistics.median(local), statistics.median(floor)
    seeds = seed_build_ms()
    makes, get_ms = provisioning_ms(args.makes)
    print(f"{'measure':<44}{'median':>10}")
    print(f"{'(a) LocalFleet cold start to first answer':<44}{cold:>9.3f}s")
    print(f"{'(b) uvicorn+starlette floor':<44}{base:>9.3f}s")
    for key, ms in seeds.items():
        print(f"{'seed build ' + key:<44}{ms:>8.1f}ms")
    for key, ms in makes.items():
        print(f"{'(c) make ' + key:<44}{ms:>8.1f}ms  = {ms / get_ms:.0f}x (d)")
    print(f"{'(d) control-plane GET (same client)':<44}{get_ms:>8.2f}ms")
    print(json.dumps({"cold_start_s": round(cold, 3), "asgi_floor_s": round(base, 3),
                      "ratio_vs_floor": round(cold / base, 2), "seed_build_ms": seeds,
                      "make_ms": makes, "control_get_ms": get_ms,
                      "make_ratio_vs_get": {k: round(v / get_ms, 1) for k, v in makes.items()}}))


if __name__ == "__main__":
    main()
