"""Entry point of the ``fleetenv`` command.

Each subcommand lives in its own module of this package, named like it, and exposes
``add_arguments(parser)`` (the parser's description is the module docstring) and
``run(args) -> int``.

Errors from fleetenv are printed as one readable line; ``--debug`` shows the traceback.
Ctrl-C prints one line and exits 130. ``python -m fleetenv`` runs the same ``main()``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

#: command name -> one-line help; each lives in the module ``fleetenv.cli.<name>``.
COMMANDS: dict[str, str] = {
    "demo": "run every bundled task on the embedded local Fleet with the reference policy",
    "run": "run a policy on the tasks of a task file, print the summary",
    "tools": "list the tools of an environment (provisions, then deletes)",
    "report": "summarise a results file (pass@k, per env, stop reasons)",
    "serve": "run a server in the foreground: 'local' (the embedded local Fleet) or "
             "'openenv' (Fleet tasks for OpenEnv clients)",
    "sweep": "delete the running instances of a run tag (--dry-run: list)",
    "evaluate": "score tasks with Fleet's harness jobs: k rollouts per model, per-model scores",
}

#: Third-party loggers that are chatty at INFO (one line per HTTP request or MCP message).
_NOISY_LOGGERS = ("httpx", "httpx2", "httpcore", "mcp", "uvicorn", "uvicorn.access",
                  "uvicorn.error", "urllib3", "fleet")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetenv",
        description="Run LLM-agent episodes on Fleet environments (or the embedded local Fleet).",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"fleetenv.cli.{name}")
        module.add_arguments(sub.add_parser(
            name, help=help_text, description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    configure_logging(debug=args.debug)
    module = importlib.import_module(f"fleetenv.cli.{args.command}")
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt as exc:
        summary = getattr(exc, "summary", None) or "interrupted"
        print(f"fleetenv {args.command}: {summary}", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        from fleetenv.core.redaction import redact

        print(f"fleetenv {args.command}: error: {redact(str(exc)) or type(exc).__name__}",
              file=sys.stderr)
        print("(run with --debug for the traceback)", file=sys.stderr)
        return 1


def configure_logging(*, debug: bool) -> None:
    """Quiet by default: fleetenv's own INFO messages, only warnings from everything else.

    A run would otherwise print a line per HTTP request (httpx), per MCP message (mcp) and
    per lifecycle event; the summary table is what the user came for, and every event is in
    the results file anyway. ``--debug`` turns everything on.
    """
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if debug:
        return
    # A command's messages are read by a person, not grepped from a service log: no
    # timestamp or logger name, and a level only when it is not plain information.
    for handler in logging.getLogger().handlers:
        if getattr(handler, "stream", None) in (sys.stderr, sys.stdout):
            handler.setFormatter(PlainFormatter())
    logging.getLogger("fleetenv").setLevel(logging.INFO)
    # Per-episode lifecycle events (started, provisioned, completed, deleted) are INFO;
    # failures among them are WARNING or above and still show.
    logging.getLogger("fleetenv.events").setLevel(logging.WARNING)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class PlainFormatter(logging.Formatter):
    """``message`` for INFO, ``warning: message`` / ``error: message`` above it (the
    traceback of a logged exception only with ``--debug``, which keeps the full format)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno <= logging.INFO:
            return message
        return f"{record.levelname.lower()}: {message}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
