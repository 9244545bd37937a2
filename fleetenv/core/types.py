"""The episode contract of fleetenv, in one file: what goes in, what comes out.

Plain data, no I/O, nothing from the layers above, so every layer can use it. Read top
to bottom: the vocabularies (``Modality``, ``StopReason``, ``GradeStatus``,
``GradeReason``; ``str`` enums), the actions (``ToolCall``, ``FinalAnswer``, ``Done``,
``ListTools``: :data:`Action`), ``Observation``, ``Grade``, the steps (``StepResult``,
``StepInfo``, ``ResetInfo``) and ``RolloutResult``. docs/reference/episodes.md renders
them; the options are :class:`fleetenv.EpisodeOptions`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, Union

from fleetenv.core.errors import ToolArgumentsError, VerifierError
from fleetenv.core.redaction import redact, scrub_secrets, scrub_value

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.tool_results import ToolResult

__all__ = [
    "Action",
    "AppGrade",
    "Done",
    "FinalAnswer",
    "Grade",
    "GradeReason",
    "GradeStatus",
    "ListTools",
    "Modality",
    "Observation",
    "ResetInfo",
    "RolloutResult",
    "StepInfo",
    "StepResult",
    "StopReason",
    "StrEnum",
    "ToolCall",
]


# ---------------------------------------------------------------------- 1. vocabularies

class StrEnum(str, Enum):
    """A ``str`` enum that formats as its value on every Python version we support
    (``enum.StrEnum`` is 3.11+, and a plain ``(str, Enum)`` formats as ``Cls.NAME``
    in f-strings on 3.12+)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(str(member.value) for member in cls)


class Modality(StrEnum):
    """How an agent acts on an environment.

    It decides which MCP endpoints an episode expects, the image type and TTL of the
    instance, and whether observations carry screenshots, so a typo must fail when the
    task is loaded, not surface later as a shorter tool list.
    """

    TOOL_USE = "tool_use"
    COMPUTER_USE = "computer_use"
    BROWSER_USE = "browser_use"


class StopReason(StrEnum):
    """Why an episode ended. :attr:`terminates` and :attr:`truncates` map it onto
    Gymnasium's ``terminated`` / ``truncated`` flags."""

    #: The agent finished (``Done()``, a final answer, OpenEnv's ``done=True``).
    AGENT_DONE = "agent_done"
    #: The step limit was reached.
    MAX_STEPS = "max_steps"
    #: The episode deadline passed.
    TIME_LIMIT = "time_limit"
    #: The instance stopped or expired (TTL) under the episode.
    INSTANCE_EXPIRED = "instance_expired"
    #: The caller closed or reset an episode that had not ended; it was still graded.
    ABANDONED = "abandoned"
    #: The caller closed without grading (Ctrl-C, ``close(grade=False)``).
    INTERRUPTED = "interrupted"
    #: ``reset()`` failed (provisioning, MCP setup), so the episode never started.
    INIT_ERROR = "init_error"
    #: A rollout failed (the policy raised, the environment broke).
    ERROR = "error"
    #: A runner cancelled the rollout.
    CANCELLED = "cancelled"

    @property
    def terminates(self) -> bool:
        """The agent ended the episode itself (Gymnasium's ``terminated``)."""
        return self is StopReason.AGENT_DONE

    @property
    def truncates(self) -> bool:
        """The episode was cut short from outside (Gymnasium's ``truncated``)."""
        return self in (StopReason.MAX_STEPS, StopReason.TIME_LIMIT,
                        StopReason.INSTANCE_EXPIRED)


class GradeStatus(StrEnum):
    """Whether an episode's reward is a grade."""

    #: The verifier ran and returned a score: the reward is a float.
    GRADED = "graded"
    #: Grading was attempted and failed; the reward is ``None`` and a
    #: :class:`GradeReason` says why (never a stand-in 0.0).
    UNKNOWN = "unknown"
    #: Nobody tried to grade (the rollout failed or was cancelled first).
    NOT_GRADED = "not_graded"


class GradeReason(StrEnum):
    """Why a grade is unknown."""

    #: The task has no verifier code.
    NO_VERIFIER = "no_verifier"
    #: The verifier ran and failed (raised, crashed, timed out on the runner).
    VERIFIER_ERROR = "verifier_error"
    #: Fleet's verifier service could not be reached or kept failing (429, 5xx,
    #: transport errors) until the retries or the verification deadline ran out.
    VERIFIER_UNREACHABLE = "verifier_unreachable"
    #: The instance stopped (expired, deleted) before or while it was graded.
    INSTANCE_GONE = "instance_gone"
    #: The verifier returned something that is not a finite score.
    BAD_RESULT = "bad_result"
    #: The verifier's LLM judge failed (a stdout line starting ``JUDGE ERROR:``) on
    #: every attempt; its score is no grade.
    JUDGE_ERROR = "judge_error"
    #: Grading was interrupted (Ctrl-C, an error) before the verifier answered.
    INTERRUPTED = "interrupted"
    #: ``close()`` / ``reset()`` waited their bound for a grade still being computed.
    GRADING_TIMEOUT = "grading_timeout"


