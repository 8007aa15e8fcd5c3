"""Scheduled deployments on a real Prefect server: `build_deployments` with a cron (or interval)
schedule stores the schedule, the `RunConfig` form schema and the `continue_for` default."""

from __future__ import annotations

import httpx
import pytest

from configs.run_config import TrainerSection
from flows.serve import build_deployments

pytestmark = pytest.mark.slow


def _register(served, **schedule) -> dict[str, dict]:
    """Apply the smoke deployments to the server and read them back, by flow name."""
    with served.services.prefect_client():
        ids = [deployment.apply() for deployment in build_deployments(["smoke"], **schedule)]
    api = f"{served.services.prefect_url}/api"
    found = {}
    for deployment_id in ids:
        response = httpx.get(f"{api}/deployments/{deployment_id}", timeout=30)
        response.raise_for_status()
        deployment = response.json()
        flow = httpx.get(f"{api}/flows/{deployment['flow_id']}", timeout=30).json()
        found[flow["name"]] = deployment
    assert set(found) == {"train", "evaluate"}, found.keys()
    return found


def test_cron_schedule_form_schema_and_continue_for_are_stored(served) -> None:
    found = _register(served, cron="0 3 * * *", continue_for=1)
    train = found["train"]
    assert train["name"] == "smoke"
    assert [s["schedule"].get("cron") for s in train["schedules"]] == ["0 3 * * *"]
    assert all(s["active"] for s in train["schedules"])
    assert found["evaluate"]["schedules"] == [], "only training runs on a schedule"

    # the UI form is generated from this schema: RunConfig's descriptions and bounds
    definitions = train["parameter_openapi_schema"]["definitions"]
    learning_rate = definitions["TrainerSection"]["properties"]["learning_rate"]
    assert learning_rate["description"] == TrainerSection.model_fields["learning_rate"].description
    assert learning_rate["exclusiveMinimum"] == 0.0
    assert definitions["RolloutSection"]["properties"]["group_size"]["minimum"] == 1
    assert train["enforce_parameter_schema"], "bad form values must be refused by the server"

    config = train["parameters"]["config"]
    assert config["run"]["continue_for"] == 1
    assert config["run"]["name"] == "smoke"
    assert found["evaluate"]["parameters"]["checkpoint"] == "latest"


def test_interval_schedule_replaces_the_cron(served) -> None:
    train = _register(served, interval_s=3600)["train"]
    assert [s["schedule"].get("interval") for s in train["schedules"]] == [3600.0]
    assert train["parameters"]["config"]["run"]["continue_for"] == 0
