"""Fleet's task import (``/v1/tasks``) and harness jobs (``/v1/jobs``,
``/v1/sessions/job/{id}``), on the local Fleet (docs/evaluate.md, "On the local Fleet").

The wire format is fleet-python 0.2.133's (``import_single_task``, ``create_job``,
``get_job``, ``list_jobs``, ``list_job_sessions``). There is no model here: the harness
runs two stand-in models, ``reference`` (replays the task's reference solution) and
``noop`` (finishes at once). Each session is one real episode over HTTP and MCP against
this server, run in a worker thread by the :class:`~fleetenv.local.config.Harness` this
Fleet was given (``LocalFleet(harness=...)``), so the local Fleet never imports the stack
that runs episodes; without one, creating a job is a 501 that says so.

Bounds: ``max_concurrent_per_model`` sessions of a job at once (at most
:data:`MAX_CONCURRENT_SESSIONS`), ``max_duration_minutes`` per job (then it ends
``errored``), and a server stop cancels every running job, closing its episodes.
"""

from __future__ import annotations

import functools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetenv.local.config import Harness
from fleetenv.local.instances import iso
from fleetenv.local.state import LocalFleetState
from fleetenv.local.wire import ControlPlaneError, guarded, json_body

__all__ = ["LOCAL_MODELS", "MAX_CONCURRENT_SESSIONS", "JobRoutes"]

#: The models the local harness runs (see the module docstring).
LOCAL_MODELS = ("reference", "noop")
#: Sessions of one job that run at once, whatever the request asks.
MAX_CONCURRENT_SESSIONS = 4
#: Job modes (``JobCreateRequest.mode``) and the task modality each runs.
_MODES = {"tool-use": "tool_use", "computer-use": "computer_use",
          "browser-use": "browser_use"}


@dataclass
class LocalSession:
    session_id: str
    task_key: str
    model: str
    created_at: float
    status: str = "pending"
    started_at: float | None = None
    ended_at: float | None = None
    step_count: int = 0
    verifier: dict[str, Any] | None = None
    error: str | None = None

    def response(self) -> dict[str, Any]:
        """A ``fleet.models.SessionInfo``."""
        return {
            "session_id": self.session_id,
            "instance": None,
            "model": self.model,
            "status": self.status,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "step_count": self.step_count,
            "verifier_execution": self.verifier,
            "error": self.error,
        }


@dataclass
class LocalJob:
    job_id: str
    name: str | None
    created_at: float
    models: list[str]
    pass_k: int
    tasks: list[dict[str, Any]]
    modality: str | None
    max_steps: int | None
    max_seconds: float
    concurrency: int
    status: str = "pending"
    error: str | None = None
    sessions: list[LocalSession] = field(default_factory=list)

    def response(self) -> dict[str, Any]:
        """A ``fleet.models.JobResponse`` plus what the local Fleet knows besides."""
        done = sum(1 for s in self.sessions if s.status in ("completed", "failed"))
        return {"id": self.job_id, "name": self.name, "created_at": iso(self.created_at),
                "status": self.status, "error": self.error,
                "total_sessions": len(self.sessions), "finished_sessions": done}