# ---------------------------------------------------------------------- 2. actions

def new_call_id() -> str:
    """A fresh id for a tool call that came without one."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """Call tool ``name`` with ``arguments`` (a dict, or the raw JSON text a model wrote)."""

    name: str
    arguments: Mapping[str, Any] | str | None = None
    id: str = field(default_factory=new_call_id)

    def decoded_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; raises ``ToolArgumentsError`` saying what is wrong."""
        raw = self.arguments
        if raw is None or raw == "":
            return {}
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ToolArgumentsError(
                    f"arguments of {self.name!r} are not valid JSON ({exc.msg} at "
                    f"position {exc.pos}): {self.arguments!r:.200}",
                    hint="send the arguments as a JSON object, e.g. {\"id\": 3}",
                    tool=self.name,
                ) from None
            except RecursionError:  # json's parser recurses once per nesting level
                raise ToolArgumentsError(
                    f"arguments of {self.name!r} are JSON nested too deeply to read",
                    hint="send a flat JSON object of the tool's parameters",
                    tool=self.name,
                ) from None
        if not isinstance(raw, Mapping):
            raise ToolArgumentsError(
                f"arguments of {self.name!r} must be a JSON object, got "
                f"{type(raw).__name__}: {raw!r:.200}",
                hint="wrap the values in an object keyed by parameter name",
                tool=self.name,
            )
        return dict(raw)

    def to_openai(self) -> dict[str, Any]:
        """The assistant-message ``tool_calls`` entry for this call: the arguments as
        written (a list stays a list; nothing is reshaped into an object)."""
        raw: Any = self.arguments
        if isinstance(raw, str):
            arguments = raw
        else:
            value = {} if raw is None else dict(raw) if isinstance(raw, Mapping) else raw
            arguments = json.dumps(value, default=str)
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": arguments}}


@dataclass(frozen=True)
class FinalAnswer:
    """End the episode with an answer; the verifier receives it as ``final_answer``."""

    answer: str
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True)
class Done:
    """End the episode without an answer (the agent is finished)."""


@dataclass(frozen=True)
class ListTools:
    """Ask for the tool list again (OpenEnv's list-tools action); takes no turn."""


Action = Union[ToolCall, FinalAnswer, Done, ListTools]  # noqa: UP007 (runtime alias)


# ---------------------------------------------------------------------- 3. observations

