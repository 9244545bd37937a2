"""Turning one raw task mapping, in any spelling in circulation, into canonical fields.

Task files come from several exporters that never agreed on names: Fleet's SDK export
writes ``key/env_id/version/data_id/verifier_func/task_modality``, the Fleet API answers
``environment_id`` and a nested ``verifier`` object, OpenEnv configs say ``task_key`` and
``verifier_code``. Every alias is declared in one table (a dropped ``data_id`` would run a
task without its data seed), two aliases that disagree are an error instead of a silent
pick, and every problem is a ``ConfigurationError`` that names the field and says what to
write instead.

Versions follow fleet-python's ``make()``: a version that starts with a digit gets a
``v`` prefix (``"1"`` -> ``"v1"``, ``"1.2"`` -> ``"v1.2"``), others are kept as written
(``"latest"``). Normalising here means ``Task.env_spec`` is exactly what Fleet receives,
and two spellings of one version compare equal.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any, NoReturn

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.modality import MODALITIES, suggest_modality

__all__ = ["ALIASES", "normalize_task_fields", "normalize_version", "split_spec"]

#: canonical field -> every name it is accepted under (canonical name first).
ALIASES: dict[str, tuple[str, ...]] = {
    "key": ("key", "task_key", "id"),
    "prompt": ("prompt",),
    "env_key": ("env_key", "env_id", "environment_id"),
    "env_version": ("env_version", "version"),
    "data_key": ("data_key", "data_id"),
    "data_version": ("data_version",),
    "env_variables": ("env_variables",),
    "verifier": ("verifier", "verifier_code", "verifier_func"),
    "verifier_id": ("verifier_id",),
    "modality": ("modality", "task_modality"),
    "metadata": ("metadata",),
}

_ALIAS_TO_FIELD = {alias: field for field, names in ALIASES.items() for alias in names}

#: Fields Fleet exports that fleetenv does not use; accepted and dropped without comment.
#: Any other unknown field is dropped too, unless it looks like a typo of a known one.
FLEET_FIELDS_IGNORED = frozenset({
    "created_at", "updated_at", "team_id", "project_key", "task_project_key",
    "verifier_sha", "verifier_runtime_version", "output_json_schema",
})

#: What the Fleet API puts in ``verifier.code`` when it could not load the source.
_UNLOADED_CODE_PREFIX = "<error loading code:"


def _fail(message: str, *, field: str | None, task: str | None, hint: str) -> NoReturn:
    raise ConfigurationError(message, hint=hint, task=task, field=field)


def _type_name(value: Any) -> str:
    # JSON names read better than Python names in a message about a JSON file.
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _a_type(value: Any) -> str:
    """``"an array"``, ``"a number"``: the type name with its article."""
    name = _type_name(value)
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def split_spec(spec: str, *, field: str, task: str | None) -> tuple[str, str | None]:
    """Split ``"key:version"`` the way fleet-python's ``make()`` does (first colon)."""
    name, sep, version = spec.strip().partition(":")
    name = name.strip()
    if not name:
        _fail(f"{field} {spec!r} has no name before the ':'", field=field, task=task,
              hint=f'write it as "<name>" or "<name>:<version>", e.g. "{field}": "helpdesk:v1"')
    if any(ch.isspace() for ch in name):
        _fail(f"{field} {spec!r} contains whitespace", field=field, task=task,
              hint="environment and data keys are single words like \"helpdesk\"")
    if sep and not version.strip():
        _fail(f"{field} {spec!r} has an empty version after the ':'", field=field, task=task,
              hint=f'drop the ":" or add the version, e.g. "{name}:v1"')
    return name, (normalize_version(version, field=field, task=task) if sep else None)


