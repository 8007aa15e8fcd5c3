"""Prefect tasks of a training iteration: one verb each, wiring `agent_core.iteration` phases.

Tasks take and return small pydantic models (config, paths, counts, metrics), never tensors or
tables. Every phase is idempotent on disk, so retrying a task is safe.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from agent_core import iteration as phases
from agent_core.iteration import (
    LogResult,
    PartitionResult,
    RunHandle,
    ScoreResult,
    ShardResult,
    UpdateResult,
)
from configs.run_config import RunConfig


@task(name="prepare_run", cache_policy=NONE)
def prepare_run(config: RunConfig, tags: dict[str, str]) -> RunHandle:
    """Model folder, run folder, MLflow run, and the iteration to start from."""
    return phases.prepare_run(config, tags)


@task(name="collect_rollouts", cache_policy=NONE, retries=1, retry_delay_seconds=2)
def collect_rollouts(config: RunConfig, run: RunHandle, iteration: int, shard: int) -> ShardResult:
    """Run one shard's episodes with the current policy and stage its steps."""
    return phases.collect_shard(config, run, iteration, shard)


@task(name="score_rollouts", cache_policy=NONE)
def score_rollouts(
    config: RunConfig, run: RunHandle, iteration: int, shards: list[ShardResult]
) -> ScoreResult:
    """Rewards and advantages for the iteration's steps."""
    return phases.score(config, run, iteration, shards)


@task(name="write_replay", cache_policy=NONE, retries=1)
def write_replay(run: RunHandle, iteration: int, scored: ScoreResult) -> PartitionResult:
    """Commit the iteration's Arrow replay partition."""
    return phases.commit(run, iteration, scored)


@task(name="update_policy", cache_policy=NONE)
def update_policy(
    config: RunConfig, run: RunHandle, iteration: int, partition: PartitionResult
) -> UpdateResult:
    """One DeepSpeed policy update on the partition; saves the next checkpoint."""
    return phases.update(config, run, iteration, partition)


@task(name="log_iteration", cache_policy=NONE, retries=2, retry_delay_seconds=2)
def log_iteration(
    config: RunConfig,
    run: RunHandle,
    iteration: int,
    shards: list[ShardResult],
    scored: ScoreResult,
    partition: PartitionResult,
    updated: UpdateResult,
) -> LogResult:
    """Metrics, step table, checkpoint and samples to MLflow."""
    return phases.log_iteration(config, run, iteration, shards, scored, partition, updated)


@task(name="finish_run", cache_policy=NONE)
def finish_run(config: RunConfig, run: RunHandle, status: str) -> None:
    """End the MLflow run and free live models."""
    phases.finish_run(config, run, status)
