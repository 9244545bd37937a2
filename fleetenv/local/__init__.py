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
``410 Gone`` with a JSON ``detail`` (fast: fleet-python does not retry 410).
Verifier code runs in a small pool of pre-warmed worker processes with a time limit
(the request's ``timeout``, capped by ``verifier_timeout``); a verifier that hangs or
kills its interpreter yields an error result and the server keeps serving. The pool
grows by one worker per verification in flight beyond it (up to
``verifier_workers_max``), and answers the time a run waited for a worker in the
``X-Verifier-Queue-Ms`` header. Each run
gets a forked process with a scrubbed environment (no API keys), resource limits (CPU,
memory, file size, processes), a fresh temporary working directory, its own process
group killed with it, and, when the server is root, the user ``nobody``. That is
damage control on one machine, not a sandbox: see ``verifier_worker``.
Read-only queries (``read_only: true``, and any query on ``seed``) are enforced by
SQLite itself (an authorizer and ``PRAGMA query_only``): ATTACH, DETACH, VACUUM and
every write are refused with a "read-only query" error.

Fault injection
---------------
``fleet.faults.add(kind, *, instance=, tool=, route=, method=, key=, seconds=, status=,
message=, times=) -> fault_id``; ``fleet.faults.clear(fault_id=None)`` removes one or
all (and releases held requests); ``fleet.faults.list()``; ``fleet.faults.expire(id)``
expires an instance now, exactly as its TTL would. ``times=None`` keeps a fault until
cleared; ``times=N`` applies it to the next N matching events (``times=1``: one-shot).
Selectors left out match everything. ``route`` is an ``fnmatch`` glob on the request
path, e.g. ``"/v1/env/instances*"`` (control plane), ``"*/api/v1/env/reset"`` (manager),
``"*/mcp*"`` (both MCP endpoints), ``"*/api/v1/mcp*"`` (computer endpoint only).
``*`` also matches ``/``, so ``"*/mcp*"`` covers both MCP endpoints; to pick the app-tools
endpoint alone, name it: ``f"/instances/{iid}/mcp*"``. ``instance`` matches instance URLs
and ``/v1/env/instances/{id}...``.

=================  ==============================  =====================================
kind               selectors / parameters          effect
=================  ==============================  =====================================
http_error         route method instance;          answer ``{"detail": message}`` with
                   status (503), message           ``status`` (e.g. 429, 500, 502, 503)
http_delay         route method instance; seconds  wait, then handle normally
http_hang          route method instance           hold the request until the fault is
                                                   cleared (then handle it) or the server
                                                   stops (then drop it)
drop_connection    route method instance           close the socket with no response
tool_delay         instance tool; seconds          wait before running the tool
tool_hang          instance tool                   hold the tool call until cleared
tool_error         instance tool; message          tool returns ``isError`` and does not
                                                   run
tool_output        instance tool; payload, size    run the tool, then append to its
                                                   result: ``huge`` = ``size`` bytes of
                                                   text, ``binary`` = ``size`` non-UTF-8
                                                   bytes as a blob resource
session_loss       instance route                  the next MCP request on an existing
                                                   session finds it forgotten: 404
                                                   "Session not found"
mcp_restart        instance route; payload         the next MCP request on an existing
                   (python typescript everything   session restarts the servers: every
                   gateway)                        session is forgotten, and forgotten
                                                   ids get that server kind's answer
                                                   (404 / 404 / 400 / 410)
mcp_starting       instance route; seconds         new MCP sessions get 503 until
                                                   ``seconds`` after the fault was added
mcp_handshake_delay instance route; seconds        each new MCP session waits
                                                   ``seconds``; the fault shows ``peak``
create_error       status (503), message,          ``POST /v1/env/instances`` fails with
                   retryable                       ``status``; ``times=N`` = N transient
                                                   failures, a 4xx = a permanent one;
                                                   ``retryable`` sends Fleet's structured
                                                   body ``{"detail": {"message",
                                                   "retryable"}}``, which overrides that
create_failed      message                         the instance is created in status
                                                   ``"error"`` (a boot failure): permanent
create_reply       payload seconds                 the instance IS created, then the
                                                   answer is held ``seconds``
                                                   (``payload="delay"``) or is a 200 that
                                                   is not JSON (``"malformed"``)
verifier_crash     instance key                    the verifier's process dies
                                                   mid-run; error result
verifier_hang      instance key                    the verifier hangs until its time
                                                   limit; error result
verifier_unavailable instance key; status (503), the verifier service answers
                   message                         ``status`` and runs nothing
verifier_delay     instance key; seconds           the verifier run is held ``seconds``
verifier_judge_error instance key; message         the verifier runs; a ``JUDGE ERROR:
                                                   <message>`` line comes first in its
                                                   stdout
=================  ==============================  =====================================

Tool executions are counted per instance and tool, and per ``_meta["fleetenv/call_id"]``
(a count above 1 for one call id means a logical call ran twice). Unknown tool names,
``tool_error`` faults and calls cancelled while held by a delay or hang do not count.

Also served: browser leases (``/v1/browser``, each with its own MCP endpoint:
``fleetenv.local.leases``), traces (``/v1/traces/*``, ``/v1/sessions/ingest``, and a
browsable page at ``/traces``: ``fleetenv.local.traces``), task import and harness jobs
(``/v1/tasks``, ``/v1/jobs``, ``/v1/sessions/job/{id}``: ``fleetenv.local.jobs``, which
runs jobs with the harness it was given; without one, a job is refused with a 501).
Heartbeats extend an instance's TTL. Not modelled: the judge routes answer 501.
"""

from __future__ import annotations

from fleetenv.local.config import LocalFleetError
from fleetenv.local.local_fleet import Faults, LocalFleet

__all__ = ["Faults", "LocalFleet", "LocalFleetError"]
