"""The one error hierarchy of fleetenv (docs/errors.md: what each error says, and which
to catch for which decision).

Context values are plain strings chosen by the raiser; secrets must never be passed in.
As a last line of defence, the registered secrets are scrubbed from the message, hint and
context when the error is built (so ``args`` and a pickled copy are clean too), and
``redact()`` is applied to the rendered message.
"""

from __future__ import annotations

from typing import Any

from fleetenv.core.redaction import redact, scrub_secrets

__all__ = [
    "ArgumentTypeError",
    "ConfigurationError",
    "ConnectError",
    "DeadlineExceeded",
    "EpisodeStateError",
    "EvaluationError",
    "EvaluationFailed",
    "FleetEnvError",
    "InstanceGoneError",
    "InvalidActionError",
    "LoopThreadError",
    "MetricsError",
    "PermanentProvisioningError",
    "ProvisioningError",
    "ResourceError",
    "ResultsFileError",
    "RolloutCancelled",
    "RolloutWorkerError",
    "ToolArgumentsError",
    "ToolCallError",
    "ToolCallMayHaveRunError",
    "ToolCallParseError",
    "ToolError",
    "ToolNotFoundError",
    "TraceUploadError",
    "TransientProvisioningError",
    "VerifierError",
]


class FleetEnvError(Exception):
    """Base of every error fleetenv raises on purpose.

    ``message`` says what went wrong, ``context`` names the objects involved
    (``task=``, ``env=``, ``instance=``, ``endpoint=``, ``tool=`` ...), ``hint`` says
    what to try. ``str(err)`` renders all three on one line so logs stay greppable.
    """

    default_hint: str | None = None
    #: Whether the same operation may succeed if tried again later (a rate limit, a
    #: server still starting). The class sets the default; a raiser may override it.
    #: fleetenv's own retries (``fleetenv.core.retry``) read this and nothing else.
    retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None,
                 retryable: bool | None = None, **context: Any) -> None:
        # Server and tool texts end up in messages: scrubbed here, they never reach args.
        self.message = scrub_secrets(str(message))
        hint = hint if hint is not None else self.default_hint
        self.hint = scrub_secrets(hint) if hint else hint
        if retryable is not None:
            self.retryable = retryable
        self.context: dict[str, str] = {
            key: scrub_secrets(str(value)) for key, value in context.items()
            if value is not None
        }
        super().__init__(self.message)

    def __str__(self) -> str:
        text = self.message
        if self.context:
            text += " [" + ", ".join(f"{k}={v}" for k, v in self.context.items()) + "]"
        if self.hint:
            text += f" (hint: {self.hint})"
        return redact(text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable across process pools with their keyword-only fields.
        return (_rebuild, (type(self), self.message, self.hint, self.context, self.retryable))


def _rebuild(
    cls: type[FleetEnvError], message: str, hint: str | None, context: dict[str, str],
    retryable: bool = False,
) -> FleetEnvError:
    err = cls.__new__(cls)
    FleetEnvError.__init__(err, message, hint=hint, retryable=retryable, **context)
    return err


class ConfigurationError(FleetEnvError):
    """Bad configuration or input data (task file, API key, base URL, arguments)."""

    retryable = False


class LoopThreadError(FleetEnvError, RuntimeError):
    """A blocking fleetenv call was made on fleetenv's own event-loop thread (it would deadlock)."""

    retryable = False
    default_hint = (
        "call the blocking API from another thread, or use the async twin (`await ..._async()`)"
    )


class DeadlineExceeded(FleetEnvError, TimeoutError):
    """An operation ran past its timeout or the episode past its deadline."""

    retryable = False  # a raiser sets True when a later try may fit (a longer budget)

    #: True when it did not run out but was given up on purpose (a cancelled run past
    #: its grace, interpreter exit): see ``fleetenv.fleet.deadlines.abandon_calls``.
    abandoned: bool = False


class ConnectError(FleetEnvError, ConnectionError):
    """Could not reach an endpoint (nothing was sent that could have had an effect)."""

    retryable = True


class ProvisioningError(FleetEnvError):
    """Creating or preparing an instance failed."""

    retryable = False


class TransientProvisioningError(ProvisioningError):
    """Provisioning failed for a reason that may pass (rate limit, 5xx, timeout, connection)."""

    retryable = True
    default_hint = "retry later, or lower the number of instances created at once"


class PermanentProvisioningError(ProvisioningError):
    """Provisioning can never succeed as asked (bad key, unknown environment or version)."""

    retryable = False


class InstanceGoneError(FleetEnvError):
    """The instance was deleted, stopped, or expired (TTL) while it was still needed."""

    retryable = False
    default_hint = "raise ttl_seconds, or start a new episode on a fresh instance"


class ToolError(FleetEnvError):
    """Base of tool-level failures (as opposed to a tool that ran and reported an error)."""

    retryable = False  # the raiser sets it from the server's answer


class ToolNotFoundError(ToolError, LookupError):
    """The action named a tool that no endpoint of this episode offers."""

    retryable = False


class ToolArgumentsError(ToolError, ValueError):
    """The tool arguments are not a JSON object (or not valid JSON), or do not fit the
    tool's input schema (missing, mistyped or undeclared arguments)."""

    retryable = False


class ToolCallError(ToolError):
    """A tool call failed in transport or protocol before it could have run."""

    retryable = True


class ToolCallMayHaveRunError(ToolCallError):
    """A tool call failed after the request may have reached the server.

    It is never retried by fleetenv: the tool may already have changed state, and a
    replay could, for example, create a second booking.
    """

    retryable = False
    default_hint = (
        "check the environment state before calling the tool again; fleetenv does not "
        "replay calls that may have run"
    )


class ResourceError(FleetEnvError, LookupError):
    """An MCP server answered a resource request with an error (e.g. no such URI)."""

    retryable = False


class EvaluationError(FleetEnvError):
    """Talking to Fleet's task or job API failed (``retryable`` says if it may pass)."""

    retryable = False  # the raiser sets it from Fleet's answer (5xx, 429, connection)


class EvaluationFailed(FleetEnvError):
    """The harness job ended without results (``errored`` or ``cancelled``)."""

    retryable = False
    default_hint = ("open the job in Fleet's UI (or list its sessions) for each session's "
                    "error; check the task's environment and verifier")


class TraceUploadError(FleetEnvError):
    """A trace job could not be created or a transcript could not be uploaded."""

    retryable = False  # the raiser sets it from Fleet's answer (5xx, 429, connection)
    default_hint = ("check that the API key may write traces on this Fleet; the run "
                    "itself is unaffected (results files hold every transcript)")


class VerifierError(FleetEnvError):
    """The verifier could not produce a grade (so the reward is unknown, not 0.0).

    Raised by :meth:`fleetenv.Grade.raise_for_status` for callers that want an unknown
    grade to be an exception; episodes themselves never raise it (an unknown grade is a
    ``None`` reward with a reason).
    """

    retryable = False


class RolloutCancelled(FleetEnvError):
    """A runner was cancelled while this rollout was queued or in progress."""

    retryable = False
    default_hint = "the run was stopped on purpose (cancel(), Ctrl-C); nothing to fix"


class RolloutWorkerError(FleetEnvError):
    """The executor could not run a rollout or hand back its result (a worker process
    died, the result could not be unpickled, the executor refused the job)."""

    retryable = False
    default_hint = ("the other rollouts are unaffected; check the worker's stderr, or run "
                    "with the default thread executor to see the full traceback")


class ResultsFileError(ConfigurationError):
    """A results file could not be written, or one of its lines is not a rollout result."""

    retryable = False


class MetricsError(ConfigurationError, ValueError):
    """A metric was asked for with arguments it is not defined for."""

    retryable = False


class ArgumentTypeError(ConfigurationError, TypeError):
    """A public entry point got an argument of the wrong type (the hint says what to pass)."""

    retryable = False


class EpisodeStateError(FleetEnvError, RuntimeError):
    """The episode object was used out of order (step before reset, after close, ...)."""

    retryable = False


class InvalidActionError(FleetEnvError, TypeError):
    """``step()`` got something that is not an action in any accepted form."""

    retryable = False
    default_hint = (
        "pass a fleetenv.ToolCall, an OpenAI tool_call dict, {'tool': ..., 'params': ...}, "
        "fleetenv.FinalAnswer(...), or a whole model turn (its text, an assistant message, "
        "a list of tool calls)"
    )


class ToolCallParseError(FleetEnvError, ValueError):
    """A model's text holds a tool call that cannot be read (broken JSON, no tool name,
    an unclosed tag). ``context`` names the ``format`` and the ``offset`` in the text
    where the problem is; the message quotes a snippet."""

    retryable = False
    default_hint = (
        "write each call in the format the tools prompt shows, e.g. "
        '<tool_call>{"name": "...", "arguments": {...}}</tool_call> (hermes)'
    )

    @property
    def offset(self) -> int | None:
        """Where in the text the problem is (characters from the start), if known."""
        value = self.context.get("offset")
        return int(value) if value is not None else None

    @property
    def format(self) -> str | None:
        """The tool-call format that was being read (``"hermes"``, ``"openai"`` ...)."""
        return self.context.get("format")