@dataclass(frozen=True)
class Observation:
    """One observation of an episode.

    After ``reset()``: ``step == 0``, ``content`` is the initial screenshot for
    computer/browser use (else empty). After ``step()``: ``content`` renders the result
    of the action (a tool result, or an error the agent can recover from).

    It carries the typed tool result *and* its rendering as OpenAI chat content, so a
    trainer can append it to the conversation without knowing MCP. A ``tool`` message
    holds the text parts (OpenAI's tool messages accept text only), and any images follow
    in a ``user`` message, in their original order. The observation of a whole assistant
    turn holds one observation per tool call in ``calls`` and renders one ``tool``
    message per call, all of them before any image message (OpenAI wants every tool
    message of a turn right after the assistant message that made the calls).
    """

    task_key: str
    prompt: str
    modality: str
    step: int
    tools: list[dict[str, Any]] = field(repr=False)
    """The tools in OpenAI function format (modality-filtered, plus the submit tool)."""
    content: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI chat content parts (``text`` and ``image_url``), in order."""
    result: ToolResult | None = field(default=None, repr=False)
    tool_name: str | None = None
    tool_call_id: str | None = None
    is_error: bool = False
    error: str | None = None
    turn: bool = False
    """Whether this observes a whole assistant turn (see ``calls``), not one action."""
    calls: tuple[Observation, ...] = field(default=(), repr=False)
    """For a turn: one observation per tool call it ran, in order (empty for a turn
    without tool calls). ``content`` joins theirs; ``tool_name``, ``tool_call_id`` and
    ``result`` are the last call's."""
    parse_error: str | None = None
    """For a turn whose tool calls could not be read: what is wrong and where."""

    @property
    def text(self) -> str:
        """All text parts joined (images as a short note)."""
        parts = []
        for part in self.content:
            if part.get("type") == "text":
                parts.append(part["text"])
            elif part.get("type") == "image_url":
                parts.append("[image]")
        return "\n".join(parts)

    def to_messages(self) -> list[dict[str, Any]]:
        """The chat messages to append for this observation.

        For the reset observation: one ``user`` message with the prompt (and the initial
        screenshot). For a tool observation: a ``tool`` message answering
        ``tool_call_id`` with the text parts, then a ``user`` message with the images if
        there are any.
        """
        if self.turn:
            return self._turn_messages()
        if self.tool_call_id is None:
            return [{"role": "user", "content": [{"type": "text", "text": self.prompt},
                                                 *self.content]}]
        texts = [p for p in self.content if p.get("type") == "text"]
        images = [p for p in self.content if p.get("type") == "image_url"]
        if not texts:
            texts = [{"type": "text", "text": "(see the image below)" if images else "(empty)"}]
        messages: list[dict[str, Any]] = [
            {"role": "tool", "tool_call_id": self.tool_call_id, "content": texts}
        ]
        if images:
            messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Image output of {self.tool_name}:"}, *images]})
        return messages

    def _turn_messages(self) -> list[dict[str, Any]]:
        """A turn's messages: a ``tool`` message per call, then one ``user`` message with
        every image; a turn without calls (a parse error, a no-op) says why as ``user``."""
        if not self.calls:
            return [{"role": "user", "content": list(self.content)}] if self.content else []
        messages: list[dict[str, Any]] = []
        images: list[dict[str, Any]] = []
        for call in self.calls:
            call_messages = call.to_messages()
            messages.append(call_messages[0])
            for extra in call_messages[1:]:
                images.extend(extra["content"])
        if images:
            messages.append({"role": "user", "content": images})
        return messages

    def _repr_html_(self) -> str:
        """Jupyter's rich display: step, tool, text, and screenshots as images."""
        from fleetenv.core.rendering import observation_html

        return observation_html(self)

    def _repr_png_(self) -> bytes | None:
        """The screenshot (the last PNG image) for frontends without HTML; else None."""
        from fleetenv.core.rendering import image_bytes

        return image_bytes(self.content, "image/png")

    def _repr_jpeg_(self) -> bytes | None:
        """The last JPEG image, like ``_repr_png_``."""
        from fleetenv.core.rendering import image_bytes

        return image_bytes(self.content, "image/jpeg")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (for trajectories), without the tool list."""
        view = {
            "task_key": self.task_key, "step": self.step, "modality": self.modality,
            "tool_name": self.tool_name, "tool_call_id": self.tool_call_id,
            "is_error": self.is_error, "error": self.error, "content": self.content,
        }
        if self.turn:
            view["calls"] = [call.to_dict() for call in self.calls]
            view["parse_error"] = self.parse_error
        return view


# ---------------------------------------------------------------------- 4. grades

@dataclass(frozen=True)
class AppGrade:
    """One app's verdict in a multi-app verifier's output."""

    score: float
    """What its ``App <name>: n`` line said (``1.0`` passed; ``0.0``, or any other
    number, did not)."""
    trivial: bool = False
    """It passed only because nothing changed there; excluded from the partial score."""

    @property
    def passed(self) -> bool:
        return self.score == 1.0


@dataclass(frozen=True)
class Grade:
    """The outcome of one verification: a graded reward, or unknown with a reason.

    ``reward`` is what the episode returns. It is the verifier's own ``score``, except
    with ``partial_reward`` on, where a score of 0.0 is replaced by the ``partial`` score
    when the verifier's stdout has one (OpenEnv's ``fleet_env`` rule).
    """

    reward: float | None
    status: GradeStatus
    reason: GradeReason | None = None
    """Why the grade is unknown (``None`` when graded)."""
    stdout: str | None = None
    error: str | None = None
    execution_id: str | None = None
    seconds: float = 0.0
    queue_s: float | None = None
    """Of ``seconds``, how long the runs waited for a free verifier runner before they
    started, when the runner says (the local Fleet does; ``None`` when it does not)."""
    score: float | None = None
    """The verifier's own score (the strict reward), ``None`` when unknown."""
    partial: float | None = None
    """The partial score read from stdout (accumulators or multi-app), if it has one;
    read whether or not ``partial_reward`` is on, so it can be logged either way."""
    apps: dict[str, AppGrade] = field(default_factory=dict, hash=False)
    """Per-app verdicts of a multi-app verifier (``App <name>: 0|1``), by app name."""
    attempts: int = 1
    """How many times the verifier was run (or tried) for this grade."""
    error_type: str | None = None
    """The class of the last error (``DeadlineExceeded``, ``AssertionError``...)."""

    @classmethod
    def unknown(cls, reason: GradeReason, error: str | None = None, **fields: Any) -> Grade:
        return cls(reward=None, status=GradeStatus.UNKNOWN, reason=reason,
                   error=redact(error) if error else None, **fields)

    @property
    def graded(self) -> bool:
        return self.status is GradeStatus.GRADED

    def raise_for_status(self) -> Grade:
        """Return the grade if it is one; raise ``VerifierError`` if it is unknown.

        For callers (evaluation scripts, CI checks) that would rather stop than carry a
        ``None`` reward along; like ``requests.Response.raise_for_status``.
        """
        if self.graded:
            return self
        raise VerifierError(
            f"the grade is unknown ({self.reason}): {self.error or 'no error message'}",
            hint="see the verifier's stdout and error; an unknown grade is not a 0.0",
            execution=self.execution_id)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        data["reason"] = None if self.reason is None else str(self.reason)
        return data


