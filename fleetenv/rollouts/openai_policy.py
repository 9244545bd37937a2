"""A policy backed by any OpenAI-compatible chat-completions server (hosted APIs, vLLM, ...).

Why plain ``requests`` and not the ``openai`` package: the wire format is one POST, the
package would be a heavy extra dependency, and owning the loop lets the policy keep the
house rules itself: every request has a timeout, retries follow the shared
:class:`~fleetenv.core.retry.Backoff`, and the API key can never reach a repr, a log line,
an exception or a results file.

Retrying a model request is always safe: it has no side effect on the environment (unlike
a tool call, which fleetenv never replays). So 408, 429, 5xx, connection errors and
timeouts are retried, honouring ``Retry-After``; any other 4xx means the request itself is
wrong (key, model, URL, options) and fails at once with the server's own explanation.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from pydantic import SecretStr

from fleetenv._version import __version__
from fleetenv.core.errors import ConfigurationError, ConnectError, DeadlineExceeded, FleetEnvError
from fleetenv.core.redaction import credentials_in, register_secret, scrub_secrets
from fleetenv.core.retry import Backoff
from fleetenv.rollouts.policy import PolicyContext, Reply, reply_from_assistant_message

__all__ = ["DEFAULT_OPENAI_BASE_URL", "OpenAIChatPolicy", "normalize_assistant_message"]

logger = logging.getLogger("fleetenv.rollouts")

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
ENV_OPENAI_BASE_URL = "OPENAI_BASE_URL"

#: Statuses that say "try again later": request timeout, rate limit, server trouble.
_RETRY_STATUSES = frozenset({408, 429})
#: A server asking for a longer pause than this is obeyed only up to it, so one bad
#: header cannot park a training worker for an hour.
_MAX_RETRY_AFTER_S = 60.0
#: Opening a TCP/TLS connection never needs the full (generation-sized) read timeout.
_CONNECT_TIMEOUT_S = 10.0


class OpenAIChatPolicy:
    """Asks an OpenAI-compatible ``/chat/completions`` endpoint for each next move.

    The conversation (``context.messages``) and the tools (``context.tools``, native tool
    calling) are sent as they are; several tool calls in one reply run in order; a reply
    without tool calls ends the episode (its text is the final answer when the task wants
    one). ``extra_body`` is merged into the request last, for anything else the server
    takes (``top_p``, ``max_completion_tokens``, vLLM's ``chat_template_kwargs``, ...).

    Thread-safe: one ``requests.Session`` per thread, so a trainer's thread pool can share
    one policy. Worst-case time of one ``act``: ``(max_retries + 1) * timeout_s`` plus the
    backoff pauses.

    ``seed`` is sent as the request's ``seed`` (servers that honour it sample
    reproducibly). When the server returns ``logprobs`` (ask with
    ``extra_body={"logprobs": True}``), they are kept in the reply's meta, so they reach
    ``RolloutResult.turn_meta``.
    """

    # Set by _setup_runtime_state (again after unpickling: they do not cross processes).
    _lock: threading.Lock
    _local: threading.local
    _sessions: weakref.WeakSet[requests.Session]
    _stats: dict[str, int]

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        extra_body: Mapping[str, Any] | None = None,
        tool_choice: str | None = "auto",
        retry_base_s: float = 1.0,
        retry_cap_s: float = 30.0,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError("the OpenAI policy needs a model name",
                                     hint="pass model='gpt-4o-mini' (or the name vLLM serves)")
        if not timeout_s > 0:
            raise ConfigurationError(f"timeout_s must be positive, got {timeout_s!r}",
                                     hint="give the model request a timeout in seconds")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigurationError(f"max_retries must be an integer >= 0, got {max_retries!r}",
                                     hint="use 0 to disable retries")
        if not 0 < retry_base_s <= retry_cap_s:
            raise ConfigurationError(
                f"need 0 < retry_base_s <= retry_cap_s, got {retry_base_s!r} and {retry_cap_s!r}",
                hint="e.g. retry_base_s=1.0, retry_cap_s=30.0")
        self.model = model.strip()
        self.base_url = _clean_base_url(base_url or os.environ.get(ENV_OPENAI_BASE_URL)
                                        or DEFAULT_OPENAI_BASE_URL)
        self.api_key_env = api_key_env
        key = api_key if api_key is not None else os.environ.get(api_key_env)
        key = key.strip() if isinstance(key, str) else None
        if not key and not _is_loopback(self.base_url):
            raise ConfigurationError(
                f"no API key for the model server at {_display_url(self.base_url)}",
                hint=f"set {api_key_env} or pass api_key=... (only a loopback server such as "
                     "a local vLLM may go without one)",
                model=self.model)
        self._api_key: SecretStr | None = SecretStr(key) if key else None
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        self.tool_choice = tool_choice
        self.backoff = Backoff(base=retry_base_s, cap=retry_cap_s)
        self._setup_runtime_state()

    # ------------------------------------------------------------------ public API

    @property
    def url(self) -> str:
        """The endpoint this policy posts to."""
        return f"{self.base_url}/chat/completions"

    def describe(self) -> str:
        """The label results are tagged with (no secrets)."""
        return f"openai:{self.model}"

    def act(self, context: PolicyContext) -> Reply:
        message, meta = self._chat(context.messages, context.tools)
        return reply_from_assistant_message(message, context.task, meta)

    def complete(self, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One chat completion: the assistant message, normalised for sending back.

        Raises ``ConfigurationError`` (bad key, model or URL), ``DeadlineExceeded`` /
        ``ConnectError`` (the server never answered, after the retries), or
        ``FleetEnvError`` (any other refusal or a malformed answer).
        """
        return self._chat(messages, tools)[0]

    def _chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The normalised assistant message, and the reply's ``finish_reason`` and
        ``usage`` (a trainer filters replies cut by the token limit on them)."""
        data = self._post(self._request_body(messages, tools or []))
        choices = data.get("choices") if isinstance(data, Mapping) else None
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, Mapping) else None
        if not isinstance(first, Mapping) or not isinstance(message, Mapping):
            self._count_failure()
            raise self._error(FleetEnvError, "the model server's answer has no "
                              "choices[0].message", "check base_url points at an "
                              "OpenAI-compatible /v1 API", detail=_short(json.dumps(data)))
        usage = data.get("usage")
        meta: dict[str, Any] = {"finish_reason": first.get("finish_reason")}
        if first.get("logprobs") is not None:  # only when asked for and the server has them
            meta["logprobs"] = first["logprobs"]
        if isinstance(usage, Mapping):
            meta["usage"] = {name: value for name, value in usage.items()
                             if isinstance(value, int)}
            with self._lock:
                for name in ("prompt_tokens", "completion_tokens"):
                    value = usage.get(name)
                    if isinstance(value, int):
                        self._stats[name] += value
        return normalize_assistant_message(message), meta

    def stats(self) -> dict[str, int]:
        """Counters since construction: ``requests`` (HTTP attempts), ``retries``,
        ``failures`` (calls that raised), ``prompt_tokens``, ``completion_tokens``."""
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        """Close the HTTP sessions of every thread (the policy stays usable: threads that
        call it again open new ones)."""
        with self._lock:
            sessions = list(self._sessions)
            self._sessions = weakref.WeakSet()
            self._local = threading.local()
        for session in sessions:
            session.close()

    def __repr__(self) -> str:
        return (f"OpenAIChatPolicy(model={self.model!r}, "
                f"base_url={_display_url(self.base_url)!r})")

    def __getstate__(self) -> dict[str, Any]:
        # Sessions, locks and thread-locals do not cross processes; each worker opens its own.
        state = dict(self.__dict__)
        for name in ("_local", "_sessions", "_lock"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup_runtime_state(stats=state.get("_stats"))

    # ------------------------------------------------------------------ internals

    def _setup_runtime_state(self, stats: dict[str, int] | None = None) -> None:
        # Servers and tools echo keys: scrubbed from all output of this process (and of
        # each worker process this policy is unpickled in).
        if self._api_key is not None:
            register_secret(self._api_key.get_secret_value())
        for value in credentials_in(self.extra_body):
            register_secret(value)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sessions = weakref.WeakSet()
        self._stats = dict(stats or dict.fromkeys(
            ("requests", "retries", "failures", "prompt_tokens", "completion_tokens"), 0))

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            with self._lock:
                self._local.session = session
                self._sessions.add(session)
        return session

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": f"fleetenv/{__version__}", "Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key.get_secret_value()}"
        return headers

    def _request_body(self, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.seed is not None:
            body["seed"] = self.seed
        body.update(self.extra_body)
        return body

    def preflight(self, *, timeout_s: float = 30.0) -> None:
        """One tiny request, before a run provisions anything: is the server there, does
        it take the key, does it know the model?

        Raises at once, without retries, what every episode would otherwise hit after its
        retries: ``ConnectError`` (nothing listening, DNS), ``DeadlineExceeded`` (no answer
        within ``timeout_s``) or ``ConfigurationError`` (a refused key, a 404 for the model
        or URL), each naming the URL. Answers that say "later" (429, 5xx) pass: the run's
        own retries deal with those. The request asks for one token (and, if the server
        rejects that option, is sent once more as the run would send it).
        """
        body = self._request_body([{"role": "user", "content": "Reply with OK."}], [])
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            try:
                self._preflight_attempt({**body, "max_tokens": 1}, timeout_s)
                return
            except FleetEnvError as exc:
                if exc.context.get("status") != "400":
                    raise
        self._preflight_attempt(body, timeout_s)

    def _preflight_attempt(self, body: dict[str, Any], timeout_s: float) -> None:
        failure = self._attempt(body, timeout_s=timeout_s)[1]  # the rest raise at once
        if isinstance(failure, DeadlineExceeded | ConnectError):
            raise failure

    def _post(self, body: dict[str, Any]) -> Any:
        """POST with retries; the parsed JSON of a 2xx answer."""
        attempt = 0
        while True:
            data, failure, wait = self._attempt(body)
            if failure is None:
                return data
            if attempt >= self.max_retries:
                self._count_failure()
                if self.max_retries:
                    raise type(failure)(f"{failure.message} (gave up after {attempt + 1} "
                                        "attempts)", hint=failure.hint,
                                        retryable=failure.retryable, **failure.context)
                raise failure
            delay = wait if wait is not None else self.backoff.delay(attempt)
            attempt += 1
            with self._lock:
                self._stats["retries"] += 1
            logger.warning("model request failed, retry %d/%d in %.1f s: %s",
                           attempt, self.max_retries, delay, failure)
            time.sleep(delay)

    def _attempt(self, body: dict[str, Any], *, timeout_s: float | None = None
                 ) -> tuple[Any, FleetEnvError | None, float | None]:
        """One HTTP attempt: ``(json, None, None)`` on success, ``(None, error, Retry-After)``
        on a failure worth retrying; raises at once on one that is not."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._stats["requests"] += 1
        try:
            response = self._session().post(
                self.url, json=body, headers=self._headers(),
                timeout=(min(_CONNECT_TIMEOUT_S, timeout), timeout))
        except requests.Timeout:
            return None, self._error(DeadlineExceeded, f"the model server did not answer "
                                     f"within {timeout:g} s", "raise timeout_s, or "
                                     "check the server is not overloaded",
                                     retryable=True), None
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
            # The reason only ("Connection refused"), not urllib3's nested repr of its pool,
            # connection object and retry state, which is repeated on every retry line.
            return None, self._error(ConnectError, "could not reach the model server: "
                                     f"{_connection_reason(exc)}",
                                     "check --base-url / base_url (the API root, e.g. "
                                     "http://127.0.0.1:8000/v1) and that the server is "
                                     "running"), None
        except requests.RequestException as exc:
            self._count_failure()
            raise self._error(FleetEnvError, "the model request could not be sent",
                              "check base_url", detail=_short(scrub_secrets(str(exc)))) from None
        with response:
            status = response.status_code
            if 200 <= status < 300:
                try:
                    return response.json(), None, None
                except ValueError:
                    self._count_failure()
                    raise self._error(
                        FleetEnvError, "the model server's answer is not JSON",
                        "check base_url points at an OpenAI-compatible /v1 API",
                        status=status, detail=_short(scrub_secrets(response.text))) from None
            detail = _short(scrub_secrets(_server_message(response)))
            if status in _RETRY_STATUSES or status >= 500:
                what = "rate limited" if status == 429 else "failing"
                hint = ("lower the number of episodes in flight, or raise max_retries"
                        if status == 429 else "try again later, or raise max_retries")
                error = self._error(FleetEnvError, f"the model server is {what} "
                                    f"(HTTP {status}): {detail}", hint, status=status)
                error.retryable = True  # the same request may well succeed later
                return None, error, _retry_after(response)
        self._count_failure()
        raise self._client_error(status, detail)

    def _client_error(self, status: int, detail: str) -> FleetEnvError:
        if status in (401, 403):
            return self._error(ConfigurationError, f"the model server refused the API key "
                               f"(HTTP {status}): {detail}", f"check the key in "
                               f"{self.api_key_env} (or api_key=) is valid for this server "
                               "and model", status=status)
        if status == 404:
            return self._error(ConfigurationError, f"the model server answered 404: {detail}",
                               "check the model name and that base_url is the API root "
                               "(e.g. https://host/v1)", status=status)
        return self._error(FleetEnvError, f"the model server rejected the request "
                           f"(HTTP {status}): {detail}",
                           "check the policy options (max_tokens, tool_choice, extra_body) and "
                           "that the server supports tool calling (vLLM: "
                           "--enable-auto-tool-choice --tool-call-parser ...)", status=status)

    def _error(self, cls: type[FleetEnvError], message: str, hint: str,
               **context: Any) -> FleetEnvError:
        return cls(message, hint=hint, model=self.model, url=_display_url(self.url), **context)

    def _count_failure(self) -> None:
        with self._lock:
            self._stats["failures"] += 1