def normalize_version(value: Any, *, field: str, task: str | None) -> str | None:
    """A version as fleet-python sends it: a string, ``v``-prefixed if it starts with a digit.

    ``None`` and ``""`` mean "no version" (exports with empty cells write ``""``). A JSON
    integer is accepted (``1`` -> ``"v1"``); a float is refused because ``1.10`` has
    already become ``1.1`` by the time we see it.
    """
    if value is None:
        return None
    if isinstance(value, float):
        _fail(f"{field} must be a string, got the number {value!r}", field=field,
              task=task, hint=f'quote the version as written, e.g. "{field}": "v{value}"')
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        _fail(f"{field} must be a string, got {_type_name(value)}", field=field, task=task,
              hint=f'write it like "{field}": "v1"')
    version = value.strip()
    if not version:
        return None
    if ":" in version or any(ch.isspace() for ch in version):
        _fail(f"{field} {value!r} may not contain ':' or whitespace", field=field, task=task,
              hint='a version is one word like "v1" or "v1.2"')
    if version[0].isdigit():
        version = f"v{version}"
    return version


def _verifier_parts(value: Any, *, task: str | None) -> tuple[str | None, str | None]:
    """(source, verifier_id) from a ``verifier`` value: source text or the API's object."""
    if isinstance(value, Mapping):
        code = value.get("code")
        verifier_id = value.get("verifier_id")
        if code is not None and not isinstance(code, str):
            _fail(f"verifier.code must be a string, got {_type_name(code)}",
                  field="verifier.code", task=task, hint="put the verifier's Python source there")
        return code, _optional_id(verifier_id, field="verifier.verifier_id", task=task)
    if value is None or isinstance(value, str):
        return value, None
    _fail(f"verifier must be Python source text or an object with 'code', got "
          f"{_type_name(value)}", field="verifier", task=task,
          hint='write "verifier_func": "def validate_task(env, final_answer=None): ..."')