# ---------------------------------------------------------------------- 5. steps

class ResetInfo(TypedDict, total=False):
    """The ``info`` of ``reset()``: every key it may hold (the first six always).

    Like Gymnasium's ``info``, a fresh dict per call; ids live here, never in the
    observation.
    """

    task_key: str
    """The task played."""
    rollout_id: str
    """The id of this episode in events, traces and results."""
    instance_id: str | None
    """The Fleet instance the episode runs on."""
    root_url: str | None
    """The instance's base URL (its MCP endpoints hang below it)."""
    modality: Modality
    """How the agent acts (tool use, computer use, browser use)."""
    tools: list[str]
    """The names of the tools offered to the agent."""
    reset: str
    """``"instance_replaced"`` when restoring the instance's seed state failed and a new
    instance was provisioned (it is never reused dirty)."""
    screenshot_error: str
    """Computer and browser use: why the initial screenshot failed (the observation
    says so too; the episode goes on)."""


class StepInfo(TypedDict, total=False):
    """The ``info`` of ``step()``: every key it may hold.

    Always: ``step``, ``stop_reason``, ``tool_calls``, ``tool_errors``, ``instance_id``.
    Per action, as it happened: ``tool_name``, ``tool_error``, ``local_tool``,
    ``instance_error``, ``submitted_answer``, ``history``, ``tools_changed``; per whole
    turn: ``turn_calls``, ``parse_error``, ``no_tool_call``. On the step that ends the
    episode, the grade: ``reward_status`` and the keys after it.
    """

    step: int
    """The step number (1 for the first step after ``reset()``)."""
    stop_reason: StopReason | None
    """Why the episode ended on this step (``None`` while it goes on)."""
    tool_calls: int
    """Calls to the env's tools so far this episode, sent or refused."""
    tool_errors: int
    """The calls among them that failed."""
    instance_id: str | None
    """The Fleet instance the episode runs on."""
    tool_name: str
    """The tool of the (last) tool call of this step."""
    tool_error: str
    """Why the (last) tool call failed: an unknown tool, arguments that do not fit, an
    error the tool reported, a timeout. The observation shows it to the agent."""
    local_tool: str
    """A context tool or meta-tool this step ran locally (never sent to MCP)."""
    instance_error: str
    """The instance is gone under the episode (it ends ``instance_expired``)."""
    submitted_answer: str
    """The final answer this step submitted."""
    history: list[dict[str, Any]]
    """Context tools: the trimmed chat history to continue with, after
    ``manage_context`` replaced it."""
    tools_changed: bool
    """A server changed its tool list during this step; ``obs.tools`` is the new one."""
    turn_calls: int
    """For a whole model turn: how many of its tool calls ran."""
    parse_error: str
    """For a whole model turn: why its tool calls could not be read."""
    no_tool_call: bool
    """For a whole model turn without tool calls, with ``no_tool_call="noop"``."""
    reward_status: GradeStatus
    """Whether the reward is a grade (on the last step)."""
    reward_reason: GradeReason | None
    """Why the grade is unknown (``None`` when graded)."""
    verifier_stdout: str | None
    """What the verifier printed."""
    verifier_error: str | None
    """The verifier's error, when the grade is unknown."""
    verifier_execution_id: str | None
    """Fleet's id of the verifier run."""
    verifier_score: float | None
    """The verifier's own score, before ``partial_reward`` replaced a 0.0."""
    partial_reward: float | None
    """The partial score read from the verifier's output, if it printed one."""
    app_scores: dict[str, float]
    """A multi-app verifier's verdict per app."""
    final_answer: str | None
    """The answer the verifier received."""


