"""Serve steprl from the Prefect UI: start a Prefect server and an MLflow server on 127.0.0.1,
register `train` and `evaluate` deployments (typed parameter forms from `RunConfig`, optional
cron or interval schedules), and run them until Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path

from prefect import serve
from prefect.settings import PREFECT_API_URL, temporary_settings

from agent_core.config import load_config
from flows.evaluate import evaluate
from flows.train import train

HEALTH_TIMEOUT_S = 90


@dataclass
class Services:
    """The server processes started by `start_services` and their URLs."""

    prefect_url: str
    mlflow_url: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        """Terminate every server's process group (then kill what does not exit)."""
        for proc in self.processes:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.processes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()

    @contextmanager
    def prefect_client(self) -> Iterator[None]:
        """Point this process's Prefect client at the started server. Prefect reads
        PREFECT_API_URL once, at import: setting os.environ later reaches child processes only,
        and the client here would silently use a temporary ephemeral API instead."""
        with temporary_settings(updates={PREFECT_API_URL: f"{self.prefect_url}/api"}):
            yield


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    # the whole group, even after its leader exited: `mlflow server` runs uvicorn and job
    # workers as children that would otherwise outlive it
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _check_port_free(host: str, port: int, name: str) -> None:
    # a server already listening there would answer our health check in place of ours
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise RuntimeError(
                f"{name} port {port} on {host} is in use ({exc.strerror}): stop what listens "
                f"there or choose another port (--{name.lower()}-port)"
            ) from None


def _wait_healthy(url: str, proc: subprocess.Popen, name: str, log: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{name} not healthy at {url} after {HEALTH_TIMEOUT_S}s; see {log}")


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    # own process group: Ctrl-C in the foreground is handled by us, then the group is stopped
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def start_services(
    host: str = "127.0.0.1",
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
    state_dir: Path = Path(".steprl"),
) -> Services:
    """Start the Prefect server (UI + API) and the MLflow server (sqlite + local artifacts),
    wait until both answer, and point this process's environment (so its child processes and
    MLflow) at them; for this process's Prefect client use `Services.prefect_client()`."""
    _check_port_free(host, prefect_port, "Prefect")
    _check_port_free(host, mlflow_port, "MLflow")
    bin_dir = Path(sys.executable).parent
    env = os.environ | {
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(prefect_port),
        "PREFECT_UI_API_URL": f"http://{host}:{prefect_port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    services = Services(f"http://{host}:{prefect_port}", f"http://{host}:{mlflow_port}")
    prefect_log, mlflow_log = state_dir / "prefect-server.log", state_dir / "mlflow-server.log"
    prefect_cmd = [str(bin_dir / "prefect"), "server", "start", "--host", host]
    prefect_cmd += ["--port", str(prefect_port)]
    services.processes.append(_spawn(prefect_cmd, env, prefect_log))
    mlflow_cmd = [
        str(bin_dir / "mlflow"), "server",
        "--backend-store-uri", f"sqlite:///{Path('mlflow.db').resolve()}",
        "--artifacts-destination", str(Path("mlartifacts").resolve()),
        "--host", host, "--port", str(mlflow_port), "--workers", "1",
    ]  # fmt: skip
    services.processes.append(_spawn(mlflow_cmd, env, mlflow_log))
    try:
        _wait_healthy(
            f"{services.prefect_url}/api/health", services.processes[0], "Prefect", prefect_log
        )
        _wait_healthy(f"{services.mlflow_url}/health", services.processes[1], "MLflow", mlflow_log)
    except BaseException:
        services.stop()
        raise
    os.environ["PREFECT_API_URL"] = f"{services.prefect_url}/api"
    os.environ["MLFLOW_TRACKING_URI"] = services.mlflow_url
    return services


def build_deployments(
    presets: list[str],
    cron: str | None = None,
    interval_s: int | None = None,
    continue_for: int = 0,
):
    """A `train` and an `evaluate` deployment per preset. Parameters default to the preset's
    values; the form in the UI is generated from `RunConfig` (descriptions, bounds, enums).
    With `continue_for`, each scheduled train run adds that many iterations to the same run."""
    deployments = []
    for preset in presets:
        overrides = [f"run.continue_for={continue_for}"] if continue_for else []
        config = load_config(preset, overrides).model_dump(mode="json")
        schedule = {"cron": cron} if cron else {"interval": interval_s} if interval_s else {}
        deployments.append(
            train.to_deployment(
                name=preset.replace("_", "-"),
                parameters={"config": config},
                description=f"Train with the '{preset}' preset (edit any field in the form).",
                tags=["steprl", "train"],
                **schedule,
            )
        )
        deployments.append(
            evaluate.to_deployment(
                name=preset.replace("_", "-"),
                parameters={"config": config, "checkpoint": "latest"},
                description=f"Evaluate a checkpoint of the '{preset}' run on held-out tasks.",
                tags=["steprl", "evaluate"],
            )
        )
    return deployments


def serve_forever(
    presets: list[str],
    cron: str | None = None,
    interval_s: int | None = None,
    continue_for: int = 0,
    with_servers: bool = True,
    host: str = "127.0.0.1",
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
) -> None:
    """Start the servers (unless told not to), register the deployments and execute their
    runs in this process until interrupted; then stop the servers."""
    services = start_services(host, prefect_port, mlflow_port) if with_servers else None
    if services:
        print(f"Prefect UI: {services.prefect_url}    MLflow UI: {services.mlflow_url}", flush=True)
    try:
        deployments = build_deployments(presets, cron, interval_s, continue_for)
        with services.prefect_client() if services else nullcontext():
            serve(*deployments, pause_on_shutdown=False)
    except KeyboardInterrupt:
        pass
    finally:
        if services:
            services.stop()
            print("stopped the Prefect and MLflow servers", flush=True)
