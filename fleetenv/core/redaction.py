"""Keeping credentials out of everything fleetenv writes or prints: one scrubber
(docs/configuration.md, "Keys a server or a tool echoes").

Two ways, used together: **by value**, every credential the process holds, registered
when first held (:func:`register_secret`), replaced by ``***`` wherever it appears, as
written or JSON- or HTML-escaped; **by shape**, ``Authorization: Bearer x``, ``?token=x``,
``"api_key": "x"`` and the like, blanked even when never registered (:func:`redact`).
Error messages, events and traces get both; result lines, reports, reprs and log records
the by-value pass only, so a tool's ``"next_page_token": "..."`` in a transcript stays
what it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import logging
import re
import threading
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["MARKER", "MIN_SECRET_LENGTH", "credential_name", "credentials_in",
           "hide_credentials", "install_log_scrubbing", "redact", "redact_value",
           "register_secret", "scrub_exception", "scrub_secrets", "scrub_value",
           "secret_digest"]

#: What a secret is replaced by.
MARKER = "***"
#: Shorter values are not registered: scrubbing ``"abc"`` everywhere would garble text.
MIN_SECRET_LENGTH = 8
#: Registered values kept at most (a process holds a handful; past this, the oldest go).
MAX_SECRETS = 256

_lock = threading.Lock()
_secrets: dict[str, None] = {}  # insertion-ordered, so the oldest is dropped first
#: Every written form of every registered secret, longest first (read without the lock:
#: the tuple is replaced, never changed).
_forms: tuple[str, ...] = ()

logger = logging.getLogger("fleetenv")


def register_secret(value: str | None) -> None:
    """Scrub ``value`` from everything fleetenv writes from now on (values shorter than
    :data:`MIN_SECRET_LENGTH` are ignored). Cheap when already registered."""
    global _forms
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH or value in _secrets:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets[value] = None
        dropped = len(_secrets) > MAX_SECRETS
        if dropped:
            del _secrets[next(iter(_secrets))]
        forms = {form for secret in _secrets for form in _written_forms(secret)}
        _forms = tuple(sorted(forms, key=len, reverse=True))
    if dropped:
        logger.warning("more than %d credentials registered for scrubbing; the oldest is "
                       "no longer scrubbed", MAX_SECRETS)


def _written_forms(secret: str) -> set[str]:
    """How ``secret`` can appear in text we write: as is, JSON-escaped, HTML-escaped."""
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
             html.escape(secret)}
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


def scrub_secrets(text: str) -> str:
    """``text`` with every registered secret replaced by :data:`MARKER` (by value only)."""
    for form in _forms:
        if form in text:
            text = text.replace(form, MARKER)
    return text


def scrub_value(value: Any) -> Any:
    """:func:`scrub_secrets` applied to every string in a JSON-like value (a copy)."""
    return _each_string(scrub_secrets, value)


def _each_string(clean: Callable[[str], str], value: Any) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, list | tuple):
        return [_each_string(clean, v) for v in value]
    if isinstance(value, dict):
        return {k: _each_string(clean, v) for k, v in value.items()}
    return value


_SECRET_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)([A-Za-z0-9._~+/=-]+)"),
    re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?basic\s+)([A-Za-z0-9+/=]+)"),
    re.compile(r"(?i)((?:api[_-]?key|token|authorization|secret)[\"']?\s*[:=]\s*[\"']?)"
               r"([^\s\"'&,})\]]+)"),
)
#: Values that stand for a credential without being one, kept as written so hints stay
#: readable: ``pass api_key=...``, ``api_key=None``, ``token=<your key>``, an already
#: blanked ``***``, and the scheme word of ``Authorization: Bearer ***``.
_PLACEHOLDER = re.compile(r"(?i)\.\.\.|none|null|\*+|<[^>]*>?|bearer|basic")


def _blank(match: re.Match[str]) -> str:
    value = match.group(2)
    return match.group(0) if _PLACEHOLDER.fullmatch(value) else match.group(1) + MARKER


def redact(text: str) -> str:
    """Blank the registered secrets and anything that looks like a credential."""
    text = scrub_secrets(text)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(_blank, text)
    return text


def redact_value(value: Any) -> Any:
    """:func:`redact` applied to every string in a JSON-like value (a copy)."""
    return _each_string(redact, value)


def scrub_exception(exc: BaseException) -> BaseException:
    """Scrub the registered secrets from a caught exception's message, in place (its
    string ``args`` and a ``message`` attribute): an error of ours that wraps it keeps
    it as ``__cause__``, and a printed traceback shows the cause's message too."""
    exc.args = tuple(scrub_secrets(a) if isinstance(a, str) else a for a in exc.args)
    message = getattr(exc, "message", None)
    if isinstance(message, str):
        with contextlib.suppress(AttributeError):  # a read-only property (from args)
            exc.message = scrub_secrets(message)  # type: ignore[attr-defined]  # some have one
    return exc