class StepResult(NamedTuple):
    """What ``step()`` returns: Gymnasium's 5-tuple, with names.

    It unpacks and compares as the plain tuple
    (``obs, reward, terminated, truncated, info = env.step(action)``), and each part
    has its name (``env.step(action).reward``).
    """

    observation: Observation
    """What the agent sees after the action."""
    reward: float | None
    """0.0 before the last step (or ``failed_parse_reward`` for an unreadable turn);
    on the last step the grade: a float, or ``None`` when it is unknown."""
    terminated: bool
    """The agent finished (:attr:`StopReason.terminates`)."""
    truncated: bool
    """The episode was cut: step limit, deadline, instance expired
    (:attr:`StopReason.truncates`)."""
    info: StepInfo
    """Diagnostics (see :class:`StepInfo`): counters, tool errors, the grade."""


# ---------------------------------------------------------------------- 6. results

@dataclass
class RolloutResult:
    """Everything worth keeping about one rollout (one JSONL line in a results file)."""

    task_key: str
    env_key: str
    sample: int = 0
    rollout_id: str | None = None
    policy: str | None = None
    reward: float | None = None
    """The graded reward; ``None`` when the grade is unknown or the rollout failed."""
    grade_status: GradeStatus = GradeStatus.NOT_GRADED
    """``graded``, ``unknown`` (the verifier could not grade) or ``not_graded``."""
    grade_reason: GradeReason | None = None
    stop_reason: StopReason | None = None
    """Why the rollout ended (a :class:`~fleetenv.StopReason`)."""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_error_messages: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``provision_s``, ``steps_s``, ``policy_s``, ``verify_s``, ``total_s``."""
    instance_id: str | None = None
    final_answer: str | None = None
    verifier_stdout: str | None = None
    verifier_error: str | None = None
    verifier_execution_id: str | None = None
    verifier_score: float | None = None
    """The verifier's own score, before ``partial_reward`` replaced a 0.0 (if it did)."""
    partial_reward: float | None = None
    """The partial score parsed from the verifier's output (accumulators, app blocks)."""
    app_scores: dict[str, float] = field(default_factory=dict)
    """Per app of a multi-app task, its verdict (trivial apps excluded from scoring)."""
    error: dict[str, str] | None = None
    """``{"type": ..., "message": ...}`` when the rollout failed."""
    turn_meta: list[dict[str, Any]] = field(default_factory=list)
    """Per policy reply, what the policy reported (an OpenAI-compatible policy: the
    ``finish_reason`` and token ``usage``, and ``logprobs`` when the server sent them);
    empty for policies that report nothing."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The tools the agent was offered (OpenAI function format), as at its first turn."""
    tool_timings: list[dict[str, Any]] = field(default_factory=list)
    """Per tool call sent, in order: ``{"tool", "seconds", "outcome"}`` (outcome ``ok``,
    ``tool_error`` or ``failed``); what ``fleetenv report`` charts tool latency from."""
    transcript: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Values read back from a results file arrive as plain strings.
        self.grade_status = GradeStatus(self.grade_status)
        if self.grade_reason is not None:
            self.grade_reason = GradeReason(self.grade_reason)
        if self.stop_reason is not None:
            self.stop_reason = StopReason(self.stop_reason)

    @property
    def graded(self) -> bool:
        return self.grade_status is GradeStatus.GRADED

    @property
    def passed(self) -> bool:
        """Graded and full marks (the pass@k notion of success)."""
        return self.reward is not None and self.reward >= 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (vocabulary values as their plain strings)."""
        data = asdict(self)
        for name in ("grade_status", "grade_reason", "stop_reason"):
            if data[name] is not None:
                data[name] = str(data[name])
        return data

    def __repr__(self) -> str:
        # Transcripts and tool errors may hold what a tool echoed: no registered secret.
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return scrub_secrets(f"{type(self).__name__}({shown})")

    def scrubbed(self) -> RolloutResult:
        """A copy without any registered secret, for a result leaving its process (a
        worker's result on its way to the parent, which may not know that worker's
        credentials)."""
        return RolloutResult.from_dict(scrub_value(self.to_dict()))

    def _repr_html_(self) -> str:
        """Jupyter's rich display: outcome, reward, timings, a collapsible transcript."""
        from fleetenv.core.rendering import result_html

        return result_html(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutResult:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})
