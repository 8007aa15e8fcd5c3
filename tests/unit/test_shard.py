"""The split of an iteration's tasks into rollout shards: every task in exactly one shard,
whatever the shard count, and at least one shard per rollout worker."""

from __future__ import annotations

import pytest

from agent_core.collect.iteration_tasks import iteration_tasks
from agent_core.config.load import load_config
from agent_core.rollout.shard import shard_count, shard_tasks


@pytest.mark.parametrize("shards", [1, 2, 3, 5])
@pytest.mark.parametrize("count", [0, 1, 4, 7])
def test_every_task_lands_in_exactly_one_shard(shards: int, count: int) -> None:
    tasks = list(range(count))
    split = [shard_tasks(tasks, shard, shards) for shard in range(shards)]
    assert sorted(t for part in split for t in part) == tasks
    assert all(part == sorted(part) for part in split)  # each shard keeps the iteration's order


def test_a_shard_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="shard 2 does not exist: the iteration has 2 shards"):
        shard_tasks([1, 2, 3], 2, 2)


@pytest.mark.parametrize(
    ("overrides", "count"),
    [
        ([], 1),
        (["rollout.num_shards=3"], 3),
        (["rollout.workers=2"], 2),  # the README's scale-out command: num_shards left alone
        (["rollout.workers=2", "rollout.num_shards=3"], 3),
    ],
)
def test_shard_count(overrides: list[str], count: int) -> None:
    assert shard_count(load_config("smoke", overrides)) == count


def test_two_workers_split_the_iterations_tasks() -> None:
    """`--set rollout.workers=2` with `num_shards` at its default: the two shards the flow maps
    hold the iteration's task instances once each (shard 1 once ran all but the first)."""
    cfg = load_config("smoke", ["rollout.workers=2", "rollout.tasks_per_iteration=5"])
    tasks = iteration_tasks(cfg, 1)
    split = [shard_tasks(tasks, s, shard_count(cfg)) for s in range(shard_count(cfg))]
    ids = [t.task_id for part in split for t in part]
    assert sorted(ids) == sorted(t.task_id for t in tasks) and len(set(ids)) == 5