def normalize_assistant_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message as the model sent it, made valid to send back.

    Only what the API requires is touched: ``role`` is ``assistant``; ``content`` is
    present (``None`` when the reply is only tool calls); an empty ``tool_calls`` list is
    dropped; each call gets an ``id`` (the tool result must answer it), ``type`` and string
    ``arguments`` (malformed argument text is kept: the environment answers it with a tool
    error the model can read). ``None``-valued extras (``refusal``, ``audio``,
    ``function_call``) are left out; everything else, such as vLLM's
    ``reasoning_content``, is kept.
    """
    out = {k: v for k, v in message.items() if v is not None}
    out["role"] = "assistant"
    out.setdefault("content", None)
    calls = out.pop("tool_calls", None)
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_normalize_call(call) for call in calls]
    return out


def _normalize_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call  # not a tool call at all: the action parser will say so
    out = dict(call)
    if not out.get("id"):
        out["id"] = f"call_{uuid.uuid4().hex[:24]}"
    out.setdefault("type", "function")
    function = out.get("function")
    if isinstance(function, Mapping):
        function = dict(function)
        arguments = function.get("arguments")
        if arguments is None:
            function["arguments"] = "{}"
        elif not isinstance(arguments, str):
            function["arguments"] = json.dumps(arguments)
        out["function"] = function
    return out


def _clean_base_url(value: str) -> str:
    text = value.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"the model server URL {_display_url(text)!r} is not an http(s) URL with a host",
            hint="pass base_url like https://api.openai.com/v1 or http://127.0.0.1:8000/v1")
    if parts.query or parts.fragment:
        raise ConfigurationError(
            "the model server URL may not have a query string or fragment",
            hint="pass the API root only (e.g. https://host/v1); put keys in api_key")
    suffix = "/chat/completions"
    return text[: -len(suffix)] if text.endswith(suffix) else text


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _display_url(url: str) -> str:
    """The URL without user-info or query (where credentials hide)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else url.split("?")[0]


