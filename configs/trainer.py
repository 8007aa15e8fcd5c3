"""The `trainer` section: the DeepSpeed policy update, its fields in documented groups like TRL's
GRPOConfig (optimisation, batching, policy loss, off-policy correction, KL to a reference, value
head, precision and memory, devices and distribution, LoRA, checkpoints, diagnostics), named in
`TRAINER_GROUPS` for the configuration reference."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from configs.base import Section
from configs.lora import LoraSection

AdamBeta = Annotated[float, Field(ge=0.0, lt=1.0, strict=True)]


class TrainerSection(Section):
    """The DeepSpeed policy update."""

    # --- Optimisation ---
    # AdamW and the passes over each iteration's rows: how big a step the update takes and how
    # often it steps over the same rows (PPO epochs).
    learning_rate: float = Field(1e-5, gt=0.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    betas: tuple[AdamBeta, AdamBeta] = Field(
        (0.9, 0.999),
        strict=False,  # YAML and JSON give a list; each beta stays strict (AdamBeta)
        description="AdamW betas (beta1, beta2), each in [0, 1).",
    )
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="RL updates: the learning rate rises linearly over the optimizer's first "
        "this many steps (learning_rate * t / lr_warmup_steps at its t-th step), as verl's "
        "actor lr_warmup_steps (whose first step takes 0). t counts every step of the AdamW "
        "state, so fresh moments (warmup.keep_optimizer_state=false) start at t=1, carried "
        "ones after the warm-up's steps, and a resumed run goes on where its checkpoint's "
        "state left off. Fresh AdamW moves every weight by about the learning rate on each "
        "early step whatever its gradient (the first step is lr * sign(g)). 0 = no warm-up. "
        "Logged as actor/lr.",
    )
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    epochs: int = Field(1, ge=1, description="Passes over the iteration's steps (PPO epochs).")
    target_kl: float | None = Field(
        None,
        gt=0.0,
        description="Early stop (PPO's target KL): an update takes no more optimizer steps, "
        "in this epoch or later ones, once a mini-batch's actor/approx_kl (mean over its "
        "tokens of 0.5 (log pi - log pi_old)^2, measured before its step) passes this; that "
        "mini-batch's step is not taken either. Logged as actor/early_stopped and "
        "actor/early_stop_kl. None: never stop early.",
    )

    # --- Batching ---
    # Which step rows enter the update and how they are cut and laid out: rows per optimizer step
    # (mini-batch) and per forward/backward (micro-batch), then the layout switches (packed
    # trajectories, a shared-prefix tree), which keep the gradient and trade memory for speed.
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="Sequences per forward/backward (micro-batch); with shared_prefix the most "
        "a micro-batch's prefix tree may hold.",
    )
    mini_batch_size: int = Field(
        64,
        ge=1,
        description="Step rows per optimizer step; gradients of its micro-batches accumulate. "
        "A packed trajectory is not split: a mini-batch takes whole sequences until it holds "
        "at least this many rows. Must be a multiple of micro_batch_size.",
    )
    mini_batches: int | None = Field(
        None,
        ge=1,
        description="RL updates: the most optimizer steps per epoch, whatever the number of "
        "step rows. The epoch's rows are split into this many mini-batches of whole groups "
        "(every step of a task's group of episodes in the same one, as verl's mini-batches of "
        "prompts hold their responses), of about equal rows; fewer when mini-batches of "
        "mini_batch_size rows would be fewer (32 one-step episodes at 16 stay 2 steps). The "
        "warm-up keeps mini-batches of mini_batch_size rows. It keeps an env with long "
        "episodes from taking more optimizer steps per update, and so drifting further, than "
        "a short one from the same number of episodes. None: mini-batches of mini_batch_size "
        "rows.",
    )
    micro_batch_tokens: int = Field(
        1024,
        ge=16,
        description="With shared_prefix: most tree positions per micro-batch (micro_batch_size "
        "still caps its sequences). Attention over a tree costs tokens^2, so 512-2048 is the "
        "useful range on a 135M model (bench/update.py --tree-tokens).",
    )
    pack_trajectories: bool = Field(
        True,
        description="Pack each append-only trajectory's steps into one sequence (same gradient, "
        "O(T) instead of O(T^2) tokens); other trajectories train step by step.",
    )
    shared_prefix: bool = Field(
        True,
        description="Merge each micro-batch's sequences into one prefix tree with a tree "
        "attention mask: a prefix shared by many rows (system prompt, worked examples, a "
        "group's task) is processed once. Same loss and gradients; false = left-padded rows. "
        "A VLM's rows merge where each picture is a fixed number of image tokens (LLaVA-style), "
        "each picture told apart by its digest; others stay left-padded.",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="Leave rows whose advantage is exactly 0 out of the update: they carry no "
        "policy gradient, so this only saves compute (the token-mean is over the rest). "
        "Ignored when a value head, a KL loss or an entropy bonus makes such rows matter.",
    )

    # --- Policy loss ---
    # The clipped PPO-style surrogate: the importance ratio's clip ranges and its denominator, how
    # per-token losses reduce to one scalar, and the entropy bonus.
    clip_eps: float = Field(
        0.2, gt=0.0, description="PPO clip range for the importance ratio (1 - eps, 1 + eps)."
    )
    clip_eps_high: float | None = Field(
        None,
        gt=0.0,
        description="Upper clip range (DAPO 'clip-higher'); None = clip_eps.",
    )
    clip_ratio_c: float | None = Field(
        None,
        gt=1.0,
        description="Dual clip (verl): for negative advantages the loss is capped at "
        "-A * clip_ratio_c, e.g. 3.0; None = off.",
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "traj-mean-token-mean"
    ] = Field(
        "token-mean",
        description="How per-token losses reduce to a scalar over a mini-batch: mean over all "
        "response tokens; mean over steps of each step's token sum / token mean; or "
        "traj-mean-token-mean: mean over trajectories (all steps of one episode) of each "
        "trajectory's token mean, so a 6-step failure weighs what a 1-step success weighs.",
    )
    entropy_coef: float = Field(
        0.0, ge=0.0, description="Entropy bonus weight (the loss subtracts coef * entropy)."
    )
    negative_advantage_weight: float = Field(
        1.0,
        ge=0.0,
        description="Multiplies every negative advantage in the policy loss (the stored "
        "advantage and advantage/mean stay the estimator's; the loss-weighted diagnostics, "
        "advantage/weighted_* and loss_weight/*, use the weighted one). 1 = the estimator's "
        "advantages; 0 = only steps that did better than their baseline are reinforced "
        "(positive-sample reinforcement, PSR); above 1 weighs what did worse more "
        "(W-REINFORCE's ratio, positives at 0.1 of negatives, is 10). Rows it zeroes stay in "
        "the loss's weights, so each trajectory still weighs the same.",
    )

    # --- Demonstrations in RL ---
    # A supervised term on the warm-up's demonstrations in every RL optimizer step (InstructGPT's
    # PPO-ptx and OpenRLHF's ptx_coef mix a pretraining loss the same way): RL is pulled back
    # toward what the solver does while it reinforces what the policy's own samples did well.
    demonstration_loss_coef: float = Field(
        0.0,
        ge=0.0,
        description="Weight of the mean negative log-likelihood of demonstration replies (at "
        "temperature 1) added to every RL optimizer step's loss; the demonstrations are the "
        "warm-up's (warmup.source, warmup.path, warmup.tasks: the same rows, whether or not "
        "warmup.enabled). 0 = off. actor/demonstration_nll logs the term before each step.",
    )
    demonstration_rows: int = Field(
        16,
        ge=1,
        description="Demonstration replies (step rows) per RL optimizer step, drawn as whole "
        "demonstration episodes (without replacement within a step, seeded by the run's seed "
        "and the iteration) until they hold at least this many: an episode's steps share "
        "their prompt's start, so its forward costs about one episode's tokens.",
    )

    # --- Off-policy correction ---
    # Rows sampled by another policy than the one the update starts from: a sampler whose
    # log-probs differ from the trainer's (bf16 weights, vLLM), or, with asynchronous training,
    # an older policy. The importance ratio's denominator, and a per-token weight on the
    # policy-gradient loss from the behaviour policy (the stored log-probs) to the proximal one
    # (the trainer's recomputed log-probs).
    old_logprobs: Literal["rollout", "recompute"] = Field(
        "rollout",
        description="Importance-ratio denominator: the log-probs stored at rollout, or "
        "recomputed by the trainer before the update (use when rollout and trainer numerics "
        "differ, e.g. bf16 rollout weights). With recompute the update also logs how the two "
        "differ (actor/off_policy_*, actor/rollout_logprob_diff_*).",
    )
    off_policy_correction: Literal["none", "decoupled", "tis", "mis"] = Field(
        "none",
        description="Weight on each token's clipped loss from rho = pi_proximal / pi_behaviour "
        "(the recomputed probability over the stored one): 'none' = no weight; 'decoupled' = "
        "rho (AReaL's decoupled PPO; unbounded, so for small gaps); 'tis' = min(rho, tis_cap) "
        "(truncated IS, Yao et al. 2025); 'mis' = rho inside [mis_low, mis_high], else the "
        "token is masked (IcePop). Needs old_logprobs=recompute: every weight needs the "
        "proximal log-probs, and given them each method anchors the PPO clip there, so one "
        "choice names both.",
    )
    tis_cap: float = Field(
        2.0,
        ge=1.0,
        description="'tis': the largest weight (verl's and TRL's default 2.0; 1.5-5 typical). "
        ">= 1, so a token both policies agree on keeps weight 1.",
    )
    mis_low: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="'mis': a token with rho below this is masked (IcePop as AReaL ships it: "
        "0.5; 0 = an upper bound only, AReaL's earlier default). < 1, so a token both policies "
        "agree on stays.",
    )
    mis_high: float = Field(
        5.0,
        gt=1.0,
        description="'mis': a token with rho above this is masked (IcePop: 5.0).",
    )

    # --- KL to a reference ---
    # A KL(policy || frozen reference) term in the loss (KL shaped into the reward is
    # algorithm.kl_coef instead). Any coefficient > 0 loads a frozen copy of policy version 0.
    kl_loss_coef: float = Field(
        0.0,
        ge=0.0,
        description="Weight of a KL(policy || frozen reference) term in the loss, reference "
        "log-probs computed in the update. The reference is policy version 0, the policy RL "
        "starts from: the warm-up checkpoint when warmup.enabled, else model.path (with "
        "trainer.lora: model.path's weights under the adapters, before any warm-up).",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Per-token KL estimator of the KL loss: k1 = log ratio, k3 = "
        "exp(-r) + r - 1 (unbiased, >= 0).",
    )
    kl_clamp: float | None = Field(
        None,
        gt=0.0,
        description="Clamp each token's KL-loss estimate to [-kl_clamp, kl_clamp] (verl clamps "
        "k3 to [-10, 10], i.e. 10.0); None = no clamp.",
    )

    # --- Value head ---
    # A value head on the policy and its clipped loss; estimators 'gae' and 'bilevel_gae' need it.
    value_head: bool = Field(
        False,
        description="Add a value head (read at each step's last prompt token) trained with a "
        "clipped value loss; required by estimators 'gae' and 'bilevel_gae'.",
    )
    value_loss_coef: float = Field(0.5, ge=0.0, description="Weight of the value loss.")
    value_clip: float | None = Field(
        0.2, gt=0.0, description="Value-loss clip range around the rollout-time value; None = off."
    )

    # --- Precision and memory ---
    # Numerics of the update's forward/backward and trading compute for activation memory.
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "auto",
        description="Compute dtype of the update: 'bfloat16' = fp32 master weights with bf16 "
        "autocast for forward/backward; 'auto' = bfloat16 where the device's bf16 matmuls are "
        "the fast ones (a CUDA GPU with bf16; a CPU with AVX512-BF16/AMX whose bf16 GEMM a "
        "start-up probe times at >= 1.25x fp32's speed), else float32: without AVX512-BF16/AMX "
        "bf16 falls back to a scalar GEMM, and with AVX512-BF16 alone it can be the slower "
        "one (bench/dtype.py shows the pick on a machine).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory."
    )
    optimizer_state: Literal["float32", "bfloat16", "8bit"] = Field(
        "float32",
        description="How AdamW stores its two moments per trained parameter: 'float32' (8 "
        "bytes); 'bfloat16' (4 bytes: each step computes in fp32 and rounds them back); "
        "'8bit' (about 2 bytes: torchao's AdamW8bit, block-wise quantized, its step compiled "
        "by torch.compile on first use; needs the optim8bit extra). Weights and gradients "
        "stay fp32; the last two change the update's numerics. Needs zero_stage 0.",
    )
    mmap_threshold_mib: float | None = Field(
        None,
        ge=0.25,
        le=32.0,
        description="While the trainer trains, glibc maps every block of this many MiB or more "
        "on its own, so freed gradients, moments and activations leave no free space resident "
        "(None: the process's 4 MiB). 1 cut the 135M model's checkpointed update from 24.7 to "
        "23.1 bytes per parameter at 8 % more time, and took a 360M model's 23 % longer "
        "(docs/scaling.md). Only where the steprl command set the threshold: a "
        "MALLOC_MMAP_THRESHOLD_ in the environment wins.",
    )

    # --- Devices and distribution ---
    # Where the update runs: DeepSpeed's accelerator and ZeRO stage, and the data-parallel ranks
    # (Ray actors in one torch.distributed group) with the resources each reserves.
    accelerator: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="DeepSpeed accelerator: 'auto' = cuda when available, else cpu."
    )
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage (0-3).")
    ranks: int = Field(
        1,
        ge=1,
        description="Data-parallel DeepSpeed ranks of the update: 1 = in the flow's process; "
        "N > 1 = N long-lived Ray actors in one torch.distributed group (gloo on CPU, NCCL on "
        "GPU), each training on its share of every mini-batch (one global batch).",
    )
    rank_cpus: float = Field(
        1.0, gt=0.0, description="Ray CPUs reserved by each trainer rank (trainer.ranks > 1)."
    )
    rank_gpus: float = Field(
        0.0, ge=0.0, description="Ray GPUs reserved by each trainer rank (1 per rank on GPUs)."
    )

    # --- LoRA ---
    # Train low-rank adapters instead of every weight (the trainer.lora sub-section).
    lora: LoraSection | None = Field(
        None,
        description="Train LoRA adapters instead of every weight (e.g. {r: 16, alpha: 32}); "
        "None = full fine-tuning. Checkpoints then hold the merged weights (what rollouts, "
        "evaluation and the MLflow model load) and the PEFT adapter in `adapter/`.",
    )

    # --- Images ---
    # An image-text-to-text policy (a VLM): which of its image weights train.
    train_vision_tower: bool = Field(
        False,
        description="A VLM policy: train its vision encoder too. False keeps the encoder as "
        "it is (its projector into the language model trains either way; with trainer.lora "
        "the projector trains whole beside the language model's adapters). Ignored for a "
        "text model.",
    )

    # --- Checkpoints ---
    # What each iteration's checkpoint holds and how many are kept.
    save_deepspeed_state: bool = Field(
        True,
        description="Save DeepSpeed optimizer state with each checkpoint (exact resume). "
        "Costs about 2x the model size on disk per checkpoint.",
    )
    keep_checkpoints: int = Field(
        2, ge=1, description="Keep this many newest checkpoint folders; older ones are deleted."
    )

    # --- Diagnostics ---
    # Extra measurements of the update that cost compute and change no weights.
    estimate_reward_after_update: bool = Field(
        False,
        description="After the update, one no-grad forward over the iteration's rows gives each "
        "trajectory's log-prob ratio new/old; actor/reward_after_update_estimate is then the "
        "self-normalised, clipped importance estimate of the updated policy's reward on the same "
        "trajectories, beside actor/reward_before_update (an estimate, not a rollout; costs "
        "about a third of one training epoch).",
    )

    @model_validator(mode="after")
    def _lora_fits(self) -> TrainerSection:
        if self.lora is not None and self.zero_stage == 3:
            raise ValueError(
                "trainer.lora with zero_stage=3 is not supported (the adapters are tiny: "
                "partitioning them saves nothing): use zero_stage 0, 1 or 2"
            )
        return self

    @model_validator(mode="after")
    def _compact_moments_unpartitioned(self) -> TrainerSection:
        if self.optimizer_state != "float32" and self.zero_stage != 0:
            raise ValueError(
                f"trainer.optimizer_state={self.optimizer_state!r} needs zero_stage=0 (ZeRO "
                "hands the optimizer flat fp32 partitions of its own): set zero_stage=0 or "
                "optimizer_state=float32"
            )
        return self

    @model_validator(mode="after")
    def _correction_has_proximal(self) -> TrainerSection:
        if self.off_policy_correction != "none" and self.old_logprobs != "recompute":
            raise ValueError(
                f"trainer.off_policy_correction={self.off_policy_correction!r} weighs each "
                "token by pi_proximal / pi_behaviour, and the proximal log-probs are the "
                "trainer's recomputed ones: set trainer.old_logprobs=recompute (or "
                "off_policy_correction=none)"
            )
        return self

    @model_validator(mode="after")
    def _batch_multiple(self) -> TrainerSection:
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"mini_batch_size={self.mini_batch_size} is not a multiple of "
                f"micro_batch_size={self.micro_batch_size}: set mini_batch_size to "
                f"{self.micro_batch_size * max(1, self.mini_batch_size // self.micro_batch_size)}"
            )
        return self


# TrainerSection's fields by group, in field order: the configuration reference prints each
# group as a sub-heading (tests check that the groups hold every field once, in order).
TRAINER_GROUPS: dict[str, tuple[str, ...]] = {
    "Optimisation": (
        "learning_rate",
        "weight_decay",
        "betas",
        "lr_warmup_steps",
        "max_grad_norm",
        "epochs",
        "target_kl",
    ),
    "Batching": (
        "micro_batch_size",
        "mini_batch_size",
        "mini_batches",
        "micro_batch_tokens",
        "pack_trajectories",
        "shared_prefix",
        "skip_zero_advantage",
    ),
    "Policy loss": (
        "clip_eps",
        "clip_eps_high",
        "clip_ratio_c",
        "loss_agg_mode",
        "entropy_coef",
        "negative_advantage_weight",
    ),
    "Demonstrations in RL": ("demonstration_loss_coef", "demonstration_rows"),
    "Off-policy correction": (
        "old_logprobs",
        "off_policy_correction",
        "tis_cap",
        "mis_low",
        "mis_high",
    ),
    "KL to a reference": ("kl_loss_coef", "kl_estimator", "kl_clamp"),
    "Value head": ("value_head", "value_loss_coef", "value_clip"),
    "Precision and memory": (
        "dtype",
        "gradient_checkpointing",
        "optimizer_state",
        "mmap_threshold_mib",
    ),
    "Devices and distribution": ("accelerator", "zero_stage", "ranks", "rank_cpus", "rank_gpus"),
    "LoRA": ("lora",),
    "Images": ("train_vision_tower",),
    "Checkpoints": ("save_deepspeed_state", "keep_checkpoints"),
    "Diagnostics": ("estimate_reward_after_update",),
}
