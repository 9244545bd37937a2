"""FleetConfig / resolve_config: precedence, local mode, validation, secrecy, pickling."""

from __future__ import annotations

import logging
import pickle
import random
from typing import Any

import pytest

from fleetenv.core.config import DEFAULT_BASE_URL, FleetConfig, resolve_config
from fleetenv.core.errors import ConfigurationError

SECRET = "sk-live-0123456789abcdef"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_API_KEY", raising=False)
    monkeypatch.delenv("FLEET_BASE_URL", raising=False)


# --- precedence -------------------------------------------------------------------------

def test_defaults_without_key_mean_local_mode() -> None:
    config = resolve_config()
    assert config.use_local is True
    assert config.api_key is None
    assert config.base_url == DEFAULT_BASE_URL == "https://orchestrator.fleetai.com"


def test_documented_defaults() -> None:
    config = resolve_config()
    timeouts = config.timeouts
    assert (timeouts.call, timeouts.connect, timeouts.reset, timeouts.read) == (
        60.0, 10.0, 10.0, 60.0)
    assert (timeouts.provision, config.max_steps, timeouts.verify, timeouts.delete) == (
        600.0, 50, 120.0, 30.0)
    assert (config.max_creating_instances, config.max_live_instances) == (16, 64)
    assert (config.ttl_for("tool_use"), config.ttl_for("computer_use"),
            config.ttl_for("browser_use")) == (900, 1800, 1800)
    assert timeouts.episode is None


def test_env_vars_are_used_when_no_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_API_KEY", SECRET)
    monkeypatch.setenv("FLEET_BASE_URL", "https://us-west-1.fleetai.com/")
    config = resolve_config()
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == SECRET
    assert config.base_url == "https://us-west-1.fleetai.com"
    assert config.use_local is False


def test_arguments_beat_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_API_KEY", "env-key")
    monkeypatch.setenv("FLEET_BASE_URL", "https://env.example.com")
    config = resolve_config(api_key="arg-key", base_url="https://arg.example.com")
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == "arg-key"
    assert config.base_url == "https://arg.example.com"


def test_empty_values_count_as_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_API_KEY", "env-key\n")
    config = resolve_config(api_key="", base_url="  ")
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == "env-key"  # stripped
    assert config.base_url == DEFAULT_BASE_URL
    monkeypatch.setenv("FLEET_API_KEY", "")
    assert resolve_config().use_local is True


def test_environ_argument_replaces_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_API_KEY", "from-os")
    config = resolve_config(environ={})
    assert config.use_local is True


def test_base_url_without_key_is_an_error_not_silent_local_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_BASE_URL", "https://us-west-1.fleetai.com")
    with pytest.raises(ConfigurationError) as err:
        resolve_config()
    assert "FLEET_BASE_URL" in str(err.value)
    assert "FLEET_API_KEY" in (err.value.hint or "")
    assert resolve_config(use_local=True).use_local is True  # explicit local is fine


def test_explicit_use_local_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_API_KEY", SECRET)
    assert resolve_config(use_local=True).use_local is True
    with pytest.raises(ConfigurationError) as err:
        resolve_config(environ={}, use_local=False)
    assert err.value.context["field"] == "api_key"


def test_knobs_from_arguments() -> None:
    config = resolve_config(timeouts={"call": 5, "episode": 30}, max_steps=7,
                            ttl_seconds={"tool_use": 120})
    assert (config.timeouts.call, config.max_steps) == (5.0, 7)
    assert config.ttl_for("tool_use") == 120
    assert config.ttl_for("computer_use") == 1800  # untouched modalities keep defaults
    assert config.episode_deadline_for("computer_use") == 30.0
    assert resolve_config(ttl_seconds=300).ttl_seconds.browser_use == 300


def test_episode_deadline_defaults_to_the_ttl() -> None:
    config = resolve_config()
    assert config.episode_deadline_for("tool_use") == 900.0
    assert config.episode_deadline_for("browser_use") == 1800.0


def test_a_sessions_backoff_follows_base_and_cap() -> None:
    from fleetenv import Session

    backoff = Session(retry_base_s=2, retry_cap_s=5).retry.backoff
    backoff.rng.seed(1)
    delays = [backoff.delay(n) for n in range(6)]
    assert 1.0 <= delays[0] <= 2.0
    assert all(2.5 <= d <= 5.0 for d in delays[2:])
    assert isinstance(backoff.rng, random.Random)


# --- validation -------------------------------------------------------------------------

