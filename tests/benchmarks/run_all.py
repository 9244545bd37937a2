"""Run every benchmark, one after another, and rewrite the figures in the docs.

    python tests/benchmarks/run_all.py --quick      # about 7 minutes on 2 quiet cores
    python tests/benchmarks/run_all.py              # the full sizes (up to 1,024 episodes)
    python tests/benchmarks/run_all.py --quick --dry-run   # print the tables only
    python tests/benchmarks/run_all.py --from-json run.json  # re-render a saved run

Each ``bench_*.py`` script of this directory runs in its own interpreter (its output is
shown as it comes), and the last line it prints, one JSON object, is its result. When
every benchmark succeeded, the generated parts of ``docs/performance.md`` (the figures
table, the scale table) and of ``README.md`` (its performance table) are rewritten
between their ``<!-- name:start -->`` / ``<!-- name:end -->`` markers, with the date, the
commit and the machine (cores, CPU model, Python, load average at the start of each
benchmark). A failed benchmark rewrites nothing and the exit status is 1. ``--json PATH``
also writes every benchmark's result there; ``--from-json PATH`` renders such a file again
without running anything.

The benchmarks run one at a time: they measure a shared machine, and each compares
fleetenv with its baseline in the same run, so noise hits both alike. The rollouts
benchmark runs twice: on the machine as it is, and with one busy-loop process per core
(``--hog``), the "machine is busy" condition.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # for instruments

from instruments import machine  # noqa: E402 - after the path is set

CORES = os.cpu_count() or 1
#: How long one benchmark may take before it is stopped (the full scale run is the longest).
TIMEOUT_S = 3 * 3600


@dataclass(frozen=True)
class Bench:
    """One benchmark run: its script, its arguments, how its result reads in the table."""

    key: str
    script: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    target: str
    cell: Callable[[dict[str, Any]], str]


# ----------------------------------------------------------------------------- cells

def _mcp_call(r: dict[str, Any]) -> str:
    return (f"(a) {r['fleetenv_ms']:.2f} ms, (b) {r['raw_async_ms']:.2f} ms: ratio "
            f"**{r['ratio_vs_raw_async']:.2f}**; (c) {r['session_per_call_ms']:.1f} ms: "
            f"**{r['speedup_vs_session_per_call']:.1f}x** slower than (a)")


def _call_layers(r: dict[str, Any]) -> str:
    layers = r["layers"]
    steps = ", ".join(f"{name} {row['cpu_us_per_call']:.0f} us "
                      f"(**{row['ratio_vs_expert']:.2f}**, +{row['added_us']:.0f})"
                      for name, row in layers.items() if name != "expert")
    call, wake = r["hand_offs"].values()
    return (f"client CPU per call, one episode, sequential: expert raw "
            f"{layers['expert']['cpu_us_per_call']:.0f} us; {steps}; a hand-off alone "
            f"{call:.0f} us (a bare wake-up of the loop: {wake:.0f} us)")


def _rollouts(r: dict[str, Any]) -> str:
    parts = []
    for size, report in r["sizes"].items():
        rows = report["rows"]
        modes = [f"{mode} **{rows[f'fleetenv/{mode}']['ratio_vs_raw']:.2f}** "
                 f"({rows[f'fleetenv/{mode}']['ratio_vs_raw_expert']:.2f})"
                 for mode in r["modes"]]
        cpu = ", ".join(
            f"{name.removeprefix('fleetenv/')} {row['cpu_ms_per_call']:.2f}"
            + (f" (loop {row['loop_cpu_ms_per_call']:.2f})" if "loop_cpu_ms_per_call" in row
               else "")
            for name, row in rows.items())
        rate = ", ".join(f"{name.removeprefix('fleetenv/')} {row['calls_per_s']:.0f}"
                         for name, row in rows.items())
        load = report["load"]
        busy = (f"; cores {load['machine_busy']:.0%} busy" if "machine_busy" in load else "")
        hog = (f", {load['processes']} hog(s) at {load.get('hog_core_share', 0):.0%} of a core"
               if load["processes"] else "")
        failures = report.get("failures", [])
        failed = f"; **{len(failures)} failure(s)**: {'; '.join(failures)}" if failures else ""
        parts.append(f"{size} x {r['calls']}: ratio vs raw (vs expert) {', '.join(modes)}; "
                     f"calls/s {rate}; client CPU ms per call {cpu}; "
                     f"{report['loop_threads']} loop thread{busy}{hog}{failed}")
    return "<br>".join(parts)


def _scale(r: dict[str, Any]) -> str:
    cells = []
    for size, rows in r["sizes"].items():
        ratios = "; ".join(
            f"{name.removeprefix('fleetenv/')} {row['ratio_vs_asyncio']:.2f} "
            f"({row['ratio_vs_asyncio_expert']:.2f})"
            for name, row in rows.items() if name.startswith("fleetenv/"))
        failed = sum(row["failed"] for row in rows.values())
        cells.append(f"{size}: {ratios}" + (f", **{failed} failed**" if failed else ""))
    return ("ratio vs the asyncio program (vs the expert one), by concurrent episodes: "
            + "<br>".join(cells) + "<br>see [Scale](#scale)")


def _local_start(r: dict[str, Any]) -> str:
    seeds = ", ".join(f"{ms:.0f} ms ({app})" for app, ms in r["seed_build_ms"].items())
    makes = ", ".join(f"{ms:.0f} ms ({app})" for app, ms in r["make_ms"].items())
    return (f"**{r['cold_start_s']:.2f} s** (floor {r['asgi_floor_s']:.2f} s); seed "
            f"databases build in {seeds}; `make` takes {makes}")


def _runner_batch(r: dict[str, Any]) -> str:
    return (f"(a) {r['parallel_batch_s']:.2f} s, (b) {r['serial_batch_s']:.2f} s per batch "
            f"of {r['tasks']}: speedup {r['speedup']:.2f}")


def _screenshot(r: dict[str, Any]) -> str:
    shots = ", ".join(f"{v['screenshot_ms']:.1f} ms ({app})" for app, v in r.items())
    ratios = ", ".join(f"{v['ratio_vs_encode']:.2f}x" for v in r.values())
    return f"{shots}; {ratios} the encoding alone"


def _ray_nodes(r: dict[str, Any]) -> str:
    rates = ", ".join(f"{count} node(s) {row['episodes_per_s']:.2f}"
                      for count, row in r["nodes"].items())
    return (f"episodes/s, RayRunner(workers={r['workers']}, per_worker={r['per_worker']}), "
            f"{r['episodes']} episodes: {rates}; ratio **{r['ratio_vs_one_node']:.2f}** "
            "(nodes on one machine share its cores)")


BENCHMARKS = (
    Bench("bench_mcp_call.py", "bench_mcp_call.py", (), (),
          "ratio <= 1.15; speedup >= 10", _mcp_call),
    Bench("bench_call_layers.py", "bench_call_layers.py", (), (),
          "(measured, no target)", _call_layers),
    Bench("bench_rollouts.py", "bench_rollouts.py",
          ("--episodes", "64", "--mode", "both", "--rounds", "5"),
          ("--episodes", "64,256", "--mode", "both", "--rounds", "5"),
          ">= 1.0 asyncio mode, >= 0.95 thread mode (vs raw); >= 0.95 (vs expert)",
          _rollouts),
    Bench(f"bench_rollouts.py --hog {CORES}", "bench_rollouts.py",
          ("--episodes", "64", "--mode", "threads", "--rounds", "3", "--hog", str(CORES)),
          ("--episodes", "64,256", "--mode", "threads", "--rounds", "3", "--hog", str(CORES)),
          ">= 0.85 thread mode (vs raw)", _rollouts),
    Bench("bench_scale.py", "bench_scale.py", ("--sizes", "1,16,64", "--rounds", "2"), (),
          ">= 1.0 vs raw, >= 0.95 vs expert, at every size", _scale),
    Bench("bench_local_start.py", "bench_local_start.py", (), (), "< 2 s", _local_start),
    Bench("bench_runner_batch.py", "bench_runner_batch.py", (), (),
          "(measured, no target)", _runner_batch),
    Bench("bench_screenshot.py", "bench_screenshot.py", (), (),
          "(measured, no target)", _screenshot),
    Bench("bench_ray_nodes.py", "bench_ray_nodes.py", ("--rounds", "3"),
          ("--samples", "4", "--rounds", "5"), "(measured, no target)", _ray_nodes),
)


# ----------------------------------------------------------------------------- running

def run(bench: Bench, quick: bool) -> dict[str, Any]:
    """Run one benchmark, echoing its output; its result (last JSON line) and context."""
    args = bench.quick if quick else bench.full
    command = [sys.executable, str(HERE / bench.script), *args]
    print(f"\n=== {bench.key}: {' '.join(command[1:])}", flush=True)
    load = machine()["loadavg"]
    started = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    last = ""
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        watchdog = threading.Timer(TIMEOUT_S, proc.kill)  # a hung benchmark is stopped
        watchdog.start()
        try:
            for line in proc.stdout:
                print(f"  {line.rstrip()[:400]}", flush=True)
                if line.strip():
                    last = line.strip()
            code = proc.wait()
        finally:
            watchdog.cancel()
    seconds = time.perf_counter() - started
    outcome: dict[str, Any] = {"command": " ".join(["python", str(Path(
        "tests/benchmarks") / bench.script), *args]), "loadavg_at_start": load,
        "seconds": round(seconds, 1), "exit_code": code}
    try:
        outcome["result"] = json.loads(last) if code == 0 else None
    except ValueError:
        outcome["result"] = None
    if outcome["result"] is None:
        print(f"=== {bench.key} FAILED (exit {code}); last line: {last[:300]}", flush=True)
    return outcome


def commit() -> str:
    """The short commit of the checkout, marked when it has uncommitted changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, timeout=30,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha} (with uncommitted changes)" if dirty else sha