# ----- credential-looking settings -----------------------------------------------------

#: Setting names that hold credentials. ``token`` only at a name's end or before ``-``:
#: ``max_tokens``, ``tokenizer`` and ``stop_token_ids`` are settings, ``access_token`` and
#: ``X-Token`` are credentials.
_CREDENTIAL_NAME = re.compile(r"(?i)api[_-]?key|access[_-]?key|private[_-]?key|secret|"
                              r"passw(?:or)?d|auth(?:orization)?(?![a-z])|bearer|credential|"
                              r"token(?![a-z_])")
#: String values shaped like keys, whatever their setting is called.
_CREDENTIAL_VALUE = re.compile(r"(?i)\s*(?:bearer\s+|basic\s+)\S{8,}|"
                               r"\s*(?:sk[-_]|gh[pousr]_|github_pat_|hf_|xox[abprs]-|AIza)"
                               r"[A-Za-z0-9_-]{8,}")
#: Names that point at a credential without holding it (``api_key_env="OPENAI_API_KEY"``).
_CREDENTIAL_POINTER = re.compile(r"(?i)[_-](?:env|var|file|path)$")


def credential_name(name: str) -> bool:
    """Whether a setting called ``name`` holds a credential (``api_key``, ``x-token``...)."""
    return bool(_CREDENTIAL_NAME.search(name)) and not _CREDENTIAL_POINTER.search(name)


def secret_digest(value: str) -> str:
    """What a stored setting shows instead of a credential: a tagged sha256 prefix, which
    changes when the value does (``--resume`` notices) and does not give it away."""
    return f"[secret sha256:{hashlib.sha256(value.encode('utf-8')).hexdigest()[:16]}]"


def hide_credentials(value: Any, name: str = "") -> Any:
    """A copy of a JSON-like setting with each credential string replaced by its
    :func:`secret_digest`: strings under a credential-looking name (``api_key``,
    ``Authorization``, ``access_token``), and strings shaped like keys (``sk-...``,
    ``Bearer ...``) under any name."""
    if isinstance(value, str):
        if credential_name(name) or _CREDENTIAL_VALUE.match(value):
            return secret_digest(value)
        return value
    if isinstance(value, list | tuple):
        return [hide_credentials(v, name) for v in value]
    if isinstance(value, dict):
        return {k: hide_credentials(v, str(k)) for k, v in value.items()}
    return value


def credentials_in(value: Any, name: str = "") -> list[str]:
    """The credential strings :func:`hide_credentials` would hide (for ``Bearer x``,
    also ``x``)."""
    if isinstance(value, str):
        if not (credential_name(name) or _CREDENTIAL_VALUE.match(value)):
            return []
        scheme, _, rest = value.strip().partition(" ")
        return [value, rest.strip()] if scheme.lower() in ("bearer", "basic") else [value]
    if isinstance(value, list | tuple):
        return [found for v in value for found in credentials_in(v, name)]
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in credentials_in(v, str(k))]
    return []


# ----- log records ----------------------------------------------------------------------

def _scrub_record(record: logging.LogRecord) -> None:
    """Scrub the registered secrets from a record as it is created, before any filter or
    handler sees it: its message, its exception's text and its stack."""
    if not _forms:  # nothing registered: the record is left as it is, at no cost
        return
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: logging reports it when a handler formats
        return
    cleaned = scrub_secrets(message)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        text = _exception_text(record.exc_info)
        cleaned = scrub_secrets(text)
        if cleaned != text:  # formatters use exc_text when set instead of formatting again
            record.exc_text = cleaned
    if record.stack_info:
        record.stack_info = scrub_secrets(record.stack_info)


_FORMATTER = logging.Formatter()
#: Tracebacks are formatted one at a time, as a handler's lock would have them.
_format_lock = threading.Lock()


def _exception_text(exc_info: Any) -> str:
    """The traceback a handler would print; without frames if formatting them fails (CPython
    before 3.11.8 can fail building the carets' AST when two threads do, gh-106905), since
    an exception raised here would fail the caller's logging call."""
    try:
        with _format_lock:
            return _FORMATTER.formatException(exc_info)
    except Exception:
        return "".join(traceback.format_exception_only(exc_info[0], exc_info[1]))


def install_log_scrubbing() -> None:
    """Scrub every log record of the process as it is created (idempotent; done on
    import), fleetenv's and other libraries' alike (an MCP client logs raw tool results
    at DEBUG).

    Why the record factory: a filter on the ``fleetenv`` logger does not see the records
    of its children (``fleetenv.mcp`` ...), and handlers are the user's. The factory wraps
    whatever factory was installed before, so others' factories keep working.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "fleetenv_scrubs", False):
        return

    def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _scrub_record(record)
        return record

    make_record.fleetenv_scrubs = True  # type: ignore[attr-defined]  # our marker
    logging.setLogRecordFactory(make_record)


install_log_scrubbing()
