"""Fleet's harness jobs on the local Fleet: each session one real episode, played by a
scripted policy that needs no model (the ``reference`` and ``noop`` models of
docs/evaluate.md) through fleetenv's own ``run_episode``, on a private session against
the local Fleet over HTTP and MCP, exactly as any client would run it.

The local Fleet never imports the stack: whoever builds it from the top (the default
backend registered by ``fleetenv/__init__.py``, ``fleetenv serve``, the test fixtures)
passes it this class, ``LocalFleet(harness=ScriptedHarness)``.
"""

from __future__ import annotations

from typing import Any

from fleetenv.core.tasks import Task
from fleetenv.fleet.session import Session
from fleetenv.rollouts.policy import ScriptedPolicy
from fleetenv.rollouts.rollout import CancelToken, run_episode

__all__ = ["HARNESS_PROVISION_BUDGET_S", "ScriptedHarness"]

#: How long a session may try to get an instance (transient failures are retried).
HARNESS_PROVISION_BUDGET_S = 60.0


class ScriptedHarness:
    """Runs the sessions of one harness job; ``cancel()`` closes every episode of it,
    which ends any tool call in flight."""

    def __init__(self) -> None:
        self._cancel = CancelToken()

    def cancel(self) -> None:
        self._cancel.cancel()

    def run(self, *, base_url: str, token: str, task: dict[str, Any], model: str,
            modality: str | None, max_steps: int | None) -> dict[str, Any]:
        """One session, blocking (a worker thread of the local Fleet calls it):
        ``{"turns", "verifier"}``, or ``{"turns", "error"}`` when the episode failed."""
        fields = dict(task)
        if modality is not None:
            fields.pop("task_modality", None)
            fields["modality"] = modality
        policy = ScriptedPolicy.reference() if model == "reference" else ScriptedPolicy([])
        with Session(api_key=token, base_url=base_url,
                     timeouts={"provision": HARNESS_PROVISION_BUDGET_S}) as session:
            result = run_episode(Task(**fields), policy, session=session,
                                 max_steps=max_steps, cancel=self._cancel)
        if result.error is not None:
            return {"turns": result.turns,
                    "error": f"{result.error['type']}: {result.error['message']}"}
        verify_ms = int(1000 * result.timings.get("verify_s", 0.0))
        graded = result.graded
        return {"turns": result.turns, "verifier": {
            "success": graded,
            "score": result.verifier_score if graded else None,
            "stdout": result.verifier_stdout,
            "execution_time_ms": verify_ms,
            "result": result.reward,
            "execution_id": result.verifier_execution_id,
            "error": result.verifier_error,
        }}
