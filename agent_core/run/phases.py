"""The phases of one training iteration as plain functions over a run folder.

prepare_run -> collect_shard (per shard) -> score -> commit -> update -> log_iteration.
Each phase reads its inputs from disk, writes its output atomically, returns a small pydantic
result, and returns the stored result instead of redoing work that is already complete, so a
rerun of a crashed iteration resumes where it stopped. `tasks/` wraps each one as a Prefect task.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from agent_core import live as runtime
from agent_core.algorithms.advantages import ESTIMATORS, AdvantageOptions
from agent_core.algorithms.diagnostics import (
    advantage_diagnostics,
    falling_streak,
    reward_after_update_estimate,
    update_warnings,
)
from agent_core.algorithms.returns import StepArrays
from agent_core.config.load import changed_settings, dump_config, flatten
from agent_core.core.faults import crash_point
from agent_core.core.records import Step, Task
from agent_core.core.registry import resolve
from agent_core.envs import env_class, make_env, make_tasks
from agent_core.envs.task_file import sample_train_tasks
from agent_core.models import ensure_model_folder
from agent_core.prompting.renderer import AgentFlow
from agent_core.replay.schema import steps_to_table, table_to_steps
from agent_core.replay.store import (
    CorruptPartitionError,
    atomic_write_bytes,
    commit_partition,
    iteration_dir,
    partition_info,
    read_ipc,
    read_partition,
    remove_staged,
    verify_partition,
    write_ipc,
)
from agent_core.rewards.judge_engines import judge_engines
from agent_core.rewards.scoring import configured_terms, group_trajectories, score_steps
from agent_core.rollout.engine import SamplingParams
from agent_core.rollout.loop import AgentEnvLoop, RolloutMeta
from agent_core.rollout.shard import shard_count, shard_tasks
from agent_core.run import lock as run_lock
from agent_core.serving.agent_loop import AgentFunctionLoop, agent_function_loop
from agent_core.serving.episodes import check_failed_share, episode_metrics, role_metrics
from agent_core.trainer.batching import TrainRow
from agent_core.trainer.policy_trainer import metrics_dict, saved_layout
from configs.run_config import RunConfig

log = logging.getLogger(__name__)
CHECKPOINTS = "checkpoints"
LATEST = "latest"
LOGGED_MARK = "logged.json"
REPAIRS = "repairs"


class RunHandle(BaseModel):
    """Where a run lives and where it (re)starts."""

    run_dir: str
    mlflow_run_id: str
    base_model: str
    start_weights: str = Field(
        "", description="Policy version 0: the warm-up checkpoint when warm-up is on, else base."
    )
    start_iteration: int
    iterations: int
    repairs: int = Field(
        0,
        description="Reruns that removed damaged files; part of the task cache key, so the "
        "tasks whose files were removed run again instead of returning their cached results.",
    )


class ShardResult(BaseModel):
    """One rollout shard's staging file and counts."""

    iteration: int
    shard: int
    path: str
    episodes: int
    steps: int
    generate_calls: int
    generated_tokens: int
    prompt_tokens: int
    generate_seconds: float
    seconds: float = Field(description="Wall seconds of the shard, its failed tries included.")
    pid: int = Field(0, description="Process that ran the shard (the flow's, or a worker's).")
    attempts: int = Field(
        1, description="Tries it took: more than one when its rollout worker died or stalled."
    )
    failed_seconds: float = Field(
        0.0, description="Seconds of the failed tries (until each was found out), in `seconds`."
    )
    episode_ends: dict[str, int] = Field(
        default_factory=dict,
        description="Agent functions: episodes per way they ended (agent, answer, agent_error, "
        "timeout, refused).",
    )
    lost_episodes: dict[str, str] = Field(
        default_factory=dict,
        description="Agent functions: episodes that left no row (no answered call), and why.",
    )


class ScoreResult(BaseModel):
    """Scored steps (staging) and the iteration's reward and advantage statistics."""

    iteration: int
    path: str
    steps: int
    trajectories: int
    metrics: dict[str, float]
    seconds: float