def _optional_id(value: Any, *, field: str, task: str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return value.strip() or None
    _fail(f"{field} must be a string, got {_type_name(value)}", field=field, task=task,
          hint=f'write it like "{field}": "abc123"')


def _present_values(raw: Mapping[str, Any], field: str, task: str | None) -> list[tuple[str, Any]]:
    """(alias, value) for every alias of ``field`` given a non-null value."""
    found: list[tuple[str, Any]] = []
    for alias in ALIASES[field]:
        value = raw.get(alias)
        if field == "verifier" and value is not None:
            value, _ = _verifier_parts(value, task=task)
            if isinstance(value, str) and (
                not value.strip() or value.startswith(_UNLOADED_CODE_PREFIX)
            ):
                value = None
        if value is not None:
            found.append((alias, value))
    return found


def _pick(raw: Mapping[str, Any], field: str, task: str | None,
          same: Any = None) -> Any:
    """The value of ``field`` under whichever alias was used; disagreeing aliases fail."""
    found = _present_values(raw, field, task)
    if not found:
        return None
    first_alias, first = found[0]
    for alias, value in found[1:]:
        a, b = (same(first), same(value)) if same else (first, value)
        if a != b:
            _fail(f"{first_alias!r} and {alias!r} both set {field} but disagree "
                  f"({_short(first)} vs {_short(value)})", field=field, task=task,
                  hint=f"keep only one of {first_alias!r} / {alias!r}")
    return first


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "...'"


def _task_label(raw: Mapping[str, Any]) -> str | None:
    """The task key for error messages, before it is validated."""
    for alias in ALIASES["key"]:
        value = raw.get(alias)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return None


def _check_typos(raw: Mapping[str, Any], task: str | None) -> None:
    """Fail on an unknown field that looks like a misspelt known one (``promt``).

    Unknown fields are otherwise ignored, so new Fleet export fields do not break old
    fleetenv versions; but a misspelt ``metdata`` would silently lose the metadata.
    """
    known = list(_ALIAS_TO_FIELD)
    for name in raw:
        if name in _ALIAS_TO_FIELD or name in FLEET_FIELDS_IGNORED or not isinstance(name, str):
            continue
        match = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if match and not _present_values(raw, _ALIAS_TO_FIELD[match[0]], task):
            _fail(f"unknown field {name!r}", field=name, task=task,
                  hint=f"did you mean {match[0]!r}?")


def _mapping(raw: Mapping[str, Any], field: str, task: str | None) -> dict[str, Any]:
    value = _pick(raw, field, task)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        _fail(f"{field} must be an object, got {_type_name(value)}", field=field, task=task,
              hint=f'write it like "{field}": {{"NAME": "value"}}')
    for name in value:
        if not isinstance(name, str):
            _fail(f"{field} keys must be strings, got {_type_name(name)} {name!r}",
                  field=field, task=task, hint="use string keys")
    return dict(value)


def _reference_solution(metadata: Mapping[str, Any], task: str | None) -> None:
    """Validate ``metadata.reference_solution`` at load time, so a replay cannot fail late."""
    steps = metadata.get("reference_solution")
    base = "metadata.reference_solution"
    if steps is None:
        return
    if not isinstance(steps, list):
        _fail(f"{base} must be an array of {{\"name\", \"arguments\"}} objects, got "
              f"{_type_name(steps)}", field=base, task=task,
              hint='write [{"name": "tool_name", "arguments": {...}}, ...]')
    for index, step in enumerate(steps):
        where = f"{base}[{index}]"
        if not isinstance(step, Mapping):
            _fail(f"{where} must be an object, got {_type_name(step)}", field=where,
                  task=task, hint='write {"name": "tool_name", "arguments": {...}}')
        name = step.get("name")
        if not isinstance(name, str) or not name.strip():
            _fail(f"{where}.name must be a non-empty string", field=f"{where}.name",
                  task=task, hint="name the tool the step calls")
        arguments = step.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                _fail(f"{where}.arguments is a string but not valid JSON ({exc.msg})",
                      field=f"{where}.arguments", task=task,
                      hint="write the arguments as a JSON object")
        if arguments is not None and not isinstance(arguments, Mapping):
            _fail(f"{where}.arguments must be an object, got {_type_name(arguments)}",
                  field=f"{where}.arguments", task=task,
                  hint='write "arguments": {"param": value}')


def normalize_task_fields(raw: Any) -> dict[str, Any]:
    """Canonical ``Task`` fields from a raw mapping; raises ``ConfigurationError``."""
    if not isinstance(raw, Mapping):
        _fail(f"a task must be a JSON object, got {_type_name(raw)}", field=None, task=None,
              hint='each task looks like {"key": ..., "prompt": ..., "env_key": ...}')
    task = _task_label(raw)
    _check_typos(raw, task)

    key = _pick(raw, "key", task, same=lambda v: str(v).strip())
    if key is None or isinstance(key, bool) or not isinstance(key, (str, int)) \
            or not str(key).strip():
        got = ("missing or empty" if key is None or isinstance(key, str)
               else f"{_a_type(key)}, not a string")
        _fail(f"the task key is {got}", field="key", task=None,
              hint='give every task a unique "key" (aliases: "task_key", "id")')
    key = str(key).strip()

    prompt = _pick(raw, "prompt", task)
    if not isinstance(prompt, str):
        got = "missing" if prompt is None else f"{_a_type(prompt)}, not a string"
        _fail(f"prompt is {got}", field="prompt", task=key,
              hint='add "prompt": "<what the agent must do>"')

    env_value = _pick(raw, "env_key", task, same=lambda v: _spec_or_raw(v, key))
    if env_value is None or (isinstance(env_value, str) and not env_value.strip()):
        _fail("env_key is missing or empty", field="env_key", task=key,
              hint='add "env_key": "<environment>" or "<environment>:<version>" '
                   '(aliases: "env_id", "environment_id")')
    if not isinstance(env_value, str):
        _fail(f"env_key must be a string, got {_type_name(env_value)}", field="env_key",
              task=key, hint='write it like "env_key": "helpdesk:v1"')
    env_key, env_version = _merge_spec(raw, env_value, "env_key", "env_version", key)

    data_value = _pick(raw, "data_key", task, same=lambda v: _spec_or_raw(v, key))
    data_key: str | None = None
    data_version = normalize_version(_pick_version(raw, "data_version", key),
                                     field="data_version", task=key)
    if data_value is not None:
        if not isinstance(data_value, str):
            _fail(f"data_key must be a string, got {_type_name(data_value)}",
                  field="data_key", task=key, hint='write it like "data_key": "seed:v1"')
        if data_value.strip():
            data_key, data_version = _merge_spec(raw, data_value, "data_key", "data_version",
                                                 key)
    if data_key is None and data_version is not None:
        _fail("data_version is set but data_key is not", field="data_version", task=key,
              hint='add "data_key": "<dataset>" (alias "data_id") or drop data_version')

    verifier = _pick(raw, "verifier", task)
    verifier_id = _optional_id(raw.get("verifier_id"), field="verifier_id", task=key)
    if verifier_id is None and isinstance(raw.get("verifier"), Mapping):
        verifier_id = _verifier_parts(raw["verifier"], task=key)[1]
    metadata = _mapping(raw, "metadata", key)
    nested = metadata.get("verifier")
    if verifier_id is None and isinstance(nested, Mapping):
        verifier_id = _optional_id(nested.get("verifier_id"),
                                   field="metadata.verifier.verifier_id", task=key)

    modality = _pick(raw, "modality", task)
    if modality is None:
        modality = "tool_use"
    if not isinstance(modality, str) or modality not in MODALITIES:
        guess = suggest_modality(modality) if isinstance(modality, str) else None
        _fail(f"unknown modality {_short(modality)}", field="modality", task=key,
              hint=f"use one of {', '.join(MODALITIES)}"
                   + (f" (did you mean {guess!r}?)" if guess else ""))

    _reference_solution(metadata, key)
    flag = metadata.get("needs_final_answer")
    if flag is not None and not isinstance(flag, bool):
        _fail(f"metadata.needs_final_answer must be true or false, got {_type_name(flag)}",
              field="metadata.needs_final_answer", task=key, hint="write true or false")

    return {
        "key": key,
        "prompt": prompt,
        "env_key": env_key,
        "env_version": env_version,
        "data_key": data_key,
        "data_version": data_version,
        "env_variables": _mapping(raw, "env_variables", key),
        "verifier": verifier,
        "verifier_id": verifier_id,
        "modality": modality,
        "metadata": metadata,
    }


def _spec_or_raw(value: Any, task: str) -> Any:
    """Comparison form of a spec, so ``env_id: "a:1"`` equals ``env_key: "a:v1"``."""
    if isinstance(value, str) and value.strip():
        return split_spec(value, field="env_key", task=task)
    return value


def _merge_spec(raw: Mapping[str, Any], spec: str, key_field: str, version_field: str,
                task: str) -> tuple[str, str | None]:
    """Combine ``"name:version"`` with a separate version field; they must agree."""
    name, spec_version = split_spec(spec, field=key_field, task=task)
    separate = normalize_version(_pick_version(raw, version_field, task),
                                 field=version_field, task=task)
    if spec_version and separate and spec_version != separate:
        _fail(f"{key_field} {spec!r} says version {spec_version!r} but {version_field} "
              f"says {separate!r}", field=version_field, task=task,
              hint=f"keep the version in one place, e.g. \"{key_field}\": \"{name}\", "
                   f"\"{version_field}\": \"{separate}\"")
    return name, spec_version or separate


def _pick_version(raw: Mapping[str, Any], field: str, task: str) -> Any:
    """Like ``_pick``, but ``version: 1`` and ``env_version: "v1"`` agree."""
    return _pick(raw, field, task,
                 same=lambda v: normalize_version(v, field=field, task=task))
