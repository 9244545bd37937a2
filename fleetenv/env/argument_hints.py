"""Errors for arguments of the wrong type at the public entry points, with what to pass.

``FleetEnv("helpdesk")`` is the classic: a string that names an environment or a task.
It is refused rather than looked up, because a key alone does not say where the task
comes from (your task file, Fleet's task list, the bundled samples that only the local
Fleet serves); the error says how to get the :class:`~fleetenv.Task` for that key.
"""

from __future__ import annotations

from fleetenv.core.errors import ArgumentTypeError

__all__ = ["session_type_error", "task_type_error"]

_LOAD = "tasks = {t.key: t for t in fleetenv.load_tasks('tasks.json')}"


def _bundled() -> tuple[set[str], set[str]]:
    """Keys of the bundled sample tasks, and of their environments (empty if unreadable)."""
    try:
        from fleetenv.core.task_files import bundled_tasks_path, load_tasks

        tasks = load_tasks(bundled_tasks_path())
    except Exception:  # only a better hint is lost
        return set(), set()
    return {t.key for t in tasks}, {t.env_key for t in tasks}


def task_type_error(value: object, *, where: str = "FleetEnv") -> ArgumentTypeError:
    """The error for ``where(value)`` when ``value`` is not a Task or a task dict."""
    kind = type(value).__name__
    if isinstance(value, str):
        task_keys, env_keys = _bundled()
        if value in task_keys:
            hint = ("it is one of the bundled sample tasks: tasks = {t.key: t for t in "
                    "fleetenv.load_tasks(fleetenv.bundled_tasks_path())}; "
                    f"{where}(tasks[{value!r}])")
        elif value in env_keys or ":" in value:
            hint = (f"{value!r} names an environment, not a task; load tasks of it "
                    f"({_LOAD}) and pass one, e.g. {where}(tasks['<task key>'])")
        else:
            hint = f"load the task and pass it: {_LOAD}; {where}(tasks[{value!r}])"
        return ArgumentTypeError(f"{where} needs a fleetenv.Task (or a task dict), got the "
                                 f"string {value!r:.80}", hint=hint)
    return ArgumentTypeError(f"{where} needs a fleetenv.Task (or a task dict), got a {kind}",
                             hint=f"pass one task, e.g. {_LOAD}; {where}(tasks['<key>'])"
                             if isinstance(value, list | tuple) else
                             "pass a fleetenv.Task, or a dict in a task file's format")


def session_type_error(value: object, *, where: str = "FleetEnv") -> ArgumentTypeError:
    """The error for ``session=`` that is not a :class:`fleetenv.Session`."""
    kind = type(value).__name__
    hint = ("pass config=... for a FleetConfig" if kind == "FleetConfig"
            else "pass api_key=... (and base_url=...) for a key" if isinstance(value, str)
            else "pass a fleetenv.Session, or leave session= out for the default one")
    return ArgumentTypeError(f"{where}(session=...) must be a fleetenv.Session, got a {kind}",
                             hint=hint)