class PartitionResult(BaseModel):
    """The committed replay partition."""

    iteration: int
    path: str
    rows: int
    sha256: str
    seconds: float


class UpdateResult(BaseModel):
    """The policy update's metrics and the checkpoint it produced."""

    iteration: int
    policy_version: int
    checkpoint: str
    metrics: dict[str, float]
    seconds: float


def run_dir_of(cfg: RunConfig) -> Path:
    """The folder of this run: `<output_dir>/<name>`."""
    return Path(cfg.run.output_dir) / cfg.run.name


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    """The checkpoint written by iteration `iteration` (holds policy version `iteration`)."""
    return run_dir / CHECKPOINTS / f"iter_{iteration:04d}"


WARMUP = "warmup"


def warmup_dir(run_dir: Path) -> Path:
    """The checkpoint written by the supervised warm-up (policy version 0 when enabled)."""
    return Path(run_dir) / CHECKPOINTS / WARMUP


def policy_weights(run: RunHandle, version: int) -> Path:
    """The HF folder holding policy `version` (0 = the warm-up checkpoint or the base model)."""
    if version == 0:
        return Path(run.start_weights or run.base_model)
    return checkpoint_dir(Path(run.run_dir), version)


def _is_logged(run_dir: Path, iteration: int) -> bool:
    return (iteration_dir(run_dir, iteration) / LOGGED_MARK).is_file()


def repairs(run_dir: Path, bump: bool = False) -> int:
    """How many times damaged files of this run were removed (`bump` counts one more)."""
    path = Path(run_dir) / REPAIRS
    count = int(path.read_text()) if path.is_file() else 0
    if bump:
        count += 1
        atomic_write_bytes(path, str(count).encode())
    return count


def repair_iteration(run_dir: Path, iteration: int) -> list[str]:
    """Check what an unfinished iteration left on disk; remove every corrupt file and what was
    derived from it, so the phases redo that work instead of reading it. Returns one message
    per corrupt file, naming it."""
    folder = iteration_dir(run_dir, iteration)
    problems: list[str] = []
    try:
        if partition_info(run_dir, iteration) is not None:
            verify_partition(run_dir, iteration)
    except CorruptPartitionError as exc:
        problems.append(str(exc))
        repairs(run_dir, bump=True)  # before deleting: a crash in between still misses the cache
        # the committed data is unusable and its staging is gone: redo the whole iteration
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(checkpoint_dir(run_dir, iteration), ignore_errors=True)
        return problems
    for staged in sorted(folder.glob("rollouts/*.arrow")) + sorted(folder.glob("scored.arrow")):
        if not staged.exists():
            continue  # removed above as derived from a corrupt shard
        try:
            read_ipc(staged)
        except CorruptPartitionError as exc:
            problems.append(str(exc))
            repairs(run_dir, bump=True)
            for derived in [staged, staged.with_suffix(".json"), folder / "scored.arrow",
                            folder / "scored.json"]:  # fmt: skip
                remove_staged(derived)
    return problems


def prepare_run(cfg: RunConfig, tags: dict[str, str]) -> RunHandle:
    """Lock the run folder (while this run lives, another run of the same name is refused;
    finish_run unlocks), make the model folder exist, create or reopen the run folder and its
    MLflow run, and find the first iteration not yet complete."""
    run_dir = run_dir_of(cfg)
    run_lock.acquire(run_dir, cfg.run.name)
    try:
        return _open_run(cfg, run_dir, tags)
    except BaseException:
        run_lock.release(run_dir)
        raise


