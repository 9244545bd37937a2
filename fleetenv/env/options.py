"""``EpisodeOptions``: how one env plays its episodes, as one value.

``FleetEnv(task, max_steps=10, context_tools=True)`` builds one from its keyword
arguments; ``FleetEnv(task, options=EpisodeOptions(...))`` takes one made elsewhere.
The adapters (Gymnasium, SkyRL, Tinker, OpenEnv) and the runners pass one through to
every env they make, so an option is declared, documented and checked here only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetenv.core.config import FleetConfig, finite_reward
from fleetenv.core.errors import ConfigurationError
from fleetenv.core.tasks import Task
from fleetenv.env.tool_call_parsing import PARSE_FORMATS
from fleetenv.mcp.arguments import ArgumentsMode, check_mode
from fleetenv.mcp.error_rules import ToolErrorRule, resolve_rule

__all__ = ["NO_TOOL_CALL_MODES", "OPTION_NAMES", "PARTIAL_REWARD_KEY", "TOOL_ENDPOINT_MODES",
           "EpisodeOptions", "ResolvedOptions"]

#: Task metadata that turns partial rewards on for the task (a bool); the
#: ``partial_reward`` option overrides it.
PARTIAL_REWARD_KEY = "partial_reward"

#: What a turn without tool calls does: end the episode with its text as the final
#: answer (``Done`` when there is no text), or nothing (the turn counts, the agent is
#: told it made no call).
NO_TOOL_CALL_MODES = ("final_answer", "noop")
#: Which MCP endpoints a tool-use episode opens (``fleetenv.mcp.router.endpoints_for``):
#: ``{root}mcp``, and ``{root}api/v1/mcp`` only when the first serves no tool; or both,
#: at once, offering the union of their tools (the previous Fleet client's way).
TOOL_ENDPOINT_MODES = ("first", "union")


@dataclass(frozen=True)
class EpisodeOptions:
    """The options of a :class:`~fleetenv.FleetEnv`'s episodes.

    ``None`` means the default: the session's config (``max_steps``,
    ``check_arguments``, ``tool_error_rule``, and by the task's modality ``ttl_seconds``
    and ``episode_deadline_s``; see docs/configuration.md) or the task's metadata
    (``partial_reward``). A value that does not fit fails where it is given, naming the
    option. ``env.options`` holds the env's options with every default filled in.
    """

    max_steps: int | None = None
    """Steps before the episode is cut (``max_steps``) and graded."""
    ttl_seconds: int | None = None
    """The instance's time to live."""
    episode_deadline_s: float | None = None
    """The episode's wall-clock limit (``time_limit``); default: the config's, else the
    instance TTL."""
    max_text_chars: int = 16_000
    """Tool output text an observation shows; the rest is cut with a visible marker (the
    whole text stays on ``obs.result``)."""
    run_tag: str | None = None
    """A tag on the instances the env creates, to find and sweep them in Fleet."""
    check_arguments: ArgumentsMode | None = None
    """How a call's arguments are checked against the tool's input schema before
    sending: ``"strict"``, ``"lenient"`` or ``"off"`` (:mod:`fleetenv.mcp.arguments`)."""
    tool_error_rule: str | ToolErrorRule | None = None
    """Which results are tool errors: ``"fleet"``, ``"protocol"``, or a callable
    ``(ToolResult) -> str | None`` (:mod:`fleetenv.mcp.error_rules`)."""
    partial_reward: bool | None = None
    """Pay a verifier score of 0.0 as the partial score its output gives, if any
    (:class:`~fleetenv.Grade`, docs/grading.md); default: the task's
    ``metadata["partial_reward"]``, else off."""
    context_tools: bool = False
    """Offer the context tools (``check_context``, ``manage_context``,
    ``search_history``, ``search_tool_output``, ``view_tool_output``), answered locally;
    long tool text is cut at ``max_text_chars`` and kept for them. After
    ``manage_context``, ``info["history"]`` is the trimmed history to continue with
    (docs/context-tools.md)."""
    meta_tools: bool = False
    """Offer ``search_tools``, ``get_tool_schema`` and ``list_service_tools`` instead of
    the tool list (for envs with very many tools)."""
    tool_call_format: str = "auto"
    """How ``step()`` reads a model's text: ``"auto"``, ``"hermes"``, ``"llama3"``,
    ``"mistral"`` or ``"openai"`` (:func:`~fleetenv.parse_tool_calls`)."""
    no_tool_call: str = "final_answer"
    """What a turn without tool calls does: ``"final_answer"`` (its text ends the episode
    as the answer, as Tinker, verifiers and OpenAI agent loops do) or ``"noop"`` (the
    turn counts, nothing runs). See docs/episodes.md."""
    failed_parse_reward: float | None = None
    """The reward of a step whose turn could not be read (``None``: the usual 0.0)."""
    tool_endpoints: str | None = None
    """Which MCP endpoints a tool-use episode opens: ``"first"`` (the default: one
    session, ``{root}mcp``, and ``{root}api/v1/mcp`` only when the first serves no tool)
    or ``"union"`` (both at once, and the tools of both, ``{root}mcp``'s first, as the
    previous Fleet client listed them; the OpenEnv drop-in's default). docs/mcp.md."""

    def __post_init__(self) -> None:
        if self.check_arguments is not None:
            check_mode(self.check_arguments)
        if self.tool_error_rule is not None:
            resolve_rule(self.tool_error_rule)
        _flag(self.context_tools, "context_tools")
        _flag(self.meta_tools, "meta_tools")
        fmt = self.tool_call_format
        object.__setattr__(self, "tool_call_format", _choice(
            fmt.lower() if isinstance(fmt, str) else fmt, PARSE_FORMATS, "tool_call_format"))
        _choice(self.no_tool_call, NO_TOOL_CALL_MODES, "no_tool_call")
        if self.tool_endpoints is not None:
            _choice(self.tool_endpoints, TOOL_ENDPOINT_MODES, "tool_endpoints")
        if self.failed_parse_reward is not None:
            object.__setattr__(self, "failed_parse_reward", finite_reward(
                self.failed_parse_reward, field="failed_parse_reward",
                hint="e.g. failed_parse_reward=-1.0, or None for the usual 0.0"))

    @classmethod
    def of(cls, options: EpisodeOptions | Mapping[str, Any] | None = None,
           **changes: Any) -> EpisodeOptions:
        """``options`` (these options, a mapping of their names, or ``None`` for the
        defaults) with every change that is not ``None``: how the keyword arguments of
        ``FleetEnv`` and the adapters become one ``EpisodeOptions``."""
        if options is None or isinstance(options, Mapping):
            options = cls(**_known(dict(options or {}), "option"))
        elif not isinstance(options, EpisodeOptions):
            raise ConfigurationError(
                f"options must be a fleetenv.EpisodeOptions, got a {type(options).__name__}",
                hint="e.g. options=fleetenv.EpisodeOptions(max_steps=10)")
        given = _known({k: v for k, v in changes.items() if v is not None}, "option")
        return dataclasses.replace(options, **given) if given else options

    def resolved(self, config: FleetConfig, task: Task) -> ResolvedOptions:
        """These options with every default filled in from ``config`` and ``task``."""
        modality = task.modality
        return ResolvedOptions(**{
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "max_steps": self.max_steps or config.max_steps,
            "ttl_seconds": self.ttl_seconds or config.ttl_for(modality),
            "episode_deadline_s": (self.episode_deadline_s
                                   or config.episode_deadline_for(modality)),
            "check_arguments": self.check_arguments or config.check_arguments,
            "tool_error_rule": (config.tool_error_rule if self.tool_error_rule is None
                                else self.tool_error_rule),
            "partial_reward": (bool(task.metadata.get(PARTIAL_REWARD_KEY, False))
                               if self.partial_reward is None else self.partial_reward),
            "tool_endpoints": self.tool_endpoints or TOOL_ENDPOINT_MODES[0]})


