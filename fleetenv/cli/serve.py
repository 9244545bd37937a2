"""``fleetenv serve MODE``: run a server in the foreground until Ctrl-C.

Two modes, one command:

- ``fleetenv serve local``: the embedded local Fleet (a stand-in of Fleet's API on
  loopback). It prints the base URL and a throwaway token as ``export`` lines, so another
  shell can point fleet-python or fleetenv at it.
- ``fleetenv serve openenv``: Fleet tasks as an OpenEnv environment server
  (openenv-core's HTTP/WebSocket API), one Fleet instance per OpenEnv session. Tasks come
  from ``--tasks FILE`` (on Fleet with ``FLEET_API_KEY``, else on the embedded local
  Fleet) or, without it, the bundled sample tasks on the embedded local Fleet.

The older spellings still work: ``fleetenv serve [flags]`` is ``fleetenv serve local``
(with a note on stderr), and ``fleetenv serve --openenv [flags]`` is ``fleetenv serve
openenv``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

#: Defaults that differ by mode (resolved in ``run``; argparse cannot know the mode yet).
_DEFAULT_PORT = {"local": 8765, "openenv": 8000}

_LOCAL_ONLY = ("apps", "ttl_seconds", "verifier_timeout")
_OPENENV_ONLY = ("task", "tasks", "max_sessions", "session_timeout", "max_steps",
                 "unknown_reward", "allow_origin")

_TOKEN_HELP = {
    "local": "API token clients must send (default: a random one)",
    "openenv": "token clients must send, as the password of the base URL "
               "(http://fleetenv:TOKEN@host:port); 'auto' makes a random one and prints "
               "that URL (default: $FLEETENV_OPENENV_TOKEN, else none)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    parser.epilog = ("run 'fleetenv serve local --help' or 'fleetenv serve openenv --help' "
                     "for the options of each mode")
    parser.formatter_class = argparse.HelpFormatter
    # The legacy forms ('fleetenv serve --port 0', 'fleetenv serve --openenv --task K')
    # parse on this parser: it knows every option, without listing them in its help.
    parser.add_argument("--openenv", action="store_true", help=argparse.SUPPRESS)
    _add_common(parser, hidden=True, token_help="")
    _add_local(parser, hidden=True)
    _add_openenv(parser, hidden=True)
    modes = parser.add_subparsers(dest="serve_mode", metavar="MODE")
    local = modes.add_parser("local", help="the embedded local Fleet (default port 8765)",
                             description="Run the embedded local Fleet in the foreground.")
    _add_common(local, hidden=False, token_help=_TOKEN_HELP["local"])
    _add_local(local, hidden=False)
    openenv = modes.add_parser(
        "openenv", help="Fleet tasks as an OpenEnv environment server (default port 8000)",
        description="Serve Fleet tasks over OpenEnv's HTTP/WebSocket API: each OpenEnv "
                    "session gets its own Fleet instance, deleted when the session closes. "
                    "Needs openenv-core (pip install 'fleetenv[openenv]').")
    _add_common(openenv, hidden=False, token_help=_TOKEN_HELP["openenv"])
    _add_openenv(openenv, hidden=False)


def _option(parser: argparse.ArgumentParser, hidden: bool, *flags: str,
            help: str, **kwargs: Any) -> None:
    """One option, set only when given (defaults come from ``_DEFAULTS`` in ``run``): the
    top ``serve`` parser and a mode's parser both know it, and whichever parses last
    must not overwrite a value given to the other with its default. On the top parser
    (the legacy spellings) it is hidden from the help."""
    kwargs.pop("default", None)
    parser.add_argument(*flags, help=argparse.SUPPRESS if hidden else help,
                        default=argparse.SUPPRESS, **kwargs)


def _add_common(parser: argparse.ArgumentParser, *, hidden: bool, token_help: str) -> None:
    _option(parser, hidden, "--host", default="127.0.0.1",
            help="interface to bind (default 127.0.0.1)")
    _option(parser, hidden, "--port", type=int, default=None,
            help="port to bind (default 8765 local, 8000 openenv; 0 picks a free one)")
    _option(parser, hidden, "--allow-non-loopback", action="store_true", default=False,
            help="allow binding a non-loopback interface (exposes the server: anyone who "
                 "reaches it can create instances)")
    _option(parser, hidden, "--token", default=None, help=token_help)


def _add_local(parser: argparse.ArgumentParser, *, hidden: bool) -> None:
    _option(parser, hidden, "--apps", default=None, metavar="MODULE:ATTR",
            help="serve these apps ({env_key: AppSpec}) instead of the bundled sample apps")
    _option(parser, hidden, "--ttl-seconds", type=int, default=3600,
            help="default instance lifetime (default 3600)")
    _option(parser, hidden, "--verifier-timeout", type=float, default=30.0,
            help="maximum seconds one verifier may run (default 30)")


def _add_openenv(parser: argparse.ArgumentParser, *, hidden: bool) -> None:
    _option(parser, hidden, "--tasks", default=None, metavar="FILE",
            help="task file to serve (default: the bundled sample tasks, on the embedded "
                 "local Fleet)")
    _option(parser, hidden, "--task", default=None, metavar="KEY",
            help="the task a reset without task=... plays (default: the only task, if "
                 "the file has one)")
    _option(parser, hidden, "--max-sessions", type=int, default=None, metavar="N",
            help="concurrent OpenEnv sessions (default: the config's max_live_instances)")
    _option(parser, hidden, "--session-timeout", type=float, default=None, metavar="S",
            help="close a session idle this many seconds, deleting its instance "
                 "(default: never)")
    _option(parser, hidden, "--max-steps", type=int, default=None, metavar="N",
            help="turns per episode (default: the config's max_steps)")
    _option(parser, hidden, "--unknown-reward", type=float, default=None, metavar="R",
            help="reward sent for an episode whose grade is unknown (default: null)")
    _option(parser, hidden, "--allow-origin", action="append", metavar="ORIGIN",
            help="let web pages of this origin (scheme://host[:port]) use the server; "
                 "repeatable (default: only the server's own pages, and clients that are "
                 "not browsers)")


def run(args: argparse.Namespace) -> int:
    mode = _mode(args)
    if args.port is None:
        args.port = _DEFAULT_PORT[mode]
    return _run_openenv(args) if mode == "openenv" else _run_local(args)


def _mode(args: argparse.Namespace) -> str:
    chosen: str | None = getattr(args, "serve_mode", None)
    if getattr(args, "openenv", False):
        if chosen == "local":
            raise SystemExit("fleetenv serve: --openenv contradicts the 'local' mode; "
                             "use 'fleetenv serve openenv'")
        chosen = "openenv"
    if chosen is None:
        print("note: 'fleetenv serve' without a mode means 'fleetenv serve local'; "
              "spell it that way ('fleetenv serve openenv' serves OpenEnv)", file=sys.stderr)
        chosen = "local"
    _apply_defaults(args)
    other = _OPENENV_ONLY if chosen == "local" else _LOCAL_ONLY
    given = [name for name in other if getattr(args, name, None) not in (None, False)
             and not _is_default(name, getattr(args, name))]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        other_mode = "openenv" if chosen == "local" else "local"
        raise SystemExit(f"fleetenv serve {chosen}: {flags} belong(s) to 'fleetenv serve "
                         f"{other_mode}'")
    return chosen


_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1", "port": None, "token": None, "allow_non_loopback": False,
    "apps": None, "ttl_seconds": 3600, "verifier_timeout": 30.0, "tasks": None,
    "task": None, "max_sessions": None, "session_timeout": None, "max_steps": None,
    "unknown_reward": None, "allow_origin": None,
}


def _apply_defaults(args: argparse.Namespace) -> None:
    for name, value in _DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, value)


def _is_default(name: str, value: object) -> bool:
    return bool(_DEFAULTS.get(name) == value)


def _run_local(args: argparse.Namespace) -> int:
    from fleetenv.local import LocalFleet
    from fleetenv.local.traces import page_url
    from fleetenv.rollouts.harness import ScriptedHarness

    fleet = LocalFleet(
        apps=args.apps,
        host=args.host,
        port=args.port,
        token=args.token,
        allow_non_loopback=args.allow_non_loopback,
        ttl_seconds=args.ttl_seconds,
        verifier_timeout=args.verifier_timeout,
        log_level="DEBUG" if getattr(args, "debug", False) else "WARNING",
        harness=ScriptedHarness,
    )
    try:
        with fleet:
            print(f"local Fleet serving at {fleet.base_url}  (Ctrl-C to stop)")
            print(f"export FLEET_BASE_URL={fleet.base_url}")
            print(f"export FLEET_API_KEY={fleet.token}")
            print(f"traces (browser): {page_url(fleet.base_url, fleet.token)}")
            sys.stdout.flush()
            fleet.wait()
    except KeyboardInterrupt:
        print("local Fleet stopped", file=sys.stderr)
        return 0
    return 0


def _run_openenv(args: argparse.Namespace) -> int:
    _check_loopback(args.host, args.allow_non_loopback)
    from fleetenv.cli.demo import demo_config
    from fleetenv.core.task_files import bundled_tasks_path, load_tasks
    from fleetenv.fleet.session import Session

    try:
        from fleetenv.adapters.openenv.access import TOKEN_ENV, new_token, url_with_token
        from fleetenv.adapters.openenv.server import FleetServerSettings, OpenEnvServer
    except ImportError as exc:
        raise SystemExit(f"fleetenv serve openenv: {exc}") from None
    if args.tasks is None:
        tasks = load_tasks(bundled_tasks_path())
        session = Session(demo_config())  # the bundled tasks exist only locally
    else:
        tasks = load_tasks(args.tasks)
        session = Session()
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    made_token = token == "auto"
    if made_token:
        token = new_token()
    with session:
        settings = FleetServerSettings.build(tasks, session=session, default_task=args.task,
                                             unknown_reward=args.unknown_reward,
                                             max_steps=args.max_steps)
        server = OpenEnvServer(settings, host=args.host, port=args.port,
                               max_sessions=args.max_sessions,
                               session_timeout_s=args.session_timeout,
                               allowed_origins=args.allow_origin or (), token=token)
        try:
            with server:
                where = "Fleet" if not session.config.use_local else "the embedded local Fleet"
                print(f"OpenEnv server for {len(tasks)} task(s) on {where} at {server.url}  "
                      "(Ctrl-C to stop)")
                if token is None:
                    print(f"connect: GenericEnvClient(base_url={server.url!r})")
                elif made_token:  # printed once, for the operator: nobody else knows it
                    print("connect: GenericEnvClient(base_url="
                          f"{url_with_token(server.url, token)!r})")
                else:
                    print("connect: GenericEnvClient(base_url="
                          f"{url_with_token(server.url, 'TOKEN')!r})  (TOKEN: your token, "
                          "percent-encoded)")
                sys.stdout.flush()
                server.wait()
        except KeyboardInterrupt:
            print("OpenEnv server stopped", file=sys.stderr)
    return 0


def _check_loopback(host: str, allowed: bool) -> None:
    """Every OpenEnv session creates an instance on the caller's Fleet account: binding
    beyond loopback must be asked for (and wants a token)."""
    from fleetenv.local.config import is_loopback_host

    if not allowed and not is_loopback_host(host):
        raise SystemExit(f"fleetenv serve openenv: --host {host} is not a loopback address; "
                         "the server creates instances on your Fleet account for whoever "
                         "connects. Add --allow-non-loopback to serve on it anyway, with "
                         "--token auto so that only clients given its URL can")