def refuse_other_layout(cfg: RunConfig, run_dir: Path) -> None:
    """Refuse a rerun at its start when the checkpoint it goes on from holds DeepSpeed state
    written by other `trainer.ranks` or `trainer.zero_stage`: the optimizer state is
    partitioned by both, and loading it would fail only at the next update, after that
    iteration's rollouts were collected."""
    pointer = run_dir / CHECKPOINTS / LATEST
    if pointer.is_file():
        resumed = run_dir / CHECKPOINTS / pointer.read_text().strip()
    elif cfg.warmup.enabled:
        resumed = warmup_dir(run_dir)
    else:
        return
    t = cfg.trainer
    layout = saved_layout(resumed, t.zero_stage)
    if layout is None or layout == (t.ranks, t.zero_stage):
        return
    asked = [
        f"trainer.{name}={new} (recorded: {old})"
        for name, old, new in (
            ("ranks", layout[0], t.ranks),
            ("zero_stage", layout[1], t.zero_stage),
        )
        if old != new
    ]
    raise ValueError(
        f"run folder {run_dir} goes on from {resumed.name}, whose DeepSpeed optimizer state "
        f"was written by trainer.ranks={layout[0]} at trainer.zero_stage={layout[1]}, but "
        f"this run asks for {' and '.join(asked)}: rerun with trainer.ranks={layout[0]} "
        f"trainer.zero_stage={layout[1]}, or start a new run.name"
    )


def _open_run(cfg: RunConfig, run_dir: Path, tags: dict[str, str]) -> RunHandle:
    from agent_core import tracking

    model = cfg.model
    base = ensure_model_folder(model.path, model.source, model.tiny_hidden_size, model.tiny_layers)
    refuse_other_layout(cfg, run_dir)
    changed = changed_settings(run_dir / "config.yaml", cfg)
    if changed:
        log.warning(
            "run folder %s was started with other settings (%s); it goes on with the new ones "
            "(a new run.name starts afresh)",
            run_dir,
            "; ".join(changed),
        )
    atomic_write_bytes(run_dir / "config.yaml", dump_config(cfg).encode())
    run_id = tracking.start_or_resume_run(cfg.tracking, run_dir, cfg.run.name, flatten(cfg), tags)
    start = 1
    while _is_logged(run_dir, start):
        start += 1
    for problem in repair_iteration(run_dir, start):
        log.warning("redoing work of iteration %d: %s", start, problem)
    target = start - 1 + cfg.run.continue_for if cfg.run.continue_for else cfg.run.iterations
    first_weights = warmup_dir(run_dir) if cfg.warmup.enabled else base
    return RunHandle(
        run_dir=str(run_dir),
        mlflow_run_id=run_id,
        base_model=str(base.resolve()),
        start_weights=str(Path(first_weights).resolve()),
        start_iteration=start,
        iterations=target,
        repairs=repairs(run_dir),
    )


def iteration_tasks(cfg: RunConfig, iteration: int) -> list[Task]:
    """The task instances of an iteration: distinct training seeds drawn from the run seed."""
    return train_tasks(cfg, iteration, cfg.rollout.tasks_per_iteration)


def train_tasks(cfg: RunConfig, stream: int, count: int) -> list[Task]:
    """`count` distinct training-range tasks from seed stream `stream` (an iteration, or -1
    for warm-up demonstrations)."""
    rng = random.Random(cfg.run.seed * 1_000_003 + stream)
    env = cfg.env
    if env.tasks is not None:
        return sample_train_tasks(env.tasks, rng, count)
    seeds = rng.sample(
        range(env.train_seed_start, env.train_seed_start + env.train_seed_count),
        min(count, env.train_seed_count),
    )
    return make_tasks(env.name, seeds, env.task_options)


def make_loop(
    cfg: RunConfig,
    engine: runtime.Engine | None,
    seed: int,
    temperature: float | None = None,
    tokenizer=None,
) -> AgentEnvLoop | AgentFunctionLoop:
    """An episode loop over `engine` for the configured env, context and sampling (with no
    engine, only solver demonstrations can run; give the `tokenizer` then), or over the
    user's agent function when `env.agent` is set."""
    env = cfg.env
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature if temperature is None else temperature,
        top_p=cfg.rollout.top_p,
        stop_strings=env_class(env.name).stop_strings,
        seed=seed,
    )
    factory = partial(
        make_env,
        env.name,
        env.max_steps,
        env.few_shot,
        env.kwargs,
        env.context,
        env.tools,
        env.tool_options.model_dump(),
    )
    if env.agent is not None and engine is not None:
        return agent_function_loop(cfg, engine, factory, sampling)
    flow = AgentFlow(tokenizer if engine is None else engine.tokenizer, env.tool_prompt)
    return AgentEnvLoop(engine, flow, factory, sampling, cfg.rollout.max_prompt_tokens)


