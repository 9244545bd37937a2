"""A Fleet task in the Tinker cookbook's RL loop: one GRPO group through ``do_group_rollout``.

    pip install 'fleetenv[tinker]'      # tinker-cookbook: Python >= 3.11, with torch
    python examples/tinker_env.py

With a model, the only lines that change are the two marked ``real run``: the tokenizer
is your model's (``model_name="Qwen/Qwen3-8B"``) and the policy samples from Tinker
(``TinkerTokenCompleter(sampling_client, max_tokens=1024)``). Here, with no model and no
model hub, a tiny tokenizer is trained offline and the "policy" replays the task's
reference solution as tokens, so the whole pipeline runs for real on the embedded local
Fleet: the cookbook's renderer writes the tools into the prompt and parses the tool
calls back out of the tokens, fleetenv runs them on a live instance, the verifier grades
each episode, and the group's instances are gone at the end.

Without tinker-cookbook installed it says so and exits 0.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import tempfile

import fleetenv
from fleetenv import bundled_tasks_path


def main() -> int:
    try:
        importlib.import_module("fleetenv.adapters.tinker")  # its ImportError says what to do
    except ImportError as exc:
        print(f"tinker_env: skipped: {exc}")
        return 0
    from tinker_cookbook.rl.rollouts import do_group_rollout

    from fleetenv.adapters.tinker import FleetEnvGroupBuilder
    from fleetenv.adapters.tinker.testing import ReferencePolicy, offline_tokenizer

    tasks = fleetenv.load_tasks(bundled_tasks_path())
    task = next(t for t in tasks if t.key == "helpdesk-assign-api-ticket")
    with tempfile.TemporaryDirectory() as tmp:
        model_name = offline_tokenizer(tmp)  # real run: "Qwen/Qwen3-8B"
        builder = FleetEnvGroupBuilder(task, group_size=4, model_name=model_name,
                                       renderer_name="qwen3_instruct")
        policy = ReferencePolicy(builder.renderer(), tasks)  # real run: TinkerTokenCompleter
        group = asyncio.run(do_group_rollout(builder, policy))

    print(f"tinker_env: group rewards {group.get_total_rewards()}")
    for trajectory in group.trajectories_G:
        last = trajectory.transitions[-1]
        print(f"  stop={trajectory.stop_reason} turns={len(trajectory.transitions)} "
              f"provision_s={last.metrics['fleet/provision_s']:.2f} "
              f"tool_calls={last.metrics['fleet/tool_calls']} "
              f"tool_errors={last.metrics['fleet/tool_errors']} "
              f"grade={last.logs['fleet/grade_status']}")
    return 0 if group.get_total_rewards() == [1.0] * 4 else 1


if __name__ == "__main__":
    sys.exit(main())