class JobRoutes:
    """The handlers; ``control_plane.build_router`` mounts them."""

    def __init__(self, state: LocalFleetState) -> None:
        self.state = state
        self.tasks: dict[str, dict[str, Any]] = {}
        self.projects: dict[str, set[str]] = {}
        self.imported_at: dict[str, float] = {}
        self.jobs: dict[str, LocalJob] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/v1/tasks", guarded(self.import_task), methods=["POST"]),
            Route("/v1/tasks", guarded(self.list_tasks), methods=["GET"]),
            Route("/v1/tasks/{task_key}", guarded(self.get_task), methods=["GET"]),
            Route("/v1/jobs", guarded(self.create_job), methods=["POST"]),
            Route("/v1/jobs", guarded(self.list_jobs), methods=["GET"]),
            Route("/v1/jobs/{job_id}", guarded(self.get_job), methods=["GET"]),
            Route("/v1/sessions/job/{job_id}", guarded(self.job_sessions), methods=["GET"]),
        ]

    # ----- tasks --------------------------------------------------------------------------

    async def import_task(self, request: Request) -> Response:
        body = await json_body(request)
        canonical = self._validate_task(body)
        key = canonical["key"]
        self.tasks[key] = _in_fleet_names(body, canonical)
        self.imported_at[key] = time.time()
        project = request.query_params.get("project_key")
        if project:
            self.projects.setdefault(project, set()).add(key)
        return JSONResponse(self._task_response(key))

    async def list_tasks(self, request: Request) -> Response:
        """``fleet.Fleet().load_tasks(...)``: the imported tasks, filtered."""
        q = request.query_params
        keys = q.getlist("task_keys") or list(self.tasks)
        project = q.get("project_key") or q.get("task_project_key")
        out = []
        for key in keys:
            task = self.tasks.get(key)
            if task is None or (q.get("env_key") and task.get("env_id") != q["env_key"]):
                continue
            if project and key not in self.projects.get(project, set()):
                continue
            out.append(self._task_response(key))
        return JSONResponse({"tasks": out, "total": len(out)})

    async def get_task(self, request: Request) -> Response:
        key = request.path_params["task_key"]
        if key not in self.tasks:
            raise ControlPlaneError(404, f"Task '{key}' not found; import it first "
                                    "(POST /v1/tasks)")
        return JSONResponse(self._task_response(key))

    def _task_response(self, key: str) -> dict[str, Any]:
        """A ``fleet.models.TaskResponse``."""
        body = self.tasks[key]
        return {
            "key": key, "prompt": body["prompt"], "team_id": "local",
            "environment_id": body["env_id"],
            "created_at": iso(self.imported_at[key]),
            "verifier_func": body.get("verifier_func"), "version": body.get("version"),
            "data_id": body.get("data_id"), "data_version": body.get("data_version"),
            "env_variables": body.get("env_variables") or {},
            "metadata": body.get("metadata") or {},
        }

    def _validate_task(self, body: dict[str, Any]) -> dict[str, Any]:
        """The task in canonical fields, or a 422 / 400 naming what is wrong."""
        from fleetenv.core.errors import ConfigurationError
        from fleetenv.core.tasks import Task

        if not isinstance(body.get("verifier_func"), str) or not body["verifier_func"].strip():
            raise ControlPlaneError(422, "field 'verifier_func' is required: a task is "
                                    "imported with the source of its verifier")
        try:
            task = Task(**body)
        except ConfigurationError as exc:
            raise ControlPlaneError(422, f"invalid task: {exc}") from exc
        if task.env_key not in self.state.apps:
            raise ControlPlaneError(400, f"Environment '{task.env_key}' not found (local "
                                    f"Fleet serves: {', '.join(sorted(self.state.apps))})")
        return {"key": task.key, "env_key": task.env_key, "env_version": task.env_version,
                "data_key": task.data_key, "data_version": task.data_version}

    # ----- jobs ---------------------------------------------------------------------------

    async def create_job(self, request: Request) -> Response:
        if self.state.harness is None:
            raise ControlPlaneError(501, "this local Fleet runs no harness jobs: it was "
                                    "built without a harness (LocalFleet(harness=...), "
                                    "e.g. fleetenv.rollouts.harness.ScriptedHarness)")
        body = await json_body(request)
        models = body.get("models")
        if not isinstance(models, list) or not models:
            raise ControlPlaneError(422, "field 'models' must be a non-empty list")
        unknown = [m for m in models if m not in LOCAL_MODELS]
        if unknown:
            raise ControlPlaneError(400, f"model(s) {unknown} are not run by the local Fleet; "
                                    f"its harness runs {list(LOCAL_MODELS)} (no LLM here)")
        pass_k = _positive_int(body, "pass_k", 1)
        max_steps = body.get("max_steps")
        if max_steps is not None:
            max_steps = _positive_int(body, "max_steps", 1)
        minutes = _positive_int(body, "max_duration_minutes", 60)
        concurrency = min(_positive_int(body, "max_concurrent_per_model", 30),
                          MAX_CONCURRENT_SESSIONS)
        mode = body.get("mode")
        if mode is not None and mode not in _MODES:
            raise ControlPlaneError(422, f"field 'mode' must be one of {sorted(_MODES)}, "
                                    f"got {mode!r}")
        tasks = self._job_tasks(body)
        job = LocalJob(job_id=f"job-{secrets.token_hex(6)}", name=body.get("name"),
                       created_at=time.time(), models=list(models), pass_k=pass_k,
                       tasks=tasks, modality=_MODES[mode] if mode else None,
                       max_steps=max_steps, max_seconds=minutes * 60.0,
                       concurrency=concurrency)
        for task in tasks:
            for model in models:
                for _ in range(pass_k):
                    job.sessions.append(LocalSession(
                        session_id=f"sess-{secrets.token_hex(6)}", task_key=task["key"],
                        model=model, created_at=job.created_at))
        self.jobs[job.job_id] = job
        self.state.task_group.start_soon(self._run_job, job, self.state.harness())
        return JSONResponse({"job_id": job.job_id, "workflow_job_id": None,
                             "status": job.status, "name": job.name})

    def _job_tasks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        keys = body.get("task_keys")
        if keys is not None:
            if not isinstance(keys, list) or not keys:
                raise ControlPlaneError(422, "field 'task_keys' must be a non-empty list")
            missing = [k for k in keys if k not in self.tasks]
            if missing:
                raise ControlPlaneError(400, f"task(s) {missing} not found: import them "
                                        "first (POST /v1/tasks)")
            selected = list(dict.fromkeys(keys))
        elif body.get("project_key"):
            selected = sorted(self.projects.get(str(body["project_key"]), ()))
        elif body.get("env_key"):
            selected = sorted(k for k, t in self.tasks.items()
                              if t.get("env_id") == body["env_key"])
        else:
            raise ControlPlaneError(422, "name the tasks: one of 'task_keys', 'env_key' or "
                                    "'project_key' is required")
        excluded = set(body.get("excluded_task_keys") or ())
        tasks = [self.tasks[k] for k in selected if k not in excluded]
        if not tasks:
            raise ControlPlaneError(400, "the job selects no imported task")
        return tasks

    async def list_jobs(self, request: Request) -> Response:
        jobs = [job.response() for job in self.jobs.values()]
        return JSONResponse({"jobs": jobs, "total": len(jobs)})

    async def get_job(self, request: Request) -> Response:
        return JSONResponse(self._job(request).response())

    async def job_sessions(self, request: Request) -> Response:
        job = self._job(request)
        groups = []
        for task in job.tasks:
            sessions = [s for s in job.sessions if s.task_key == task["key"]]
            scores = [s.verifier["score"] for s in sessions
                      if s.verifier and s.verifier.get("score") is not None]
            passed = sum(1 for score in scores if score >= 1.0)
            groups.append({
                "task_id": task["key"],
                "task": {"key": task["key"], "prompt": task["prompt"],
                         "env_id": task.get("env_id"), "version": task.get("version"),
                         "verifier_func": task.get("verifier_func"),
                         "metadata": task.get("metadata") or {}},
                "total_sessions": len(sessions),
                "passed_sessions": passed,
                "pass_rate": passed / len(sessions) if sessions else 0.0,
                "average_score": sum(scores) / len(scores) if scores else None,
                "sessions": [s.response() for s in sessions],
            })
        return JSONResponse({"job_id": job.job_id, "total_sessions": len(job.sessions),
                             "tasks": groups})

    def _job(self, request: Request) -> LocalJob:
        job_id = request.path_params["job_id"]
        job = self.jobs.get(job_id)
        if job is None:
            raise ControlPlaneError(404, f"Job '{job_id}' not found")
        return job

    # ----- the harness --------------------------------------------------------------------

    async def _run_job(self, job: LocalJob, harness: Harness) -> None:
        job.status = "running"
        limiter = anyio.CapacityLimiter(job.concurrency)
        tasks = {task["key"]: task for task in job.tasks}
        try:
            with anyio.move_on_after(job.max_seconds) as scope:
                async with anyio.create_task_group() as group:
                    for session in job.sessions:
                        group.start_soon(self._run_session, job, session,
                                         tasks[session.task_key], harness, limiter)
        except BaseException:  # cancelled (the server stops): close the episodes
            harness.cancel()
            raise
        if scope.cancelled_caught:
            harness.cancel()
            for session in job.sessions:
                if session.status in ("pending", "running"):
                    session.status, session.ended_at = "failed", time.time()
                    session.error = "the job ran past its max_duration_minutes"
            job.status = "errored"
            job.error = f"the job ran past its max_duration_minutes ({job.max_seconds:g} s)"
            return
        failures = [s for s in job.sessions if s.status == "failed"]
        if failures and len(failures) == len(job.sessions):
            job.status = "errored"
            job.error = f"every session failed; first: {failures[0].error}"
        else:
            job.status = "completed"

    async def _run_session(self, job: LocalJob, session: LocalSession, task: dict[str, Any],
                           harness: Harness, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            session.status, session.started_at = "running", time.time()
            run = functools.partial(harness.run, base_url=self.state.base_url,
                                    token=self.state.config.token, task=task,
                                    model=session.model, modality=job.modality,
                                    max_steps=job.max_steps)
            try:
                outcome = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
            except Exception as exc:  # the harness itself broke: this session failed
                outcome = {"error": f"{type(exc).__name__}: {exc}"}
            session.ended_at = time.time()
            session.step_count = int(outcome.get("turns") or 0)
            session.verifier = outcome.get("verifier")
            session.error = outcome.get("error")
            session.status = "failed" if session.error else "completed"


def _in_fleet_names(body: dict[str, Any], canonical: dict[str, Any]) -> dict[str, Any]:
    """The task as sent, with its identity fields under Fleet's export names only (the
    names jobs and filters read), whatever aliases it came with."""
    from fleetenv.core.task_fields import ALIASES

    names = {"key": "key", "env_key": "env_id", "env_version": "version",
             "data_key": "data_id", "data_version": "data_version"}
    out = {k: v for k, v in body.items()
           if not any(k in ALIASES[field] for field in names)}
    out.update({fleet_name: canonical[field] for field, fleet_name in names.items()})
    return out


def _positive_int(body: dict[str, Any], name: str, default: int) -> int:
    value = default if body.get(name) is None else body[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ControlPlaneError(422, f"field '{name}' must be an integer >= 1, got {value!r}")
    return value

