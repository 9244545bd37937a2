"""The unmodified fleet-python SDK against fleetenv.local: the whole instance lifecycle."""

from __future__ import annotations

import uuid
from typing import Any

import fleet
import httpx
import pytest
from fleet import exceptions as fx

from fleetenv.local import LocalFleet
from fleetenv.local.cdp import find_chromium

pytestmark = pytest.mark.timeout(20)

VERIFIER = '''
from fleet.verifiers.verifier import verifier

@verifier(key="rename-groceries")
def validate_rename(env, final_answer=None) -> int:
    env.instance.load()
    seed = env.db("seed")
    current = env.db("current")
    row = current.table("notes").eq("id", 1).first()
    print("title is", row["title"], "answer is", final_answer)
    seed.diff(current, IgnoreConfig(table_fields={"notes": {"updated_at"}})).expect_exactly(
        [{"type": "modify", "table": "notes", "pk": 1,
          "resulting_fields": [("title", "shopping")], "no_other_changes": True}]
    )
    if not normalized_contains("shopping", final_answer or ""):
        return TASK_FAILED_SCORE
    return TASK_SUCCESSFUL_SCORE
'''


def runner_headers(local: LocalFleet) -> dict[str, str]:
    """What fleet-python adds to manager calls on a gated Fleet (the stand-in is gated)."""
    token = local.runner_token()
    assert token, "the local Fleet gates manager routes by default"
    return {"X-Runner-Token": token}


def _task(client: fleet.Fleet) -> Any:
    return client.load_task_from_json(
        {"key": "rename-groceries", "prompt": "Rename the groceries note to shopping",
         "env_id": "notes", "version": "v1", "verifier_func": VERIFIER}
    )


def test_full_lifecycle_through_fleet_python(notes_fleet: LocalFleet, notes_client: Any) -> None:
    env = notes_client.make("notes:v1", data_key="notes-seed:v1", ttl_seconds=120,
                            image_type="standard")
    assert env.status == "running"
    assert env.version == "v1" and env.data_version == "v1"
    assert env.urls.root.endswith(f"/instances/{env.instance_id}/")
    assert env.manager_url == f"{env.urls.root}api/v1/env"

    resources = env.resources()
    browser = [("cdp", "cdp")] if find_chromium() else []  # a real instance's browser
    assert sorted((r.name, r.type.value if hasattr(r.type, "value") else r.type)
                  for r in resources) == [*browser, ("current", "sqlite"), ("seed", "sqlite")]
    db = env.db("current")
    columns = {c["name"]: c for c in db.describe().tables[0].columns}
    assert columns["id"]["pk"] == 1 and columns["id"]["primary_key"] is True
    assert columns["title"]["pk"] == 0 and columns["title"]["notnull"] is True

    assert db.query("SELECT title FROM notes ORDER BY id").rows == [["groceries"], ["todo"]]
    refused = db.query("UPDATE notes SET title = 'x'")  # query() is read_only=True
    assert refused.success is False and "readonly" in (refused.error or "")
    refused_seed = env.db("seed").exec("DELETE FROM notes")
    assert refused_seed.success is False
    added = db.exec("INSERT INTO notes (title) VALUES (?)", ["scratch"])
    assert added.success and added.rows_affected == 1 and added.last_insert_id == 3

    assert env.reset().success
    assert db.query("SELECT COUNT(*) FROM notes").rows == [[2]]

    db.exec("UPDATE notes SET title = 'shopping', updated_at = 'later' WHERE id = 1")
    task = _task(notes_client)
    passed = task.verify_detailed(env, "I renamed it to Shopping")
    assert passed.success is True, passed.error
    assert passed.result == 1
    assert "title is shopping" in passed.stdout
    assert passed.execution_id and passed.execution_time_ms >= 0
    wrong_answer = task.verify_detailed(env, final_answer="done")
    assert wrong_answer.success and wrong_answer.result == 0

    db.exec("UPDATE notes SET body = 'unexpected' WHERE id = 2")
    unexpected = task.verify_detailed(env, "shopping")
    assert unexpected.success is False
    assert unexpected.error["type"] and "Traceback" in unexpected.error["traceback"]

    closed = env.close()
    assert closed.status == "stopped"
    assert notes_client.instance(env.instance_id).status == "stopped"
    stopped = {i["instance_id"]: i for i in notes_fleet.instances(status="stopped")}
    assert stopped[env.instance_id]["stop_reason"] == "deleted"
    # the dead instance's manager answers 410 fast (not retried by fleet-python)
    gone = httpx.post(f"{env.manager_url}/reset", json={}, timeout=5,
                      headers=runner_headers(notes_fleet))
    assert gone.status_code == 410 and "stopped" in gone.json()["detail"]


