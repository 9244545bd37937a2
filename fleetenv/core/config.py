"""Where fleetenv runs (Fleet or the embedded local stand-in) and how long it waits.

Resolution order, the settings, and why the API key survives pickling: docs/configuration.md.
No API key means local mode: a higher layer starts the embedded ``fleetenv.local``; a base
URL set without a key is an error instead, so a forgotten key cannot quietly run the local
sample apps.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.modality import MODALITIES, Modality

__all__ = [
    "DEFAULT_BASE_URL",
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "FleetConfig",
    "TTLDefaults",
    "Timeouts",
    "finite_reward",
    "resolve_config",
]

DEFAULT_BASE_URL = "https://orchestrator.fleetai.com"
ENV_API_KEY = "FLEET_API_KEY"
ENV_BASE_URL = "FLEET_BASE_URL"

def finite_reward(value: object, *, field: str, hint: str) -> float:
    """A reward setting (e.g. ``failed_parse_reward``, the Gymnasium adapter's
    ``unknown_reward``) as a float: a finite number, not a bool, else a
    ``ConfigurationError`` naming ``field``. Trainers add rewards up; one NaN or ``True``
    slipped into a group would corrupt every advantage computed from it."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        raise ConfigurationError(f"{field} must be a finite number, got {value!r:.40}",
                                 field=field, hint=hint)
    return float(value)


class TTLDefaults(BaseModel):
    """Instance time-to-live by modality, in seconds.

    tool_use 900 s (600 s let long episodes outlive their instance); computer_use and
    browser_use 1800 s, since screenshot round-trips make their episodes several times
    longer.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_use: int = Field(900, gt=0)
    computer_use: int = Field(1800, gt=0)
    browser_use: int = Field(1800, gt=0)

    def for_modality(self, modality: Modality | str) -> int:
        return int(getattr(self, Modality(modality).value))


class Timeouts(BaseModel):
    """How long each operation may take, in seconds: one deadline per operation, enforced
    in one place (the operation's own scope on the loop or around its HTTP calls; no
    caller adds a timer of its own on top).

    ``connect`` (10 s): opening a connection (TCP + TLS) to any endpoint, and one attempt
    at opening an MCP session (handshake and first tool listing); opening an episode's
    sessions may take three of them, retries included.
    ``read`` (60 s): one read-only request: the manager API's describe / query, listing an
    MCP endpoint's tools or resources, one request of an evaluation job, a control-plane
    request made outside any operation.
    ``call`` (60 s): one MCP tool call, from send to result.
    ``reset`` (10 s): the manager API's ``/reset`` (restoring the seed state); short, since
    some images hang on it and a fresh instance is the better answer then.
    ``provision`` (600 s): everything it takes to get one running instance: caps,
    create, retries, readiness.
    ``verify`` (120 s): one verification, retries included: an overall deadline (no
    floor), enforced on every socket read, so a server that trickles its answer cannot
    stretch it.
    ``delete`` (30 s): deleting one instance, retries included (at interpreter exit a
    shorter budget of its own).
    ``episode`` (``None``): one episode's wall-clock limit; ``None`` means the instance
    TTL of the task's modality.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect: float = Field(10.0, gt=0, allow_inf_nan=False)
    read: float = Field(60.0, gt=0, allow_inf_nan=False)
    call: float = Field(60.0, gt=0, allow_inf_nan=False)
    reset: float = Field(10.0, gt=0, allow_inf_nan=False)
    provision: float = Field(600.0, gt=0, allow_inf_nan=False)
    verify: float = Field(120.0, gt=0, allow_inf_nan=False)
    delete: float = Field(30.0, gt=0, allow_inf_nan=False)
    episode: float | None = Field(None, gt=0, allow_inf_nan=False)


