"""Trace upload: every finished episode's transcript goes to a Fleet trace job.

Runs on a local Fleet when FLEET_API_KEY is not set (no account needed):

    python examples/traces.py

``Runner(traces="job name")`` creates the trace job on the first upload and sends each
finished episode (transcript with its screenshots, reward, task, model, instance and
verifier execution id) from a background thread, so the rollouts never wait for it.
Upload failures are retried inside a budget, then counted, never fatal:
``runner.trace_report()`` says what was sent. On Fleet the job appears in Fleet's UI;
on a local Fleet, ``fleetenv serve`` prints the address of a page that shows them.
"""

from __future__ import annotations

import contextlib
import os
import sys

import httpx

from fleetenv import Runner, bundled_tasks_path, load_tasks, resolve_config
from fleetenv.local import LocalFleet

JOB = "examples-traces"


def main() -> int:
    tasks = load_tasks(bundled_tasks_path())
    chosen = ([t for t in tasks if t.modality == "tool_use"][:2]
              + [t for t in tasks if t.modality == "computer_use"][:1])

    with contextlib.ExitStack() as stack:
        if os.environ.get("FLEET_API_KEY"):
            config, local = resolve_config(), None
        else:  # our own local Fleet, so we can read the traces back from it below
            local = stack.enter_context(LocalFleet())
            config = resolve_config(api_key=local.token, base_url=local.base_url)

        with Runner(workers=3, config=config, traces=JOB) as runner:
            for result in runner.run(chosen, "reference"):
                print(f"{result.task_key}: reward={result.reward} "
                      f"instance={result.instance_id}")
        report = runner.trace_report()
        assert report is not None
        print(report.summary())

        if local is not None and report.job_id:
            # The local Fleet's read route (Fleet's own UI reads its store directly).
            job = httpx.get(f"{local.base_url}/v1/traces/jobs/{report.job_id}",
                            headers={"Authorization": f"Bearer {local.token}"},
                            timeout=10.0).json()
            for session in job["sessions"]:
                print(f"  stored {session['task_key']}: {session['message_count']} "
                      f"messages, score={session['metadata']['score']}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
