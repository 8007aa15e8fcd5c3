"""Every metric steprl logs to MLflow, declared once: its name (or a name pattern whose `<part>`s
a run fills in, such as `reward/<term>`), what it means and its unit. The code that writes a
metric takes its key from `metric_key`, which refuses a name declared nowhere; docs/metrics.md is
generated from this table (`python -m agent_core.core.metrics_doc --write`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

SHARE = "share (0-1)"
FLAG = "0 or 1"


@dataclass(frozen=True)
class Metric:
    """One logged metric, or a family of them when `name` holds `<part>`s."""

    name: str
    unit: str
    meaning: str

    @property
    def is_pattern(self) -> bool:
        """Whether `name` stands for many keys (it holds a `<part>`)."""
        return "<" in self.name


def _m(name: str, unit: str, meaning: str) -> Metric:
    return Metric(name, unit, meaning)


# The families, in the order docs/metrics.md shows them: (prefix, what its metrics describe).
FAMILIES: tuple[tuple[str, str], ...] = (
    ("reward", "the iteration's episodes as scored, at step k (the iteration)"),
    ("success_rate", "the iteration's episodes, at step k"),
    ("episode", "the iteration's episodes, at step k"),
    (
        "role",
        "a team's roles (a team env's, or an agent's calls naming `model=policy:<role>`): its "
        "episodes and, for the update's rows, its KL, entropy and adapter, at step k",
    ),
    ("advantage", "the advantages the estimator gave the iteration's rows, at step k"),
    ("loss_weight", "how the coming update's loss weighs the rows, at step k"),
    ("critic", "the value head (algorithm.estimator=gae), at step k"),
    ("rollout", "collection of the iteration's episodes, at step k"),
    ("throughput", "the iteration's speed, at step k"),
    ("actor", "the iteration's policy update (RL), at step k"),
    ("refill", "dynamic sampling (refill.drop set), at step k"),
    ("warning", "the iteration's health checks (their text is in the console), at step k"),
    ("timing_s", "wall-clock seconds of the iteration's phases, at step k"),
    ("warmup", "the cold start's supervised fine-tuning (warmup.enabled), at step 0"),
    (
        "eval",
        "held-out evaluation: of policy k in training (eval.every), at step k; of a "
        "checkpoint by `steprl eval`, in an MLflow run of its own",
    ),
    ("eval_base", "held-out evaluation of the base model before the warm-up, at step 0"),
)

_ACTOR = (
    _m("actor/policy_loss", "loss", "The RL loss (policy term, entropy bonus, KL and value "
       "terms), mean over the update's optimizer steps."),
    _m("actor/grad_norm", "L2 norm", "Gradient norm before clipping, mean over optimizer steps."),
    _m("actor/clip_fraction", SHARE, "Response tokens whose importance ratio the clip cut, mean "
       "over micro-batches."),
    _m("actor/dual_clip_fraction", SHARE, "Tokens of negative advantage the dual clip "
       "(trainer.clip_ratio_c) capped, mean over micro-batches."),
    _m("actor/approx_kl", "nats/token", "0.5 (log ratio)^2 to the policy that sampled (or the "
       "proximal one), mean over micro-batches: how far the update moved the policy."),
    _m("actor/ratio_mean", "ratio", "Mean importance ratio pi / pi_old over response tokens."),
    _m("actor/entropy", "nats/token", "Mean entropy of the policy's next-token distribution "
       "over response tokens (at the rollout temperature)."),
    _m("actor/kl_ref", "nats/token", "The KL estimate to the reference model "
       "(trainer.kl_loss_coef > 0), mean over micro-batches; 0 without."),
    _m("actor/value_loss", "loss", "Clipped value loss per step row (value head); 0 without."),
    _m("actor/value_clip_fraction", SHARE, "Values whose clipped error was the larger one."),
    _m("actor/optimizer_steps", "steps", "Optimizer steps the update took."),
    _m("actor/skipped_steps", "steps", "Optimizer steps skipped for a non-finite loss or "
       "gradient (never written into a checkpoint)."),
    _m("actor/lr", "learning rate", "Mean learning rate of the update's steps (below "
       "trainer.learning_rate while trainer.lr_warmup_steps ramps it up)."),
    _m("actor/early_stopped", FLAG, "1 when trainer.target_kl stopped the update early."),
    _m("actor/early_stop_kl", "nats/token", "The approx_kl of the mini-batch that passed "
       "trainer.target_kl (0 when the update ran to the end)."),
    _m("actor/nonfinite_losses", "micro-batches", "Micro-batches whose loss was not finite "
       "(they added no gradient)."),
    _m("actor/demonstration_nll", "nats/token", "trainer.demonstration_loss_coef: the "
       "demonstration replies' mean NLL (T = 1), measured before each step; 0 when off."),
    _m("actor/demonstration_rows", "rows", "Demonstration rows the update trained on."),
    _m("actor/rows", "rows", "Step rows the update trained on (replayed rows included)."),
    _m("actor/sequences", "sequences", "Sequences after packing (a packed trajectory is one)."),
    _m("actor/packed_trajectories", "trajectories", "Trajectories packed into one sequence "
       "(trainer.pack_trajectories)."),
    _m("actor/trained_tokens", "tokens", "Response tokens the loss was computed on."),
    _m("actor/padded_tokens", "tokens", "Positions the forwards processed, padding or prefix "
       "tree included."),
    _m("actor/bf16_autocast", FLAG, "1 when the update ran in bf16 autocast, 0 in fp32."),
    _m("actor/rollout_logprob_diff_mean", "nats/token", "trainer.old_logprobs=recompute: mean "
       "|rollout log-prob - the trainer's recomputed one|; 0 when not recomputed."),
    _m("actor/rollout_logprob_diff_max", "nats", "The largest such gap of one token."),
    _m("actor/off_policy_ratio_mean", "ratio", "Recomputed: mean over tokens of rho = "
       "pi_proximal / pi_behaviour."),
    _m("actor/off_policy_ratio_max", "ratio", "Recomputed: the largest rho."),
    _m("actor/off_policy_ratio_min", "ratio", "Recomputed: the smallest rho."),
    _m("actor/off_policy_weight_mean", "weight", "Mean weight trainer.off_policy_correction "
       "put on a token's loss (1 with none, 0 = masked)."),
    _m("actor/off_policy_truncated_share", SHARE, "Tokens whose weight tis truncated."),
    _m("actor/off_policy_masked_share", SHARE, "Tokens mis masked."),
    _m("actor/off_policy_kl", "nats/token", "k1 estimate of KL(behaviour || proximal)."),
    _m("actor/reward_before_update", "reward", "trainer.estimate_reward_after_update: the "
       "trained trajectories' mean sampled reward."),
    _m("actor/reward_after_update_estimate", "reward", "Self-normalised importance estimate of "
       "the updated policy's mean reward on those trajectories (it cannot see outcomes the old "
       "policy never reached)."),
    _m("actor/reward_estimate_ess_share", SHARE, "Effective sample share of that estimate."),
    _m("actor/replay_rows", "rows", "replay: past rows replayed in this update."),
    _m("actor/replay_age_mean", "policy versions", "replay: mean age of the replayed rows."),
    _m("actor/replay_age_max", "policy versions", "replay: the oldest replayed row's age."),
    _m("actor/replay_eligible_rows", "rows", "replay: past rows the draw chose from."),
    _m("actor/replay_dropped_for_age", "rows", "replay: past rows too old to be drawn."),
    _m("actor/async/staleness_mean", "policy versions", "Mean staleness of the partition's rows "
       "(iteration - 1 - the policy version that sampled them)."),
    _m("actor/async/staleness_max", "policy versions", "The stalest row's staleness."),
    _m("actor/async/staleness_share_<age>", SHARE, "Rows of that staleness (0, 1, ...)."),
    _m("actor/async/dropped_stale_rows", "rows", "Rows older than overlap.max_staleness, "
       "left out of the update."),
    _m("actor/async/mixed_version_trajectories", "trajectories", "Trajectories sampled by two "
       "policy versions or more (partial rollouts)."),
    _m("actor/async/mixed_version_share", SHARE, "Their share of the trajectories."),
)  # fmt: skip
# what became of each task the iteration drew (`agent_core.replay.staleness`)
_TASK_OUTCOMES = {
    "trained": "at least one of its rows was in the update",
    "stale": "its rows with a policy gradient were all older than overlap.max_staleness",
    "zero_variance": "every row's advantage was exactly 0 (no policy gradient)",
    "uniform_outcome": "refill.drop left it out: its episodes all succeeded or all failed",
    "no_success": "refill.drop left it out: none of its episodes succeeded",
    "failed": "no row at all: every episode of it was lost (env or agent error)",
}
_ACTOR_TASKS = tuple(
    _m(f"actor/async/tasks_{outcome}", "tasks", f"Drawn tasks whose outcome: {why}.")
    for outcome, why in _TASK_OUTCOMES.items()
)
# the refill record's reasons for leaving a group out (`agent_core.run.refill.REASONS`)
_REFILL_DROPPED = tuple(
    _m(f"refill/dropped_{reason}", "groups", f"Groups left out because {why}.")
    for reason, why in {
        "failed": "every episode was lost to an env or agent error",
        "stale": "their rows were older than overlap.max_staleness",
        "zero_variance": "every episode got the same reward",
        "uniform_outcome": "every episode succeeded or every one failed",
        "no_success": "no episode succeeded",
    }.items()
)

METRICS: tuple[Metric, ...] = (
    _m("reward/mean", "reward", "Mean episode return (the sum of its steps' rewards)."),
    _m("reward/std", "reward", "Standard deviation of the episode returns."),
    _m("reward/<term>", "term value", "Mean per episode of reward term `<term>` (reward.terms, "
       "before its weight), e.g. reward/answer_match."),
    _m("reward/kl_to_reference", "nats/step", "KL-in-reward (algorithm.kl_coef > 0): mean k1 "
       "KL of the sampling policy to the reference per step."),
    _m("reward/judge_parse_failures", "replies", "Judged terms: judge replies no score could be "
       "read from."),
    _m("reward/judge_generate_calls", "calls", "Judged terms: generate calls of the judge."),
    _m("success_rate", SHARE, "Episodes whose env reported success."),
    _m("episode/steps_mean", "steps", "Mean agent steps per episode."),
    _m("episode/rows_mean", "rows", "Stored rows per episode (below steps_mean where a tree's "
       "episodes share rows)."),
    _m("episode/truncated_share", SHARE, "Episodes cut short (max_steps, the prompt budget)."),
    _m("episode/tool_calls_ok_mean", "calls", "Mean tool calls per episode that parsed and ran."),
    _m("episode/response_tokens_mean", "tokens", "Mean reply length per step."),
    _m("role/<role>/reward_mean", "reward", "Mean return of that role's trajectories."),
    _m("role/<role>/success_rate", SHARE, "Success of that role's trajectories."),
    _m("role/<role>/steps_mean", "steps", "Mean steps of that role's trajectories."),
    _m("role/<role>/own_success_rate", SHARE, "Of that role's steps the env scored on their "
       "own (`info.role_success`: a verifier's verdicts, a chain worker's notes), the share "
       "that were right."),
    _m("role/<role>/approx_kl", "nats", "actor/approx_kl over that role's micro-batches."),
    _m("role/<role>/entropy", "nats/token", "actor/entropy over that role's micro-batches."),
    _m("role/<role>/clip_fraction", SHARE, "actor/clip_fraction over that role's "
       "micro-batches."),
    _m("role/<role>/grad_norm", "L2 norm", "Gradient norm of that role's adapter before its "
       "own clipping, mean over the optimizer steps it took part in (a shared role: the "
       "shared adapter's)."),
    _m("role/<role>/adapter_update_norm", "L2 norm", "How far the update moved that role's "
       "adapter: the L2 norm of its weights' change (a shared role: the shared adapter's)."),
    _m("advantage/mean", "advantage", "Mean advantage per row."),
    _m("advantage/abs_mean", "advantage", "Mean |advantage| per row."),
    _m("advantage/zero_share", SHARE, "Rows of advantage exactly 0 (no policy gradient)."),
    _m("advantage/zero_variance_group_share", SHARE, "Groups whose episodes all got the same "
       "return (no advantage to learn from)."),
    _m("advantage/weighted_mean", "advantage", "Mean advantage as trainer.loss_agg_mode weighs "
       "the rows: > 0, the update pushes the sampled tokens up on the whole."),
    _m("advantage/weighted_bias", "ratio", "weighted_mean / the weighted mean |advantage| "
       "(-1..1): how one-sided the update leans."),
    _m("advantage/per_token_mean", "advantage", "Mean advantage per response token."),
    _m("advantage/per_step_mean", "advantage", "Mean advantage per step (token-mean per step)."),
    _m("advantage/per_trajectory_mean", "advantage", "Mean advantage per trajectory."),
    _m("loss_weight/failed_share", SHARE, "The loss's weight on rows of failed trajectories."),
    _m("loss_weight/success_share", SHARE, "The loss's weight on rows of successful ones."),
    _m("loss_weight/no_success_group_share", SHARE, "The policy gradient's weight (loss weight "
       "x |advantage|) from groups where nothing succeeded."),
    _m("critic/value_mean", "value", "Mean value-head estimate over the iteration's rows."),
    _m("rollout/episodes", "episodes", "Episodes collected."),
    _m("rollout/steps", "steps", "Agent steps collected."),
    _m("rollout/generate_calls", "calls", "Batched generate calls of the rollout engine."),
    _m("rollout/generated_tokens", "tokens", "Tokens sampled."),
    _m("rollout/prompt_tokens", "tokens", "Prompt tokens of every step."),
    _m("rollout/prefilled_tokens", "tokens", "Prompt tokens the engine's prefill computed."),
    _m("rollout/prefix_cache_tokens", "tokens", "Prompt tokens its prefix cache held instead."),
    _m("rollout/prefix_cache_share", SHARE, "prefix_cache_tokens / (that + prefilled_tokens)."),
    _m("rollout/shard_retries", "tries", "Shards redone after their worker died or stalled."),
    _m("rollout/episodes_<end>", "episodes", "Agent rollouts: episodes that ended that way "
       "(answer, agent, agent_error, timeout, refused, ...)."),
    _m("rollout/episodes_lost", "episodes", "Agent rollouts: episodes that left no row."),
    _m("throughput/generated_tokens_per_s", "tokens/s", "Sampled tokens / generate seconds."),
    _m("throughput/trained_tokens_per_s", "tokens/s", "actor/trained_tokens / the update's "
       "seconds."),
    *_ACTOR,
    *_ACTOR_TASKS,
    _m("refill/rounds", "rounds", "Refill rounds after the first draw."),
    _m("refill/tasks_drawn", "tasks", "Tasks drawn in all rounds, retries left out."),
    _m("refill/tasks_retried", "tasks", "Tasks drawn again after their episodes were lost."),
    _m("refill/kept_groups", "groups", "Groups the update trains on."),
    _m("refill/batch_full", FLAG, "1 when the kept groups filled rollout.tasks_per_iteration."),
    _m("refill/batch_share", SHARE, "Kept groups / rollout.tasks_per_iteration."),
    _m("refill/episodes", "episodes", "Episodes the refill rounds collected."),
    _m("refill/generated_tokens", "tokens", "Tokens the refill rounds sampled."),
    _m("refill/drawn_success_rate", SHARE, "Success rate of the first draw, before any group "
       "was left out."),
    _m("refill/drawn_reward_mean", "reward", "Mean return of the first draw."),
    *_REFILL_DROPPED,
    _m("warning/count", "warnings", "Warnings the iteration printed."),
    _m("warning/reward_falling_iterations", "iterations", "Iterations in a row reward/mean fell "
       "(up to tracking.warn_reward_falling)."),
    _m("warning/entropy_ratio", "ratio", "actor/entropy over the run's first update's (0 "
       "before any): a rising policy entropy is warned at tracking.warn_entropy_rise."),
    _m("timing_s/collect", "s", "Collection: the longest shard, retries included."),
    _m("timing_s/collect_redone", "s", "Time shards spent on tries that failed."),
    _m("timing_s/refill", "s", "Dynamic sampling's judging and refill rounds."),
    _m("timing_s/score", "s", "Rewards and advantages."),
    _m("timing_s/write_replay", "s", "Writing the Arrow partition."),
    _m("timing_s/update", "s", "The update phase, checkpoint included."),
    _m("timing_s/update_recompute", "s", "Inside it: recomputing old log-probs."),
    _m("timing_s/update_forward_backward", "s", "Inside it: the policy loss's forward and "
       "backward (reference forwards included)."),
    _m("timing_s/update_demonstrations", "s", "Inside it: the demonstration loss's forward and "
       "backward."),
    _m("timing_s/update_optimizer", "s", "Inside it: optimizer steps (grad norm and AdamW)."),
    _m("timing_s/update_checkpoint", "s", "Inside it: writing the checkpoint."),
    _m("timing_s/sync", "s", "Loading the new weights into the rollout engine or workers."),
    _m("timing_s/log", "s", "Logging the iteration to MLflow."),
    _m("timing_s/warmup", "s", "The whole warm-up (at step 0)."),
    _m("warmup/<name>", "as actor/<name>", "The warm-up's SFT update: its field <name> as "
       "actor/<name> reports it (warmup/policy_loss: the demonstrations' mean NLL), and its "
       "recompute_, optimizer_ and demonstration_seconds."),
    _m("warmup/demo_success_rate", SHARE, "Success of the solver episodes the demonstrations "
       "came from."),
    _m("warmup/reply_tokens_max", "tokens", "The longest demonstration reply."),
    _m("warmup/replies_over_max_new_tokens", "replies", "Demonstration replies longer than "
       "rollout.max_new_tokens (RL cuts its samples there)."),
    _m("warmup/heldout_<fit>", "probability or steps", "warmup.heldout_episodes: how the "
       "policy after (or, with _base, before) the warm-up plays held-out solver episodes: "
       "reply_prob (mean per-reply probability), episode_prob, steps, episodes."),
    _m("warmup/align_<name>", "as named", "warmup.align_tasks: the VLM alignment stage: rows "
       "(image captions), optimizer_steps, caption_token_prob (held-out boards, after; _base: "
       "before), seconds."),
    _m("eval/success_rate", SHARE, "Held-out episodes that succeeded."),
    _m("eval/reward_mean", "reward", "Mean held-out episode return."),
    _m("eval/steps_mean", "steps", "Mean held-out episode length."),
    _m("eval/episodes", "episodes", "Held-out episodes played."),
    _m("eval/tasks", "tasks", "Held-out tasks."),
    _m("eval/role/<role>/own_success_rate", SHARE, "A team's held-out episodes: of that role's "
       "steps the env scored on their own (a verifier's verdicts), the share that were right."),
    _m("eval/pass_at_<k>", SHARE, "Unbiased pass@k over eval.samples_per_task samples per task "
       "(k = 1 and k = samples_per_task)."),
    _m("eval_base/<name>", "as eval/<name>", "eval/<name> of the base model, before the "
       "warm-up."),
)  # fmt: skip

_EXACT = {m.name: m for m in METRICS if not m.is_pattern}


def _pattern(name: str) -> re.Pattern[str]:
    """`name` as a regex: each `<part>` matches any non-empty text."""
    return re.compile(".+".join(re.escape(text) for text in re.split(r"<\w+>", name)))


# the most specific pattern first: warmup/heldout_<fit> before warmup/<name>
_PATTERNS = [
    (_pattern(m.name), m)
    for m in sorted(METRICS, key=lambda m: -len(re.sub(r"<\w+>", "", m.name)))
    if m.is_pattern
]


def declared(name: str) -> Metric | None:
    """The declaration a logged key falls under (its own, or a pattern's); None when none."""
    if name in _EXACT:
        return _EXACT[name]
    return next((m for pattern, m in _PATTERNS if pattern.fullmatch(name)), None)


def undeclared(names: Iterable[str]) -> list[str]:
    """The keys of `names` declared nowhere, sorted."""
    return sorted(n for n in set(names) if declared(n) is None)


def metric_key(name: str, /, **parts: object) -> str:
    """The logged key of metric `name`, a declared name or pattern with its `<part>`s given as
    keywords: `metric_key("reward/<term>", term="answer_match")`. A key declared nowhere
    raises: a new metric is added to METRICS (name, unit, meaning) first."""
    filled = re.sub(r"<(\w+)>", lambda m: str(parts[m.group(1)]), name)
    if declared(filled) is None:
        raise KeyError(
            f"metric {filled!r} is declared nowhere: add it (name, unit, meaning) to METRICS in "
            "agent_core/core/metrics.py, then regenerate docs/metrics.md"
        )
    return filled
