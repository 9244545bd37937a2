"""``fleetenv sweep --tag TAG``: delete the running instances created under a run tag.

Every instance fleetenv creates carries its session's (or runner's) run tag. When a
delete failed even after its retries, and fleetenv could not delete the instance at exit
either, the warning names this command with the tag to sweep. The instance would
otherwise run until its TTL. ``--dry-run`` only lists what would be deleted.

It talks to Fleet with ``FLEET_API_KEY`` (and ``FLEET_BASE_URL``). Only sweep a tag when
nothing created under it is still in use: a running episode's instance is deleted too.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tag", required=True, metavar="TAG",
                        help="the run tag (e.g. fleetenv-0123456789ab) whose running "
                             "instances to delete")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the running instances with that tag, delete nothing")


def run(args: argparse.Namespace) -> int:
    from fleetenv.core.errors import ConfigurationError
    from fleetenv.fleet.leases import sweep_leases
    from fleetenv.fleet.session import Session

    tag = args.tag.strip()
    if not tag:
        raise ConfigurationError("--tag is empty", hint="pass the run tag to sweep")
    with Session() as session:
        if session.is_local:
            print("note: no FLEET_API_KEY, so this sweeps a fresh embedded local Fleet, "
                  "which has no instances of other processes")
        found = session.provisioner.sweep_tag(tag, dry_run=args.dry_run)
        found += sweep_leases(session, tag, dry_run=args.dry_run)  # browser leases too
        where = session.base_url
    if not found:
        print(f"no running instance tagged {tag} on {where}")
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(found)} running instance(s) tagged {tag} on {where}:")
    for instance_id in found:
        print(f"  {instance_id}")
    return 0