# ----------------------------------------------------------------------------- tables

def provenance(run_info: dict[str, Any]) -> str:
    box = run_info["machine"]
    return (f"Measured {run_info['date']} at commit `{run_info['commit']}` on "
            f"{box['cores']} cores ({box['cpu']}), Python {box['python']}, load average "
            f"{'/'.join(f'{v:.2f}' for v in box['loadavg'])} at the start, by "
            f"`python tests/benchmarks/run_all.py{' --quick' if run_info['quick'] else ''}` "
            f"({run_info['minutes']:.0f} min).")


def figures_table(run_info: dict[str, Any]) -> str:
    lines = [provenance(run_info), "",
             "| benchmark | result | target | load at start |", "|---|---|---|---|"]
    for bench in BENCHMARKS:
        outcome = run_info["benchmarks"].get(bench.key)
        if outcome is None:  # a run saved before this benchmark existed (--from-json)
            continue
        load = outcome["loadavg_at_start"]
        lines.append(f"| `{outcome['command'].removeprefix('python ')}` | "
                     f"{bench.cell(outcome['result'])} | {bench.target} | "
                     f"{f'{load[0]:.2f}' if load else '?'} |")
    return "\n".join(lines)


def _scale_rows(run_info: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = run_info["benchmarks"]["bench_scale.py"]["result"]
    sizes: dict[str, Any] = result["sizes"]
    return sizes


def scale_table(run_info: dict[str, Any]) -> str:
    lines = [
        "| episodes | thread mode: ratio (vs expert), CPU/call (loop) | asyncio mode: ratio "
        "(vs expert), CPU/call (loop) | asyncio program: CPU/call | expert program: "
        "CPU/call | requests / connections per episode (threads; asyncio program; expert) "
        "| peak threads (threads, asyncio mode) | failed |",
        "|---|---|---|---|---|---|---|---|"]
    for size, rows in _scale_rows(run_info).items():
        def fleet(mode: str, rows: dict[str, Any] = rows) -> str:
            row = rows.get(f"fleetenv/{mode}")
            if row is None:
                return "(not run)"
            return (f"{row['ratio_vs_asyncio']:.2f} ({row['ratio_vs_asyncio_expert']:.2f}), "
                    f"{row['cpu_ms_per_call']:.2f} ms ({row['loop_cpu_ms_per_call']:.2f})")

        wire = "; ".join(
            f"{rows[name]['requests_per_episode']:.0f} / "
            f"{rows[name]['connections_per_episode']:.1f}"
            for name in ("fleetenv/threads", "asyncio", "asyncio-expert") if name in rows)
        threads = ", ".join(str(rows[name]["peak_threads"])
                            for name in ("fleetenv/threads", "fleetenv/asyncio") if name in rows)
        failed = sum(row["failed"] for row in rows.values())
        lines.append(
            f"| {int(size):,} | {fleet('threads')} | {fleet('asyncio')} | "
            f"{rows['asyncio']['cpu_ms_per_call']:.2f} ms | "
            f"{rows['asyncio-expert']['cpu_ms_per_call']:.2f} ms | {wire} | {threads} | "
            f"{failed} |")
    return "\n".join(lines)


def readme_table(run_info: dict[str, Any]) -> str:
    sizes = _scale_rows(run_info)
    header = "| concurrent episodes | " + " | ".join(f"{int(s):,}" for s in sizes) + " |"
    lines = [header, "|---|" + "---|" * len(sizes)]
    for mode in ("threads", "asyncio"):
        for raw, label in (("asyncio", "the asyncio program"),
                           ("asyncio_expert", "the expert asyncio program")):
            cells = []
            for rows in sizes.values():
                row = rows.get(f"fleetenv/{mode}")
                cells.append(f"{row[f'ratio_vs_{raw}']:.2f}" if row else "-")
            name = "thread" if mode == "threads" else "asyncio"
            lines.append(f"| `Runner`, {name} mode, vs {label} | " + " | ".join(cells) + " |")
    date, sha = run_info["date"], run_info["commit"]
    box = run_info["machine"]
    load = run_info["benchmarks"]["bench_scale.py"]["loadavg_at_start"]
    lines += ["", f"(Measured {date} at commit `{sha}` on {box['cores']} cores, load average "
              f"{load[0]:.1f} at the start, by `python tests/benchmarks/run_all.py"
              f"{' --quick' if run_info['quick'] else ''}`.)"]
    return "\n".join(lines)


def replace_between(text: str, name: str, body: str, where: str) -> str:
    """``text`` with what lies between the ``name`` markers replaced by ``body``."""
    pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(\n<!-- {name}:end -->)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{where} has no <!-- {name}:start --> ... <!-- {name}:end --> "
                         "markers; add them where the generated table belongs")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text, count=1)


