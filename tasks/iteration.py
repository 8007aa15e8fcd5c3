"""Prefect tasks of a training iteration: one verb each, wiring `agent_core` phases.

Tasks take and return small pydantic models (config, paths, counts, metrics), never tensors or
tables. Results are persisted and cached by the inputs that define the work (the run's folder
and MLflow id, so a new run never hits an old cache): a retried or resumed flow run returns
finished tasks' results instead of redoing them. Every phase is also idempotent on disk.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE
from pydantic import BaseModel

from agent_core.core.results import (
    PartitionResult,
    RunHandle,
    ScoreResult,
    ShardResult,
    UpdateResult,
)
from agent_core.run import placement, prepare, score, update, warmup
from agent_core.run import report as reporting
from agent_core.run import write_replay as replay_phase
from agent_core.run.placement import SyncResult
from agent_core.run.report import LogResult
from agent_core.run.warmup import WarmupResult
from configs.run_config import RunConfig
from tasks import flow_runs


def _key_part(value: Any) -> Any:
    if isinstance(value, RunHandle):  # the run's identity, not where this attempt started
        # ...and its repairs: results cached before files were removed must not come back
        return {"run_dir": value.run_dir, "mlflow_run_id": value.mlflow_run_id,
                "repairs": value.repairs}  # fmt: skip
    if isinstance(value, RunConfig):  # a rerun may ask for more iterations: same work per k
        return value.model_dump(mode="json", exclude={"run": {"iterations", "continue_for"}})
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_key_part(v) for v in value]
    return value


def phase_key(context: Any, parameters: dict[str, Any]) -> str:
    """Cache key of a phase: its name and the inputs that define its work."""
    payload = json.dumps({k: _key_part(v) for k, v in parameters.items()}, sort_keys=True)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:32]
    return f"steprl-{context.task.name}-{digest}"


CACHED: dict[str, Any] = {"cache_key_fn": phase_key, "persist_result": True}


def artifact_key(run_name: str, iteration: int) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for a run's iteration."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")
    return f"steprl-{slug}-iter-{iteration}"


@task(name="prepare_run", cache_policy=NONE)
def prepare_run(config: RunConfig, tags: dict[str, str]) -> RunHandle:
    """Model folder, run folder, MLflow run, and the iteration to start from; an earlier flow
    run of this run folder that Prefect still shows unfinished is marked Crashed."""
    run = prepare.prepare_run(config, tags)
    try:
        crashed = flow_runs.take_over(run.run_dir, tags["prefect.flow_run_id"])
    except Exception as exc:  # a stale state in the UI must not stop the run that repairs it
        get_run_logger().warning("could not check the run folder's last flow run: %s", exc)
    else:
        if crashed:
            get_run_logger().warning(
                "flow run %s of run %r ended without reporting (its process was killed or "
                "crashed): marked Crashed",
                crashed,
                config.run.name,
            )
    return run


@task(name="warmup_policy", **CACHED)
def warmup_policy(config: RunConfig, run: RunHandle) -> WarmupResult:
    """Supervised cold start on demonstrations; its checkpoint is policy version 0."""
    return warmup.warmup(config, run)


@task(name="collect_rollouts", retries=2, retry_delay_seconds=2, **CACHED)
def collect_rollouts(config: RunConfig, run: RunHandle, iteration: int, shard: int) -> ShardResult:
    """Run one shard's episodes with the current policy (here or on its rollout worker) and
    stage its steps."""
    return placement.collect(config, run, iteration, shard)


@task(name="score_rollouts", **CACHED)
def score_rollouts(
    config: RunConfig, run: RunHandle, iteration: int, shards: list[ShardResult]
) -> ScoreResult:
    """Rewards and advantages for the iteration's steps; with `refill.drop` set, dynamic
    sampling first: dropped groups left out and refilled from new tasks in extra rounds."""
    return score.score(config, run, iteration, shards)


@task(name="write_replay", retries=1, **CACHED)
def write_replay(
    config: RunConfig, run: RunHandle, iteration: int, scored: ScoreResult
) -> PartitionResult:
    """Commit the iteration's Arrow replay partition (its groups and trajectories checked)."""
    return replay_phase.write_replay(config, run, iteration, scored)


@task(name="update_policy", **CACHED)
def update_policy(
    config: RunConfig, run: RunHandle, iteration: int, partition: PartitionResult
) -> UpdateResult:
    """One DeepSpeed policy update on the partition; saves the next checkpoint."""
    return update.update(config, run, iteration, partition)


@task(name="sync_weights", cache_policy=NONE)
def sync_weights(config: RunConfig, run: RunHandle, iteration: int) -> SyncResult:
    """Every rollout engine takes policy `iteration` before it samples again."""
    return placement.sync(config, run, iteration)


@task(name="log_iteration", retries=2, retry_delay_seconds=2, **CACHED)
def log_iteration(
    config: RunConfig,
    run: RunHandle,
    iteration: int,
    shards: list[ShardResult],
    scored: ScoreResult,
    partition: PartitionResult,
    updated: UpdateResult,
    synced: SyncResult | None = None,
) -> LogResult:
    """Metrics, step table, checkpoint, traces and samples to MLflow; a Prefect artifact
    linking to the MLflow run."""
    result = reporting.log_iteration(
        config, run, iteration, shards, scored, partition, updated, synced
    )
    m = result.metrics
    create_markdown_artifact(
        key=artifact_key(config.run.name, iteration),
        markdown=(
            f"### {config.run.name} — iteration {iteration}\n\n"
            f"| reward/mean | success_rate | policy loss | steps/episode |\n|---|---|---|---|\n"
            f"| {m['reward/mean']:.3f} | {m['success_rate']:.3f} | {m['actor/policy_loss']:.4f} "
            f"| {m['episode/steps_mean']:.2f} |\n\n"
            f"MLflow run `{result.mlflow_run_id}`: {result.mlflow_url}\n\n"
            f"Replay partition: `{partition.path}` ({partition.rows} steps)"
        ),
        description=f"steprl iteration {iteration} of run {config.run.name}",
    )
    return result


@task(name="finish_run", cache_policy=NONE)
def finish_run(config: RunConfig, run: RunHandle, status: str) -> None:
    """End the MLflow run, free live models and stop the run's rollout workers."""
    placement.release(run.run_dir)
    prepare.finish_run(config, run, status)
