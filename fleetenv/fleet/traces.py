"""Trace upload: each finished episode's transcript to a Fleet trace job (docs/traces.md).

Two routes, as fleet-python 0.2.133 sends them, every body and answer validated with its
pydantic models (a wire-format drift fails here, loudly): ``POST /v1/traces/jobs`` and
``POST /v1/sessions/ingest``, on the session's Fleet with its key (``jobs_url`` may move
the first). :class:`TraceUploader` keeps uploads off the critical path (a bounded queue
drained by one job on the runtime's pool) and never raises into the run; each upload is
retried on transient answers inside its own budget, with the same ``X-Request-ID``.
Transcripts go in the shape Fleet's session viewer shows, images capped, every
credential scrubbed by value.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import queue
import re
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from fleetenv import runtime
from fleetenv.core.errors import (
    ConfigurationError,
    DeadlineExceeded,
    FleetEnvError,
    TraceUploadError,
)
from fleetenv.core.redaction import redact_value, register_secret
from fleetenv.core.retry import Deadline, RetryPolicy
from fleetenv.fleet.classify import error_detail, request_error

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.types import RolloutResult
    from fleetenv.fleet.session import Session

__all__ = ["TraceClient", "TraceOptions", "TraceReport", "TraceUploadError",
           "TraceUploader", "ingest_request", "trace_body"]

logger = logging.getLogger("fleetenv.traces")

#: Errors kept in the report (the count is exact; the texts are samples).
_KEPT_ERRORS = 20
#: A turn footer a harness appends to an observation for the model (``[Turn 3/64]``):
#: a text part of only that (and whitespace) is left out of the upload; longer text is not
#: a footer.
_TURN_FOOTER = re.compile(r"\[Turn\s*\d+\s*/\s*\d+\]")
_MAX_FOOTER_CHARS = 64
#: What the first failure to create a trace job suggests when no ``jobs_url`` is set.
_JOBS_URL_HINT = ("if this Fleet serves trace jobs on another host, name it: "
                  "TraceOptions(jobs_url=URL), or `fleetenv run --trace-jobs-url URL` (the "
                  "previous client used https://api.internal.fleet-platform.fleetai.com)")


@dataclass(frozen=True)
class TraceOptions:
    """How a run uploads its episodes (``Runner(traces=TraceOptions("my job"))``).

    ``job``: the trace job's name (Fleet's UI lists jobs by name). ``model``: the model
    recorded for every episode (default: the policy's description, e.g. ``openai:gpt-4o``).
    ``budget_s``: the most one upload (or the job's creation) may take, retries included.
    ``max_pending``: episodes waiting for upload before new ones are dropped (counted),
    so a slow Fleet never holds the rollouts back. ``flush_timeout_s``: how long
    ``close()`` waits for the queue to drain. ``max_image_bytes`` / ``max_trace_bytes``:
    caps on one inline image and on all images of one trace (data-URL length).
    ``jobs_url``: the base URL of the host that serves ``POST /v1/traces/jobs``, when it
    is not the session's Fleet (default ``None``: the session's base URL); uploads stay
    on the session's Fleet either way.
    """

    job: str
    model: str | None = None
    budget_s: float = 60.0
    max_pending: int = 256
    flush_timeout_s: float = 60.0
    max_image_bytes: int = 2_000_000
    max_trace_bytes: int = 16_000_000
    jobs_url: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not self.job.strip():
            raise ConfigurationError(f"the trace job name must be a non-empty string, not "
                                     f"{self.job!r}", field="traces",
                                     hint='e.g. Runner(traces="nightly-eval")')
        for name in ("budget_s", "flush_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigurationError(f"{name} must be above 0, got {value!r}",
                                         field=f"traces.{name}")
        for name in ("max_pending", "max_image_bytes", "max_trace_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}",
                                         field=f"traces.{name}")
        if self.jobs_url is not None:
            object.__setattr__(self, "jobs_url", _base_url(self.jobs_url))

    @classmethod
    def of(cls, value: str | TraceOptions) -> TraceOptions:
        """``Runner(traces=...)`` accepts a job name or the options."""
        if isinstance(value, TraceOptions):
            return value
        if isinstance(value, str):
            return cls(job=value)
        raise ConfigurationError(f"traces= takes a job name or TraceOptions, not a "
                                 f"{type(value).__name__}", field="traces",
                                 hint='e.g. Runner(traces="nightly-eval")')


@dataclass
class TraceReport:
    """What a :class:`TraceUploader` did: counts, the job, and sample errors."""

    job: str
    job_id: str | None = None
    uploaded: int = 0
    failed: int = 0
    dropped: int = 0
    """Episodes not uploaded because the queue was full or ``close()`` ran out of time
    (including one whose upload was still under way then)."""
    session_ids: dict[str, str] = field(default_factory=dict)
    """Fleet's session id per uploaded episode, keyed by its ``rollout_id``."""
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.dropped == 0

    def summary(self) -> str:
        """One line for a run summary."""
        where = f"trace job {self.job!r}" + (f" ({self.job_id})" if self.job_id else "")
        line = f"traces: {self.uploaded} uploaded to {where}"
        if self.failed or self.dropped:
            line += f"; {self.failed} failed, {self.dropped} not sent"
            if self.errors:
                line += f"; first error: {self.errors[0]}"
        return line


# ----- the payload -------------------------------------------------------------------------


def ingest_request(result: RolloutResult, *, job_id: str, model: str | None,
                   secrets: tuple[str, ...] = (), max_image_bytes: int = 2_000_000,
                   max_trace_bytes: int = 16_000_000) -> dict[str, Any]:
    """The ``POST /v1/sessions/ingest`` body for one finished episode, validated with
    fleet-python's ``SessionIngestRequest`` (raises ``TraceUploadError`` if it refuses)."""
    metadata: dict[str, Any] = {
        "grade_status": str(result.grade_status), "stop_reason": _str(result.stop_reason),
        "env_key": result.env_key, "sample": result.sample, "rollout_id": result.rollout_id,
        "policy": result.policy, "turns": result.turns, "tool_calls": result.tool_calls,
        "tool_errors": result.tool_errors, "source": "fleetenv",
    }
    if result.error:
        metadata["error"] = dict(result.error)
    if not result.transcript:  # Fleet needs one message; say why there is no conversation
        reason = (result.error or {}).get("message") or "the episode produced no messages"
        transcript: list[Any] = [{"role": "system", "content": f"(no transcript: {reason})"}]
    else:
        transcript = result.transcript
    ended = time.time()
    return trace_body(
        transcript, job_id=job_id, task_key=result.task_key, model=model or result.policy,
        reward=result.reward, instance_id=result.instance_id,
        verifier_execution_id=result.verifier_execution_id, metadata=metadata,
        status=_status(result),
        started_at=ended - float(result.timings.get("total_s", 0.0) or 0.0), ended_at=ended,
        secrets=secrets, max_image_bytes=max_image_bytes, max_trace_bytes=max_trace_bytes)


def trace_body(chat_history: list[Any], *, job_id: str | None, task_key: str | None,
               model: str | None, reward: float | None, instance_id: str | None = None,
               verifier_execution_id: str | None = None,
               metadata: dict[str, Any] | None = None, status: str = "completed",
               started_at: float | None = None, ended_at: float | None = None,
               secrets: tuple[str, ...] = (), max_image_bytes: int = 2_000_000,
               max_trace_bytes: int = 16_000_000) -> dict[str, Any]:
    """An ingest body from an OpenAI-format chat history (what OpenEnv's ``upload_trace``
    takes), in the shape Fleet's session viewer shows (see the module docstring): secrets
    scrubbed, images capped, ``metadata.score`` = ``reward``, validated with
    fleet-python's ``SessionIngestRequest``."""
    from fleet.models import SessionIngestRequest
    from pydantic import ValidationError

    for secret in secrets:  # the caller's credentials: scrubbed here and from now on
        register_secret(secret)
    images = _ImageBudget(max_image_bytes, max_trace_bytes)
    messages = _viewer_messages(chat_history, images)
    meta: dict[str, Any] = {**redact_value(dict(metadata or {})), "score": reward,
                            "reward": reward}
    if images.omitted:
        meta["images_omitted"] = images.omitted
    body = {
        "messages": messages, "job_id": job_id, "task_key": task_key, "model": model,
        "instance_id": instance_id, "verifier_execution_id": verifier_execution_id,
        "status": status, "metadata": meta,
        "started_at": None if started_at is None else _iso(started_at),
        "ended_at": None if ended_at is None else _iso(ended_at),
    }
    try:
        request = SessionIngestRequest.model_validate(body)
    except ValidationError as exc:
        raise TraceUploadError(f"fleet-python's SessionIngestRequest refuses the trace: "
                               f"{exc.errors()[0].get('msg')}", task=task_key,
                               hint="a trace needs at least one message with a 'role'"
                               ) from exc
    dumped: dict[str, Any] = request.model_dump(mode="json", exclude_none=True)
    return dumped


def _status(result: RolloutResult) -> str:
    if result.error is None:
        return "completed"
    return "cancelled" if _str(result.stop_reason) == "cancelled" else "failed"


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


class _ImageBudget:
    def __init__(self, per_image: int, per_trace: int) -> None:
        self.per_image = per_image
        self.left = per_trace
        self.omitted = 0

    def admit(self, url: str) -> dict[str, Any] | None:
        """``None`` if the data URL fits; else the text part that replaces it."""
        size = len(url)
        if size <= self.per_image and size <= self.left:
            self.left -= size
            return None
        self.omitted += 1
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        cap = "per-image" if size > self.per_image else "per-trace"
        return {"type": "text", "text": f"[image omitted from the trace: {size} bytes over "
                                        f"the {cap} cap; sha256 {digest}]"}


def _viewer_messages(history: list[Any], images: _ImageBudget) -> list[dict[str, Any]]:
    """The chat history as Fleet's session viewer shows it.

    The viewer drops the images of ``user`` messages, so a ``user`` message that carries
    one goes as a ``tool`` message answering the latest assistant tool call that no such
    message answered yet (its first call's id), else a new ``call_...`` id.
    """
    out: list[dict[str, Any]] = []
    pending: str | None = None  # the call the next image-carrying user message answers
    for message in history:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "user")
        calls = message.get("tool_calls")
        if role == "assistant" and isinstance(calls, list) and calls:
            first = calls[0].get("id") if isinstance(calls[0], dict) else None
            pending = first if isinstance(first, str) and first else _new_call_id()
        if role == "user" and _has_image(message.get("content")):
            message = {**message, "role": "tool", "tool_call_id": pending or _new_call_id()}
            pending = None
        out.append(_message(message, images))
    return out


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:8]}"


