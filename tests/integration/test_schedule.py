"""Scheduled deployments on a real Prefect server: `build_deployments` with a cron (or interval)
schedule stores the schedule, the `RunConfig` form schema and the `continue_for` default; a run
fired by the schedule of a served deployment continues the existing run and is named for it; a
schedule made in the UI on a finished run says why nothing ran and survives `steprl serve`,
whose Ctrl-C ends the run it interrupts and leaves no scheduled run queued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    found = {}
    for deployment_id in ids:
        response = served.api("get", f"/deployments/{deployment_id}")
        response.raise_for_status()
        deployment = response.json()
        flow = served.api("get", f"/flows/{deployment['flow_id']}").json()
        found[flow["name"]] = deployment
    assert set(found) == {"train", "evaluate"}, found.keys()
    return found


def test_cron_schedule_form_schema_and_continue_for_are_stored(served) -> None:
    found = _register(served, cron="0 3 * * *", continue_for=1)
    train = found["train"]
    assert train["name"] == "smoke"
    assert [s["schedule"].get("cron") for s in train["schedules"]] == ["0 3 * * *"]
    assert [s["slug"] for s in train["schedules"]] == ["steprl-serve"]
    assert all(s["active"] for s in train["schedules"])
    assert found["evaluate"]["schedules"] == [], "only training runs on a schedule"

    # the UI form is generated from this schema: RunConfig's descriptions and bounds, the
    # bounds also written out, the fields that may not be null required
    definitions = train["parameter_openapi_schema"]["definitions"]
    learning_rate = definitions["TrainerSection"]["properties"]["learning_rate"]
    description = TrainerSection.model_fields["learning_rate"].description
    assert learning_rate["description"] == f"{description} Allowed: > 0.0."
    assert learning_rate["exclusiveMinimum"] == 0.0
    assert "learning_rate" in definitions["TrainerSection"]["required"]
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
            serve,
            cwd=served.root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its flow-run processes are stopped with it
        )
    try:
        runs, completed, deadline = [], [], time.monotonic() + FIRE_S
        while not completed and time.monotonic() < deadline:
            assert runner.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(3)
            deployment = served.api("get", "/deployments/name/train/smoke")
            if deployment.status_code != 200:
                continue
            runs = _scheduled_runs(served, deployment.json()["id"])
            completed = [r for r in runs if r["state"]["type"] == "COMPLETED"]
    finally:
        stop_process_group(runner)
    assert completed, f"no scheduled run completed\n{log.read_text(errors='replace')[-3000:]}"
    assert completed[0]["parameters"]["config"]["run"]["continue_for"] == 1
    assert completed[0]["name"] == "smoke-iter-2", "a scheduled run is named for what it trains"
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


def _deployment(served) -> dict:
    response = served.api("get", "/deployments/name/train/smoke")
    response.raise_for_status()
    return response.json()


def _serve(served, log_name: str) -> subprocess.Popen:
    """`steprl serve --preset smoke --no-servers` in its own session (so that a signal to its
    group reaches it and the flow-run processes it starts, as Ctrl-C in a terminal does)."""
    command = [sys.executable, "-m", "flows.cli", "serve", "--preset", "smoke", "--no-servers"]
    with (served.root / ".steprl" / log_name).open("ab") as out:
        return subprocess.Popen(
            command,
            cwd=served.root,
            env=_child_env(served),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _until(what: str, probe, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(2)
    pytest.fail(f"timed out waiting for {what}\n{log.read_text(errors='replace')[-3000:]}")


def _registered(served, runner: subprocess.Popen) -> dict | None:
    assert runner.poll() is None, "the runner exited"
    deployment = _deployment(served)
    return deployment if deployment["status"] == "READY" and not deployment["paused"] else None


def test_a_ui_schedule_says_why_nothing_ran_survives_serve_and_ctrl_c(served) -> None:
    """On the finished `smoke` run (2 iterations, after the test above): a schedule made as the
    UI makes one (no continue_for) fires a run named for it that ends "Nothing to run" and
    says why; a run that Ctrl-C of `steprl serve` interrupts ends Crashed, not Running; no
    scheduled run is left queued; the next `steprl serve` keeps the schedule and resumes."""
    log = served.root / ".steprl" / "ui-schedule.log"
    runner = _serve(served, log.name)
    try:
        deployment = _until("train/smoke ready", lambda: _registered(served, runner), RUN_S, log)
        assert [s["slug"] for s in deployment["schedules"]] == [], "serve's own cron is gone"
        earlier = {r["id"] for r in _scheduled_runs(served, deployment["id"])}
        created = served.api(
            "post",
            f"/deployments/{deployment['id']}/schedules",
            json=[{"schedule": {"cron": "* * * * *"}, "active": True}],
        )
        assert created.status_code == 201, created.text

        def said_why() -> dict | None:
            done = [
                r
                for r in _scheduled_runs(served, deployment["id"])
                if r["id"] not in earlier and r["state"]["type"] == "COMPLETED"
            ]
            return done[0] if done else None

        ran = _until("a scheduled run to finish", said_why, FIRE_S, log)
        assert (ran["state"]["name"], ran["name"]) == ("Nothing to run", "smoke-nothing-to-run")
        assert "already holds every iteration up to 1" in ran["state"]["message"]
        assert "continue_for" in ran["state"]["message"]

        config = deployment["parameters"]["config"]
        longer = {"config": config | {"run": config["run"] | {"name": "cut", "iterations": 5}}}
        made = served.api(
            "post",
            f"/deployments/{deployment['id']}/create_flow_run",
            json={"parameters": longer, "name": "cut-by-ctrl-c"},
        )
        flow_run = f"/flow_runs/{made.json()['id']}"
        _until(
            "the run to start",
            lambda: served.api("get", flow_run).json()["state"]["type"] == "RUNNING",
            RUN_S,
            log,
        )
        time.sleep(5)
        os.killpg(runner.pid, signal.SIGINT)  # Ctrl-C in the terminal running `steprl serve`
        runner.wait(timeout=120)
    finally:
        stop_process_group(runner)
    state = served.api("get", flow_run).json()["state"]
    assert state["type"] in {"CRASHED", "CANCELLED"}, state
    assert _deployment(served)["paused"]
    assert [
        r for r in _scheduled_runs(served, deployment["id"]) if r["state"]["type"] == "SCHEDULED"
    ] == []

    again = _serve(served, log.name)
    try:
        deployment = _until("train/smoke resumed", lambda: _registered(served, again), RUN_S, log)
    finally:
        stop_process_group(again)
    assert [s["schedule"].get("cron") for s in deployment["schedules"]] == ["* * * * *"]


def test_runs_a_stopped_serve_left_unfinished_are_ended_and_marked_crashed(served) -> None:
    """What a flow run's own interrupt handling may not get to under load: after `serve`
    returns, its flow runs' processes are ended and its deployments' runs still Running are
    set Crashed, saying that a rerun resumes them; a finished run is left as it is."""
    import multiprocessing

    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    from flows.interrupted import MESSAGE, end_run_processes, mark_interrupted

    _register(served)
    deployments = build_deployments(["smoke"])
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    process.start()  # as Prefect's runner starts a flow run: a `spawn` child
    with served.services.prefect_client(), get_client(sync_client=True) as client:
        train = client.read_deployment_by_name("train/smoke")
        running = client.create_flow_run_from_deployment(train.id, state=Running())
        done = client.create_flow_run_from_deployment(train.id, state=Completed())
        assert end_run_processes() == [process.pid]
        assert not Path(f"/proc/{process.pid}").exists()  # ended and reaped
        assert mark_interrupted(deployments) == [running.name]
        crashed = client.read_flow_run(running.id).state
        assert (crashed.type.value, crashed.message) == ("CRASHED", MESSAGE)
        assert client.read_flow_run(done.id).state.type.value == "COMPLETED"
