"""Joining or starting Ray, and what every actor process needs from the flow's process:
its working folder, import path and the environment variables steprl reads. A Ray started
here is for this machine alone: its servers listen on loopback, its token file is private."""

from __future__ import annotations

import math
import os
import secrets
import sys
import threading
from pathlib import Path
from typing import Any

from configs.run_config import RunConfig

_LOCK = threading.Lock()
# variables an actor must see as the flow's process does (faults, offline hubs, math threads)
_FORWARDED_PREFIXES = ("STEPRL_", "HF_", "TRANSFORMERS_", "MKL_", "OMP_", "DS_", "CUDA_VISIBLE")


def ensure_ray(cfg: RunConfig) -> None:
    """Connect to the configured Ray once per process: '' starts a local Ray sized for the
    run's workers and ranks; 'auto' or an address joins an existing cluster."""
    import ray

    with _LOCK:
        if ray.is_initialized():
            return
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": True,
            "configure_logging": False,
        }
        if cfg.ray.address:
            kwargs["address"] = cfg.ray.address
        else:
            kwargs["num_cpus"] = cfg.ray.num_cpus or local_cpus(cfg)
            _loopback_only()
        _private_token_file(create=not cfg.ray.address)
        _init_on_keeper_thread(kwargs)


def _loopback_only() -> None:
    """Make the Ray started next take 127.0.0.1 as its node's address: its GCS, raylet,
    workers, agents and metrics endpoint then listen on loopback only (by default each
    listened on every interface). Ray's switch for this is named after the platforms where it
    is the default and is read when Ray is imported, so the flag is set as well as the
    variable (which the processes Ray starts inherit)."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _private_token_file(create: bool) -> None:
    """Ray turns token authentication on for a cluster it starts and keeps the token in
    ~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH), written with the default umask: readable by
    every user of the machine, who could then join the cluster and run code as this one.
    Make an existing file 0600, and (`create`) write a missing one 0600 before Ray would."""
    if os.environ.get("RAY_AUTH_TOKEN"):  # the token is in the environment: no file is read
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.is_file():
        path.chmod(0o600)
    elif create:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(secrets.token_hex(32))  # what Ray itself generates: 256 random bits


def _init_on_keeper_thread(kwargs: dict[str, Any]) -> None:
    """`ray.init` on a thread that lives as long as the process. A local Ray's raylet and GCS
    are started with PR_SET_PDEATHSIG, which Linux fires when the *thread* that started them
    exits: started from a Prefect task's worker thread, the whole cluster was SIGKILLed when
    the flow's thread pool shut down at the end of the run."""
    import ray

    started = threading.Event()
    errors: list[BaseException] = []

    def keeper() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)
            started.set()
            return
        started.set()
        threading.Event().wait()  # never returns: Ray's processes live while this thread does

    threading.Thread(target=keeper, name="steprl-ray-keeper", daemon=True).start()
    started.wait()
    if errors:
        raise errors[0]


def local_cpus(cfg: RunConfig) -> int:
    """CPUs a local Ray advertises: enough for every worker and rank to be placed at once
    (Ray's CPUs are reservations for placement, not cores)."""
    return max(1, math.ceil(cfg.actor_cpus()))


def actor_env(threads: int) -> dict[str, str]:
    """Environment variables of an actor process: the flow's steprl/HF/math settings, its
    import path (so 'package.module:Class' names resolve as in the flow) and `threads` math
    threads when given."""
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_PREFIXES)}
    paths = [os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p)]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def actor_options(cpus: float, gpus: float, threads: int) -> dict[str, Any]:
    """`.options(...)` of a steprl actor: its resources and environment. Actors are not
    restarted by Ray: steprl replaces a dead one itself, knowing what it was doing."""
    return {
        "num_cpus": cpus,
        "num_gpus": gpus,
        "max_restarts": 0,
        "runtime_env": {"env_vars": actor_env(threads)},
    }


def wait_started(actors: list[Any], cfg: RunConfig, what: str, cpus: float, gpus: float) -> list:
    """The actors' process ids once each answers; a clear error (what was asked for, what
    the cluster has) when Ray cannot start them within `ray.start_timeout_s`."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get([a.pid.remote() for a in actors], timeout=cfg.ray.start_timeout_s)
    except GetTimeoutError:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise RuntimeError(
            f"Ray did not start {len(actors)} {what} (each asking num_cpus={cpus:g}, "
            f"num_gpus={gpus:g}) within ray.start_timeout_s={cfg.ray.start_timeout_s:g}; "
            f"the cluster has {ray.cluster_resources()}: lower the count or the per-actor "
            "resources, or add nodes"
        ) from None