def _already_done(run: RunHandle, iteration: int, staged: Path, record: Path) -> bool:
    """A phase's output is complete: its staging file and record exist, or the iteration's
    partition is already committed (staging files are gone then; the record stays)."""
    if not record.is_file():
        return False
    return staged.is_file() or partition_info(run.run_dir, iteration) is not None


def run_shard(cfg: RunConfig, run: RunHandle, iteration: int, shard: int):
    """The shard's episodes with policy `iteration - 1` (deterministic for a seed): steps and
    rollout statistics. No files are written."""
    tasks = shard_tasks(iteration_tasks(cfg, iteration), shard, shard_count(cfg))
    version = iteration - 1
    engine = runtime.rollout_engine(cfg, Path(run.run_dir), version, policy_weights(run, version))
    loop = make_loop(cfg, engine, seed=cfg.run.seed * 7_919 + iteration * 104_729 + shard)
    meta = RolloutMeta(run.mlflow_run_id, iteration, version, cfg.env.name)
    return loop.run(tasks, cfg.rollout.group_size, meta)


def collect_shard(cfg: RunConfig, run: RunHandle, iteration: int, shard: int) -> ShardResult:
    """Run this shard's share of the iteration's episodes with policy `iteration - 1` and stage
    their steps as Arrow IPC."""
    start = time.perf_counter()
    folder = iteration_dir(run.run_dir, iteration) / "rollouts"
    out, meta_file = folder / f"shard_{shard:03d}.arrow", folder / f"shard_{shard:03d}.json"
    if _already_done(run, iteration, out, meta_file):
        return ShardResult.model_validate_json(meta_file.read_text())
    steps, stats = run_shard(cfg, run, iteration, shard)
    crash_point("collect", iteration)
    write_ipc(steps_to_table(steps), out)
    result = ShardResult(
        iteration=iteration,
        shard=shard,
        path=str(out),
        episodes=stats.episodes,
        steps=stats.steps,
        generate_calls=stats.generate_calls,
        generated_tokens=stats.generated_tokens,
        prompt_tokens=stats.prompt_tokens,
        generate_seconds=stats.generate_seconds,
        seconds=time.perf_counter() - start,
        pid=os.getpid(),
        episode_ends=stats.episode_ends,
        lost_episodes=stats.lost_episodes,
    )
    meta_file.write_text(result.model_dump_json())
    return result


def _critic_columns(
    cfg: RunConfig, run: RunHandle, iteration: int, steps: list[Step]
) -> tuple[list[float] | None, list[float] | None]:
    """Per-step values from the value head and per-step KL to the reference, when the config
    uses them (both come from the trainer holding policy `iteration - 1`)."""
    if not (cfg.trainer.value_head or cfg.algorithm.kl_coef > 0):
        return None, None
    version = iteration - 1
    trainer = runtime.policy_trainer(
        cfg, Path(run.run_dir), version, policy_weights(run, version), policy_weights(run, 0)
    )
    rows = [TrainRow(s.prompt_ids, s.response_ids, s.response_logprobs, 0.0) for s in steps]
    values = trainer.step_values(rows) if cfg.trainer.value_head else None
    kl = trainer.reference_kl(rows) if cfg.algorithm.kl_coef > 0 else None
    return values, kl


