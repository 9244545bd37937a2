"""Serve Fleet tasks over OpenEnv and play one with openenv-core's own client.

The same server as ``fleetenv serve openenv``, started in-process on a free port. With no
``FLEET_API_KEY`` it runs the bundled sample tasks on the embedded local Fleet. Needs
``pip install 'fleetenv[openenv]'``.
"""

from __future__ import annotations

from openenv.core.generic_client import GenericEnvClient

from fleetenv import Session, bundled_tasks_path
from fleetenv.adapters.openenv.server import FleetServerSettings, OpenEnvServer
from fleetenv.core.task_files import load_tasks
from fleetenv.core.tasks import Task

TASK = "helpdesk-assign-api-ticket"


def main() -> None:
    tasks = load_tasks(bundled_tasks_path())
    with Session() as session:  # every OpenEnv session's FleetEnv runs on this one
        settings = FleetServerSettings.build(tasks, session=session, default_task=TASK)
        play(settings, tasks)


def play(settings: FleetServerSettings, tasks: list[Task]) -> None:
    with OpenEnvServer(settings, port=0) as server, \
            GenericEnvClient(base_url=server.url).sync() as env:
        result = env.reset()  # the default task
        print("prompt:", result.observation["text"][:70], "...")
        # A model would write these; here, the task's reference solution.
        reference = next(t for t in tasks if t.key == TASK).reference_solution
        for call in reference:
            result = env.step({"tool_name": call.name, "arguments": dict(call.arguments)})
            print(f"  {call.name} -> {result.observation['text'][:60]!r}")
        result = env.step({"text": "Ticket 1124 is assigned to Daniel Kim, priority high."})
        info = result.observation["info"]
        print(f"openenv_server done={result.done} stop_reason={info['stop_reason']} "
              f"reward={result.reward}")


if __name__ == "__main__":
    main()
