"""fleetenv.local: an embedded stand-in of Fleet on loopback (docs/local-fleet.md).

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

One server, one port: the control plane under ``/v1`` (``control_plane``, with
``leases``, ``traces``, ``jobs``, ``verification``), each instance under
``/instances/{id}/`` (its manager API, ``manager_api``, and MCP servers, ``mcp_host``),
the admin routes behind ``LocalFleet``'s inspection and fault methods under ``/_local``
(``admin``, ``faults``), and the trace page under ``/traces``.
"""

from __future__ import annotations

from fleetenv.local.config import LocalFleetError
from fleetenv.local.local_fleet import Faults, LocalFleet

__all__ = ["Faults", "LocalFleet", "LocalFleetError"]