def _server_message(response: requests.Response) -> str:
    """The server's own explanation: OpenAI's ``error.message``, vLLM's ``message``,
    FastAPI's ``detail``, else the raw text."""
    try:
        data = response.json()
    except ValueError:
        return response.text.strip() or response.reason or ""
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        for name in ("message", "detail"):
            if data.get(name):
                value = data[name]
                return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(data)


def _retry_after(response: requests.Response) -> float | None:
    """``retry-after-ms`` or ``Retry-After`` (seconds), capped; ``None`` when absent."""
    for name, scale in (("retry-after-ms", 0.001), ("Retry-After", 1.0)):
        value = response.headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
        if seconds >= 0:
            return min(seconds, _MAX_RETRY_AFTER_S)
    return None


def _connection_reason(exc: BaseException) -> str:
    """The innermost OS-level reason of a ``requests`` connection error, e.g.
    ``"[Errno 111] Connection refused"``, else a short form of its text."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return (f"[Errno {current.errno}] {current.strerror}" if current.errno is not None
                    else current.strerror)
        reason = getattr(current, "reason", None)
        linked = [current.__cause__, current.__context__, reason, *current.args]
        stack.extend(item for item in linked if isinstance(item, BaseException))
    match = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
    return match.group(0).strip() if match else _short(str(exc), 200)


def _short(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