def _estimate(
    cfg: RunConfig, steps: list[Step], values: list[float] | None, kl: list[float] | None
) -> dict[str, float]:
    """Fill `return_`, `advantage` (and `value`) of every step; return diagnostics."""
    arrays = StepArrays.from_columns(
        [s.group_id for s in steps],
        [s.trajectory_id for s in steps],
        [s.step_index for s in steps],
        [s.reward for s in steps],
        value=values,
        anchor=[s.anchor_key for s in steps],
        done=[s.done for s in steps],
        truncated=[s.truncated for s in steps],
        kl=kl,
    )
    algo = cfg.algorithm
    options = AdvantageOptions(
        gamma=algo.gamma,
        norm_by_std=algo.norm_by_std,
        batch_std=algo.batch_std,
        epsilon=algo.epsilon,
        lam=algo.lam,
        kl_coef=algo.kl_coef,
        whiten_advantages=algo.whiten_advantages,
        step_advantage_weight=algo.step_advantage_weight,
        gigpo_episode_return=algo.gigpo_episode_return,
    )
    result = resolve("estimator", algo.estimator, ESTIMATORS)(arrays, options)
    for i, (step, ret, adv) in enumerate(
        zip(steps, result.returns, result.advantages, strict=True)
    ):
        step.return_, step.advantage = float(ret), float(adv)
        step.value = values[i] if values is not None else None
    adv = np.asarray(result.advantages)
    metrics = {
        "advantage/mean": float(adv.mean()) if adv.size else 0.0,
        "advantage/abs_mean": float(np.abs(adv).mean()) if adv.size else 0.0,
        "advantage/zero_share": float(np.mean(adv == 0.0)) if adv.size else 0.0,
        "advantage/zero_variance_group_share": result.zero_variance_groups / max(1, result.groups),
    }
    if values is not None:
        metrics["critic/value_mean"] = float(np.mean(values)) if values else 0.0
    if kl is not None:
        metrics["reward/kl_to_reference"] = float(np.mean(kl)) if kl else 0.0
    return metrics


def _episode_metrics(steps: list[Step]) -> dict[str, float]:
    trajectories = list(group_trajectories(steps).values())
    n = max(1, len(trajectories))
    totals = [sum(s.reward for s in t) for t in trajectories]
    return {
        "reward/mean": float(np.mean(totals)) if totals else 0.0,
        "reward/std": float(np.std(totals)) if totals else 0.0,
        "success_rate": sum(t[-1].success for t in trajectories) / n,
        "episode/steps_mean": len(steps) / n,
        "episode/truncated_share": sum(t[-1].truncated for t in trajectories) / n,
        "episode/tool_calls_ok_mean": sum(t[-1].info.get("tool_calls_ok", 0) for t in trajectories)
        / n,
        "episode/response_tokens_mean": float(np.mean([len(s.response_ids) for s in steps]))
        if steps
        else 0.0,
    } | role_metrics(trajectories)


def _update_diagnostics(cfg: RunConfig, steps: list[Step]) -> dict[str, float]:
    """How the coming update leans (`advantage_diagnostics`), over the rows it will train on."""
    success = {tid: t[-1].success for tid, t in group_trajectories(steps).items()}
    skip_zero = _skips_zero_advantage(cfg)
    trained = [s for s in steps if s.response_ids and not (skip_zero and s.advantage == 0.0)]
    return advantage_diagnostics(
        np.array([s.advantage for s in trained]),
        np.array([len(s.response_ids) for s in trained]),
        np.array([s.trajectory_id for s in trained]),
        np.array([not success[s.trajectory_id] for s in trained], dtype=bool),
        cfg.trainer.loss_agg_mode,
    )


def _reward_falling(run_dir: Path, iteration: int, reward: float, limit: int) -> int:
    """How many iterations in a row reward/mean fell up to `iteration` (at most `limit`),
    from the earlier iterations' score records."""
    history = [reward]
    for k in range(iteration - 1, max(0, iteration - limit - 1), -1):
        record = iteration_dir(run_dir, k) / "scored.json"
        if not record.is_file():
            break
        earlier = ScoreResult.model_validate_json(record.read_text()).metrics
        history.insert(0, earlier["reward/mean"])
    return falling_streak(history)


def _warn(cfg: RunConfig, run_dir: Path, iteration: int, metrics: dict) -> dict[str, float]:
    """Log the iteration's warnings (`update_warnings`); returns the metrics they add."""
    t = cfg.tracking
    falling = _reward_falling(run_dir, iteration, metrics["reward/mean"], t.warn_reward_falling)
    added = {"warning/reward_falling_iterations": float(falling)}
    warnings = update_warnings(
        metrics | added, t.warn_advantage_bias, t.warn_reward_falling, cfg.trainer.loss_agg_mode
    )
    for warning in warnings:
        log.warning("iteration %d: %s", iteration, warning)
    return added | {"warning/count": float(len(warnings))}


