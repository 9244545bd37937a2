"""``FleetRLDataset`` and ``FleetRLDatasetBuilder``: Fleet tasks as a Tinker RL dataset.

A batch is ``batch_size`` group builders (one task each), the tasks shuffled once per
epoch with ``seed``; the builder is a ``chz`` class like the cookbook's own, so a training
script configures it from the command line.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from fleetenv.adapters.tinker import _cookbook as cb
from fleetenv.adapters.tinker.env import DEFAULT_SYSTEM_PROMPT
from fleetenv.adapters.tinker.group import FleetEnvGroupBuilder
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.tasks import Task
from fleetenv.env.options import EpisodeOptions

__all__ = ["FleetRLDataset", "FleetRLDatasetBuilder"]


class FleetRLDataset(cb.RLDatasetBase):
    """Batches of :class:`FleetEnvGroupBuilder`, one per task, shuffled per epoch.

    ``make_builder(task)`` makes each task's group builder (the dataset builder passes
    its settings through it).
    """

    def __init__(self, tasks: Sequence[Task], *, batch_size: int,
                 make_builder: Any, n_epochs: int = 1, seed: int = 0) -> None:
        if not tasks:
            raise ConfigurationError("a FleetRLDataset needs at least one task",
                                     hint="check tasks_path / task_keys / modality")
        if batch_size < 1 or n_epochs < 1:
            raise ConfigurationError(
                f"batch_size and n_epochs must be >= 1 (got {batch_size}, {n_epochs})")
        self.tasks = list(tasks)
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.seed = seed
        self._make_builder = make_builder
        self._batches_per_epoch = math.ceil(len(self.tasks) / batch_size)

    def __len__(self) -> int:
        return self._batches_per_epoch * self.n_epochs

    def get_batch(self, index: int) -> Sequence[FleetEnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of a dataset of {len(self)} batches")
        epoch, within = divmod(index, self._batches_per_epoch)
        order = list(self.tasks)
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        chunk = order[within * self.batch_size:(within + 1) * self.batch_size]
        builders: list[FleetEnvGroupBuilder] = [self._make_builder(task) for task in chunk]
        return builders


@cb.chz_class
class FleetRLDatasetBuilder(cb.RLDatasetBuilderBase):
    """Builds the train (and optional test) :class:`FleetRLDataset` from a tasks file.

    ``tasks_path``: a task file in any format fleetenv reads (default: the tasks
    bundled with the local Fleet); ``task_keys``: only these; ``modality``: only tasks of
    this modality (default ``tool_use``: Tinker's renderers are text renderers);
    ``test_task_keys``: held out as the test set (``test_group_size`` episodes each).
    ``max_live_instances`` / ``max_creating_instances`` cap the session the episodes share
    (per process). The rest are :class:`FleetEnvGroupBuilder`'s settings.
    """

    batch_size: int
    group_size: int
    model_name: str
    renderer_name: str | None = None
    tasks_path: str | None = None
    task_keys: list[str] | None = None
    test_task_keys: list[str] | None = None
    test_group_size: int = 1
    modality: str | None = "tool_use"
    n_epochs: int = 1
    seed: int = 0
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    failed_parse_reward: float = -1.0
    terminate_on_parse_error: bool = True
    unknown_reward: float = 0.0
    max_trajectory_tokens: int | None = None
    max_steps: int | None = None
    base_url: str | None = None
    max_live_instances: int | None = None
    max_creating_instances: int | None = None

    async def __call__(self) -> tuple[FleetRLDataset, FleetRLDataset | None]:
        tasks = self._tasks()
        held_out = set(self.test_task_keys or ())
        train = [task for task in tasks if task.key not in held_out]
        test = [task for task in tasks if task.key in held_out]
        train_set = FleetRLDataset(train, batch_size=self.batch_size,
                                   make_builder=self._builder_factory(self.group_size),
                                   n_epochs=self.n_epochs, seed=self.seed)
        test_set = (FleetRLDataset(test, batch_size=self.batch_size,
                                   make_builder=self._builder_factory(self.test_group_size),
                                   seed=self.seed)
                    if test else None)
        return train_set, test_set

    def _tasks(self) -> list[Task]:
        from fleetenv.core.task_files import bundled_tasks_path, load_tasks

        path = bundled_tasks_path() if self.tasks_path is None else self.tasks_path
        tasks = [task for task in load_tasks(path)
                 if self.modality is None or task.modality == self.modality]
        if self.task_keys is not None:
            by_key = {task.key: task for task in tasks}
            missing = [key for key in self.task_keys if key not in by_key]
            if missing:
                raise ConfigurationError(
                    f"task key(s) not in {path}: {', '.join(missing)}",
                    hint="check the spelling, or the modality filter (modality=None keeps all)",
                    field="task_keys")
            tasks = [by_key[key] for key in self.task_keys]
        return tasks

    def _builder_factory(self, group_size: int) -> Callable[[Task], FleetEnvGroupBuilder]:
        caps = {name: value for name, value in (
            ("max_live_instances", self.max_live_instances),
            ("max_creating_instances", self.max_creating_instances)) if value is not None}
        # A partial, not a closure: a dataset may be pickled to rollout workers.
        return functools.partial(
            FleetEnvGroupBuilder, group_size=group_size, model_name=self.model_name,
            renderer_name=self.renderer_name, system_prompt=self.system_prompt,
            failed_parse_reward=self.failed_parse_reward,
            terminate_on_parse_error=self.terminate_on_parse_error,
            unknown_reward=self.unknown_reward,
            max_trajectory_tokens=self.max_trajectory_tokens,
            env_options=EpisodeOptions(max_steps=self.max_steps),
            base_url=self.base_url, fleet_settings=caps)