@dataclass(frozen=True)
class ResolvedOptions(EpisodeOptions):
    """An env's :class:`EpisodeOptions` with every default filled in (``env.options``);
    made by :meth:`EpisodeOptions.resolved`, so its fields are never ``None``."""

    max_steps: int = 0
    ttl_seconds: int = 0
    episode_deadline_s: float = 0.0
    check_arguments: ArgumentsMode = "strict"
    tool_error_rule: str | ToolErrorRule = "fleet"
    partial_reward: bool = False
    tool_endpoints: str = "first"


#: The names of the options, in declaration order.
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EpisodeOptions))


def _known(values: dict[str, Any], what: str) -> dict[str, Any]:
    """``values``, once every name in it is an option's."""
    unknown = sorted(set(values) - set(OPTION_NAMES))
    if unknown:
        raise ConfigurationError(f"unknown episode {what}(s): {', '.join(unknown)}",
                                 hint=f"the options are {', '.join(OPTION_NAMES)}")
    return values


def _choice(value: object, allowed: tuple[str, ...], name: str) -> str:
    """One of ``allowed``, refused with the list otherwise."""
    if isinstance(value, str) and value in allowed:
        return value
    raise ConfigurationError(f"{name}={value!r:.40} is not one of {', '.join(allowed)}",
                             hint=f"e.g. {name}={allowed[0]!r}")


def _flag(value: object, name: str) -> bool:
    """An on/off option, refused unless it is a bool (``"false"`` is not false)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r:.60} must be True or False",
                                 hint=f"pass {name}=True to enable it")
    return value