def _has_image(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "image_url" for p in content)


def _is_turn_footer(part: Any) -> bool:
    text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
    if not isinstance(text, str):
        return False
    text = text.strip()
    return len(text) <= _MAX_FOOTER_CHARS and _TURN_FOOTER.fullmatch(text) is not None


def _message(message: dict[str, Any], images: _ImageBudget) -> dict[str, Any]:
    role = str(message.get("role") or "user")
    out: dict[str, Any] = {"role": role}
    content = message.get("content")
    if isinstance(content, list):
        out["content"] = [_part(p, images) for p in content if not _is_turn_footer(p)]
    elif content is not None:
        out["content"] = redact_value(content)
    if role == "assistant" and message.get("tool_calls"):  # never an empty list
        out["tool_calls"] = redact_value(message["tool_calls"])
    if role == "tool" and message.get("tool_call_id") is not None:
        out["tool_call_id"] = redact_value(message["tool_call_id"])
    if message.get("thinking") is not None:
        out["thinking"] = redact_value(message["thinking"])
    return out


def _part(part: Any, images: _ImageBudget) -> Any:
    if isinstance(part, dict) and part.get("type") == "image_url":
        image = part.get("image_url")  # OpenAI takes {"url": ...} or the URL itself
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str) and url.startswith("data:"):
            replacement = images.admit(url)
            return part if replacement is None else replacement
    return redact_value(part)


