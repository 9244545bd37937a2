"""The subprocess side of ``LocalFleet(in_process=False)``: ``python -m fleetenv.local.child``.

It runs an ordinary in-process ``LocalFleet``, prints one JSON line with its base URL
when ready, and stops cleanly when its stdin closes (the parent stopped it, or died) or
on SIGTERM. The token arrives in ``FLEETENV_LOCAL_TOKEN``, never on the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from types import FrameType

from fleetenv.local.local_fleet import LocalFleet


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fleetenv.local.child")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--apps", default=None)
    parser.add_argument("--harness", default=None)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--ttl-seconds", type=int, default=3600)
    parser.add_argument("--verifier-timeout", type=float, default=30.0)
    parser.add_argument("--verifier-workers", type=int, default=2)
    parser.add_argument("--verifier-workers-max", type=int, default=32)
    parser.add_argument("--instance-limit", type=int, default=1000)
    parser.add_argument("--allow-non-loopback", action="store_true")
    return parser


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> int:
    args = _parser().parse_args()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    fleet = LocalFleet(
        apps=args.apps,
        host=args.host,
        port=args.port,
        token=os.environ.pop("FLEETENV_LOCAL_TOKEN", None),
        log_level=args.log_level,
        allow_non_loopback=args.allow_non_loopback,
        ttl_seconds=args.ttl_seconds,
        verifier_timeout=args.verifier_timeout,
        verifier_workers=args.verifier_workers,
        verifier_workers_max=args.verifier_workers_max,
        instance_limit=args.instance_limit,
        harness=args.harness,
    )
    with fleet:
        sys.stdout.write(json.dumps({"base_url": fleet.base_url}) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the parent closes our stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
