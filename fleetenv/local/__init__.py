"""fleetenv.local: an embedded stand-in of Fleet on loopback.

The unmodified fleet-python SDK provisions, resets, queries, verifies and deletes
against it, and MCP clients list and call tools on it, exactly as they would on Fleet::

    from fleetenv.local import LocalFleet
    import fleet

    with LocalFleet() as local:                      # serves fleetenv.local.apps.APPS
        client = fleet.Fleet(api_key=local.token, base_url=local.base_url, max_retries=0)
        env = client.make("helpdesk")                # POST /v1/env/instances
        mcp_url = f"{env.urls.root}mcp"              # app tools; computer: {root}api/v1/mcp
        env.close()

It sits on top of fleetenv and imports none of the stack that talks to it (only the plain
task model of ``fleetenv.core``, to check imported tasks): what runs harness jobs is
given to it, ``LocalFleet(harness=...)``. Importing this package is cheap: mcp, uvicorn
and fleet-python are imported when a server starts.

Layout of one server (one port; ``{root}`` = ``{base_url}/instances/{id}/``):

* control plane ``/v1/...`` (bearer token ``LocalFleet.token``): instances (create with
  idempotent ``X-Request-ID``, get, list by status, delete, batch delete, heartbeat),
  environments, regions, account, runner token, verifier check/execute;
* ``{root}api/v1/env/...``: the manager API over the instance's SQLite files (reset,
  resources, describe, query honouring ``read_only``, structured diff, health, and the
  ``cdp`` browser resource when Chromium is installed), 404 without ``X-Runner-Token``
  (served at ``/v1/runner-auth/token``), as on gated Fleet clusters;
* ``{root}mcp`` and ``{root}api/v1/mcp`` (with or without a trailing slash):
  streamable-HTTP MCP servers with the app's tools and its ``computer`` tool;
* ``/_local/...`` (same token): the admin routes behind ``LocalFleet.instances()``,
  ``tool_call_counts()``, ``tool_calls_by_call_id()`` and ``LocalFleet.faults``.

Instances stop when deleted or when ``ttl_seconds`` (default 3600) runs out; the
control plane then reports ``status: "stopped"`` and every instance URL answers
``410 Gone`` with a JSON ``detail`` (fast: fleet-python does not retry 410). Verifier
code runs in forked, resource-limited processes of a pool of pre-warmed workers
(``worker_pool``, ``verifier_worker``): damage control on one machine, not a sandbox.
Read-only queries are enforced by SQLite itself (``databases``). Also served: browser
leases (``leases``), traces (``traces``), task import and harness jobs (``jobs``).

Fault injection (``LocalFleet.faults``, kinds in ``faults.KINDS``), what is imitated and
what is not, and how verifier code is isolated: docs/local-fleet.md.
"""

from __future__ import annotations

from fleetenv.local.config import LocalFleetError
from fleetenv.local.local_fleet import Faults, LocalFleet

__all__ = ["Faults", "LocalFleet", "LocalFleetError"]