def rewrite(run_info: dict[str, Any]) -> None:
    docs = ROOT / "docs" / "performance.md"
    text = docs.read_text(encoding="utf-8")
    text = replace_between(text, "figures", figures_table(run_info), "docs/performance.md")
    text = replace_between(text, "scale", scale_table(run_info), "docs/performance.md")
    docs.write_text(text, encoding="utf-8")
    readme = ROOT / "README.md"
    text = replace_between(readme.read_text(encoding="utf-8"), "performance",
                           readme_table(run_info), "README.md")
    readme.write_text(text, encoding="utf-8")
    print(f"rewrote the figures in {docs.relative_to(ROOT)} and {readme.relative_to(ROOT)}")


# ----------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="the quick sizes (64 episodes at most)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the tables, rewrite no file")
    parser.add_argument("--json", metavar="PATH",
                        help="also write every benchmark's result (JSON) to PATH")
    parser.add_argument("--from-json", metavar="PATH",
                        help="run nothing: render the tables of a run saved with --json")
    options = parser.parse_args()
    if options.from_json:
        run_info = json.loads(Path(options.from_json).read_text(encoding="utf-8"))
    else:
        started = time.perf_counter()
        run_info = {"date": datetime.date.today().isoformat(), "commit": commit(),
                    "machine": machine(), "quick": options.quick, "benchmarks": {}}
        for bench in BENCHMARKS:
            run_info["benchmarks"][bench.key] = run(bench, options.quick)
        run_info["minutes"] = (time.perf_counter() - started) / 60
    if options.json and not options.from_json:
        Path(options.json).write_text(json.dumps(run_info, indent=1) + "\n", encoding="utf-8")
    failed = [key for key, outcome in run_info["benchmarks"].items()
              if outcome["result"] is None]
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}; no figures rewritten")
    print(f"\nall benchmarks ran in {run_info['minutes']:.1f} min\n")
    for render in (figures_table, scale_table, readme_table):
        print(render(run_info), end="\n\n")
    if not options.dry_run:
        rewrite(run_info)


if __name__ == "__main__":
    main()
