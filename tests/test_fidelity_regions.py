"""Regions on the local Fleet, and fleetenv's handling of a region Fleet does not serve.

Real Fleet answers a create for an unknown region with 400 ``Region X not supported.
Please use [...]``, which fleet-python turns into ``FleetRegionError(region,
supported_regions)``; the local Fleet answers the same, and fleetenv reports it as a
permanent provisioning error (no retries) that names the valid regions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fleet
import pytest
from _support.fixtures_local import TEST_APPS
from fleet import exceptions as fx

from fleetenv.core.errors import PermanentProvisioningError
from fleetenv.fleet.classify import provisioning_error
from fleetenv.fleet.provisioning import ProvisionRequest
from fleetenv.fleet.session import Session
from fleetenv.local import LocalFleet

pytestmark = pytest.mark.timeout(60)

REGIONS = ("us-west-1", "eu-west-2")


@pytest.fixture(scope="module")
def regional() -> Iterator[LocalFleet]:
    with LocalFleet(apps=TEST_APPS, verifier_workers=1, regions=REGIONS) as local:
        yield local


def test_the_local_fleet_lists_and_enforces_its_regions(regional: LocalFleet) -> None:
    client = regional.client()
    assert client.list_regions() == list(REGIONS)
    with pytest.raises(fx.FleetRegionError) as unknown:
        client.make("notes", region="mars")
    assert unknown.value.status_code == 400
    assert unknown.value.region == "mars"
    assert unknown.value.supported_regions == list(REGIONS)
    assert not regional.instances(status="running")  # nothing was created

    default, chosen = client.make("notes"), client.make("notes", region="eu-west-2")
    try:
        assert (default.region, chosen.region) == ("us-west-1", "eu-west-2")
        listed = client.instances(status="running", region="eu-west-2")
        assert [i.instance_id for i in listed] == [chosen.instance_id]
    finally:
        default.close()
        chosen.close()


def test_fleetenv_passes_the_region_and_reports_an_unknown_one(regional: LocalFleet) -> None:
    attempts: list[dict[str, Any]] = []
    with Session(api_key=regional.token, base_url=regional.base_url) as session:
        with pytest.raises(PermanentProvisioningError) as refused:
            session.provisioner.provision(
                ProvisionRequest(env_key="notes", region="mars", task_key="t1"),
                listener=lambda kind, details: attempts.append({"kind": kind, **details}))
        text = str(refused.value)
        assert "'mars'" in text and "valid regions: us-west-1, eu-west-2" in text
        assert refused.value.context["region"] == "mars"
        assert refused.value.retryable is False
        assert [a["kind"] for a in attempts] == ["attempt"]  # permanent: never retried

        instance = session.provisioner.provision(ProvisionRequest(env_key="notes",
                                                                  region="eu-west-2"))
        try:
            assert instance.env.region == "eu-west-2"
            described = {i["instance_id"]: i for i in regional.instances(status="running")}
            assert described[instance.instance_id]["region"] == "eu-west-2"
        finally:
            session.provisioner.delete(instance)


def test_a_region_error_without_a_list_still_says_what_to_do() -> None:
    error = provisioning_error(fx.FleetRegionError("Region xx-1 is unsupported"), env="notes")
    assert isinstance(error, PermanentProvisioningError)
    assert "list_regions()" in str(error) and error.context == {"env": "notes"}


def test_a_fleet_env_creates_in_its_configured_region(regional: LocalFleet) -> None:
    from fleetenv import FleetEnv, Task
    from fleetenv.core.config import resolve_config

    task = Task(key="notes-region", prompt="p", env_key="notes")
    config = resolve_config(api_key=regional.token, base_url=regional.base_url,
                            region="eu-west-2")
    with FleetEnv(task, config=config) as env:
        env.reset()
        described = {i["instance_id"]: i for i in regional.instances(status="running")}
        assert described[env.instance_id]["region"] == "eu-west-2"

    wrong = resolve_config(api_key=regional.token, base_url=regional.base_url, region="mars")
    with FleetEnv(task, config=wrong) as env, pytest.raises(PermanentProvisioningError,
                                                            match="valid regions"):
        env.reset()


# ---------------------------------------------------------------- Fleet's region names


def test_fleet_python_creates_in_fleets_regions_on_a_default_local_fleet(
        notes_fleet: LocalFleet) -> None:
    """fleet-python's own integration tests create in ``us-west-1``: a local Fleet with its
    default settings accepts Fleet's region names (``local`` stays the default), reports
    the region back, and answers any other name with Fleet's 400."""
    client = fleet.Fleet(api_key=notes_fleet.token, base_url=notes_fleet.base_url)
    assert client.list_regions() == ["local", "us-west-1", "us-east-1", "eu-west-2"]
    west, default = client.make("notes", region="us-west-1"), client.make("notes")
    try:
        assert (west.region, default.region) == ("us-west-1", "local")
        assert client.instance(west.instance_id).region == "us-west-1"
    finally:
        west.close()
        default.close()
    with pytest.raises(fx.FleetRegionError) as unknown:
        client.make("notes", region="staging")  # a deployment in fleet-python, not a region
    assert unknown.value.status_code == 400
    assert "Region staging not supported" in str(unknown.value)
    assert unknown.value.supported_regions == ["local", "us-west-1", "us-east-1", "eu-west-2"]


def test_fleet_env_and_the_drop_in_report_the_region(notes_fleet: LocalFleet) -> None:
    from fleetenv import FleetEnv, Task
    from fleetenv.adapters.openenv import FleetTaskEnv
    from fleetenv.core.config import resolve_config

    task = Task(key="notes-region-report", prompt="p", env_key="notes")
    config = resolve_config(api_key=notes_fleet.token, base_url=notes_fleet.base_url,
                            region="us-east-1")
    with FleetEnv(task, config=config) as env:
        assert env.region is None  # no instance yet
        env.reset()
        assert env.region == "us-east-1"
    with FleetTaskEnv(task, api_key=notes_fleet.token, base_url=notes_fleet.base_url) as ported:
        ported.reset()
        assert ported.region == "local"
        assert ported._orch is not None and ported._orch._fleet_env.region == "local"