# ----- the HTTP client ---------------------------------------------------------------------


class TraceClient:
    """Blocking calls to the trace routes of the session's Fleet, each retried on
    transient answers inside ``budget_s`` (the session's retry pacing). ``jobs_url``:
    the host that serves trace jobs, when it is not the session's Fleet."""

    def __init__(self, session: Session, *, budget_s: float = 60.0,
                 jobs_url: str | None = None) -> None:
        self._session = session
        self._retry: RetryPolicy = session.retry.with_budget(budget_s)
        self.jobs_url = None if jobs_url is None else _base_url(jobs_url)

    def create_job(self, name: str, *, deadline: Deadline | None = None) -> str:
        """Create a trace job; its ``job_id``. A failure that says nothing more specific
        names ``jobs_url``: the route may live on another host."""
        from fleet.models import TraceJobRequest, TraceJobResponse

        body = TraceJobRequest(name=name).model_dump()
        try:
            answer = self._post("/v1/traces/jobs", body, what="creating trace job",
                                deadline=deadline, base_url=self.jobs_url, job=name)
        except TraceUploadError as exc:
            if exc.hint != TraceUploadError.default_hint:
                raise
            hint = (_JOBS_URL_HINT if self.jobs_url is None
                    else f"check TraceOptions.jobs_url ({self.jobs_url})")
            raise TraceUploadError(exc.message, hint=hint, retryable=exc.retryable,
                                   **exc.context) from exc
        job_id: str = TraceJobResponse.model_validate(answer).job_id
        return job_id

    def ingest(self, body: dict[str, Any], *, deadline: Deadline | None = None) -> str:
        """Upload one session; Fleet's ``session_id``."""
        from fleet.models import SessionIngestResponse

        answer = self._post("/v1/sessions/ingest", body, what="uploading trace",
                            deadline=deadline, task=body.get("task_key"))
        session_id: str = SessionIngestResponse.model_validate(answer).session_id
        return session_id

    def _post(self, path: str, body: dict[str, Any], *, what: str,
              deadline: Deadline | None, base_url: str | None = None,
              **context: Any) -> Any:
        from fleetenv.fleet.deadlines import deadline_scope

        deadline = deadline or self._retry.deadline()
        request_id = str(uuid.uuid4())  # the same on every retry: stored once
        sdk = self._session.client.sdk

        def attempt() -> Any:
            try:
                with deadline_scope(deadline, what=what, **context):
                    response = sdk.client.request("POST", path, json=body, base_url=base_url,
                                                  extra_headers={"X-Request-ID": request_id})
                return response.json()
            except DeadlineExceeded as exc:
                raise TraceUploadError(f"{what} ran out of its {deadline.seconds or 0:g} s budget",
                                       **context) from exc
            except Exception as exc:
                raise request_error(exc, what, TraceUploadError, **context) from exc

        def give_up(exc: Exception, attempts: int) -> Exception:
            return TraceUploadError(f"{what} failed {attempts} time(s) within its "
                                    f"{deadline.seconds or 0:g} s budget: "
                                    f"{error_detail(exc)}", **context)

        return self._retry.call(attempt, deadline=deadline, give_up=give_up)


