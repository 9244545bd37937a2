"""Task: aliases, version normalisation, validation at construction, immutability, export."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from fleetenv.core.errors import ConfigurationError
from fleetenv.core.tasks import ReferenceToolCall, Task, select_tasks


def make(**fields: Any) -> Task:
    base: dict[str, Any] = {"key": "add-bob", "prompt": "Add a user named bob",
                            "env_key": "helpdesk"}
    base.update(fields)
    return Task.model_validate({k: v for k, v in base.items() if v is not ...})


# --- aliases ---------------------------------------------------------------------------

@pytest.mark.parametrize(("alias", "value", "field", "expected"), [
    ("task_key", "t-1", "key", "t-1"),
    ("id", "t-2", "key", "t-2"),
    ("id", 17, "key", "17"),
    ("env_id", "crm", "env_key", "crm"),
    ("environment_id", "crm", "env_key", "crm"),
    ("version", "v3", "env_version", "v3"),
    ("data_id", "seed", "data_key", "seed"),
    ("verifier_code", "def v(env): return 1", "verifier", "def v(env): return 1"),
    ("verifier_func", "def v(env): return 1", "verifier", "def v(env): return 1"),
    ("task_modality", "computer_use", "modality", "computer_use"),
])
def test_every_alias_sets_its_canonical_field(alias: str, value: Any, field: str,
                                              expected: str) -> None:
    raw = {"key": "k", "prompt": "p", "env_key": "helpdesk"}
    canonical_of_alias = {"task_key": "key", "id": "key", "env_id": "env_key",
                          "environment_id": "env_key"}
    raw.pop(canonical_of_alias.get(alias, ""), None)
    raw[alias] = value
    task = Task.model_validate(raw)
    assert getattr(task, field) == expected


def test_nested_verifier_object_gives_code_and_id() -> None:
    task = make(verifier={"verifier_id": "ver-9", "code": "def v(env): return 1",
                          "sha256": "abc"})
    assert task.verifier == "def v(env): return 1"
    assert task.verifier_id == "ver-9"


def test_verifier_id_from_metadata_verifier() -> None:
    task = make(metadata={"verifier": {"verifier_id": "ver-7"}})
    assert task.verifier_id == "ver-7"


def test_unloaded_verifier_code_marker_counts_as_no_code() -> None:
    task = make(verifier={"verifier_id": "v1", "code": "<error loading code: 500>"},
                verifier_func="def v(env): return 1")
    assert task.verifier == "def v(env): return 1"


def test_sdk_export_sample_loads_with_all_fields() -> None:
    raw = {"key": "add-bob", "prompt": "Add bob", "env_id": "demo", "version": "v1",
           "data_id": "seed", "data_version": "v3", "env_variables": {"TZ": "UTC"},
           "verifier_func": "def validate_task(env, final_answer=None):\n    return 1\n",
           "task_modality": "tool_use", "metadata": {"difficulty": "easy"},
           "created_at": "2025-01-01T00:00:00", "verifier_sha": "deadbeef"}
    task = Task.model_validate(raw)
    assert (task.key, task.env_spec, task.data_spec) == ("add-bob", "demo:v1", "seed:v3")
    assert task.env_variables == {"TZ": "UTC"}
    assert task.metadata == {"difficulty": "easy"}


def test_aliases_that_agree_are_fine_and_that_disagree_fail() -> None:
    assert make(env_id="helpdesk").env_key == "helpdesk"
    assert make(env_key="helpdesk:1", version="v1").env_version == "v1"
    with pytest.raises(ConfigurationError) as err:
        make(env_id="crm")
    assert "'env_key' and 'env_id'" in str(err.value)
    assert "field=env_key" in str(err.value)
    with pytest.raises(ConfigurationError, match="verifier"):
        make(verifier_code="def a(env): return 1", verifier_func="def b(env): return 0")


# --- key:version ------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "key", "version", "env_spec"), [
    ("helpdesk", "helpdesk", None, "helpdesk"),
    ("helpdesk:v1", "helpdesk", "v1", "helpdesk:v1"),
    ("helpdesk:1", "helpdesk", "v1", "helpdesk:v1"),
    ("helpdesk:1.2", "helpdesk", "v1.2", "helpdesk:v1.2"),
    ("helpdesk:latest", "helpdesk", "latest", "helpdesk:latest"),
    (" helpdesk:v2 ", "helpdesk", "v2", "helpdesk:v2"),
])
def test_env_key_splits_and_versions_get_fleet_python_v_prefix(
        spec: str, key: str, version: str | None, env_spec: str) -> None:
    task = make(env_key=spec)
    assert (task.env_key, task.env_version, task.env_spec) == (key, version, env_spec)


def test_separate_versions_are_normalised_the_same_way() -> None:
    assert make(env_version="2").env_spec == "helpdesk:v2"
    assert make(version=3).env_spec == "helpdesk:v3"
    assert make(env_version="").env_version is None


def test_data_key_splits_like_env_key() -> None:
    task = make(data_key="seed:4")
    assert (task.data_key, task.data_version, task.data_spec) == ("seed", "v4", "seed:v4")
    assert make(data_id="seed", data_version="5").data_spec == "seed:v5"
    assert make().data_spec is None


@pytest.mark.parametrize("spec", ["demo:1.2", "demo:v1.2", "demo:latest", "demo"])
def test_env_spec_is_what_fleet_python_make_sends(spec: str) -> None:
    # Whatever spelling the file used, our (env_key, env_version) must be exactly what
    # fleet-python's make() puts in the create request for our env_spec.
    fleet = pytest.importorskip("fleet")

    class Captured(Exception):
        pass

    bodies: list[dict[str, Any]] = []

    def capture(method: str, path: str, json: dict[str, Any] | None = None,
                **_: Any) -> None:
        bodies.append(json or {})
        raise Captured

    client = fleet.Fleet(api_key="test-key", base_url="http://127.0.0.1:9", max_retries=0)
    client.client.request = capture
    task = make(env_key=spec, data_key="seed:3")
    with pytest.raises(Captured):
        client.make(task.env_spec, data_key=task.data_spec)
    sent = bodies[0]
    assert (sent["env_key"], sent.get("env_version")) == (task.env_key, task.env_version)
    assert (sent["data_key"], sent["data_version"]) == (task.data_key, task.data_version)


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"env_key": "helpdesk:v1", "env_version": "v2"}, "env_version", "says version"),
    ({"env_key": "helpdesk:"}, "env_key", "empty version"),
    ({"env_key": ":v1"}, "env_key", "no name"),
    ({"env_key": "help desk"}, "env_key", "whitespace"),
    ({"env_version": 1.1}, "env_version", "must be a string"),
    ({"env_version": "v1:x"}, "env_version", "may not contain"),
    ({"data_version": "v1"}, "data_version", "data_key is not"),
])
def test_bad_versions_fail_naming_the_field(fields: dict[str, Any], field: str,
                                            words: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        make(**fields)
    assert err.value.context["field"] == field
    assert err.value.context["task"] == "add-bob"
    assert words in str(err.value)
    assert err.value.hint


# --- required fields and types ----------------------------------------------------------

@pytest.mark.parametrize("env_key", [..., None, "", "   "])
def test_missing_env_key_fails_at_construction(env_key: Any) -> None:
    with pytest.raises(ConfigurationError) as err:
        make(env_key=env_key)
    assert err.value.context == {"task": "add-bob", "field": "env_key"}
    assert "env_id" in (err.value.hint or "")


def test_keyword_construction_validates_too() -> None:
    with pytest.raises(ConfigurationError, match="env_key is missing"):
        Task(key="k", prompt="p")
    task = Task(task_key="k", prompt="p", env_id="crm:2")
    assert task.env_spec == "crm:v2"


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"key": ...}, "key", "missing"),
    ({"key": ""}, "key", "missing"),
    ({"key": True}, "key", "boolean"),
    ({"prompt": ...}, "prompt", "missing"),
    ({"prompt": 5}, "prompt", "number"),
    ({"env_key": ["a"]}, "env_key", "array"),
    ({"env_variables": ["A=1"]}, "env_variables", "must be an object"),
    ({"metadata": "x"}, "metadata", "must be an object"),
    ({"verifier_func": 12}, "verifier", "source text"),
    ({"verifier_id": 1.5}, "verifier_id", "must be a string"),
    ({"modality": "gui"}, "modality", "unknown modality"),
    ({"modality": 3}, "modality", "unknown modality"),
    ({"promt": "x", "prompt": ...}, "promt", "unknown field"),
    ({"metdata": {"a": 1}}, "metdata", "unknown field"),
])
def test_wrong_fields_fail_with_field_and_hint(fields: dict[str, Any], field: str,
                                               words: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        make(**fields)
    assert err.value.context["field"] == field
    assert words in str(err.value)
    assert err.value.hint


def test_typo_hint_names_the_intended_field() -> None:
    with pytest.raises(ConfigurationError) as err:
        make(metdata={})
    assert err.value.hint == "did you mean 'metadata'?"


def test_unknown_modality_suggests_the_closest() -> None:
    with pytest.raises(ConfigurationError) as err:
        make(task_modality="computer-use")
    assert "did you mean 'computer_use'" in (err.value.hint or "")


def test_unrelated_unknown_fields_are_ignored() -> None:
    task = make(output_json_schema={"type": "object"}, team_id="t", some_new_field=1)
    assert "some_new_field" not in task.model_dump()


def test_not_a_mapping_fails() -> None:
    with pytest.raises(ConfigurationError, match="must be a JSON object, got array"):
        Task.model_validate(["helpdesk"])


def test_env_variables_values_never_appear_in_repr_or_errors() -> None:
    task = make(env_variables={"APP_TOKEN": "very-secret-value"})
    assert "very-secret-value" not in repr(task)
    assert "very-secret-value" not in str(task)
    assert "APP_TOKEN" in repr(task)
    with pytest.raises(ConfigurationError) as err:
        make(env_variables={"APP_TOKEN": "very-secret-value"}, modality="bad")
    assert "very-secret-value" not in str(err.value)


# --- derived properties -----------------------------------------------------------------

def test_needs_final_answer_from_prompt_or_metadata() -> None:
    assert not make().needs_final_answer
    assert make(prompt="Find the id, then call submit_final_answer").needs_final_answer
    assert make(metadata={"needs_final_answer": True}).needs_final_answer
    assert not make(prompt="... submit_final_answer ...",
                    metadata={"needs_final_answer": False}).needs_final_answer
    with pytest.raises(ConfigurationError, match="true or false"):
        make(metadata={"needs_final_answer": "yes"})


def test_reference_solution_is_typed_and_fresh() -> None:
    steps = [{"name": "create_user", "arguments": {"name": "bob"}},
             {"name": "list_users", "arguments": '{"limit": 5}'},
             {"name": "noop"}]
    task = make(metadata={"reference_solution": steps})
    calls = task.reference_solution
    assert calls == [ReferenceToolCall("create_user", {"name": "bob"}),
                     ReferenceToolCall("list_users", {"limit": 5}),
                     ReferenceToolCall("noop", {})]
    assert calls is not None
    calls[0].arguments["name"] = "mallory"
    assert task.reference_solution[0].arguments == {"name": "bob"}  # type: ignore[index]
    assert make().reference_solution is None


@pytest.mark.parametrize(("solution", "field"), [
    ({"name": "x"}, "metadata.reference_solution"),
    (["create_user"], "metadata.reference_solution[0]"),
    ([{"arguments": {}}], "metadata.reference_solution[0].name"),
    ([{"name": "a"}, {"name": "b", "arguments": [1]}],
     "metadata.reference_solution[1].arguments"),
    ([{"name": "a", "arguments": "{not json"}], "metadata.reference_solution[0].arguments"),
])
def test_bad_reference_solution_fails_at_construction(solution: Any, field: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        make(metadata={"reference_solution": solution})
    assert err.value.context["field"] == field


# --- immutability, pickling, export -----------------------------------------------------

def test_task_is_frozen_all_the_way_down() -> None:
    task = make(metadata={"tags": ["a"], "nested": {"x": 1}}, env_variables={"A": "1"})
    with pytest.raises(Exception, match="frozen"):
        task.key = "other"  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        task.metadata["new"] = 1
    with pytest.raises(TypeError, match="read-only"):
        task.metadata["tags"].append("b")
    with pytest.raises(TypeError, match="read-only"):
        task.metadata["nested"].update(x=2)
    with pytest.raises(TypeError, match="read-only"):
        task.env_variables.pop("A")
    assert task.metadata == {"tags": ["a"], "nested": {"x": 1}}


def test_input_mappings_are_copied_not_shared() -> None:
    metadata = {"tags": ["a"]}
    task = make(metadata=metadata)
    metadata["tags"].append("b")
    assert task.metadata["tags"] == ["a"]


def test_pickle_and_deepcopy_round_trip() -> None:
    task = make(env_key="helpdesk:1", data_key="seed:2", env_variables={"A": "1"},
                verifier_func="def v(env): return 1", verifier_id="ver",
                modality="browser_use",
                metadata={"reference_solution": [{"name": "t", "arguments": {"a": [1]}}]})
    for clone in (pickle.loads(pickle.dumps(task)), copy.deepcopy(task)):
        assert clone == task
        assert hash(clone) == hash(task)
        assert clone.reference_solution == task.reference_solution
        with pytest.raises(TypeError):
            clone.metadata["x"] = 1


def test_tasks_are_hashable_and_usable_as_keys() -> None:
    a, b = make(), make()
    assert a == b and hash(a) == hash(b)
    assert len({a, b, make(key="other")}) == 2


def test_to_fleet_dict_round_trips_and_is_plain_json() -> None:
    task = make(env_key="helpdesk:1", data_key="seed:v2", env_variables={"A": "1"},
                verifier_func="def v(env): return 1", verifier_id="ver-1",
                modality="computer_use", metadata={"tags": ["x"], "n": {"k": 1}})
    exported = task.to_fleet_dict()
    assert exported == {
        "key": "add-bob", "prompt": "Add a user named bob", "env_id": "helpdesk",
        "version": "v1", "data_id": "seed", "data_version": "v2",
        "verifier_func": "def v(env): return 1", "task_modality": "computer_use",
        "env_variables": {"A": "1"}, "metadata": {"tags": ["x"], "n": {"k": 1}},
        "verifier_id": "ver-1",
    }
    assert type(exported["metadata"]["tags"]) is list  # thawed: mutable, plain
    assert Task.model_validate(json.loads(json.dumps(exported))) == task
    assert Task.model_validate(task.model_dump()) == task


def test_to_fleet_dict_is_read_by_fleet_python_to_the_same_specs() -> None:
    fleet = pytest.importorskip("fleet")
    task = make(env_key="helpdesk:1", data_key="seed:3", metadata={"difficulty": "easy"},
                verifier_func="def validate_task(env, final_answer=None):\n    return 1\n")
    client = fleet.Fleet(api_key="test-key", base_url="http://127.0.0.1:9", max_retries=0)
    # The loader behind fleet.load_tasks_from_file; purely local, no request is made.
    fleet_task = client.load_task_from_json(task.to_fleet_dict(),
                                            raise_on_verifier_error=True)
    assert fleet_task.env_key == task.env_spec == "helpdesk:v1"
    assert fleet_task.data_key == task.data_spec == "seed:v3"
    assert fleet_task.verifier is not None
    assert fleet_task.metadata == {"difficulty": "easy"}
    # ...and the other way: fleet-python's own dump is a valid fleetenv task.
    back = Task.model_validate(fleet_task.model_dump(mode="json"))
    assert (back.key, back.env_spec, back.data_spec, back.verifier, back.metadata) == (
        task.key, task.env_spec, task.data_spec, task.verifier, task.metadata)


def test_replace_validates_and_resets_versions_with_the_key() -> None:
    task = make(env_key="helpdesk:v1", data_key="seed:v1")
    assert task.replace(env_key="crm").env_spec == "crm"
    assert task.replace(env_key="crm", version="2").env_spec == "crm:v2"
    assert task.replace(env_version="v5").env_spec == "helpdesk:v5"
    assert task.replace(data_id="other").data_spec == "other"
    assert task.replace(task_key="renamed").key == "renamed"
    with pytest.raises(ConfigurationError, match="env_key"):
        task.replace(env_key="")


# --- select_tasks -----------------------------------------------------------------------

def test_select_tasks_in_requested_order_once_each() -> None:
    tasks = [make(key=k) for k in ("a", "b", "c")]
    assert [t.key for t in select_tasks(tasks, ["c", "a", "c"])] == ["c", "a"]


def test_select_tasks_suggests_close_key() -> None:
    tasks = [make(key=k) for k in ("add-bob", "delete-alice")]
    with pytest.raises(ConfigurationError) as err:
        select_tasks(tasks, ["add-bbo"])
    assert "add-bbo" in str(err.value)
    assert err.value.hint == "did you mean 'add-bob'?"
    with pytest.raises(ConfigurationError) as err:
        select_tasks(tasks, ["zzz"])
    assert "add-bob, delete-alice" in (err.value.hint or "")