def score_in_place(cfg: RunConfig, run: RunHandle, iteration: int, steps: list[Step]) -> dict:
    """Rewards, returns and advantages written into `steps`; returns the iteration's metrics."""
    tasks = {t.task_id: t for t in iteration_tasks(cfg, iteration)}
    version = iteration - 1  # the policy that played the episodes judges them as 'policy'
    engines = judge_engines(
        cfg,
        lambda: runtime.rollout_engine(
            cfg, Path(run.run_dir), version, policy_weights(run, version)
        ),
    )
    seed = cfg.run.seed + iteration  # judge sampling (matters only at temperature > 0)
    metrics = score_steps(
        steps, tasks, configured_terms(cfg), cfg.reward.env_reward_weight, engines, seed
    )
    metrics |= _estimate(cfg, steps, *_critic_columns(cfg, run, iteration, steps))
    return metrics | _episode_metrics(steps) | _update_diagnostics(cfg, steps)


def score(cfg: RunConfig, run: RunHandle, iteration: int, shards: list[ShardResult]) -> ScoreResult:
    """Apply reward functions and the advantage estimator to the staged steps."""
    start = time.perf_counter()
    folder = iteration_dir(run.run_dir, iteration)
    out, meta_file = folder / "scored.arrow", folder / "scored.json"
    if _already_done(run, iteration, out, meta_file):
        return ScoreResult.model_validate_json(meta_file.read_text())
    ends = [(s.episodes, s.episode_ends, s.lost_episodes) for s in shards]
    check_failed_share(ends, cfg.env.agent_max_failed_share, iteration)  # before any training
    steps = table_to_steps(pa.concat_tables([read_ipc(Path(s.path)) for s in shards]))
    metrics = score_in_place(cfg, run, iteration, steps) | episode_metrics(ends)
    metrics |= _warn(cfg, Path(run.run_dir), iteration, metrics)
    crash_point("score", iteration)
    write_ipc(steps_to_table(steps), out)
    result = ScoreResult(
        iteration=iteration,
        path=str(out),
        steps=len(steps),
        trajectories=len({s.trajectory_id for s in steps}),
        metrics=metrics,
        seconds=time.perf_counter() - start,
    )
    meta_file.write_text(result.model_dump_json())
    return result


def commit(cfg: RunConfig, run: RunHandle, iteration: int, scored: ScoreResult) -> PartitionResult:
    """Commit the scored steps as the iteration's replay partition, refused when their groups
    and trajectories are not what the estimator assumed; drop the staging files."""
    start = time.perf_counter()
    info = partition_info(run.run_dir, iteration)
    if info is None:
        table = read_ipc(Path(scored.path))
        # an agent function's episode that made no call (for a role) leaves no rows
        partial = cfg.env.agent is not None
        info = commit_partition(run.run_dir, iteration, table, cfg.rollout.group_size, partial)
    folder = iteration_dir(run.run_dir, iteration)
    # staged tables go; their small records stay so reruns know the phases are done
    for staged in [*folder.glob("rollouts/*.arrow"), Path(scored.path)]:
        remove_staged(staged)
    return PartitionResult(
        iteration=iteration,
        path=info.path,
        rows=info.rows,
        sha256=info.sha256,
        seconds=time.perf_counter() - start,
    )


def _skips_zero_advantage(cfg: RunConfig) -> bool:
    """Whether the update leaves out rows of exactly zero advantage: they carry no policy
    gradient, and nothing else (value, KL, entropy) needs them."""
    t = cfg.trainer
    others_need_all = t.value_head or t.kl_loss_coef > 0 or t.entropy_coef > 0
    return t.skip_zero_advantage and not others_need_all


def train_rows(table: pa.Table, cfg: RunConfig) -> list[TrainRow]:
    """Step rows as trainer inputs. Rows with an exactly-zero advantage carry no policy
    gradient and are left out when nothing else (value, KL, entropy) needs them."""
    skip_zero = _skips_zero_advantage(cfg)
    names = ["prompt_ids", "response_ids", "response_logprobs", "advantage", "return", "value",
             "trajectory_id", "step_index"]  # fmt: skip
    cols = table.select(names).to_pydict()
    rows = []
    for p, r, lp, adv, ret, value, traj, k in zip(*(cols[n] for n in names), strict=True):
        if r and not (skip_zero and adv == 0.0):
            rows.append(TrainRow(p, r, lp, adv, ret, value or 0.0, traj, k))
    return rows


