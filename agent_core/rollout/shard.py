"""How an iteration's task instances split into rollout shards: how many shards there are and
which tasks each one runs. The flow, the in-process path and the rollout workers all ask here,
so every task lands in exactly one shard."""

from __future__ import annotations

from typing import TypeVar

from configs.run_config import RunConfig

T = TypeVar("T")


def shard_count(cfg: RunConfig) -> int:
    """Rollout shards of an iteration: `rollout.num_shards`, and at least one per rollout
    worker so that every worker has a shard to run."""
    return max(cfg.rollout.num_shards, cfg.rollout.workers)


def shard_tasks(tasks: list[T], shard: int, shards: int) -> list[T]:
    """Shard `shard`'s tasks out of `shards`: every `shards`-th task from index `shard`, so
    the shards hold whole task groups, never overlap, and together hold every task."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} does not exist: the iteration has {shards} shards")
    return tasks[shard::shards]
