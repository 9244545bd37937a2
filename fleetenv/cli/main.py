"""Entry point of the ``fleetenv`` command.

Each subcommand lives in its own module of this package and exposes
``add_parser(subparsers)`` and ``run(args) -> int``. Modules are imported only when
their command runs, so ``fleetenv --help`` stays fast.

Errors from fleetenv are printed as one readable line; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("fleetenv.cli.serve", "run the embedded local Fleet in the foreground"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetenv",
        description="Run LLM-agent episodes on Fleet environments (or the embedded local Fleet).",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_parser(sub, name, help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        from fleetenv.core.errors import redact

        print(f"fleetenv {args.command}: error: {redact(str(exc)) or type(exc).__name__}",
              file=sys.stderr)
        print("(run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
