"""Fleet tasks for the Tinker cookbook's RL loop (``tinker_cookbook.rl``).

Install the extra (``pip install 'fleetenv[tinker]'``: tinker-cookbook needs Python >=
3.11 and torch), then::

    from tinker_cookbook.rl.rollouts import do_group_rollout
    from fleetenv.adapters.tinker import FleetEnvGroupBuilder

    builder = FleetEnvGroupBuilder(task, group_size=8, model_name="Qwen/Qwen3-8B",
                                   renderer_name="qwen3")
    group = await do_group_rollout(builder, policy)   # policy: a TokenCompleter

or, for the cookbook's training loop, ``FleetRLDatasetBuilder(batch_size=..,
group_size=.., model_name=.., tasks_path=..)`` as the config's ``dataset_builder``.

- :class:`FleetEnvGroupBuilder` (``EnvGroupBuilder``): picklable; one task,
  ``group_size`` episodes provisioned concurrently within the session's caps;
  ``cleanup()`` idempotent and bounded.
- :class:`FleetTinkerEnv` (``Env``): one episode; the renderer writes the tools into
  the prompt and parses the model's tool calls from the sampled tokens, fleetenv runs
  them (``step_async``: no thread parked per call). Stop reasons are ``stop/<reason>``
  metrics, Fleet's numbers (``fleet/provision_s``, ``fleet/tool_latency_s``,
  ``fleet/tool_errors``, ...) are in ``metrics``, the verifier's output in ``logs``.
- :class:`FleetRLDataset` / :class:`FleetRLDatasetBuilder` (``RLDataset`` /
  ``RLDatasetBuilder``, a ``chz`` class).
- :mod:`fleetenv.adapters.tinker.testing`: an offline tokenizer and a policy replaying
  a task's reference solution, to check the whole pipeline without a model.

Importing this module without tinker-cookbook raises ``ImportError`` saying what to
install.
"""

from __future__ import annotations

from fleetenv.adapters.tinker._cookbook import COOKBOOK_VERSION
from fleetenv.adapters.tinker.dataset import FleetRLDataset, FleetRLDatasetBuilder
from fleetenv.adapters.tinker.env import DEFAULT_SYSTEM_PROMPT, FleetTinkerEnv
from fleetenv.adapters.tinker.group import FleetEnvGroupBuilder, session_for

__all__ = ["COOKBOOK_VERSION", "DEFAULT_SYSTEM_PROMPT", "FleetEnvGroupBuilder",
           "FleetRLDataset", "FleetRLDatasetBuilder", "FleetTinkerEnv", "session_for"]
