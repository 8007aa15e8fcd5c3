"""A run of a served deployment, created through the Prefect API as the UI form would, names
command-running standard-library functions in every role, a task file outside the data roots,
a command as the Python that starts vLLM and a server `steprl serve` did not allow: it is
refused before anything is called or sent, naming each field and how to allow it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agent_core.config.load import load_config
from configs.task_file import TaskFileSection
from tests.conftest import stop_process_group

pytestmark = pytest.mark.slow

READY_S, RUN_S = 240, 300
# in-process training tests leave torch.distributed's rendezvous in os.environ
DIST_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def _attack(marker: str, outside: str, python: str) -> dict:
    """The smoke config with a command that would create `marker` in every named role and as
    the Python of the vLLM server (`python`)."""
    config = load_config("smoke").model_dump(mode="json")
    vllm = config["rollout"]["vllm"] | {"python": python, "port": 9}  # port: another server's
    remote = config["rollout"]["remote"] | {"base_url": "http://127.0.0.1:9"}  # not allowed
    config["rollout"] |= {"engine": "vllm", "vllm": vllm, "remote": remote}
    touch = f"touch {marker}"
    config["env"] |= {
        "name": "os:system",
        "agent": "os:system",
        "tools": ["os:system"],
        "context": {
            "name": "summarize",
            "summarizer": {"name": "subprocess:run", "args": touch, "shell": True},
        },
        # whole, as the run form sends a section (its fields with defaults are required there)
        "tasks": TaskFileSection(
            path=outside,
            prompt="question",
            answer="answer",
            train={"rows": [0, 4]},
            held_out={"rows": [4, 8]},
        ).model_dump(mode="json"),
    }
    config["reward"]["terms"] = [{"name": "os:system", "weight": 1.0}]
    config["algorithm"]["estimator"] = "subprocess:run"
    return _without_nulls(config)


def _without_nulls(value):
    """`value` as the run form sends it: an empty (null) field is left out."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return [_without_nulls(v) for v in value] if isinstance(value, list) else value


def _deployment_id(served, runner: subprocess.Popen, log) -> str:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        assert runner.poll() is None, log.read_text(errors="replace")[-3000:]
        found = served.api("get", "/deployments/name/train/smoke")
        if found.status_code == 200:
            return found.json()["id"]
        time.sleep(2)
    raise AssertionError("the served deployment never appeared\n" + log.read_text()[-3000:])


def _create_run(served, deployment_id: str, parameters: dict) -> dict:
    """POST the run as the UI does (`served.api` retries a busy server's 503)."""
    path = f"/deployments/{deployment_id}/create_flow_run"
    created = served.api("post", path, json={"parameters": parameters})
    assert created.status_code == 201, created.text
    return created.json()


def _final_state(served, run_id: str) -> dict:
    deadline = time.monotonic() + RUN_S
    while time.monotonic() < deadline:
        state = served.api("get", f"/flow_runs/{run_id}").json()["state"]
        if state["type"] in {"FAILED", "CRASHED", "COMPLETED", "CANCELLED"}:
            return state
        time.sleep(2)
    raise AssertionError(f"flow run {run_id} did not finish in {RUN_S}s")


def test_a_deployment_run_naming_stdlib_functions_is_refused(served) -> None:
    """`steprl serve --allow-module os`: `os:system` reaches the type check (not marked for
    any role), `subprocess:*` is refused before import, the task file before it is opened."""
    marker, outside = served.root / "marker", served.root / "elsewhere" / "qa.jsonl"
    python = served.root / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\n")
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV} | {
        "PREFECT_API_URL": f"{served.services.prefect_url}/api",
        "MLFLOW_TRACKING_URI": served.services.mlflow_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "PYTHONUNBUFFERED": "1",
    }
    log = served.root / ".steprl" / "names-runner.log"
    serve = [sys.executable, "-m", "flows.cli", "serve", "--preset", "smoke", "--no-servers"]
    with log.open("ab") as out:
        runner = subprocess.Popen(
            [*serve, "--allow-module", "os"],
            cwd=served.root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deployment = _deployment_id(served, runner, log)
        parameters = {"config": _attack(str(marker), str(outside), str(python))}
        created = _create_run(served, deployment, parameters)
        state = _final_state(served, created["id"])
    finally:
        stop_process_group(runner)
    message = state["message"] or ""
    assert state["type"] == "FAILED", state
    assert "Deployment runs may import: os" in log.read_text(errors="replace")
    for field in ("env.name", "env.agent", "env.tools.0", "reward.terms.0.name"):
        assert f"{field}: " in message and "'os:system'" in message, (field, message)
    assert "which is not a AgentEnv subclass" in message, message
    for field in ("env.context: summarizer", "algorithm.estimator: estimator"):
        assert f"{field} 'subprocess:run': module 'subprocess' is not allowed" in message
    assert "`--allow-module subprocess`" in message
    assert "env.tasks: path" in message and "`--data-root" in message, message
    assert f"rollout.vllm.python: '{python}'" in message and "`--allow-python" in message
    assert "rollout.remote.base_url: 'http://127.0.0.1:9'" in message, message
    assert "`--allow-base-url http://127.0.0.1:9`" in message and "rollout.vllm.port: 9" in message
    assert not marker.exists()