def _reward_after_update(
    table: pa.Table, rows: list[TrainRow], log_ratios: list[float]
) -> dict[str, float]:
    """The trained trajectories' sampled mean reward and the importance estimate of the updated
    policy's (`reward_after_update_estimate`), from each row's log-prob ratio new/old."""
    cols = table.select(["trajectory_id", "reward"]).to_pydict()
    reward: dict[str, float] = {}
    for tid, r in zip(cols["trajectory_id"], cols["reward"], strict=True):
        reward[tid] = reward.get(tid, 0.0) + float(r)
    ratio: dict[str, float] = {}
    for row, lr in zip(rows, log_ratios, strict=True):
        ratio[row.trajectory_id] = ratio.get(row.trajectory_id, 0.0) + lr
    before = np.array([reward[tid] for tid in ratio])
    after, ess = reward_after_update_estimate(np.array(list(ratio.values())), before)
    return {
        "reward_before_update": float(before.mean()) if before.size else 0.0,
        "reward_after_update_estimate": after,
        "reward_estimate_ess_share": ess,
    }


def _write_latest(run_dir: Path, iteration: int) -> None:
    pointer = run_dir / CHECKPOINTS / LATEST
    tmp = pointer.with_name(LATEST + ".tmp")
    tmp.write_text(f"iter_{iteration:04d}\n")
    tmp.replace(pointer)


def _prune_checkpoints(run_dir: Path, keep: int) -> None:
    folders = sorted((run_dir / CHECKPOINTS).glob("iter_[0-9][0-9][0-9][0-9]"))
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def update(
    cfg: RunConfig, run: RunHandle, iteration: int, partition: PartitionResult
) -> UpdateResult:
    """Train policy `iteration - 1` on the iteration's steps, save checkpoint `iteration`."""
    start = time.perf_counter()
    run_dir = Path(run.run_dir)
    ckpt = checkpoint_dir(run_dir, iteration)
    record = iteration_dir(run_dir, iteration) / "update.json"
    if ckpt.is_dir() and record.is_file():
        return UpdateResult.model_validate_json(record.read_text())
    version = iteration - 1
    trainer = runtime.policy_trainer(
        cfg, run_dir, version, policy_weights(run, version), policy_weights(run, 0)
    )
    table = read_partition(run_dir, iteration)
    rows = train_rows(table, cfg)
    metrics = metrics_dict(trainer.update(rows, iteration))
    if cfg.trainer.estimate_reward_after_update:
        metrics |= _reward_after_update(table, rows, trainer.log_ratios(rows))
    crash_point("update", iteration)
    saving = time.perf_counter()
    trainer.save(
        ckpt,
        {"iteration": iteration, "policy_version": iteration, "metrics": metrics},
        on_half_written=lambda: crash_point("checkpoint", iteration),
    )
    metrics["checkpoint_seconds"] = time.perf_counter() - saving
    result = UpdateResult(
        iteration=iteration,
        policy_version=iteration,
        checkpoint=str(ckpt),
        metrics=metrics,
        seconds=time.perf_counter() - start,
    )
    # record first, prune last: a crash in between retrains from a checkpoint that still exists
    record.write_text(result.model_dump_json())
    _write_latest(run_dir, iteration)
    runtime.mark_trained(run_dir, iteration)
    _prune_checkpoints(run_dir, cfg.trainer.keep_checkpoints)
    runtime.return_free_memory()
    return result


def finish_run(cfg: RunConfig, run: RunHandle, status: str = "FINISHED") -> None:
    """End the MLflow run, free the run's live engine and trainer, unlock the run folder."""
    from agent_core import tracking

    try:
        tracking.end_run(cfg.tracking, run.mlflow_run_id, status)
    finally:
        runtime.release(Path(run.run_dir))
        run_lock.release(Path(run.run_dir))
