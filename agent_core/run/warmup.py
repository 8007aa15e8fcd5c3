"""Supervised cold start: fine-tune the base model on demonstrations before RL.

Demonstrations are episodes played by the env's own solver through the same loop, prompt
construction and tokenization as RL rollouts (or steps read from a Parquet/JSONL file); the
result is checkpoint `checkpoints/warmup`, policy version 0 of the run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import polars as pl
from PIL import Image
from pydantic import BaseModel, Field

from agent_core import live
from agent_core.collect.iteration_tasks import train_tasks
from agent_core.collect.loops import make_loop
from agent_core.core.files import atomic_write_text
from agent_core.core.images import ImageBag
from agent_core.core.metrics import metric_key
from agent_core.core.records import Step, Task
from agent_core.core.results import RunHandle
from agent_core.core.run_folder import WARMUP_RECORD, warmup_dir
from agent_core.envs import env_class
from agent_core.models import load_processor
from agent_core.replay.store import read_step_file, reading
from agent_core.rewards.scoring import group_trajectories
from agent_core.rollout.loop import RolloutMeta, RolloutStats
from agent_core.run import trainers, vision_align
from agent_core.run.evaluate import eval_tasks
from agent_core.trainer.batching import TrainRow
from agent_core.trainer.update_metrics import metrics_dict
from agent_core.workers.trainer_group import TrainerGroup
from configs.run_config import RunConfig

log = logging.getLogger(__name__)
WARMUP_STREAM = -1  # seed stream of demonstration tasks, apart from every iteration's


class WarmupResult(BaseModel):
    """The warm-up checkpoint and what went into it."""

    checkpoint: str
    episodes: int
    rows: int
    demo_success_rate: float
    metrics: dict[str, float]
    seconds: float
    heldout: dict[str, float] = Field(
        default_factory=dict,
        description="How the policy plays the solver's held-out episodes before and after the "
        "warm-up (`demonstration_fit`; keys ending _base are the base model's); empty when "
        "warmup.heldout_episodes is 0, the source is a file or no held-out episode was kept.",
    )

    alignment: dict[str, float] = Field(
        default_factory=dict,
        description="The alignment stage's figures (`vision_align.align`: caption rows, "
        "optimizer steps, held-out caption-token probability before and after, seconds); "
        "empty when warmup.align_tasks is 0.",
    )

    def console_lines(self) -> list[str]:
        """The lines the train flow prints after the warm-up (`align_lines` of `alignment`,
        `fit_lines` of `heldout`)."""
        return align_lines(self.alignment) + fit_lines(self.heldout)


def solver_episodes(
    cfg: RunConfig, tokenizer, tasks: list[Task], label: str
) -> tuple[list[list[Step]], list[list[Step]], RolloutStats, dict[str, Image.Image]]:
    """The env's solver played once on each of `tasks`: every trajectory, the ones its
    `keep_demonstration` keeps, the loop's stats, and the images their prompts show (by
    content hash; a VLM's prompts are rendered with the model folder's processor)."""
    shown = ImageBag()
    processor = load_processor(cfg.model.path)
    loop = make_loop(
        cfg, None, seed=cfg.run.seed, tokenizer=tokenizer, processor=processor, images=shown
    )
    steps, stats = loop.run(tasks, 1, RolloutMeta(label, 0, 0, cfg.env.name), solver=True)
    trajectories = list(group_trajectories(steps).values())
    good = [t for t in trajectories if env_class(cfg.env.name).keep_demonstration(t)]
    return trajectories, good, stats, shown.images


def demonstration_row(
    step: Step, images: Mapping[str, Image.Image] | None = None, adapter: str | None = None
) -> TrainRow:
    """A demonstration step as a training row (a solver's step records log-probs 0, so
    `log_ratios` of the row is the policy's log-probability of the reply), with the images
    its prompt shows (`images`: by content hash); a team's row trains its role's `adapter`."""
    return TrainRow(
        step.prompt_ids,
        step.response_ids,
        step.response_logprobs,
        0.0,
        0.0,
        0.0,
        step.trajectory_id,
        step.step_index,
        images=tuple((images or {})[sha] for sha in step.image_hashes),
        role=step.role,
        adapter=adapter,
    )


def imitated(cfg: RunConfig, trajectory: list[Step], images) -> list[TrainRow]:
    """A kept solver episode's rows, but the steps the env marks not to be imitated
    (`info["imitate"]` False: a deliberate mistake the solver played so that others react
    to it, as a team env's demonstrations do)."""
    return [
        demonstration_row(s, images, cfg.env.adapter_of(s.role))
        for s in trajectory
        if s.info.get("imitate", True)
    ]


def solver_rows(cfg: RunConfig, tokenizer) -> tuple[list[TrainRow], int, float]:
    """Demonstration steps from the env's solver on training seeds (the episodes its
    `keep_demonstration` keeps: by default the successful ones). Returns rows, episodes
    played and the solver's success rate; raises, saying how the episodes ended, when none
    was kept."""
    tasks = train_tasks(cfg, WARMUP_STREAM, cfg.warmup.tasks)
    trajectories, good, stats, images = solver_episodes(cfg, tokenizer, tasks, "warmup")
    rows = [row for t in good for row in imitated(cfg, t, images)]
    success = sum(t[-1].success for t in trajectories) / max(1, len(trajectories))
    if not rows:
        raise RuntimeError(no_demonstration(cfg, trajectories, success))
    warn_long_replies(rows, cfg.rollout.max_new_tokens)
    return rows, stats.episodes, success


def heldout_episodes(cfg: RunConfig, tokenizer) -> list[list[TrainRow]]:
    """The solver's kept demonstrations on the first `warmup.heldout_episodes` held-out tasks
    (the eval tasks, never trained on), one list of rows per episode."""
    tasks = eval_tasks(cfg)[: cfg.warmup.heldout_episodes]
    _, good, _, images = solver_episodes(cfg, tokenizer, tasks, "warmup-heldout")
    return [imitated(cfg, t, images) for t in good]


def demonstration_fit(logprobs: list[list[float]]) -> dict[str, float]:
    """How a policy plays the solver's held-out episodes, from each episode's per-reply
    log-probabilities under it: the mean probability that it samples the solver's reply at a
    step (its exact tokens, at rollout.temperature), the mean probability that it samples a
    whole solver episode (the product over the episode's steps: the per-step figure
    compounds over the horizon), and the episodes' mean length."""
    replies = [math.exp(lp) for episode in logprobs for lp in episode]
    episodes = [math.exp(sum(episode)) for episode in logprobs]
    return {
        "reply_prob": sum(replies) / max(1, len(replies)),
        "episode_prob": sum(episodes) / max(1, len(episodes)),
        "steps": len(replies) / max(1, len(episodes)),
    }


def heldout_fit(trainer, episodes: list[list[TrainRow]]) -> dict[str, float]:
    """`demonstration_fit` of the trainer's current policy on held-out solver episodes (one
    no-grad forward over their rows)."""
    flat = [row for episode in episodes for row in episode]
    logprobs = iter(trainer.log_ratios(flat))
    return demonstration_fit([[next(logprobs) for _ in episode] for episode in episodes])


def episode_end(last: Step) -> str:
    """How an episode ended, from its last step: the env's or the loop's `info["end"]`."""
    if "end" in last.info:
        return str(last.info["end"])
    return "env_error" if "env_error" in last.info else "unset"


def no_demonstration(cfg: RunConfig, trajectories: list[list[Step]], success: float) -> str:
    """Why the solver's episodes left no demonstration: how they ended (`info["end"]`), the
    solver's success rate, and the likely fixes."""
    ends = Counter(episode_end(t[-1]) for t in trajectories)
    fixes = []
    if ends["max_prompt_tokens"]:
        fixes.append(
            f"raise rollout.max_prompt_tokens (now {cfg.rollout.max_prompt_tokens}; or keep less "
            "history with env.context): the prompt outgrew it before the solver finished"
        )
    if ends["max_steps"]:
        fixes.append(f"raise env.max_steps (now {cfg.env.max_steps}): the solver ran out of turns")
    if ends["env_error"]:
        fixes.append("the env raised in its step (the log shows the traceback): fix the env")
    if not trajectories:
        fixes.append("no training task was drawn: check the training rows of env.tasks")
    elif not fixes:
        fixes.append(
            "no solver episode succeeded (info['success'] on its last step): check solve_step "
            "against the env's success test"
            if success == 0.0
            else "the env's keep_demonstration refused its successful episodes too: check it"
        )
    listed = ", ".join(f"{end} {n}" for end, n in ends.most_common()) or "none"
    return (
        f"warm-up has no demonstration to learn from: the env's keep_demonstration kept none "
        f"of {len(trajectories)} solver episodes (solver success rate {success:.2f}; episodes "
        f"ended: {listed}). Likely fix: {'; '.join(fixes)}"
    )


def reply_lengths(rows: list[TrainRow], max_new_tokens: int) -> dict[str, float]:
    """Warm-up metrics of the demonstrations' reply lengths: the longest, and how many are
    longer than `rollout.max_new_tokens` (RL samples are cut there; demonstrations are not)."""
    lengths = [len(r.response_ids) for r in rows]
    return {
        metric_key("warmup/reply_tokens_max"): float(max(lengths, default=0)),
        metric_key("warmup/replies_over_max_new_tokens"): float(
            sum(n > max_new_tokens for n in lengths)
        ),
    }


def warn_long_replies(rows: list[TrainRow], max_new_tokens: int) -> None:
    """Warn when demonstrations are longer than RL may sample: the warm-up would teach
    replies (a tool call with its JSON) that RL samples are cut short of."""
    lengths = reply_lengths(rows, max_new_tokens)
    over = int(lengths["warmup/replies_over_max_new_tokens"])
    if over:
        longest = int(lengths["warmup/reply_tokens_max"])
        log.warning(
            "%d of %d warm-up demonstration replies are longer than rollout.max_new_tokens=%d "
            "(the longest: %d tokens): the warm-up trains on them whole, but RL cuts its samples "
            "there, short of what the warm-up taught; raise rollout.max_new_tokens to at least %d",
            over,
            len(rows),
            max_new_tokens,
            longest,
            longest,
        )


def file_rows(path: str) -> tuple[list[TrainRow], int, float]:
    """Demonstration steps from a Parquet/JSONL file with prompt_ids and response_ids columns
    (steprl's step schema works as is; rows whose `success` is false are skipped)."""
    if path.endswith(".parquet"):  # a committed partition is checked against its manifest
        frame = pl.from_arrow(read_step_file(path))
    else:
        with reading(Path(path)):
            frame = pl.read_ndjson(path)
    missing = {"prompt_ids", "response_ids"} - set(frame.columns)
    if missing:
        raise ValueError(f"warmup.path={path!r} lacks columns {sorted(missing)}")
    if "success" in frame.columns and "trajectory_id" in frame.columns:
        good = frame.filter(pl.col("success").any().over("trajectory_id"))
    else:
        good = frame
    rows = [
        TrainRow(
            list(r["prompt_ids"]),
            list(r["response_ids"]),
            [0.0] * len(r["response_ids"]),
            0.0,
            trajectory_id=str(r.get("trajectory_id", i)),
            step_index=int(r.get("step_index", 0)),
        )
        for i, r in enumerate(good.iter_rows(named=True))
        if r["response_ids"]
    ]
    if not rows:
        raise RuntimeError(
            f"warm-up has no demonstration to learn from: none of the {frame.height} rows of "
            f"warmup.path={path!r} is a reply (response_ids) of a successful trajectory"
        )
    return rows, good.height, good.height / max(1, frame.height)


def warmup_rows(cfg: RunConfig, tokenizer) -> tuple[list[TrainRow], int, float]:
    """The warm-up's demonstrations as `warmup.source` names them (`solver_rows` or
    `file_rows`): the same rows each call, which trainer.demonstration_loss_coef trains on in
    every RL update too."""
    if cfg.warmup.source == "solver":
        return solver_rows(cfg, tokenizer)
    return file_rows(cfg.warmup.path or "")


def align_lines(aligned: dict[str, float]) -> list[str]:
    """The console's line on the alignment stage (none when it did not run)."""
    if not aligned:
        return []
    line = (
        f"alignment: the projector learnt {aligned['rows']:.0f} image captions in "
        f"{aligned['optimizer_steps']:.0f} steps ({aligned['seconds']:.0f} s)"
    )
    if "caption_token_prob" in aligned:
        after, before = aligned["caption_token_prob"], aligned["caption_token_prob_base"]
        line += (
            f"; on held-out boards the policy gives each caption token probability "
            f"{after:.3f} (before: {before:.3f})"
        )
    return [line]


def fit_lines(fit: dict[str, float]) -> list[str]:
    """The console's lines on the held-out solver episodes (none without them), and a
    warning when the warm-up made the solver's held-out replies less likely than the base
    model had them: it learnt something that does not carry over to tasks it did not see."""
    if not fit:
        return []
    lines = [
        f"warm-up on {fit['episodes']:.0f} held-out solver episodes of {fit['steps']:.1f} "
        f"steps: the policy samples the solver's reply with probability "
        f"{fit['reply_prob']:.3f} per step (base model {fit['reply_prob_base']:.3f}) and a "
        f"whole solver episode with {fit['episode_prob']:.3f} (base "
        f"{fit['episode_prob_base']:.3f})"
    ]
    if fit["reply_prob"] < fit["reply_prob_base"]:
        lines.append(
            "  warning: the warm-up made the solver's held-out replies less likely than the "
            "base model had them: it fits its demonstrations without carrying them over to "
            "unseen tasks; give it more warmup.tasks, fewer warmup.epochs or a lower "
            "warmup.learning_rate"
        )
    return lines


def _warmup_config(cfg: RunConfig) -> RunConfig:
    """`cfg` for the warm-up's trainer: its checkpoint keeps the DeepSpeed (optimizer) state
    only with `warmup.keep_optimizer_state`; without it RL's first trainer, built from the
    checkpoint, starts with fresh AdamW moments (and so does a rerun that resumes from it)."""
    keep = cfg.trainer.save_deepspeed_state and cfg.warmup.keep_optimizer_state
    trainer = cfg.trainer.model_copy(update={"save_deepspeed_state": keep})
    return cfg.model_copy(update={"trainer": trainer})


def warmup(cfg: RunConfig, run: RunHandle) -> WarmupResult:
    """Fine-tune the base model on demonstrations and save checkpoint `warmup` (once: a rerun
    returns the stored result)."""
    run_dir = Path(run.run_dir)
    ckpt, record = warmup_dir(run_dir), run_dir / WARMUP_RECORD
    if ckpt.is_dir() and record.is_file():
        return WarmupResult.model_validate_json(record.read_text())
    start = time.perf_counter()
    live.release(run_dir)  # nothing cached may hold weights older than the warm-up
    trainer = trainers.build_trainer(_warmup_config(cfg), Path(run.base_model), None)
    heldout, fit = [], {}
    rows, episodes, success = warmup_rows(cfg, trainer.tokenizer)
    if cfg.warmup.source == "solver" and cfg.warmup.heldout_episodes:
        heldout = heldout_episodes(cfg, trainer.tokenizer)
    if heldout:
        fit = {f"{k}_base": v for k, v in heldout_fit(trainer, heldout).items() if k != "steps"}
    aligned = vision_align.align(cfg, trainer)  # a VLM's projector first (align_tasks > 0)
    metrics = metrics_dict(trainer.sft_update(rows, cfg.warmup.epochs, cfg.warmup.learning_rate))
    if heldout:
        fit |= heldout_fit(trainer, heldout) | {"episodes": float(len(heldout))}
    trainer.save(ckpt, {"iteration": 0, "policy_version": 0, "warmup": True, "metrics": metrics})
    if isinstance(trainer, TrainerGroup):
        trainer.stop()  # the RL update starts its ranks from this checkpoint
    del trainer  # RL builds its own from the checkpoint: this one's memory goes back now
    live.return_free_memory()
    result = WarmupResult(
        checkpoint=str(ckpt),
        episodes=episodes,
        rows=len(rows),
        demo_success_rate=success,
        metrics=metrics,
        seconds=time.perf_counter() - start,
        heldout=fit,
        alignment=aligned,
    )
    from agent_core import tracking

    logged = {metric_key("warmup/<name>", name=k): v for k, v in metrics.items() if k != "seconds"}
    logged[metric_key("warmup/demo_success_rate")] = success
    logged[metric_key("timing_s/warmup")] = result.seconds
    logged |= reply_lengths(rows, cfg.rollout.max_new_tokens)
    logged |= {metric_key("warmup/heldout_<fit>", fit=k): v for k, v in fit.items()}
    logged |= {metric_key("warmup/align_<name>", name=k): v for k, v in aligned.items()}
    tracking.log_metrics(cfg.tracking, run.mlflow_run_id, 0, logged)
    atomic_write_text(record, json.dumps(result.model_dump(), indent=2))
    return result
