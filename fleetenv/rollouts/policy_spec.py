"""``PolicySpec``: a picklable recipe for any policy, and ``as_policy``.

A spec names a policy kind (the reference replay, a script, an OpenAI-compatible model,
an importable object) and is built where the episode runs, so a rollout job can cross
into a process pool or a cluster. It knows every kind, so it sits above them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetenv.core.errors import ConfigurationError
from fleetenv.rollouts.openai_policy import OpenAIChatPolicy
from fleetenv.rollouts.policy import CallablePolicy, Policy, PolicyContext, ScriptedPolicy

__all__ = ["PolicySpec", "as_policy", "parse_policy_spec"]


@dataclass(frozen=True)
class PolicySpec:
    """A picklable recipe for a policy, built where the episode runs.

    ``kind``: ``"reference"`` (replay the task's reference solution), ``"scripted"``
    (``options["calls"]``), ``"openai"`` (an OpenAI-compatible chat-completions server;
    options ``model``, ``base_url``, ``api_key_env``, ...), or ``"import"``
    (``options["target"] = "package.module:attribute"``, a policy object, a policy class
    taking no arguments, or a plain function).
    """

    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def build(self) -> Policy:
        if self.kind == "reference":
            return ScriptedPolicy.reference()
        if self.kind == "scripted":
            return ScriptedPolicy(list(self.options.get("calls") or []))
        if self.kind == "openai":
            return OpenAIChatPolicy(**dict(self.options))
        if self.kind == "import":
            return _import_policy(str(self.options.get("target", "")))
        raise ConfigurationError(
            f"unknown policy kind {self.kind!r}",
            hint="use 'reference', 'scripted', 'openai' or 'import'")

    def describe(self) -> str:
        """A short label for logs and result files (no secrets: options are not shown)."""
        detail = self.options.get("model") or self.options.get("target") or ""
        return f"{self.kind}:{detail}" if detail else self.kind


def as_policy(policy: Policy | PolicySpec | Callable[[PolicyContext], Any] | str) -> Policy:
    """Accept a policy, a spec, a plain function, or a spec string (``"reference"``,
    ``"import:pkg.mod:fn"``)."""
    if isinstance(policy, PolicySpec):
        return policy.build()
    if isinstance(policy, str):
        return parse_policy_spec(policy).build()
    if isinstance(policy, Policy):
        return policy
    if callable(policy):
        return CallablePolicy(policy)
    raise ConfigurationError(f"cannot use a {type(policy).__name__} as a policy",
                             hint="pass a Policy, a PolicySpec, or a function of the context")


def parse_policy_spec(text: str, **options: Any) -> PolicySpec:
    """``"reference"``, ``"openai"`` (with options) or ``"import:pkg.mod:attr"``."""
    kind, _, rest = text.partition(":")
    if kind == "import":
        return PolicySpec("import", {"target": rest, **options})
    return PolicySpec(kind, options)


def _import_policy(target: str) -> Policy:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"bad policy import target {target!r}",
                                 hint="write it as 'package.module:attribute'")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import policy {target!r}: {exc}",
                                 hint="check the module is importable in the worker") from exc
    if isinstance(value, type):
        value = value()
    return as_policy(value)