@pytest.mark.parametrize(("settings", "field", "words"), [
    ({"timeouts": {"call": 0}}, "timeouts.call", "greater than 0"),
    ({"timeouts": {"connect": -1}}, "timeouts.connect", "greater than 0"),
    ({"timeouts": {"reset": float("nan")}}, "timeouts.reset", "finite"),
    ({"timeouts": {"provision": "soon"}}, "timeouts.provision", "number"),
    ({"timeouts": {"episode": float("inf")}}, "timeouts.episode", "finite"),
    ({"max_steps": 0}, "max_steps", "greater than or equal to 1"),
    ({"max_live_instances": 2.5}, "max_live_instances", "integer"),
    ({"ttl_seconds": {"tool_use": -5}}, "ttl_seconds.tool_use", "greater than 0"),
    ({"retry_base_s": 10, "retry_cap_s": 1}, "retry_cap_s", "below retry_base_s"),
    ({"base_url": "orchestrator.fleetai.com"}, "base_url", "http:// or https://"),
    ({"base_url": "https://x.com/?token=abc"}, "base_url", "query string"),
])
def test_bad_values_fail_with_field_and_hint(settings: dict[str, Any], field: str,
                                             words: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        resolve_config(api_key="k", **settings)
    assert err.value.context["field"] == field
    assert words in str(err.value)
    assert err.value.hint


@pytest.mark.parametrize(("name", "suggestion"), [
    ("max_step", "max_steps"), ("max_live_instance", "max_live_instances")])
def test_unknown_setting_suggests_the_closest(name: str, suggestion: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        resolve_config(**{name: 1})
    assert err.value.hint == f"did you mean {suggestion!r}?"


def test_a_setting_that_moved_into_timeouts_says_where() -> None:
    with pytest.raises(ConfigurationError) as err:
        resolve_config(tool_timeout_s=5)
    assert err.value.hint == "it is timeouts={'call': ...} now"
    with pytest.raises(ConfigurationError) as err:
        resolve_config(timeouts={"cal": 5})
    assert err.value.context["field"] == "timeouts.cal"
    assert err.value.hint == "did you mean 'call'?"


def test_timeouts_from_a_session_mapping() -> None:
    from fleetenv import Session, Timeouts

    with Session(timeouts={"call": 30}) as session:
        assert session.config.timeouts == Timeouts(call=30)
    assert resolve_config(timeouts=Timeouts(read=5)).timeouts.read == 5


def test_unknown_ttl_modality() -> None:
    with pytest.raises(ConfigurationError) as err:
        resolve_config(ttl_seconds={"computer": 5})
    assert err.value.context["field"] == "ttl_seconds.computer"


def test_direct_construction_derives_local_mode_from_the_key() -> None:
    assert FleetConfig().use_local is True
    assert FleetConfig(api_key=SECRET).use_local is False
    assert FleetConfig(api_key="  ").use_local is True


def test_config_is_frozen() -> None:
    config = resolve_config()
    with pytest.raises(Exception, match="frozen"):
        config.max_steps = 3  # type: ignore[misc]


def test_replace_revalidates_and_keeps_the_rest() -> None:
    config = resolve_config(api_key=SECRET, ttl_seconds={"tool_use": 100},
                            timeouts={"call": 30})
    changed = config.replace(max_steps=3, ttl_seconds={"browser_use": 60},
                             timeouts={"verify": 300})
    assert changed.max_steps == 3
    assert (changed.ttl_for("tool_use"), changed.ttl_for("browser_use")) == (100, 60)
    assert (changed.timeouts.call, changed.timeouts.verify) == (30, 300)
    assert changed.api_key == config.api_key
    with pytest.raises(ConfigurationError):
        config.replace(max_steps=-1)
    local = config.replace(use_local=True, base_url="http://127.0.0.1:8765")
    assert local.use_local and local.base_url == "http://127.0.0.1:8765"


# --- secrecy ----------------------------------------------------------------------------

def test_key_never_in_repr_str_or_dumps() -> None:
    config = resolve_config(api_key=SECRET)
    for text in (repr(config), str(config), str(config.model_dump()),
                 config.model_dump_json(), repr(config.api_key), f"{config}"):
        assert SECRET not in text
    assert config.model_dump(mode="json")["api_key"] == "**********"


def test_key_never_in_logs(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve_config(api_key=SECRET)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("test").info("config: %s / %r", config, config)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("settings", [
    {"timeouts": {"call": -1}}, {"bogus": 1}, {"base_url": "nope"}, {"use_local": "maybe"}])
def test_key_never_in_error_text_or_chained_errors(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError) as err:
        resolve_config(api_key=SECRET, **settings)
    exc: BaseException | None = err.value
    while exc is not None:  # nothing in the chain may carry the key either
        assert SECRET not in str(exc) and SECRET not in repr(exc)
        exc = exc.__cause__ or exc.__context__


def test_non_string_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigurationError) as err:
        FleetConfig(api_key=SECRET.encode(), use_local=False)
    assert SECRET not in str(err.value)
    assert err.value.__context__ is None


def test_pickle_keeps_the_key_but_not_in_text() -> None:
    config = resolve_config(api_key=SECRET, max_steps=9)
    clone = pickle.loads(pickle.dumps(config))
    assert clone == config
    assert clone.api_key is not None
    assert clone.api_key.get_secret_value() == SECRET
    assert clone.use_local is False and clone.max_steps == 9
    assert SECRET not in repr(clone)
