"""Which task instances an iteration (or the warm-up) trains on: distinct training-range seeds, or
rows of the tasks file, drawn from the run seed and a seed stream; with dynamic sampling, the
tasks of each refill round, rebuilt from its plan.
"""

from __future__ import annotations

import random
from pathlib import Path

from pydantic import BaseModel, Field

from agent_core.core.files import atomic_write_text
from agent_core.core.records import Task
from agent_core.core.run_folder import refill_plan_file
from agent_core.envs import make_tasks
from agent_core.envs.task_file import sample_train_tasks
from configs.run_config import RunConfig

# Refill round r of iteration k draws from seed stream -1 - ROUND_STREAMS * k - r: negative
# like the warm-up's (-1) and distinct from it, from the iterations' own streams (k >= 1) and
# from each other (refill.max_rounds < ROUND_STREAMS).
ROUND_STREAMS = 1000


class RefillPlan(BaseModel):
    """What one refill round draws: tasks of earlier rounds run again, then new tasks."""

    retry: list[str] = Field(
        description="Task ids of earlier rounds run again with fresh envs (refill.on_failed="
        "retry), in order."
    )
    new: int = Field(ge=0, description="How many new tasks the round draws after them.")


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


def plan_refill_round(
    run_dir: str | Path, iteration: int, refill_round: int, plan: RefillPlan
) -> None:
    """Write refill round `refill_round`'s plan before its shards run (they read it back)."""
    atomic_write_text(refill_plan_file(run_dir, iteration, refill_round), plan.model_dump_json())


def round_tasks(
    cfg: RunConfig, run_dir: str | Path, iteration: int, refill_round: int
) -> list[Task]:
    """The tasks round `refill_round` of the iteration runs: round 0 is `iteration_tasks`;
    refill round r is its plan's retried tasks, then its new ones: the first tasks of round
    r's own seed stream that no earlier round of the iteration drew. Deterministic for the run
    seed, the iteration and the plans, so a rollout worker and a rerun get the same tasks."""
    tasks = iteration_tasks(cfg, iteration)
    drawn = {task.task_id: task for task in tasks}
    for r in range(1, refill_round + 1):
        plan = RefillPlan.model_validate_json(refill_plan_file(run_dir, iteration, r).read_text())
        stream = -1 - ROUND_STREAMS * iteration - r
        # a sample of `new + len(drawn)` holds at least `new` undrawn tasks when there are so many
        candidates = train_tasks(cfg, stream, plan.new + len(drawn))
        new = [task for task in candidates if task.task_id not in drawn][: plan.new]
        tasks = [drawn[task_id] for task_id in plan.retry] + new
        drawn |= {task.task_id: task for task in new}
    return tasks
