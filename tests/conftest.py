"""Shared fixtures: offline Hugging Face, a tiny random model folder, one Prefect test harness,
and real Prefect + MLflow servers for the serve / UI tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Nothing in the tests may reach a model hub or send telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Prefect's temporary API (this process and the crash tests' subprocesses) may start slowly on
# a busy 2-core machine; its 20 s default was seen to expire before any test code ran.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Llama with a byte-level ChatML tokenizer (built, not downloaded)."""
    from agent_core.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", hidden_size=64, layers=2)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random image-text-to-text model (LLaVA-shaped: the tiny Llama, a one-layer SigLIP
    encoder, 32-pixel images of 16 tokens) with its processor (built, not downloaded)."""
    from agent_core.models import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm")


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API for the whole session (it costs ~20 s to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_process_group(proc: subprocess.Popen) -> None:
    """End a process started with `start_new_session=True` and everything it started:
    SIGTERM, then SIGKILL when it has not exited 20 s later."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


def hold_run_lock(run_dir: Path) -> subprocess.Popen:
    """Another process that holds `run_dir`'s run lock (as a live training run does) until it
    is killed; returns once the lock is taken."""
    code = (
        "import sys, time; from pathlib import Path; from agent_core.run import lock as run_lock; "
        "run_lock.acquire(Path(sys.argv[1]), 'holder'); print('locked', flush=True); "
        "time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


# answers Prefect's client retries (prefect.client.base): too many requests, a bad gateway, and
# the 503 its server sends for a busy SQLite database
RETRYABLE_STATUS = frozenset({429, 502, 503})
RETRY_WAITS_S = (1, 2, 4, 8, 16)  # between the tries of a retryable answer


@dataclass
class Served:
    """Servers started by `flows.serve.start_services` and the temp folder they work in."""

    services: Any  # flows.serve.Services (imported lazily: it pulls in torch and prefect)
    root: Path

    def csrf_headers(self) -> dict[str, str]:
        """Headers that let a raw HTTP client change state on the Prefect server (CSRF
        protection is on): a token fetched for a fresh client id, as Prefect's client does."""
        import uuid

        client = str(uuid.uuid4())
        response = self.api("get", "/csrf-token", params={"client": client}, timeout=60)
        response.raise_for_status()
        return {"Prefect-Csrf-Token": response.json()["token"], "Prefect-Csrf-Client": client}

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request to the Prefect server's API (`path` after `/api`), sent as Prefect's own
        client sends it: a state change carries CSRF headers, and a retryable answer (429, 502,
        503: the server answers 503 while its SQLite database is busy) is retried, five times
        with growing waits (31 s in all). Returns the last `httpx.Response` either way."""
        import time

        import httpx

        if method.upper() != "GET":
            kwargs["headers"] = self.csrf_headers() | kwargs.get("headers", {})
        kwargs.setdefault("timeout", 30)
        url = f"{self.services.prefect_url}/api{path}"
        response = httpx.request(method, url, **kwargs)
        for wait_s in RETRY_WAITS_S:
            if response.status_code not in RETRYABLE_STATUS:
                break
            time.sleep(wait_s)
            response = httpx.request(method, url, **kwargs)
        return response

    def flow_runs(self, where: dict) -> list[dict]:
        """Flow runs matching a Prefect `flow_runs` filter (e.g. {"name": {"any_": [...]}})."""
        response = self.api("post", "/flow_runs/filter", json={"flow_runs": where})
        response.raise_for_status()
        return response.json()


# start_services exports these for child processes; they must not leak into later tests
SERVED_ENV = (
    "PREFECT_API_URL",
    "MLFLOW_TRACKING_URI",
    "PREFECT_API_AUTH_STRING",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
)


def serving(tmp_path_factory: pytest.TempPathFactory, **options: Any):
    """Start the servers (`start_services(**options)`) in a temp working directory, yield
    them as `Served`, then stop them and restore the environment, even on failure."""
    from flows.serve import start_services

    root = tmp_path_factory.mktemp("served")
    saved = {name: os.environ.get(name) for name in SERVED_ENV}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("PREFECT_HOME", str(root / "prefect-home"))
        services = start_services(
            prefect_port=free_port(), mlflow_port=free_port(), state_dir=root / ".steprl", **options
        )
        try:
            yield Served(services, root)
        finally:
            services.stop()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """A Prefect server and an MLflow server on free ports, for one test module. The working
    directory (mlflow.db, mlartifacts, runs, .models) and Prefect's home are a temp folder;
    the servers are stopped and the environment restored afterwards, even on failure."""
    yield from serving(tmp_path_factory)
