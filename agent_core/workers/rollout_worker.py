"""`RolloutWorker`: a Ray actor that holds one rollout engine across iterations and runs
rollout shards with it, writing each shard's staged Arrow file to the shared run folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from agent_core import live
from agent_core.collect.shard import collect_shard
from agent_core.core.results import RunHandle
from agent_core.workers.liveness import identity
from configs.run_config import RunConfig


class RolloutWorker:
    """One engine in its own process. Created through `ray.remote` by `RolloutPool`; its
    engine lives in the process's runtime cache, so it is built once and then only takes new
    weights (from a checkpoint folder or the object store) when the policy version moves."""

    def __init__(self, cwd: str, threads: int) -> None:
        os.chdir(cwd)  # run folders and model paths are relative to the flow's folder
        if threads:
            torch.set_num_threads(threads)

    def pid(self) -> int:
        """The worker's process id (fault tests kill it)."""
        return os.getpid()

    def heartbeat(self) -> str:
        """Its pid and node; answered on a thread of its own while a shard runs."""
        return identity()

    def collect(
        self, cfg_json: str, run_json: str, iteration: int, shard: int, refill_round: int = 0
    ) -> str:
        """Run one shard (of the iteration, or of its refill round `refill_round`) exactly as
        the in-process path does; returns its ShardResult JSON."""

        cfg = RunConfig.model_validate_json(cfg_json)
        run = RunHandle.model_validate_json(run_json)
        return collect_shard(cfg, run, iteration, shard, refill_round).model_dump_json()

    def sync(
        self, cfg_json: str, run_json: str, version: int, weights: str, state: dict | None
    ) -> float:
        """Hold policy `version`: load `state` (weights from the object store) when given,
        else the HF checkpoint folder `weights`. Returns the seconds it took."""

        start = time.perf_counter()
        cfg = RunConfig.model_validate_json(cfg_json)
        run = RunHandle.model_validate_json(run_json)
        live.engine_at(cfg, Path(run.run_dir), version, Path(weights), state)
        return time.perf_counter() - start