class FleetConfig(BaseModel):
    """Resolved settings; frozen. Build it with ``resolve_config()``; change with ``replace()``.

    Every duration is in seconds and must be a positive, finite number.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key: SecretStr | None = None
    base_url: str = DEFAULT_BASE_URL
    #: True: run on the embedded fleetenv.local. Default: True exactly when there is no key.
    use_local: bool = False

    #: How long each operation may take (a mapping sets the named ones, see `Timeouts`).
    timeouts: Timeouts = Field(default_factory=Timeouts)
    #: Backoff between provisioning retries: base * 2**n, capped, with equal jitter.
    retry_base_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    retry_cap_s: float = Field(20.0, gt=0, allow_inf_nan=False)
    #: Per session: instances in the middle of being created / created and not deleted.
    max_creating_instances: int = Field(16, ge=1)
    max_live_instances: int = Field(64, ge=1)
    ttl_seconds: TTLDefaults = Field(default_factory=TTLDefaults)
    #: Agent steps before an episode is truncated.
    max_steps: int = Field(50, ge=1)
    #: Tag put on every instance created with this config (fleet-python's ``run_id``), so
    #: a runner can list and sweep what its workers created, even in other processes.
    #: ``None``: a tag per process.
    run_tag: str | None = Field(None, min_length=1, max_length=100)
    #: Where instances are created (one of Fleet's regions; None: Fleet's default). An
    #: unknown region is a permanent provisioning error naming the valid ones.
    region: str | None = Field(None, min_length=1, max_length=64)
    #: How tool arguments are checked against the tool's input schema before sending:
    #: "strict" (also undeclared arguments), "lenient" (schema errors only), "off".
    check_arguments: Literal["strict", "lenient", "off"] = "strict"
    #: Which tool results are errors: "fleet" (``isError`` and Fleet's error payloads) or
    #: "protocol" (``isError`` only). A callable rule is a ``FleetEnv`` argument only.
    tool_error_rule: Literal["fleet", "protocol"] = "fleet"

    @model_validator(mode="before")
    @classmethod
    def _default_use_local(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("use_local") is None:
            key = data.get("api_key")
            if isinstance(key, SecretStr):
                key = key.get_secret_value()
            has_key = key is not None and not (isinstance(key, str) and not key.strip())
            data = {**data, "use_local": not has_key}
        return data

    @field_validator("api_key", mode="before")
    @classmethod
    def _clean_key(cls, value: Any) -> Any:
        # A key read with $(cat keyfile) ends in a newline; "" means "no key".
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str):
            value = value.strip()
            return value or None
        if value is None:
            return None
        raise ValueError("the API key must be a string")

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("it must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment:
            raise ValueError("it may not have a query string or fragment")
        return value.strip().rstrip("/")

    @field_validator("ttl_seconds", mode="before")
    @classmethod
    def _ttl_from_number(cls, value: Any) -> Any:
        # ttl_seconds=1200 sets every modality; a mapping overrides only the ones it names.
        if isinstance(value, int) and not isinstance(value, bool):
            return dict.fromkeys(MODALITIES, value)
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> FleetConfig:
        if self.retry_cap_s < self.retry_base_s:
            raise _SettingsConflict(
                "retry_cap_s", f"retry_cap_s ({self.retry_cap_s:g} s) is below retry_base_s "
                f"({self.retry_base_s:g} s)", "raise retry_cap_s or lower retry_base_s")
        if not self.use_local and self.api_key is None:
            raise _SettingsConflict(
                "api_key", "use_local is False but there is no API key",
                f"pass the key as the api_key argument or set {ENV_API_KEY}")
        return self

    def __init__(self, **data: Any) -> None:
        problem = None
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problem = _describe(exc)
        # Raised outside the except block so the ValidationError (whose text includes
        # input values, possibly the key) is not attached as __context__.
        if problem is not None:
            raise ConfigurationError(problem[0], hint=problem[1], field=problem[2])

    def ttl_for(self, modality: Modality | str) -> int:
        """Instance TTL in seconds for a task of this modality."""
        return self.ttl_seconds.for_modality(modality)

    def episode_deadline_for(self, modality: Modality | str) -> float:
        """Episode wall-clock limit: the explicit deadline, else the instance TTL.

        An episode cannot usefully outlive its instance, so the TTL is the natural cap.
        """
        if self.timeouts.episode is not None:
            return self.timeouts.episode
        return float(self.ttl_for(modality))

    def replace(self, **changes: Any) -> FleetConfig:
        """A validated copy with ``changes`` applied (``use_local`` is kept unless given).
        A mapping for ``ttl_seconds`` or ``timeouts`` changes only the values it names."""
        data = {name: getattr(self, name) for name in type(self).model_fields}
        for name in ("ttl_seconds", "timeouts"):
            data[name] = getattr(self, name).model_dump()
            if isinstance(changes.get(name), Mapping):
                data[name].update(changes.pop(name))
        data.update(changes)
        return FleetConfig(**data)


class _SettingsConflict(ValueError):
    """Two settings that are each valid but not together; names the one to change."""

    def __init__(self, field: str, problem: str, hint: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem
        self.hint = hint


def _describe(exc: ValidationError) -> tuple[str, str, str]:
    """(message, hint, field) for the first problem, never echoing the input value.

    Messages avoid the "api_key: value" shape on purpose: ``redact()`` would blank it.
    """
    error = exc.errors(include_input=False, include_url=False)[0]
    loc = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, _SettingsConflict):
        return cause.problem, cause.hint, cause.field
    if error["type"] == "extra_forbidden":
        parent, _, name = loc.rpartition(".")
        known = list({"ttl_seconds": MODALITIES, "timeouts": Timeouts.model_fields,
                      "": FleetConfig.model_fields}.get(parent, ()))
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = (f"it is timeouts={{{_MOVED[name]!r}: ...}} now" if name in _MOVED and not parent
                else f"did you mean {close[0]!r}?" if close
                else f"known settings: {', '.join(known)}")
        return f"unknown setting {loc!r}", hint, loc
    return f"setting {loc} is invalid ({message})", _hint_for(loc), loc


#: The settings that became `Timeouts` fields, for the error that names the new place.
_MOVED = {"tool_timeout_s": "call", "connect_timeout_s": "connect", "reset_timeout_s": "reset",
          "provision_budget_s": "provision", "verifier_timeout_s": "verify",
          "episode_deadline_s": "episode"}


def _hint_for(field: str) -> str:
    if field == "api_key":
        return (f"pass the key as the api_key argument or set {ENV_API_KEY}, or leave both "
                "unset to run locally")
    if field == "base_url":
        return f"use e.g. {DEFAULT_BASE_URL}, or unset {ENV_BASE_URL}"
    if field.endswith("_s") or field.startswith(("ttl_seconds", "timeouts")):
        return "use a positive number of seconds"
    if field.startswith("max_"):
        return "use a whole number of at least 1"
    return "see FleetConfig's field documentation for the allowed values"


def resolve_config(
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    use_local: bool | None = None,
    environ: Mapping[str, str] | None = None,
    **settings: Any,
) -> FleetConfig:
    """Settings from arguments, then ``FLEET_API_KEY`` / ``FLEET_BASE_URL``, then defaults.

    ``None`` or ``""`` means "not given" for ``api_key`` and ``base_url``. ``use_local``
    defaults to "no key found". ``environ`` replaces ``os.environ`` (for tests and
    embedding). ``settings`` are the other ``FleetConfig`` fields, e.g. ``max_steps=20``,
    ``ttl_seconds={"tool_use": 1200}`` or ``timeouts={"call": 30}``.
    """
    env = os.environ if environ is None else environ
    key = (api_key or "").strip() or env.get(ENV_API_KEY, "").strip() or None
    url = (base_url or "").strip() or env.get(ENV_BASE_URL, "").strip() or None
    if use_local is None:
        use_local = key is None
        if use_local and url is not None:
            origin = "base_url" if (base_url or "").strip() else ENV_BASE_URL
            raise ConfigurationError(
                f"{origin} is set to {url!r} but there is no API key",
                hint=f"pass the key as the api_key argument or set {ENV_API_KEY}; or unset "
                     f"{origin} to run on the embedded local Fleet",
                field="api_key")
    return FleetConfig(api_key=key, base_url=url or DEFAULT_BASE_URL, use_local=use_local,
                       **settings)
