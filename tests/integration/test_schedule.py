"""Scheduled deployments on a real Prefect server: `build_deployments` with a cron (or interval)
schedule stores the schedule, the `RunConfig` form schema and the `continue_for` default; a run
fired by the schedule of a served deployment continues the existing run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from mlflow import MlflowClient

from configs.trainer import TrainerSection
from flows.serve import build_deployments
from tests.conftest import stop_process_group

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


RUN_S = 600  # one smoke run, including its process start, on a busy 2-core machine
FIRE_S = 900  # runner start (imports torch, deepspeed) + up to a minute to the cron + the run
DIST_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def _child_env(served) -> dict[str, str]:
    # in-process training tests leave torch.distributed's rendezvous in os.environ
    return {k: v for k, v in os.environ.items() if k not in DIST_ENV} | {
        "PREFECT_API_URL": f"{served.services.prefect_url}/api",
        "MLFLOW_TRACKING_URI": served.services.mlflow_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "PYTHONUNBUFFERED": "1",
    }


def _scheduled_runs(served, deployment_id: str) -> list[dict]:
    runs = served.flow_runs({"deployment_id": {"any_": [deployment_id]}})
    return [run for run in runs if run["auto_scheduled"]]


def test_a_scheduled_run_continues_the_run(served) -> None:
    """After a finished one-iteration `smoke` run, `steprl serve --cron '* * * * *'
    --continue-for 1` registers train/smoke; the run its schedule fires trains iteration 2 of
    the same run folder and MLflow run. A scheduled run that fires while another still trains
    the run is refused by the run lock, never a second writer."""
    env = _child_env(served)
    train = [sys.executable, "-m", "flows.cli", "train", "--config", "smoke"]
    first = subprocess.run(
        train, cwd=served.root, env=env, capture_output=True, text=True, timeout=RUN_S
    )
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    run_dir = served.root / "runs" / "smoke"
    assert (run_dir / "iter_0001" / "logged.json").is_file()

    log = served.root / ".steprl" / "scheduled-runner.log"
    serve = [sys.executable, "-m", "flows.cli", "serve", "--preset", "smoke", "--no-servers"]
    serve += ["--cron", "* * * * *", "--continue-for", "1"]
    with log.open("ab") as out:
        runner = subprocess.Popen(
            serve, cwd=served.root, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its flow-run processes are stopped with it
        )  # fmt: skip
    api = f"{served.services.prefect_url}/api"
    try:
        runs, completed, deadline = [], [], time.monotonic() + FIRE_S
        while not completed and time.monotonic() < deadline:
            assert runner.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(3)
            deployment = httpx.get(f"{api}/deployments/name/train/smoke", timeout=30)
            if deployment.status_code != 200:
                continue
            runs = _scheduled_runs(served, deployment.json()["id"])
            completed = [r for r in runs if r["state"]["type"] == "COMPLETED"]
    finally:
        stop_process_group(runner)
    assert completed, f"no scheduled run completed\n{log.read_text(errors='replace')[-3000:]}"
    assert completed[0]["parameters"]["config"]["run"]["continue_for"] == 1
    for run in runs:  # any other one that finished was refused by the lock
        if run["state"]["type"] in {"FAILED", "CRASHED"}:
            assert "already being trained" in (run["state"]["message"] or ""), run["state"]

    assert (run_dir / "iter_0002" / "logged.json").is_file(), "iteration 2 of the same run"
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_0002"
    client = MlflowClient(tracking_uri=served.services.mlflow_url)
    experiment = client.get_experiment_by_name("steprl-smoke")
    mlflow_runs = client.search_runs(
        [experiment.experiment_id], filter_string="attributes.run_name = 'smoke'"
    )
    assert len(mlflow_runs) == 1, "the scheduled run continued the MLflow run, not a new one"
    history = client.get_metric_history(mlflow_runs[0].info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == [1, 2]
