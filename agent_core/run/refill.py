"""Dynamic sampling (the `refill` section): every group of an iteration judged by the reasons in
`refill.drop` (failed, stale, zero reward variance), the groups judged so left out and replaced by
groups of new tasks collected in extra rounds (staged shards, through the same collect path) until
the batch holds `rollout.tasks_per_iteration` groups or `refill.max_rounds` run out, and what
became of every drawn task recorded.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from agent_core.collect.iteration_tasks import RefillPlan, plan_refill_round, round_tasks
from agent_core.core.faults import crash_point
from agent_core.core.files import atomic_write_text
from agent_core.core.records import Step, Task
from agent_core.core.results import RefillResult, RunHandle, ShardResult
from agent_core.core.run_folder import refill_record
from agent_core.replay.schema import table_to_steps
from agent_core.replay.staleness import (
    FAILED,
    NO_SUCCESS,
    STALE,
    UNIFORM_OUTCOME,
    ZERO_VARIANCE,
)
from agent_core.replay.store import read_ipc
from agent_core.rewards.scoring import configured_terms
from agent_core.rollout.shard import shard_count
from agent_core.run import placement
from agent_core.serving.episodes import FAILED_ENDS
from configs.run_config import RunConfig

log = logging.getLogger(__name__)
# the reasons a group is left out, in the order one is reported when several apply
REASONS = (FAILED, STALE, ZERO_VARIANCE, UNIFORM_OUTCOME, NO_SUCCESS)
# rewards one round's steps of its tasks in place; returns the term means and judge counters
Reward = Callable[[list[Step], list[Task], int], dict[str, float]]


def _failed(step: Step) -> bool:
    """The step ended its episode in an env error, or an agent error, timeout or refusal."""
    return "env_error" in step.info or step.info.get("end") in FAILED_ENDS


def _flat(rows: list[Step], epsilon: float) -> bool:
    """Every group of the task (one per role) has fewer than two trajectories or episode
    rewards (each trajectory's summed reward) whose unbiased std is at most `epsilon`: the
    test the group-baseline estimators zero an advantage by."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for step in rows:
        totals[step.group_id][step.trajectory_id] += step.reward
    return all(
        len(group) < 2 or float(np.std(list(group.values()), ddof=1)) <= epsilon
        for group in totals.values()
    )


def _uniform(rows: list[Step]) -> bool:
    """Every episode of the task succeeded, or every one failed (DAPO's accuracy filter): its
    advantages can then come only from other reward differences (an env's per-step
    penalties, shaping terms), never from success against failure."""
    ended = {step.trajectory_id: step.success for step in rows if step.done}
    return len(set(ended.values())) <= 1


def _no_success(rows: list[Step]) -> bool:
    """Every episode of the task failed: its advantages can come only from per-step penalties
    or shaping terms, and then teach failing at a lower cost. A group where every episode
    succeeded stays (the filter costs nothing on an env the policy already solves)."""
    return not any(step.success for step in rows if step.done)


def _by_task(steps: list[Step]) -> dict[str, list[Step]]:
    by_task: dict[str, list[Step]] = defaultdict(list)
    for step in steps:
        by_task[step.task_id].append(step)
    return by_task


def _applies(reason: str, rows: list[Step], lost: bool, oldest_version: int, eps: float) -> bool:
    if reason == FAILED:
        return lost or any(_failed(s) for s in rows)
    if reason == STALE:
        return any(s.policy_version < oldest_version for s in rows)
    if reason == UNIFORM_OUTCOME:
        return _uniform(rows)
    if reason == NO_SUCCESS:
        return _no_success(rows)
    return _flat(rows, eps)


def group_verdicts(
    steps: list[Step],
    task_ids: list[str],
    lost: Collection[str],
    drop: Collection[str],
    oldest_version: int,
    epsilon: float,
) -> dict[str, str | None]:
    """For each task id of a round: None when its group stays in the batch, else why it is left
    out: the first reason in `drop`, in the order failed, stale, zero_variance,
    uniform_outcome, no_success, that applies.
    A task with no row at all is failed whatever `drop` says (it has no group to keep).
    failed: a task in `lost` (an episode of it left no row), or a step ending in an env or
    agent error; stale: a row sampled by a policy older than `oldest_version`; zero_variance:
    `_flat` with `epsilon`; uniform_outcome: `_uniform`; no_success: `_no_success`. `steps`
    must be rewarded."""
    by_task = _by_task(steps)
    verdicts: dict[str, str | None] = {}
    for task_id in task_ids:
        rows = by_task.get(task_id, [])
        verdicts[task_id] = (
            FAILED
            if not rows
            else next(
                (
                    reason
                    for reason in REASONS
                    if reason in drop
                    and _applies(reason, rows, task_id in lost, oldest_version, epsilon)
                ),
                None,
            )
        )
    return verdicts


def lost_tasks(iteration: int, tasks: list[Task], shards: list[ShardResult]) -> set[str]:
    """Task ids of which an episode left no row (agent functions): the loop names a lost
    episode `<iteration>:<task_id>:<index>`."""
    groups = {tid.rsplit(":", 1)[0] for shard in shards for tid in shard.lost_episodes}
    return {task.task_id for task in tasks if f"{iteration}:{task.task_id}" in groups}


def collect_round(
    cfg: RunConfig, run: RunHandle, iteration: int, refill_round: int, tasks: int
) -> list[ShardResult]:
    """Run refill round `refill_round`'s `tasks` tasks as staged shards (the shards that hold
    any of them), at once, through the collect path of the iteration's own shards: here
    (sharing the engine under its use lock) or on the rollout workers. A shard already staged
    is not run again."""
    shards = range(min(shard_count(cfg), tasks))
    with ThreadPoolExecutor(max_workers=len(shards)) as pool:
        return list(
            pool.map(lambda s: placement.collect(cfg, run, iteration, s, refill_round), shards)
        )


def _read_steps(shards: list[ShardResult]) -> list[Step]:
    return table_to_steps(pa.concat_tables([read_ipc(Path(s.path)) for s in shards]))


@dataclass
class Filled:
    """A batch after dynamic sampling: the kept groups' rewarded steps, the reward and refill
    metrics, the refill rounds' shards and the record."""

    steps: list[Step]
    metrics: dict[str, float]
    shards: list[ShardResult]
    record: RefillResult


def _failure(iteration: int, task_id: str, steps: list[Step], lost: set[str]) -> str:
    """refill.on_failed=fail: the error naming the task and how its episodes failed."""
    whys = [s.info.get("env_error") or s.info.get("agent_error") for s in steps]
    why = next((w for w in whys if w), "an episode left no row" if task_id in lost else "")
    return (
        f"iteration {iteration}: the group of task {task_id!r} failed ({why[:300]}), and "
        "refill.on_failed=fail stops the iteration: fix the env or agent and rerun, or set "
        "refill.on_failed=retry (run the task again) or refill (replace it)"
    )


def _judge_round(
    cfg: RunConfig,
    iteration: int,
    refill_round: int,
    tasks: list[Task],
    shards: list[ShardResult],
    rewarded: list[Step],
    record: RefillResult,
) -> tuple[dict[str, list[Step]], list[str]]:
    """One round's verdicts, recorded: its kept groups' steps by task id, and the task ids to
    run again (failed, under on_failed=retry). Raises under on_failed=fail."""
    r = cfg.refill
    lost = lost_tasks(iteration, tasks, shards)
    task_ids = [task.task_id for task in tasks]
    oldest = iteration - 1 - cfg.overlap.max_staleness
    verdicts = group_verdicts(rewarded, task_ids, lost, r.drop, oldest, cfg.algorithm.epsilon)
    record.rounds.append(task_ids)
    by_task = _by_task(rewarded)
    kept, retry = {}, []
    for task_id, verdict in verdicts.items():
        if verdict is None:
            kept[task_id] = by_task[task_id]
            continue
        record.drops.append((refill_round, task_id, verdict))
        if verdict == FAILED and FAILED in r.drop and r.on_failed == "fail":
            raise RuntimeError(_failure(iteration, task_id, by_task.get(task_id, []), lost))
        if verdict == FAILED and FAILED in r.drop and r.on_failed == "retry":
            retry.append(task_id)
    return kept, retry


def fill_batch(
    cfg: RunConfig, run: RunHandle, iteration: int, shards: list[ShardResult], reward: Reward
) -> Filled:
    """Judge round 0 (`shards`, the iteration's own draw) group by group; while groups are
    missing and rounds are left, plan and collect a refill round (failed tasks again under
    on_failed=retry, then as many new tasks as are still missing) and judge it. Deterministic
    for the staged shards, so a rerun after a crash plans the same rounds and reuses their
    staged shards. Writes the refill record."""
    target, max_rounds = cfg.rollout.tasks_per_iteration, cfg.refill.max_rounds
    kept: dict[str, list[Step]] = {}
    record = RefillResult(iteration=iteration, rounds=[], full=False)
    rewarded: list[dict[str, float]] = []
    refills: list[ShardResult] = []
    drawn: dict[str, float] = {}
    start = time.perf_counter()
    for refill_round in range(max_rounds + 1):
        tasks = round_tasks(cfg, run.run_dir, iteration, refill_round)
        if not tasks:
            break  # the training range holds no task this iteration has not drawn
        if refill_round:
            shards = collect_round(cfg, run, iteration, refill_round, len(tasks))
            refills += shards
            crash_point("refill", iteration)
        steps = _read_steps(shards)
        rewarded.append(reward(steps, tasks, refill_round))
        if refill_round == 0:  # what the policy sampled, before any group is left out
            drawn = _drawn_metrics(steps)
        kept_now, retry = _judge_round(cfg, iteration, refill_round, tasks, shards, steps, record)
        kept |= kept_now
        missing = target - len(kept)
        if missing == 0 or refill_round == max_rounds:
            break
        plan = RefillPlan(retry=retry, new=missing - len(retry))
        plan_refill_round(run.run_dir, iteration, refill_round + 1, plan)
    record.kept, record.full = list(kept), len(kept) == target
    if not record.full:
        log.warning(
            "iteration %d: %d of %d groups kept after %d refill rounds (refill.max_rounds=%d, "
            "or no undrawn task left): the update trains on the smaller batch",
            iteration, len(kept), target, len(record.rounds) - 1, max_rounds,
        )  # fmt: skip
    atomic_write_text(refill_record(run.run_dir, iteration), record.model_dump_json())
    steps = [step for rows in kept.values() for step in rows]
    metrics = _reward_metrics(cfg, steps, rewarded) | _refill_metrics(record, refills, target)
    metrics |= drawn
    metrics["timing_s/refill"] = time.perf_counter() - start
    return Filled(steps, metrics, refills, record)


def _drawn_metrics(steps: list[Step]) -> dict[str, float]:
    """The iteration's own draw (round 0) before dynamic sampling: its success rate and mean
    episode reward, the figures comparable with a run without refill (the batch's own
    success_rate and reward/mean are over the kept groups, chosen for their contrast)."""
    reward: dict[str, float] = defaultdict(float)
    success: dict[str, bool] = {}
    for step in steps:
        reward[step.trajectory_id] += step.reward
        if step.done:
            success[step.trajectory_id] = step.success
    n = max(1, len(reward))
    return {
        "refill/drawn_success_rate": sum(success.values()) / n,
        "refill/drawn_reward_mean": sum(reward.values()) / n,
    }


def _reward_metrics(
    cfg: RunConfig, kept: list[Step], rounds: list[dict[str, float]]
) -> dict[str, float]:
    """Each term's mean per trajectory over the kept groups (as `score_steps` gives it over
    a whole batch), and the judges' counters summed over every round."""
    names = [f"reward/{term.name}" for term in configured_terms(cfg)]
    n = max(1, len({s.trajectory_id for s in kept}))
    means = {
        name: sum(s.info["reward_terms"].get(name.removeprefix("reward/"), 0.0) for s in kept) / n
        for name in names
    }
    counters: dict[str, float] = {}
    for metrics in rounds:
        for key, value in metrics.items():
            if key not in means:
                counters[key] = counters.get(key, 0.0) + value
    return means | counters


def _refill_metrics(
    record: RefillResult, refills: list[ShardResult], target: int
) -> dict[str, float]:
    """`refill/*`: groups left out per reason (every drop, a retried task's each time), extra
    rounds, tasks they drew (new and retried), groups kept, whether the batch is full, and
    the refill rounds' episodes and generated tokens."""
    reasons = Counter(reason for _, _, reason in record.drops)
    seen, retried = set(record.rounds[0]) if record.rounds else set(), 0
    for ids in record.rounds[1:]:
        retried += sum(task_id in seen for task_id in ids)
        seen |= set(ids)
    drawn = sum(len(ids) for ids in record.rounds[1:])
    metrics = {f"refill/dropped_{reason}": float(reasons[reason]) for reason in REASONS}
    return metrics | {
        "refill/rounds": float(len(record.rounds) - 1),
        "refill/tasks_drawn": float(drawn - retried),
        "refill/tasks_retried": float(retried),
        "refill/kept_groups": float(len(record.kept)),
        "refill/batch_full": float(record.full),
        "refill/batch_share": len(record.kept) / target,
        "refill/episodes": float(sum(s.episodes for s in refills)),
        "refill/generated_tokens": float(sum(s.generated_tokens for s in refills)),
    }