def test_structured_diff_honours_ignore_config(notes_fleet: LocalFleet,
                                               notes_client: Any) -> None:
    env = notes_client.make("notes")
    headers = runner_headers(notes_fleet)
    try:
        env.resources()  # fleet-python needs this before env.db()
        env.db().exec("UPDATE notes SET title = 'new', updated_at = 'x' WHERE id = 1")
        payload = {"ignore_config": {"tables": [], "fields": ["updated_at"], "table_fields": {}}}
        diff = httpx.post(f"{env.manager_url}/diff/structured", json=payload, timeout=5,
                          headers=headers).json()
        assert diff["success"] is True
        modified = diff["diff"]["notes"]["modified_rows"]
        assert [set(m["changes"]) for m in modified] == [{"title"}]
        ignored = httpx.post(f"{env.manager_url}/diff/structured", timeout=5, headers=headers,
                             json={"ignore_config": {"tables": ["notes"]}}).json()
        assert ignored["diff"] == {}
    finally:
        env.close()


def test_versions_data_and_listing(notes_fleet: LocalFleet, notes_client: Any) -> None:
    run_id = f"run-{uuid.uuid4().hex[:6]}"
    env = notes_client.make("notes:v2", data_key="notes-seed:v2", run_id=run_id)
    try:
        assert env.version == "v2"
        env.resources()
        assert env.db().query("SELECT COUNT(*) FROM notes").rows == [[3]]
        listed = notes_client.instances(status="running", run_id=run_id)
        assert [i.instance_id for i in listed] == [env.instance_id]
        assert env.heartbeat().success is True
        envs = {e.env_key: e for e in notes_client.list_envs()}
        assert envs["notes"].default_version == "v1"
        assert notes_client.environment("notes").versions == {"v1": "v1", "v2": "v2"}
        assert notes_client.list_regions() == ["local", "us-west-1", "us-east-1", "eu-west-2"]
        assert notes_client.account().instance_limit >= 1
    finally:
        stopped = notes_client.close_all(run_id=run_id)
    assert [i.instance_id for i in stopped] == [env.instance_id]
    assert notes_client.instance(env.instance_id).status == "stopped"


def test_typed_exceptions(notes_fleet: LocalFleet, notes_client: Any, notes_faults: Any) -> None:
    bad = fleet.Fleet(api_key="not-the-token", base_url=notes_fleet.base_url, max_retries=0)
    with pytest.raises(fx.FleetAuthenticationError):
        bad.make("notes")
    with pytest.raises(fx.FleetEnvironmentNotFoundError) as missing:
        notes_client.make("nope")
    assert missing.value.env_key == "nope"
    with pytest.raises(fx.FleetVersionNotFoundError) as version:
        notes_client.make("notes:v9")
    assert version.value.version == "v9" and version.value.env_key == "notes"
    with pytest.raises(fx.FleetBadRequestError):
        notes_client.make("notes", data_key="other-data")
    with pytest.raises(fx.FleetAPIError) as unknown:
        notes_client.instance("does-not-exist")
    assert unknown.value.status_code == 404

    notes_faults.add("http_error", route="/v1/env/instances", method="POST", status=429,
                     times=1)
    with pytest.raises(fx.FleetRateLimitError):
        notes_client.make("notes")
    env = notes_client.make("notes")  # one-shot: the next create works
    env.close()