def _base_url(value: Any) -> str:
    """An http(s) base URL with a host, without credentials, query or fragment; no end
    slash. The error says what is wrong without echoing the value (it may hold a secret)."""
    from urllib.parse import urlsplit

    parts = urlsplit(value.strip()) if isinstance(value, str) else None
    problem = None
    if parts is None:
        problem = f"it is a {type(value).__name__}, not a string"
    elif parts.scheme not in ("http", "https"):
        problem = "it must start with http:// or https://"
    elif not parts.hostname:
        problem = "it has no host"
    elif parts.username or parts.password:
        problem = "it may not carry credentials (the session's API key is sent to it)"
    elif parts.query or parts.fragment:
        problem = "it may not have a query string or fragment"
    if problem is not None:
        raise ConfigurationError(
            f"jobs_url is not a base URL: {problem}", field="traces.jobs_url",
            hint='e.g. TraceOptions(job, jobs_url="https://traces.example.com")')
    return str(value).strip().rstrip("/")


# ----- the background uploader -------------------------------------------------------------


class TraceUploader:
    """Uploads finished episodes in the background; see the module docstring.

    ``submit(result)`` never blocks and never raises for an upload problem. ``close()``
    drains the queue for at most ``options.flush_timeout_s`` and returns the report.
    The trace job is created on the first upload (so a run that uploads nothing creates
    no job); if it cannot be created, every episode counts as failed with that reason.
    """

    def __init__(self, session: Session, options: str | TraceOptions) -> None:
        self.options = TraceOptions.of(options)
        self._session = session
        self._client = TraceClient(session, budget_s=self.options.budget_s,
                                   jobs_url=self.options.jobs_url)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.options.max_pending)
        self._lock = threading.Lock()
        self._report = TraceReport(job=self.options.job)
        self._job_error: TraceUploadError | None = None
        self._closing: Deadline | None = None
        self._closed = False
        self._in_flight = 0
        #: close() stopped waiting: what is still under way is counted as not sent.
        self._abandoned = False
        #: The pool job draining the queue (None: the queue was empty when it ended).
        self._draining: Future[None] | None = None

    def __repr__(self) -> str:
        return f"TraceUploader(job={self.options.job!r}, {self.report().summary()!r})"

    def submit(self, result: RolloutResult) -> bool:
        """Queue ``result`` for upload; ``False`` (counted as not sent) if the queue is
        full or the uploader is closed."""
        if not self._closed:
            try:
                self._queue.put_nowait(result)
            except queue.Full:
                pass
            else:
                self._drain_soon()
                return True
        with self._lock:
            self._report.dropped += 1
            first = self._report.dropped == 1
        if first:
            logger.warning("trace upload: episode %s not sent (%s); later ones are counted "
                           "in the run summary", result.rollout_id,
                           "the uploader is closed" if self._closed
                           else f"{self.options.max_pending} uploads already pending")
        return False

    @property
    def running(self) -> bool:
        """Whether an upload is under way or queued."""
        with self._lock:
            return self._draining is not None

    def report(self) -> TraceReport:
        """A snapshot of the counts so far."""
        with self._lock:
            r = self._report
            return TraceReport(job=r.job, job_id=r.job_id, uploaded=r.uploaded,
                               failed=r.failed, dropped=r.dropped,
                               session_ids=dict(r.session_ids), errors=list(r.errors))

    def close(self, timeout_s: float | None = None) -> TraceReport:
        """Upload what is queued (within ``timeout_s``, default the options' flush
        bound) and return the report. Idempotent."""
        bound = self.options.flush_timeout_s if timeout_s is None else timeout_s
        if not self._closed:
            self._closed = True
            closing = self._closing = Deadline(bound)
            while (draining := self._draining) is not None and not closing.expired():
                concurrent.futures.wait([draining], timeout=closing.remaining())
            with self._lock:
                if self._draining is not None:
                    self._abandoned = True
                    self._report.dropped += self._in_flight
            self._count_leftovers()
        report = self.report()
        if not report.ok:
            logger.warning("%s", report.summary())
        return report

    def _count_leftovers(self) -> None:
        left = 0
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            left += 1
        if left:
            with self._lock:
                self._report.dropped += left
            logger.warning("trace upload: %d episode(s) not sent: close() waited its "
                           "%.0f s", left, self.options.flush_timeout_s)

    # ---- the pool job

    def _drain_soon(self) -> None:
        """Start a pool job draining the queue unless one is under way."""
        with self._lock:
            if self._draining is not None:
                return
            try:
                self._draining = runtime.current().submit_blocking(self._drain)
            except (RuntimeError, FleetEnvError) as exc:  # shutting down: counted at close
                logger.debug("trace upload: no thread to upload on (%s)", exc)

    def _drain(self) -> None:
        """Upload what is queued, one at a time; end once the queue is empty."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                with self._lock:  # a submit after this sees no drain and starts one
                    if self._queue.empty():
                        self._draining = None
                        return
                continue
            closing = self._closing
            if closing is not None and closing.expired():
                with self._lock:
                    self._report.dropped += 1
                continue
            with self._lock:
                self._in_flight += 1
            try:
                self._upload(item)
            except Exception as exc:  # never let one episode stop the uploads
                self._failed(item, exc)
            finally:
                with self._lock:
                    self._in_flight -= 1

    def _deadline(self) -> Deadline:
        """One upload's budget, shortened by ``close()``'s bound once it is closing."""
        closing = self._closing
        budget = self.options.budget_s
        if closing is not None:
            remaining = closing.remaining()
            budget = min(budget, remaining) if remaining is not None else budget
        return Deadline(max(budget, 0.001))

    def _job_id(self) -> str:
        with self._lock:
            job_id, error = self._report.job_id, self._job_error
        if job_id is not None:
            return job_id
        if error is not None:
            raise TraceUploadError(f"the trace job could not be created: {error.message}",
                                   hint=error.hint, job=self.options.job)
        try:
            job_id = self._client.create_job(self.options.job, deadline=self._deadline())
        except TraceUploadError as exc:
            with self._lock:
                self._job_error = exc
            raise
        with self._lock:
            self._report.job_id = job_id
        logger.info("trace job %r created: %s", self.options.job, job_id)
        return job_id

    def _upload(self, result: RolloutResult) -> None:
        job_id = self._job_id()
        body = ingest_request(result, job_id=job_id, model=self.options.model,
                              secrets=self._secrets(),
                              max_image_bytes=self.options.max_image_bytes,
                              max_trace_bytes=self.options.max_trace_bytes)
        session_id = self._client.ingest(body, deadline=self._deadline())
        with self._lock:
            if self._abandoned:  # already counted as not sent by close()
                return
            self._report.uploaded += 1
            if result.rollout_id:
                self._report.session_ids[result.rollout_id] = session_id

    def _failed(self, result: RolloutResult, exc: Exception) -> None:
        text = str(exc)
        with self._lock:
            if self._abandoned:
                return
            self._report.failed += 1
            first = self._report.failed == 1
            if len(self._report.errors) < _KEPT_ERRORS:
                self._report.errors.append(text)
        if first:
            logger.warning("trace upload of %s (rollout %s) failed: %s; the run goes on, "
                           "later failures are counted in the run summary",
                           result.task_key, result.rollout_id, text)

    def _secrets(self) -> tuple[str, ...]:
        """The credentials that must never appear in a trace."""
        found: list[str] = []
        try:
            wrapper = self._session.client.sdk.client
            key = getattr(wrapper, "api_key", None)
            if isinstance(key, str):
                found.append(key)
            token = self._session.client.runner_tokens.token()
            if token:
                found.append(token)
        except Exception as exc:  # scrubbing falls back to redact() alone
            logger.debug("trace upload: could not read the credentials to scrub: %s", exc)
        config_key = self._session.config.api_key
        if config_key is not None:
            found.append(config_key.get_secret_value())
        return tuple(found)
