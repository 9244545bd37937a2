"""The task: what the agent must do, on which environment, and how it is graded
(docs/tasks.md). Validated completely when built, frozen all the way down, picklable.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.frozen import freeze, thaw
from fleetenv.core.modality import Modality
from fleetenv.core.task_fields import ALIASES, normalize_task_fields

__all__ = ["ReferenceToolCall", "Task", "select_tasks"]

#: The synthetic tool whose mention in a prompt means the grade needs the agent's answer.
FINAL_ANSWER_TOOL = "submit_final_answer"


@dataclass(frozen=True)
class ReferenceToolCall:
    """One step of a task's known-good solution (replayed by the scripted policy and tests)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


class Task(BaseModel):
    """One task, in canonical field names; every alias in circulation is accepted on input.

    Inputs accepted besides the canonical names: ``task_key``/``id`` (key), ``env_id``/
    ``environment_id`` (env_key), ``version`` (env_version), ``data_id`` (data_key),
    ``verifier_code``/``verifier_func``/``verifier.code`` (verifier), ``task_modality``
    (modality). ``env_key="helpdesk:1"`` is split into ``env_key="helpdesk"``,
    ``env_version="v1"``; versions starting with a digit get fleet-python's ``v`` prefix.

    Construction raises ``ConfigurationError`` (never a pydantic error) naming the task and
    the field. ``model_copy(update=...)`` skips validation, as in all pydantic models; use
    ``replace()`` to change fields.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    key: str
    prompt: str
    env_key: str
    env_version: str | None = None
    data_key: str | None = None
    data_version: str | None = None
    env_variables: dict[str, Any] = Field(default_factory=dict)
    verifier: str | None = None
    verifier_id: str | None = None
    modality: Modality = Modality.TOOL_USE
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _canonical_fields(cls, data: Any) -> Any:
        return normalize_task_fields(data)

    @model_validator(mode="after")
    def _freeze_containers(self) -> Task:
        # The model is frozen against attribute assignment; freezing the dicts too keeps
        # one episode from editing the metadata every other episode of the batch reads.
        object.__setattr__(self, "env_variables", freeze(self.env_variables))
        object.__setattr__(self, "metadata", freeze(self.metadata))
        return self

    def __hash__(self) -> int:
        return hash((self.key, self.env_spec, self.data_spec, self.modality, self.prompt))

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # env_variables may hold credentials for the app, and prompts and verifier sources
        # are long: the repr shows what identifies the task, nothing more.
        prompt = self.prompt if len(self.prompt) <= 60 else self.prompt[:57] + "..."
        yield "key", self.key
        yield "env", self.env_spec
        if self.data_spec:
            yield "data", self.data_spec
        yield "modality", self.modality
        yield "prompt", prompt
        yield "verifier", "yes" if self.verifier else "no"
        if self.env_variables:
            yield "env_variables", sorted(self.env_variables)

    @property
    def env_spec(self) -> str:
        """``"key:version"`` (or ``"key"``): the ``env_key`` argument of fleet-python's make()."""
        return f"{self.env_key}:{self.env_version}" if self.env_version else self.env_key

    @property
    def data_spec(self) -> str | None:
        """``"key:version"``, ``"key"``, or ``None``: the ``data_key`` argument of make()."""
        if self.data_key is None:
            return None
        return f"{self.data_key}:{self.data_version}" if self.data_version else self.data_key

    @property
    def needs_final_answer(self) -> bool:
        """Whether grading needs the agent's final answer (so the episode offers the tool).

        ``metadata["needs_final_answer"]`` decides when present, in either direction;
        otherwise a prompt that mentions ``submit_final_answer`` asks for one.
        """
        declared = self.metadata.get("needs_final_answer")
        if isinstance(declared, bool):
            return declared
        return FINAL_ANSWER_TOOL in self.prompt

    @property
    def reference_solution(self) -> list[ReferenceToolCall] | None:
        """The known-good tool calls from ``metadata["reference_solution"]``, or ``None``.

        Validated when the task was built; each call returns fresh, mutable objects.
        """
        steps = self.metadata.get("reference_solution")
        if steps is None:
            return None
        calls = []
        for step in steps:
            arguments = step.get("arguments") or {}
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            calls.append(ReferenceToolCall(name=step["name"], arguments=thaw(arguments)))
        return calls

    def to_fleet_dict(self) -> dict[str, Any]:
        """The task in Fleet's export format (what ``fleet.load_tasks_from_file`` reads).

        Versions are written as normalised (``"v1"``), which Fleet treats the same as
        ``"1"``. ``Task(**task.to_fleet_dict()) == task`` always holds.
        """
        data: dict[str, Any] = {
            "key": self.key,
            "prompt": self.prompt,
            "env_id": self.env_key,
            "version": self.env_version,
            "data_id": self.data_key,
            "data_version": self.data_version,
            "verifier_func": self.verifier,
            "task_modality": self.modality,
            "env_variables": thaw(self.env_variables),
            "metadata": thaw(self.metadata),
        }
        if self.verifier_id is not None:
            data["verifier_id"] = self.verifier_id
        return data

    def replace(self, **changes: Any) -> Task:
        """A validated copy with ``changes`` applied (aliases accepted).

        Changing ``env_key`` (or ``data_key``) drops the old version unless a new one is
        given, so ``replace(env_key="crm")`` does not inherit the helpdesk version.
        """
        data = self.model_dump()
        given = set(changes)
        for key, version in (("env_key", "env_version"), ("data_key", "data_version")):
            if given & set(ALIASES[key]) and not given & set(ALIASES[version]):
                data[version] = None
        for canonical, names in ALIASES.items():
            if given & set(names[1:]):  # an alias given: it replaces the canonical field
                data.pop(canonical, None)
        data.update(changes)
        return Task(**data)


def select_tasks(tasks: Sequence[Task], keys: Iterable[str]) -> list[Task]:
    """The tasks with the given keys, in the order the keys are given (each at most once).

    An unknown key is a ``ConfigurationError`` with the closest existing key as a hint,
    because a typo in a ``--task`` flag should not quietly run zero episodes.
    """
    by_key = {task.key: task for task in tasks}
    selected: list[Task] = []
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            continue
        task = by_key.get(key)
        if task is None:
            close = difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.6)
            if close:
                hint = "did you mean " + " or ".join(repr(k) for k in close) + "?"
            else:
                some = ", ".join(sorted(by_key)[:10]) or "none"
                hint = f"known keys ({len(by_key)}): {some}" + (
                    ", ..." if len(by_key) > 10 else "")
            raise ConfigurationError(f"no task with key {key!r}", hint=hint, task=key)
        seen.add(key)
        selected.append(task)
    return selected