def test_instance_limit_is_a_403() -> None:
    from _support.fixtures_local import TEST_APPS

    with LocalFleet(apps=TEST_APPS, instance_limit=1, verifier_workers=1) as local:
        client = local.client()
        first = client.make("notes")
        with pytest.raises(fleet.FleetInstanceLimitError) as limit:
            client.make("notes")
        assert limit.value.instance_limit == 1 and limit.value.running_instances == 1
        first.close()
        client.make("notes").close()


def test_only_live_instances_count_against_the_limit() -> None:
    """A create whose boot failed, and an instance that expired, free their slot."""
    from _support.fixtures_local import TEST_APPS

    with LocalFleet(apps=TEST_APPS, instance_limit=1, verifier_workers=1) as local:
        client = local.client()
        local.faults.add("create_failed", message="image pull failed", times=1)
        assert client.make("notes").status == "error"
        expiring = client.make("notes")
        local.faults.expire(expiring.instance_id)
        client.make("notes").close()
        assert client.account().instance_count == 0


def test_create_is_idempotent_on_request_id(notes_fleet: LocalFleet) -> None:
    url = f"{notes_fleet.base_url}/v1/env/instances"
    headers = {"Authorization": f"Bearer {notes_fleet.token}", "X-Request-ID": uuid.uuid4().hex}
    body = {"env_key": "notes", "created_from": "sdk", "max_wait_seconds": 870}
    first = httpx.post(url, json=body, headers=headers, timeout=10)
    again = httpx.post(url, json=body, headers=headers, timeout=10)
    assert first.status_code == again.status_code == 200
    assert first.json()["instance_id"] == again.json()["instance_id"]
    other = httpx.post(url, json={**body, "env_version": "v2"}, headers=headers, timeout=10)
    assert other.status_code == 409
    fresh = httpx.post(url, json=body, timeout=10, headers={**headers, "X-Request-ID": "new"})
    assert fresh.json()["instance_id"] != first.json()["instance_id"]
    for response in (first, fresh):
        iid = response.json()["instance_id"]
        httpx.delete(f"{url}/{iid}", headers=headers, timeout=10)


def test_reset_records_the_seed_it_was_sent(notes_fleet: LocalFleet, notes_client: Any) -> None:
    """fleet-python sends ``{"seed": 42, "timestamp": null}``; the local Fleet records and
    echoes the seed but restores the data version's rows whatever it is (documented)."""
    env = notes_client.make("notes")
    try:
        env.resources()
        rows = []
        for seed in (42, 7, None):
            env.db().exec("DELETE FROM notes")
            answer = env.reset(seed=seed)
            assert answer.success and f"seed={seed}" in answer.message
            rows.append(env.db().query("SELECT id, title FROM notes ORDER BY id").rows)
        assert rows[0] == rows[1] == rows[2] == [[1, "groceries"], [2, "todo"]]
        described = {i["instance_id"]: i for i in notes_fleet.instances()}[env.instance_id]
        assert [(r["seed"], r["timestamp"]) for r in described["resets"]] == [
            (42, None), (7, None), (None, None)]
        bad = env.instance.client.request("POST", "/reset", json={"seed": "x"}, timeout=5)
        assert bad.status_code == 422 and "seed" in bad.json()["detail"]
    finally:
        env.close()


def test_sdk_still_needs_resources_loaded_before_db(notes_client: Any) -> None:
    """fleet-python >= 0.2.115 no longer loads an instance's resources in make(), although
    its changelog says they load on first use; fleetenv.fleet.client.load_resources works
    around it. This test fails when the SDK fixes that: then delete load_resources (and
    its callers) and this test."""
    from fleetenv.fleet.client import load_resources

    env = notes_client.make("notes")
    try:
        for use in (lambda: env.db(), lambda: env.state("sqlite://current"),
                    lambda: env.browser()):
            with pytest.raises(KeyError):
                use()  # if this stops raising, the SDK fixed it: drop the workaround
        assert load_resources(env) is env
        assert env.db().query("SELECT COUNT(*) FROM notes").rows == [[2]]
        assert env.state("sqlite://current").query("SELECT 1").rows == [[1]]
    finally:
        env.close()
