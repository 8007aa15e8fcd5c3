"""`RLUpdate`: one policy update over step rows: epochs of mini-batches, each accumulating its
micro-batches' gradients (and the demonstration term's) before one optimizer step, stopped early
at trainer.target_kl; the proximal log-probs recomputed first. The supervised warm-up runs the
same loop with its own loss, plan and learning rate. A team's rows (rows with a role) go in
micro-batches of one role each, and the update reports each role's KL, entropy and clipping and
its adapter's gradient and update norms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from agent_core.algorithms.off_policy import off_policy_weights
from agent_core.core import progress
from agent_core.core.adapters import SHARED
from agent_core.core.faults import crash_point
from agent_core.core.heap import training_heap
from agent_core.trainer.batching import (
    TrainRow,
    TrainSequence,
    build_sequences,
    episode_keys,
    plan_minibatches,
    sequence_role,
    split_by_role,
    trajectory_mass,
    with_trajectory_tokens,
)
from agent_core.trainer.distributed import rank_share, sum_over_ranks
from agent_core.trainer.engine import TrainEngine
from agent_core.trainer.forwards import NoGradForwards
from agent_core.trainer.policy_loss import PolicyLoss
from agent_core.trainer.supervised import SupervisedLoss
from agent_core.trainer.update_metrics import MICRO_MEANS, ROLE_MEANS, SUMMED, UpdateMetrics
from configs.trainer import TrainerSection


@dataclass
class _Pass:
    """One update's rows and sequences, what it reports and its running sums, shared by its
    mini-batch steps; `supervised`: the warm-up's pass, not RL's."""

    rows: list[TrainRow]
    sequences: list[TrainSequence]
    metrics: UpdateMetrics
    supervised: bool
    sums: dict[str, float] = field(default_factory=dict)


class RLUpdate:
    """The update loop of one trainer, over its engine and losses."""

    def __init__(
        self,
        engine: TrainEngine,
        cfg: TrainerSection,
        seed: int,
        policy_loss: PolicyLoss,
        supervised: SupervisedLoss,
        forwards: NoGradForwards,
    ) -> None:
        self.engine = engine
        self.cfg = cfg
        self.seed = seed
        self.policy_loss = policy_loss
        self.supervised = supervised
        self.forwards = forwards

    def update(
        self,
        rows: list[TrainRow],
        iteration: int,
        epochs: int | None = None,
        demonstrations: list[TrainRow] | None = None,
    ) -> UpdateMetrics:
        """Run `epochs` (default trainer.epochs) passes over `rows`: one optimizer step per
        mini-batch of sequences; its gradient is the configured aggregate over its tokens, plus
        trainer.demonstration_loss_coef times the mean NLL of the episodes of `demonstrations`
        drawn for that step (`SupervisedLoss.demonstration_draws`)."""
        epochs = self.cfg.epochs if epochs is None else epochs
        with training_heap(self._mmap_threshold()):
            return self._run(rows, iteration, epochs, demonstrations, supervised=False)

    def sft_update(
        self, rows: list[TrainRow], epochs: int, learning_rate: float, only: tuple[str, ...] = ()
    ) -> UpdateMetrics:
        """Fine-tune on demonstration rows (response tokens only) with their own learning rate
        and epochs, through the same engine, batching and guards as the RL update (an RL
        step sets its own learning rate again); `only`: train just the weights under these
        module names (`TrainEngine.training_only`)."""
        self.engine.set_learning_rate(learning_rate)
        with self.engine.training_only(only), training_heap(self._mmap_threshold()):
            return self._run(rows, 0, epochs, None, supervised=True)

    def _mmap_threshold(self) -> int | None:
        """trainer.mmap_threshold_mib in bytes (None: the process's threshold)."""
        mib = self.cfg.mmap_threshold_mib
        return None if mib is None else int(mib * 2**20)

    def _run(
        self,
        rows: list[TrainRow],
        iteration: int,
        epochs: int,
        demonstrations: list[TrainRow] | None,
        supervised: bool,
    ) -> UpdateMetrics:
        start = time.perf_counter()
        bf16 = int(self.engine.compute_dtype == "bfloat16")
        metrics = UpdateMetrics(rows=len(rows), bf16_autocast=bf16)
        rows = with_trajectory_tokens(rows if supervised else self.train_rows(rows, metrics))
        metrics.recompute_seconds = time.perf_counter() - start
        sequences, packed = build_sequences(rows, self.cfg.pack_trajectories)
        metrics.sequences, metrics.packed_trajectories = len(sequences), packed
        run = _Pass(rows, sequences, metrics, supervised)
        micro_count = 0
        first_plan = self.minibatch_plan(sequences, rows, iteration, 0, supervised)
        draws = self.supervised.demonstration_draws(demonstrations, iteration)
        progress.start("update", len(first_plan) * epochs)
        trajectories = trajectory_mass(rows, range(len(rows)))
        team = self.engine.roles
        before = team.snapshot() if team is not None else None
        for epoch in range(epochs):
            plan = (
                self.minibatch_plan(sequences, rows, iteration, epoch, supervised)
                if epoch
                else first_plan
            )
            # traj-mean-token-mean: every mini-batch divides by the update's trajectories per
            # mini-batch, not by its own; a mini-batch of step rows holds fewer long
            # trajectories than short ones, and dividing by its own count would weigh each
            # long (often failed) trajectory more
            traj_count = trajectories / max(1, len(plan))
            for mini in plan:
                demo = next(draws) if draws is not None else None
                micro_count += self._mini_step(mini, run, traj_count, demo)
                progress.advance("update")
                if metrics.early_stopped:
                    break
                if self.engine.world > 1:  # fault tests kill one rank after its first step
                    crash_point(f"update_rank{self.engine.rank}", iteration)
            if metrics.early_stopped:
                break
        progress.finish("update")
        self._means(metrics, run.sums, self._sum_over_ranks(metrics, run.sums, micro_count))
        if not supervised and any(r.role for r in rows):
            moved = team.moved(before) if team is not None and before is not None else {}
            metrics.roles = self._role_means(rows, run.sums, moved)
        metrics.seconds = time.perf_counter() - start
        return metrics

    @staticmethod
    def _means(metrics: UpdateMetrics, sums: dict, micro_count: int) -> None:
        """The update's reported means: per optimizer step, or per micro-batch."""
        steps, n_micro = max(1, metrics.optimizer_steps), max(1, micro_count)
        metrics.policy_loss = sums.get("loss", 0.0) / steps
        metrics.demonstration_nll = sums.get("demonstration_nll", 0.0) / steps
        metrics.grad_norm = sums.get("norm", 0.0) / steps
        metrics.lr = sums.get("lr", 0.0) / steps
        for key in MICRO_MEANS:
            setattr(metrics, key, sums.get(key, 0.0) / n_micro)

    @staticmethod
    def _role_means(
        rows: list[TrainRow], sums: dict[str, float], moved: dict[str, float]
    ) -> dict[str, float]:
        """Per role: the mean over its micro-batches of each of `ROLE_MEANS`, and, for a team's
        adapters, its adapter's mean gradient norm per optimizer step it took part in and how
        far the update moved it (L2 of the change; a shared role's: the shared adapter's)."""
        out: dict[str, float] = {}
        adapters = {r.role: r.adapter for r in rows if r.role}
        for role, adapter in sorted(adapters.items()):
            n = max(1.0, sums.get(f"role/{role}/micro_batches", 0.0))
            for key in ROLE_MEANS:
                out[f"role/{role}/{key}"] = sums.get(f"role/{role}/{key}", 0.0) / n
            name = adapter or SHARED
            if name in moved:
                steps = max(1.0, sums.get(f"grad_steps/{name}", 0.0))
                out[f"role/{role}/grad_norm"] = sums.get(f"grad_norm/{name}", 0.0) / steps
                out[f"role/{role}/adapter_update_norm"] = moved[name]
        return out

    def train_rows(self, rows: list[TrainRow], metrics: UpdateMetrics) -> list[TrainRow]:
        """`rows` as the update trains them: with old_logprobs=recompute, their `old_logprobs`
        are the proximal policy's (the trainer's own, recomputed now) and, with an off-policy
        correction, their `token_weights` come from the stored (behaviour) log-probs."""
        cfg = self.cfg
        if cfg.old_logprobs != "recompute":
            return rows
        proximal = self.forwards.policy_logprobs(rows)
        flat = [torch.tensor(lp, dtype=torch.float32)[None] for lp in proximal]
        stored = [torch.tensor(r.old_logprobs, dtype=torch.float32)[None] for r in rows]
        prox = torch.cat(flat, dim=-1) if flat else torch.zeros(1, 0)
        ow = off_policy_weights(
            prox,
            torch.cat(stored, dim=-1) if stored else torch.zeros(1, 0),
            torch.ones_like(prox),
            cfg.off_policy_correction,
            tis_cap=cfg.tis_cap,
            mis_low=cfg.mis_low,
            mis_high=cfg.mis_high,
        )
        metrics.rollout_logprob_diff_mean = ow.logprob_diff_mean
        metrics.rollout_logprob_diff_max = ow.logprob_diff_max
        metrics.off_policy_ratio_mean, metrics.off_policy_ratio_max = ow.ratio_mean, ow.ratio_max
        metrics.off_policy_ratio_min, metrics.off_policy_kl = ow.ratio_min, ow.kl
        metrics.off_policy_weight_mean = ow.weight_mean
        metrics.off_policy_truncated_share = ow.truncated_share
        metrics.off_policy_masked_share = ow.masked_share
        if ow.weights is None:
            return [replace(r, old_logprobs=lp) for r, lp in zip(rows, proximal, strict=True)]
        weights = torch.split(ow.weights[0], [len(lp) for lp in proximal])
        return [
            replace(r, old_logprobs=lp, token_weights=w.tolist())
            for r, lp, w in zip(rows, proximal, weights, strict=True)
        ]

    def _sum_over_ranks(self, metrics: UpdateMetrics, sums: dict, micro_count: int) -> int:
        """Add up what each rank counted over its share (one all-reduce); returns the global
        micro-batch count. Optimizer steps and the grad norm are already global."""
        if self.engine.world == 1:
            return micro_count
        keys = sorted(SUMMED)
        counted = ("nonfinite_losses", "trained_tokens", "padded_tokens")
        local = [sums.get(k, 0.0) for k in keys] + [getattr(metrics, k) for k in counted]
        values = sum_over_ranks([*local, micro_count])
        for key, value in zip(keys, values, strict=False):
            sums[key] = value
        for key, value in zip(counted, values[len(keys) :], strict=False):
            setattr(metrics, key, int(value))
        return int(values[-1])

    def _mini_step(
        self, mini: list[list[int]], run: _Pass, traj_count: float, demo: list[TrainRow] | None
    ) -> int:
        """Accumulate gradients over the micro-batches of one mini-batch (and, with `demo`,
        the demonstration loss over those rows), then step once (or skip the step when the
        gradient is not finite). Returns the mini-batch's micro-batches processed.
        `traj_count`: the traj-mean-token-mean divisor, the same for every mini-batch."""
        metrics, sums = run.metrics, run.sums
        micros = [[run.sequences[i] for i in micro] for micro in mini]
        token_count = sum(e - s for seqs in micros for q in seqs for _, s, e in q.spans)
        step_count = sum(len(q.spans) for seqs in micros for q in seqs)
        done, kl_before = 0, sums.get("approx_kl", 0.0)
        share = rank_share(micros, self.engine.rank, self.engine.world)
        self.engine.begin_step(len(share) + bool(demo))
        for seqs, counts in share:
            batch = self.engine.collate(seqs, run.rows)
            try:
                if run.supervised:
                    parts = self.supervised.backward(batch, token_count, float(counts))
                else:
                    parts = self.policy_loss.backward(
                        batch, token_count, step_count, float(counts), traj_count
                    )
            except FloatingPointError:
                metrics.nonfinite_losses += int(counts)  # this micro-batch adds no gradient
                continue
            if not counts:
                continue
            done += 1
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + value
            role = sequence_role(seqs[0], run.rows)
            if role:  # a team's: the role's own means (one role per micro-batch)
                own = {"micro_batches": 1.0} | {k: parts.get(k, 0.0) for k in ROLE_MEANS}
                for key, value in own.items():
                    sums[f"role/{role}/{key}"] = sums.get(f"role/{role}/{key}", 0.0) + value
            metrics.trained_tokens += batch.response_tokens
            metrics.padded_tokens += int(batch.input_ids.numel())
        if demo:
            demonstrating = time.perf_counter()
            metrics.demonstration_rows += len(demo)
            nll = self.supervised.demonstration_backward(demo, metrics)
            sums["demonstration_nll"] = sums.get("demonstration_nll", 0.0) + nll
            metrics.demonstration_seconds += time.perf_counter() - demonstrating
        kl = sums.get("approx_kl", 0.0) - kl_before
        if not run.supervised and self._passed_target_kl(metrics, kl, done):
            self.engine.zero_grad()  # this mini-batch's gradient is not applied either
            return done
        stepping = time.perf_counter()
        self.engine.step(metrics, sums, done, scheduled=not run.supervised)
        metrics.optimizer_seconds += time.perf_counter() - stepping
        return done

    def minibatch_plan(
        self,
        sequences: list[TrainSequence],
        rows: list[TrainRow],
        iteration: int,
        epoch: int,
        supervised: bool = False,
    ) -> list[list[list[int]]]:
        """The [mini][micro] -> sequence indices an update runs in `epoch` of `iteration`:
        mini-batches of trainer.mini_batch_size step rows (a packed sequence holds all its
        trajectory's rows) or, in an RL update with trainer.mini_batches, that many
        mini-batches of whole groups (fewer when mini-batches of mini_batch_size rows would be
        fewer); seeded by the run's seed, the iteration and the epoch. The `supervised`
        warm-up's mini-batches take whole demonstration episodes: their steps share their
        prompt's start (one prefix tree processes it once), as a packed trajectory's do."""
        by_groups = self.cfg.mini_batches is not None and not supervised
        first = [rows[s.spans[0][0]] for s in sequences]
        keys = episode_keys(rows) if supervised else None
        plan = plan_minibatches(
            self.engine.tree_keys(sequences, rows),
            self.cfg.mini_batch_size,
            self.cfg.micro_batch_size,
            self.seed + 1000 * iteration + epoch,
            self.engine.tree,
            [len(s.spans) for s in sequences],
            groups=[r.group_id or r.trajectory_id for r in first],
            mini_batches=self.cfg.mini_batches if by_groups else None,
            episodes=[keys[s.spans[0][0]] for s in sequences] if keys else None,
        )
        if not any(r.role for r in first):
            return plan
        roles = [r.role for r in first]  # a team's: one role (one adapter) per forward
        return [split_by_role(mini, roles) for mini in plan]

    def _passed_target_kl(self, metrics: UpdateMetrics, kl_sum: float, done: int) -> bool:
        """trainer.target_kl: whether this mini-batch's approx_kl (the mean over its
        micro-batches on every rank, measured before its step: how far the update's earlier
        steps moved the policy from the one that sampled) passed the target. Every rank
        decides on the same global value, so all stop together."""
        target = self.cfg.target_kl
        if target is None:
            return False
        world = self.engine.world
        total, count = (kl_sum, done) if world == 1 else sum_over_ranks([kl_sum, done])
        kl = total / count if count else 0.0
        if kl <= target:
            return False
        metrics.early_stopped, metrics.early_stop_kl = 1, kl
        return True
