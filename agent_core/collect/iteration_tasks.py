"""Which task instances an iteration (or the warm-up) trains on: distinct training-range seeds, or
rows of the tasks file, drawn from the run seed and a seed stream.
"""

from __future__ import annotations

import random

from agent_core.core.records import Task
from agent_core.envs import make_tasks
from agent_core.envs.task_file import sample_train_tasks
from configs.run_config import RunConfig


def iteration_tasks(cfg: RunConfig, iteration: int) -> list[Task]:
    """The task instances of an iteration: distinct training seeds drawn from the run seed."""
    return train_tasks(cfg, iteration, cfg.rollout.tasks_per_iteration)


def train_tasks(cfg: RunConfig, stream: int, count: int) -> list[Task]:
    """`count` distinct training-range tasks from seed stream `stream` (an iteration, or -1
    for warm-up demonstrations); a make_task with a `split` parameter is told 'train'."""
    rng = random.Random(cfg.run.seed * 1_000_003 + stream)
    env = cfg.env
    if env.tasks is not None:
        return sample_train_tasks(env.tasks, rng, count)
    seeds = rng.sample(
        range(env.train_seed_start, env.train_seed_start + env.train_seed_count),
        min(count, env.train_seed_count),
    )
    return make_tasks(env.name, seeds, env.task_options, split="train")
