"""The original's context tools, trace upload and task evaluator, on fleetenv's own.

Porting is one changed import line, so every name SkyRL's and Tinker's integrations
import from ``envs.fleet_env`` imports from ``fleetenv.adapters.openenv`` too, with the
original's signatures. Underneath are fleetenv's implementations
(:mod:`fleetenv.env.context_tools`, :mod:`fleetenv.fleet.traces`,
:mod:`fleetenv.fleet.evaluator`); docs/porting.md lists where they behave differently.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from fleetenv import runtime
from fleetenv.core.errors import FleetEnvError, TraceUploadError
from fleetenv.env.context_tools import CONTEXT_TOOL_NAMES, CONTEXT_TOOLS, ContextTools
from fleetenv.fleet.session import Session

__all__ = [
    "CONTEXT_TOOLS",
    "CONTEXT_TOOL_NAMES",
    "ContextManager",
    "TaskEvaluator",
    "create_trace_job",
    "evaluate_task",
    "upload_trace",
]

logger = logging.getLogger("fleetenv.openenv")


class ContextManager:
    """OpenEnv's context-management tool kit (``check_context``, ``manage_context``,
    ``search_history``, ``search_tool_output``, ``view_tool_output``), answered by
    :class:`fleetenv.env.context_tools.ContextTools`. With a ``FleetEnv``, prefer
    ``FleetEnv(task, context_tools=True)``: the env then answers these tools itself."""

    def __init__(self, max_output_chars: int = 10000) -> None:
        self._tools = ContextTools(max_output_chars)

    max_output_chars = property(attrgetter("_tools.max_output_chars"))
    full_history = property(attrgetter("_tools.full_history"))
    last_full_output = property(attrgetter("_tools.last_full_output"))

    def reset(self) -> None:
        self._tools.reset()

    def get_tools(self) -> list[dict[str, Any]]:
        return self._tools.tools()

    def is_context_tool(self, name: str) -> bool:
        return self._tools.is_context_tool(name)

    def track_message(self, message: Mapping[str, Any]) -> None:
        self._tools.track(message)

    def truncate_output(self, output: Any) -> Any:
        """Strings longer than the cap are cut (the rest stays reachable); anything else
        is returned as it is, as the original did."""
        return self._tools.truncate(output) if isinstance(output, str) else output

    def execute_tool(self, name: str, args: Mapping[str, Any],
                     chat_history: list[dict[str, Any]]
                     ) -> tuple[str, list[dict[str, Any]]]:
        """``(answer, history)``: the history is the trimmed one after ``manage_context``,
        else ``chat_history`` itself."""
        reply = self._tools.execute(name, args, chat_history)
        history = [dict(m) for m in reply.history] if reply.history is not None \
            else chat_history
        return reply.text, history


# ---------------------------------------------------------------------- traces

async def create_trace_job(api_key: str, name: str, *, jobs_url: str | None = None) -> str:
    """OpenEnv's ``create_trace_job``: a trace job on Fleet; returns its id. Raises
    :class:`~fleetenv.errors.TraceUploadError` when Fleet refuses. ``jobs_url``: the host
    that serves trace jobs when it is not the Fleet base URL."""
    from fleetenv.fleet.traces import TraceClient

    client = TraceClient(Session.shared(api_key=api_key), jobs_url=jobs_url)
    return await runtime.current().run_blocking(client.create_job, name)


async def upload_trace(api_key: str, job_id: str, task_key: str, model: str,
                       chat_history: list[dict[str, Any]], reward: float | None,
                       instance_id: str | None = None,
                       metadata: dict[str, Any] | None = None,
                       verifier_execution_id: str | None = None) -> str | None:
    """OpenEnv's ``upload_trace``: one episode's chat history to a trace job; returns the
    session id, or ``None`` when the upload failed (logged, never raised, as the
    original). Images stay inline (capped), not rewritten to a bucket."""
    from fleetenv.fleet.traces import TraceClient, trace_body

    client = TraceClient(Session.shared(api_key=api_key))
    try:
        body = trace_body(chat_history, job_id=job_id, task_key=task_key, model=model,
                          reward=reward, instance_id=instance_id,
                          verifier_execution_id=verifier_execution_id,
                          metadata=metadata, secrets=(api_key,) if api_key else ())
        return await runtime.current().run_blocking(client.ingest, body)
    except (TraceUploadError, FleetEnvError) as exc:
        logger.warning("trace upload for task %s failed: %s", task_key, exc)
        return None


# ---------------------------------------------------------------------- evaluation

class TaskEvaluator:
    """OpenEnv's ``TaskEvaluator``: Fleet harness jobs that grade a task with hosted
    models, on :class:`fleetenv.Evaluator`. ``evaluate`` returns the original's dict;
    a rollout without a score is ``None`` in ``results_per_model`` and counted in
    ``num_errors``."""

    def __init__(self, api_key: str | None = None, k_rollouts: int = 4,
                 models: list[str] | None = None, max_steps: int = 30,
                 poll_interval_s: float = 10, max_poll_time_s: float = 1800) -> None:
        from fleetenv.fleet.evaluator import Evaluator

        self._evaluator = Evaluator(session=Session.shared(api_key=api_key), k=k_rollouts,
                                    models=models, max_steps=max_steps,
                                    poll_interval_s=poll_interval_s,
                                    timeout_s=max_poll_time_s)

    async def evaluate(self, prompt: str, verifier_code: str, env_key: str,
                       env_version: str = "",
                       env_variables: Mapping[str, Any] | None = None,
                       data_key: str | None = None,
                       data_version: str | None = None) -> dict[str, Any]:
        from fleetenv.core.tasks import Task

        digest = hashlib.sha256(f"{prompt}\n{verifier_code}".encode()).hexdigest()[:12]
        task = Task(key=f"eval-{digest}", prompt=prompt, verifier=verifier_code,
                    env_key=env_key, env_version=env_version or None,
                    env_variables=dict(env_variables or {}), data_key=data_key,
                    data_version=data_version)
        result = await self._evaluator.evaluate_async(task)
        return {
            "results_per_model": {name: scores.scores
                                  for name, scores in result.models.items()},
            "total_duration_s": result.seconds,
            "num_sessions": result.num_sessions,
            "num_errors": result.num_errors,
            "job_id": result.job_id,
        }


async def evaluate_task(prompt: str, verifier_code: str, env_key: str,
                        env_version: str = "", api_key: str | None = None,
                        k_rollouts: int = 4, models: Sequence[str] | None = None
                        ) -> dict[str, Any]:
    """OpenEnv's ``evaluate_task``: one `TaskEvaluator` run."""
    evaluator = TaskEvaluator(api_key=api_key, k_rollouts=k_rollouts,
                              models=list(models) if models is not None else None)
    return await evaluator.evaluate(prompt, verifier_code, env_key, env_version)
