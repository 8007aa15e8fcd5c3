"""`PolicyTrainer`: the policy (and optional value head) inside a DeepSpeed engine; one
clipped policy-gradient update per iteration with optional KL to a frozen reference, entropy
bonus and value loss, a supervised warm-up through the same engine, and no-grad forwards
(values, log-ratios, reference KL). Its checkpoints are written and read by `checkpoint`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from agent_core.algorithms.losses import aggregate, clipped_policy_loss, kl_penalty, value_loss
from agent_core.algorithms.off_policy import off_policy_weights
from agent_core.core import progress
from agent_core.core.faults import crash_point
from agent_core.trainer import lora
from agent_core.trainer.batching import (
    MicroBatch,
    TrainRow,
    TrainSequence,
    build_sequences,
    collate,
    collate_tree,
    demonstration_episodes,
    episode_keys,
    plan_minibatches,
    trajectory_mass,
    tree_microbatches,
    with_trajectory_tokens,
)
from agent_core.trainer.checkpoint import gathered_state, load_checkpoint_state, save_checkpoint
from agent_core.trainer.compute_dtype import resolve_compute_dtype
from agent_core.trainer.distributed import (
    any_rank,
    init_process_group,
    rank_share,
    select_accelerator,
    single_process_env,
    sum_over_ranks,
)
from agent_core.trainer.policy_module import PolicyModule
from configs.trainer import TrainerSection


@dataclass
class UpdateMetrics:
    """What one update reports (means over optimizer steps or micro-batches)."""

    policy_loss: float = 0.0
    grad_norm: float = 0.0
    clip_fraction: float = 0.0
    dual_clip_fraction: float = 0.0
    approx_kl: float = 0.0
    ratio_mean: float = 0.0
    entropy: float = 0.0
    kl_ref: float = 0.0
    value_loss: float = 0.0
    value_clip_fraction: float = 0.0
    optimizer_steps: int = 0
    skipped_steps: int = 0
    # the mean learning rate of the update's optimizer steps (below trainer.learning_rate while
    # trainer.lr_warmup_steps ramps it up)
    lr: float = 0.0
    # trainer.target_kl: 1 when the update stopped early (a mini-batch's approx_kl passed it),
    # and that mini-batch's approx_kl (0 when it ran to the end)
    early_stopped: int = 0
    early_stop_kl: float = 0.0
    nonfinite_losses: int = 0
    # trainer.demonstration_loss_coef: the demonstration replies' mean negative log-likelihood
    # per token (T = 1) over the update's optimizer steps, each measured before its step, and
    # the demonstration rows the update trained on (0 and 0 when off)
    demonstration_nll: float = 0.0
    demonstration_rows: int = 0
    rows: int = 0
    sequences: int = 0
    packed_trajectories: int = 0
    trained_tokens: int = 0
    padded_tokens: int = 0
    # 1 when the forward and backward ran in bf16 autocast, 0 in fp32 (what trainer.dtype
    # 'auto' resolved to on this device)
    bf16_autocast: int = 0
    # trainer.old_logprobs=recompute: |rollout log-prob - trainer's recomputed one| per token
    # (how far the rollout engine's numerics are from the trainer's; 0 when not recomputed)
    rollout_logprob_diff_mean: float = 0.0
    rollout_logprob_diff_max: float = 0.0
    # trainer.old_logprobs=recompute, over every response token of the update, rho = pi_proximal
    # (recomputed) / pi_behaviour (stored): its mean, max and min; the mean weight that
    # trainer.off_policy_correction puts on a token's loss (1 with none, 0 = masked) and the
    # shares it truncated (tis) or masked (mis); the k1 estimate of KL(behaviour || proximal)
    off_policy_ratio_mean: float = 0.0
    off_policy_ratio_max: float = 0.0
    off_policy_ratio_min: float = 0.0
    off_policy_weight_mean: float = 0.0
    off_policy_truncated_share: float = 0.0
    off_policy_masked_share: float = 0.0
    off_policy_kl: float = 0.0
    # where the update's time went: all of it, the old log-prob recompute forwards, the
    # optimizer steps (grad norm + AdamW) and the demonstration loss's forward + backward; the
    # rest is the policy loss's forward + backward
    seconds: float = 0.0
    recompute_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    demonstration_seconds: float = 0.0


# per-micro-batch sums that ranks add up ("norm" is global already)
_SUMMED = {"loss", "clip_fraction", "dual_clip_fraction", "approx_kl", "ratio_mean", "entropy",
           "kl_ref", "value_loss", "value_clip_fraction", "demonstration_nll"}  # fmt: skip


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t[None]  # [N] -> [1, N]: the loss functions take [B, L]


class PolicyTrainer:
    """Owns the DeepSpeed engine for one run (build once per process, reuse across iterations)."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: TrainerSection,
        temperature: float,
        seed: int,
        reference_path: str | Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.temperature = temperature
        self.seed = seed
        self.accelerator = select_accelerator(cfg.accelerator)
        with single_process_env():
            init_process_group(self.accelerator)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.engine, self.tokenizer = self._build(Path(model_path))
        self.device = self.engine.device
        self.compute_dtype = resolve_compute_dtype(cfg.dtype, self.device.type)
        if cfg.dtype == "auto" and any_rank(self.compute_dtype != "bfloat16", self.world):
            self.compute_dtype = "float32"  # every rank computes in the same dtype
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        # LoRA: the base without adapters is the reference (no second copy of the model)
        self._base_reference = bool(reference_path) and cfg.lora is not None
        load_ref = reference_path and cfg.lora is None
        self.reference = self._load_reference(reference_path) if load_ref else None
        self._sft = False  # set while sft_update runs
        # prefix-tree micro-batches of at most this many positions (None: left-padded ones)
        self._tree = cfg.micro_batch_tokens if cfg.shared_prefix else None

    def _ds_config(self) -> dict:
        return {
            "train_micro_batch_size_per_gpu": self.cfg.micro_batch_size,
            "gradient_accumulation_steps": max(
                1, self.cfg.mini_batch_size // (self.cfg.micro_batch_size * self.world)
            ),
            "gradient_clipping": self.cfg.max_grad_norm,
            # steprl owns the accumulation boundary: backward per micro-batch, step() per
            # mini-batch (the last mini-batch of an epoch may hold fewer micro-batches).
            "managed_gradient_accumulation": False,
            "zero_optimization": {"stage": self.cfg.zero_stage},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }

    def _build(self, model_path: Path):
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(self.seed)
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=False)
        if self.cfg.lora is not None:
            lm = lora.load_lm(model_path, self.cfg.lora)
        else:
            lm = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=torch.float32, trust_remote_code=False
            )
        lm.config.use_cache = False
        if self.cfg.gradient_checkpointing:
            lm.gradient_checkpointing_enable()
            if self.cfg.lora is not None:
                lm.enable_input_require_grads()  # frozen embeddings: keep the graph alive
        module = PolicyModule(lm, value_head=self.cfg.value_head)
        module.load_value_head(model_path)
        # A client torch AdamW avoids compiling DeepSpeed's Adam ops on CPU. Its fused kernel
        # makes one pass over weights, grads and moments (the per-parameter loop makes ~6): a
        # 135M-parameter step took 1.5 s instead of 15 s on a 2-core CPU (bench/update.py).
        optimizer = torch.optim.AdamW(
            [p for p in module.parameters() if p.requires_grad],  # LoRA: adapters + value head
            lr=self.cfg.learning_rate,
            betas=self.cfg.betas,
            weight_decay=self.cfg.weight_decay,
            fused=True,
        )
        engine, *_ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=self._ds_config()
        )
        if self.cfg.zero_stage == 0 and self.world == 1:
            # One process has nothing to average: skip DeepSpeed's flatten + all-reduce + copy
            # back of every gradient at each step (0.66 s per 135M-parameter step on 1 CPU core).
            engine.enable_backward_allreduce = False
        engine.train()
        return engine, tokenizer

    def _load_reference(self, path: str | Path) -> PolicyModule:
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, trust_remote_code=False
        )
        ref = PolicyModule(lm, value_head=False).to(self.device).eval()
        ref.requires_grad_(False)
        return ref

    def _has_reference(self) -> bool:
        return self.reference is not None or self._base_reference

    @contextlib.contextmanager
    def _as_reference(self):
        """The module whose forward is the KL reference: the frozen copy, or (LoRA) the
        policy's own base with its adapters switched off."""
        if self.reference is not None:
            yield self.reference
            return
        with lora.base_only(self.engine.module.lm):
            yield self.engine.module

    def _autocast(self):
        if self.compute_dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _logprobs(
        self, module, batch: MicroBatch, with_values: bool, temperature: float | None = None
    ):
        """Per-token log-probs [N], all log-probs [N, V] and values [S] (or None)."""
        with self._autocast():
            logits, values = module(
                batch.input_ids,
                batch.attention_mask,
                batch.position_ids,
                batch.token_pos,
                batch.value_pos if with_values else None,
            )
        t = self.temperature if temperature is None else temperature
        logp_all = torch.log_softmax(logits.float() / t, dim=-1)
        logp = logp_all.gather(-1, batch.targets[:, None]).squeeze(-1)
        return logp, logp_all, values

    def _train_rows(self, rows: list[TrainRow], metrics: UpdateMetrics) -> list[TrainRow]:
        """`rows` as the update trains them: with old_logprobs=recompute, their `old_logprobs`
        are the proximal policy's (the trainer's own, recomputed now) and, with an off-policy
        correction, their `token_weights` come from the stored (behaviour) log-probs."""
        cfg = self.cfg
        if cfg.old_logprobs != "recompute":
            return rows
        proximal, _ = self._per_step(self.engine.module, rows, with_values=False)
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
        return [replace(r, old_logprobs=lp, token_weights=w.tolist())
                for r, lp, w in zip(rows, proximal, weights, strict=True)]  # fmt: skip

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
        drawn for that step (`_demonstration_draws`)."""
        start = time.perf_counter()
        epochs = self.cfg.epochs if epochs is None else epochs
        metrics = UpdateMetrics(rows=len(rows), bf16_autocast=int(self.compute_dtype == "bfloat16"))
        rows = with_trajectory_tokens(rows if self._sft else self._train_rows(rows, metrics))
        metrics.recompute_seconds = time.perf_counter() - start
        sequences, packed = build_sequences(rows, self.cfg.pack_trajectories)
        metrics.sequences, metrics.packed_trajectories = len(sequences), packed
        sums: dict[str, float] = {}
        micro_count = 0
        first_plan = self.minibatch_plan(sequences, rows, iteration, 0)
        draws = self._demonstration_draws(demonstrations, iteration)
        progress.start("update", len(first_plan) * epochs)
        trajectories = trajectory_mass(rows, range(len(rows)))
        for epoch in range(epochs):
            plan = self.minibatch_plan(sequences, rows, iteration, epoch) if epoch else first_plan
            # traj-mean-token-mean: every mini-batch divides by the update's trajectories per
            # mini-batch, not by its own; a mini-batch of step rows holds fewer long
            # trajectories than short ones, and dividing by its own count would weigh each
            # long (often failed) trajectory more
            traj_count = trajectories / max(1, len(plan))
            for mini in plan:
                demo = next(draws) if draws is not None else None
                micro_count += self._mini_step(
                    mini, sequences, rows, metrics, sums, traj_count, demo
                )
                progress.advance("update")
                if metrics.early_stopped:
                    break
                if self.world > 1:  # fault tests kill one rank after its first step
                    crash_point(f"update_rank{self.rank}", iteration)
            if metrics.early_stopped:
                break
        progress.finish("update")
        micro_count = self._sum_over_ranks(metrics, sums, micro_count)
        steps, n_micro = max(1, metrics.optimizer_steps), max(1, micro_count)
        metrics.policy_loss = sums.get("loss", 0.0) / steps
        metrics.demonstration_nll = sums.get("demonstration_nll", 0.0) / steps
        metrics.grad_norm = sums.get("norm", 0.0) / steps
        metrics.lr = sums.get("lr", 0.0) / steps
        for key in ("clip_fraction", "dual_clip_fraction", "approx_kl", "ratio_mean", "entropy",
                    "kl_ref", "value_loss", "value_clip_fraction"):  # fmt: skip
            setattr(metrics, key, sums.get(key, 0.0) / n_micro)
        metrics.seconds = time.perf_counter() - start
        return metrics

    def _sum_over_ranks(self, metrics: UpdateMetrics, sums: dict, micro_count: int) -> int:
        """Add up what each rank counted over its share (one all-reduce); returns the global
        micro-batch count. Optimizer steps and the grad norm are already global."""
        if self.world == 1:
            return micro_count
        keys = sorted(_SUMMED)
        counted = ("nonfinite_losses", "trained_tokens", "padded_tokens")
        local = [sums.get(k, 0.0) for k in keys] + [getattr(metrics, k) for k in counted]
        values = sum_over_ranks([*local, micro_count])
        for key, value in zip(keys, values, strict=False):
            sums[key] = value
        for key, value in zip(counted, values[len(keys) :], strict=False):
            setattr(metrics, key, int(value))
        return int(values[-1])

    def _mini_step(
        self,
        mini,
        sequences,
        rows,
        metrics: UpdateMetrics,
        sums: dict,
        traj_count: float,
        demo: list[TrainRow] | None = None,
    ) -> int:
        """Accumulate gradients over the micro-batches of one mini-batch (and, with `demo`,
        the demonstration loss over those rows), then step once (or skip the step when the
        gradient is not finite). Returns the mini-batch's micro-batches processed.
        `traj_count`: the traj-mean-token-mean divisor, the same for every mini-batch."""
        micros = [[sequences[i] for i in micro] for micro in mini]
        token_count = sum(e - s for seqs in micros for q in seqs for _, s, e in q.spans)
        step_count = sum(len(q.spans) for seqs in micros for q in seqs)
        done, kl_before = 0, sums.get("approx_kl", 0.0)
        for seqs, counts in rank_share(micros, self.rank, self.world):
            batch = self._collate(seqs, rows)
            try:
                parts = self._micro_backward(
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
            metrics.trained_tokens += batch.response_tokens
            metrics.padded_tokens += int(batch.input_ids.numel())
        if demo:
            demonstrating = time.perf_counter()
            metrics.demonstration_rows += len(demo)
            sums["demonstration_nll"] = sums.get("demonstration_nll", 0.0) + self._demo_backward(
                demo, metrics
            )
            metrics.demonstration_seconds += time.perf_counter() - demonstrating
        if self._passed_target_kl(metrics, sums.get("approx_kl", 0.0) - kl_before, done):
            self.engine.zero_grad()  # this mini-batch's gradient is not applied either
            return done
        stepping = time.perf_counter()
        self._step(metrics, sums, done)
        metrics.optimizer_seconds += time.perf_counter() - stepping
        return done

    def minibatch_plan(
        self, sequences: list[TrainSequence], rows: list[TrainRow], iteration: int, epoch: int
    ) -> list[list[list[int]]]:
        """The [mini][micro] -> sequence indices this update runs in `epoch` of `iteration`:
        mini-batches of trainer.mini_batch_size step rows (a packed sequence holds all its
        trajectory's rows) or, in an RL update with trainer.mini_batches, that many
        mini-batches of whole groups (fewer when mini-batches of mini_batch_size rows would be
        fewer); seeded by the run's seed, the iteration and the epoch. The warm-up's
        mini-batches take whole demonstration episodes: their steps share their prompt's start
        (one prefix tree processes it once), as a packed trajectory's do."""
        by_groups = self.cfg.mini_batches is not None and not self._sft
        first = [rows[s.spans[0][0]] for s in sequences]
        keys = episode_keys(rows) if self._sft else None
        return plan_minibatches(
            [s.input_ids for s in sequences], self.cfg.mini_batch_size,
            self.cfg.micro_batch_size, self.seed + 1000 * iteration + epoch, self._tree,
            [len(s.spans) for s in sequences],
            groups=[r.group_id or r.trajectory_id for r in first],
            mini_batches=self.cfg.mini_batches if by_groups else None,
            episodes=[keys[s.spans[0][0]] for s in sequences] if keys else None,
        )  # fmt: skip

    def _passed_target_kl(self, metrics: UpdateMetrics, kl_sum: float, done: int) -> bool:
        """trainer.target_kl: whether this mini-batch's approx_kl (the mean over its
        micro-batches on every rank, measured before its step: how far the update's earlier
        steps moved the policy from the one that sampled) passed the target. Every rank
        decides on the same global value, so all stop together."""
        target = self.cfg.target_kl
        if target is None or self._sft:
            return False
        total, count = (kl_sum, done) if self.world == 1 else sum_over_ranks([kl_sum, done])
        kl = total / count if count else 0.0
        if kl <= target:
            return False
        metrics.early_stopped, metrics.early_stop_kl = 1, kl
        return True

    def _step(self, metrics: UpdateMetrics, sums: dict, done: int) -> None:
        """One optimizer step on the accumulated gradients, unless no micro-batch of any rank
        added a finite one or the gradient is not finite (then the step is skipped)."""
        if not any_rank(done > 0, self.world):  # every micro-batch had a non-finite loss
            self.engine.zero_grad()
            metrics.skipped_steps += 1
            return
        norm = self._grad_norm()
        if norm is not None and any_rank(not math.isfinite(norm), self.world):
            # a non-finite gradient never reaches the weights (or a checkpoint)
            self.engine.zero_grad()
            metrics.skipped_steps += 1
            return
        sums["lr"] = sums.get("lr", 0.0) + self._set_lr()
        self.engine.step()
        if norm is None or self.world > 1:  # the local norm is not the global one
            norm = self.engine.get_global_grad_norm()
        sums["norm"] = sums.get("norm", 0.0) + float(norm or 0.0)
        metrics.optimizer_steps += 1

    def _set_lr(self) -> float:
        """The learning rate of the coming optimizer step, set on every param group: an RL
        step's is trainer.learning_rate, times (t / lr_warmup_steps) while the optimizer's t-th
        step is within trainer.lr_warmup_steps (t counts every step of its AdamW state: a state
        carried from the warm-up counts the warm-up's); the warm-up keeps its own."""
        groups = self.engine.optimizer.param_groups
        if self._sft:
            return float(groups[0]["lr"])
        lr = self.cfg.learning_rate
        if self.cfg.lr_warmup_steps:
            lr *= min(1.0, (self._optimizer_age() + 1) / self.cfg.lr_warmup_steps)
        for group in groups:
            group["lr"] = lr
        return lr

    def _optimizer_age(self) -> int:
        """Optimizer steps the AdamW state has taken (0 for fresh moments): the most any
        parameter's state counts (AdamW skips a parameter in a step that gave it no gradient)."""
        optimizer = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        steps = [int(s["step"]) for s in optimizer.state.values() if "step" in s]
        return max(steps, default=0)

    def _collate(self, sequences: list[TrainSequence], rows: list[TrainRow]) -> MicroBatch:
        if self._tree is not None:
            return collate_tree(sequences, rows).to(self.device)
        return collate(sequences, rows, self.pad_id).to(self.device)

    def _backward(self, loss: torch.Tensor, weight: float) -> None:
        """Backward of a micro-batch loss that is already a share of the global mini-batch
        aggregate. DeepSpeed averages gradients over ranks, so the loss is scaled by the rank
        count to make the reduced gradient the global sum (`weight` 0: a padding pass). A
        non-finite loss on any rank skips this backward on every rank."""
        if any_rank(not torch.isfinite(loss), self.world):
            raise FloatingPointError("non-finite loss")
        self.engine.backward(loss * (weight * self.world), scale_wrt_gas=False)

    def _micro_backward(
        self,
        batch: MicroBatch,
        token_count: int,
        step_count: int,
        weight: float = 1.0,
        traj_count: float | None = None,
    ) -> dict[str, float]:
        """Loss of one micro-batch, scaled so micro-batches sum to the mini-batch aggregate
        (its token, step and trajectory counts; see `aggregate`)."""
        if self._sft:
            return self._sft_backward(batch, token_count, weight)
        cfg = self.cfg
        logp, logp_all, values = self._logprobs(self.engine, batch, with_values=cfg.value_head)
        agg = {"mode": cfg.loss_agg_mode, "token_count": token_count, "seq_count": step_count,
               "traj_tokens": _flat(batch.traj_tokens[batch.token_step]),
               "traj_count": traj_count}  # fmt: skip
        segments = _flat(batch.token_step)
        ones = torch.ones_like(_flat(logp))
        correcting = cfg.off_policy_correction != "none"
        pg = clipped_policy_loss(
            _flat(logp),
            _flat(batch.old_logprobs),
            _flat(batch.advantages[batch.token_step]),
            ones,
            cfg.clip_eps,
            clip_eps_high=cfg.clip_eps_high,
            clip_ratio_c=cfg.clip_ratio_c,
            segments=segments,
            token_weights=_flat(batch.token_weights) if correcting else None,
            **agg,
        )
        loss = pg.loss
        parts = {"clip_fraction": pg.clip_fraction, "dual_clip_fraction": pg.dual_clip_fraction,
                 "approx_kl": pg.approx_kl, "ratio_mean": pg.ratio_mean}  # fmt: skip
        with contextlib.nullcontext() if cfg.entropy_coef else torch.no_grad():
            # a metric only when its coefficient is 0: no [tokens x vocab] tensors kept for
            # the backward
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * aggregate(
                _flat(entropy), ones, segments=segments, **agg
            )
        if self._has_reference() and cfg.kl_loss_coef:
            with torch.no_grad(), self._as_reference() as module:
                ref_logp, _, _ = self._logprobs(module, batch, with_values=False)
            kl = kl_penalty(_flat(logp), _flat(ref_logp), cfg.kl_estimator, cfg.kl_clamp)
            loss = loss + cfg.kl_loss_coef * aggregate(kl, ones, segments=segments, **agg)
            parts["kl_ref"] = float(kl.detach().mean())
        if values is not None:
            vl = value_loss(
                values, batch.old_values, batch.returns, cfg.value_clip, token_count=step_count
            )
            loss = loss + cfg.value_loss_coef * vl.loss
            parts |= {"value_loss": float(vl.loss.detach()) * step_count / max(1, batch.steps),
                      "value_clip_fraction": vl.clip_fraction}  # fmt: skip
        self._backward(loss, weight)
        parts["loss"] = float(loss.detach())
        parts["entropy"] = float(entropy.detach().mean())
        return parts

    def _sft_backward(
        self, batch: MicroBatch, token_count: int, weight: float, coef: float = 1.0
    ) -> dict[str, float]:
        """Supervised warm-up: mean negative log-likelihood of the response tokens (T = 1),
        this micro-batch's share of it; its gradient times `coef`."""
        logp, _, _ = self._logprobs(self.engine, batch, with_values=False, temperature=1.0)
        loss = -logp.sum() / token_count
        self._backward(loss * coef, weight)
        return {"loss": float(loss.detach())}

    def _demonstration_draws(self, demonstrations: list[TrainRow] | None, iteration: int):
        """For each optimizer step of the update, whole demonstration episodes (without
        replacement within a step) until they hold trainer.demonstration_rows reply rows (all
        of them when fewer), drawn by the run's seed and `iteration` so that every rank draws
        the same; None when the demonstration loss is off or there are none. Whole episodes,
        because an episode's steps share their prompt's start: packed into one sequence or
        merged in one prefix tree, its forward costs about one episode's tokens, where rows of
        different episodes each cost their whole prompt."""
        if not demonstrations or not self.cfg.demonstration_loss_coef or self._sft:
            return None
        episodes = demonstration_episodes(demonstrations)
        rng, wanted = random.Random(self.seed + 7919 * iteration), self.cfg.demonstration_rows

        def draw() -> list[TrainRow]:
            rows: list[TrainRow] = []
            for episode in rng.sample(episodes, len(episodes)):
                if len(rows) >= wanted:
                    break
                rows.extend(episode)
            return rows

        return iter(draw, None)

    def _demo_backward(self, demo: list[TrainRow], metrics: UpdateMetrics) -> float:
        """Gradient of trainer.demonstration_loss_coef times the mean NLL of the `demo` rows'
        reply tokens, accumulated beside the mini-batch's policy loss; returns the NLL (this
        rank's share: the shares add up to the mean over `demo`)."""
        sequences, _ = build_sequences(demo, self.cfg.pack_trajectories)
        token_count = sum(len(r.response_ids) for r in demo)
        micros = self._sequence_micros(sequences)
        nll, coef = 0.0, self.cfg.demonstration_loss_coef
        for seqs, counts in rank_share(micros, self.rank, self.world):
            batch = self._collate(seqs, demo)
            try:
                part = self._sft_backward(batch, token_count, float(counts), coef)
            except FloatingPointError:
                metrics.nonfinite_losses += int(counts)  # this micro-batch adds no gradient
                continue
            nll += part["loss"] if counts else 0.0
        return nll

    def sft_update(self, rows: list[TrainRow], epochs: int, learning_rate: float) -> UpdateMetrics:
        """Fine-tune on demonstration rows (response tokens only) with their own learning rate
        and epochs, through the same engine, batching and guards as the RL update (an RL
        step sets its own learning rate again: `_set_lr`)."""
        for group in self.engine.optimizer.param_groups:
            group["lr"] = learning_rate
        self._sft = True
        try:
            return self.update(rows, iteration=0, epochs=epochs)
        finally:
            self._sft = False

    def _grad_norm(self) -> float | None:
        """L2 norm of the accumulated gradients before the step (ZeRO 0/1 keep full grads on
        the parameters); None under ZeRO 2/3, where DeepSpeed reports it after the step."""
        if self.cfg.zero_stage >= 2:
            return None
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])))

    def _sequence_micros(self, sequences: list[TrainSequence]) -> list[list[TrainSequence]]:
        """`sequences` in micro-batches of trainer.micro_batch_size (with shared_prefix, prefix
        trees within micro_batch_tokens positions)."""
        size, everything = self.cfg.micro_batch_size, list(range(len(sequences)))
        if self._tree is not None:
            tokens = [s.input_ids for s in sequences]
            micros = tree_microbatches(tokens, everything, size, self._tree)
        else:
            micros = [everything[start : start + size] for start in range(0, len(everything), size)]
        return [[sequences[i] for i in micro] for micro in micros]

    @torch.no_grad()
    def _per_step(self, module, rows: list[TrainRow], with_values: bool):
        """Unpacked no-grad forwards over `rows`: per-row token log-probs and values."""
        sequences, _ = build_sequences(rows, pack=False)
        logps: list[list[float]] = [[] for _ in rows]
        values = [0.0] * len(rows)
        for seqs in self._sequence_micros(sequences):
            batch = self._collate(seqs, rows)
            logp, _, vals = self._logprobs(module, batch, with_values)
            step_rows = [span[0] for q in seqs for span in q.spans]
            for step, row in enumerate(step_rows):
                logps[row] = logp[batch.token_step == step].tolist()
                if vals is not None:
                    values[row] = float(vals[step])
        return logps, values

    def step_values(self, rows: list[TrainRow]) -> list[float]:
        """The value head's estimate at each row's last prompt token."""
        if not self.cfg.value_head:
            raise RuntimeError("step_values needs trainer.value_head=true")
        return self._per_step(self.engine.module, rows, with_values=True)[1]

    def log_ratios(self, rows: list[TrainRow]) -> list[float]:
        """Per row: the log-prob of its response under the current policy minus its
        `old_logprobs` (the sampling policy's), summed over the response tokens."""
        logps, _ = self._per_step(self.engine.module, rows, with_values=False)
        return [float(sum(lp) - sum(r.old_logprobs)) for r, lp in zip(rows, logps, strict=True)]

    def reference_kl(self, rows: list[TrainRow]) -> list[float]:
        """Per-step KL of the sampling policy to the reference: the sum over response tokens of
        (rollout log-prob - reference log-prob) (the k1 estimate, for KL-in-reward)."""
        if not self._has_reference():
            raise RuntimeError("reference_kl needs a reference model (a KL coefficient > 0)")
        with self._as_reference() as module:
            ref, _ = self._per_step(module, rows, with_values=False)
        return [float(sum(r.old_logprobs) - sum(lp)) for r, lp in zip(rows, ref, strict=True)]

    def stop(self) -> None:
        """Nothing to stop: an in-process trainer holds no other process (a `TrainerGroup`'s
        ranks do); its memory goes with its last reference."""

    def lm_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (gathered) LM weights, for the rollout engine and HF checkpoints. Under ZeRO-3
        every rank must call it (a collective gather); only rank 0 gets the weights."""
        return gathered_state(self.engine, self.cfg, "lm.")

    def save(self, checkpoint_dir: Path, metadata: dict, on_half_written=None) -> Path:
        """Write checkpoint `checkpoint_dir` (every rank calls this; see `save_checkpoint`)."""
        return save_checkpoint(
            self.engine,
            self.tokenizer,
            self.cfg,
            self.rank,
            self.world,
            checkpoint_dir,
            metadata,
            on_half_written,
        )

    def load_state(self, checkpoint_dir: Path) -> bool:
        """Restore optimizer + weights from a checkpoint's DeepSpeed state; False if it has none.
        The optimizer's moments come from the checkpoint, its settings (learning rate, betas,
        weight decay) from this run's config: the saved param groups would otherwise replace a
        learning rate changed since the checkpoint was written."""
        loaded = load_checkpoint_state(self.engine, self.cfg, self.world, checkpoint_dir)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = self.cfg.learning_rate
            group["betas"] = tuple(self.cfg.betas)
            group["weight_decay"] = self.cfg.weight_decay
        return loaded


def metrics_dict(metrics: UpdateMetrics) -> dict[str, float]:
    """`UpdateMetrics` as a flat dict of floats."""
    return {k: float(v) for k, v in asdict(metrics).items()}
