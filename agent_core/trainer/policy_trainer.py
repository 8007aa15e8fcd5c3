"""`PolicyTrainer`: the HF causal LM inside a DeepSpeed engine, one clipped policy-gradient
update per iteration, and checkpoints as Hugging Face folders plus DeepSpeed state.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from agent_core.algorithms.losses import (
    PolicyLossOutput,
    clipped_policy_loss,
    token_entropy,
    token_logprobs,
)
from agent_core.trainer.batching import MicroBatch, TrainRow, collate, plan_minibatches
from agent_core.trainer.distributed import init_process_group, select_accelerator
from configs.run_config import TrainerSection

DS_STATE_DIR = "deepspeed"
LATEST_FILE = "latest"


@dataclass
class UpdateMetrics:
    """What one update reports (means over optimizer steps or response tokens)."""

    policy_loss: float = 0.0
    grad_norm: float = 0.0
    clip_fraction: float = 0.0
    approx_kl: float = 0.0
    ratio_mean: float = 0.0
    entropy: float = 0.0
    optimizer_steps: int = 0
    skipped_steps: int = 0
    nonfinite_losses: int = 0
    rows: int = 0
    trained_tokens: int = 0
    padded_tokens: int = 0
    seconds: float = 0.0


class PolicyTrainer:
    """Owns the DeepSpeed engine for one run (build once per process, reuse across iterations)."""

    def __init__(
        self, model_path: str | Path, cfg: TrainerSection, temperature: float, seed: int
    ) -> None:
        self.cfg = cfg
        self.temperature = temperature
        self.seed = seed
        self.accelerator = select_accelerator(cfg.accelerator)
        init_process_group(self.accelerator)
        self.engine, self.tokenizer = self._build(model_path)
        self.device = self.engine.device
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id

    def _ds_config(self) -> dict:
        return {
            "train_micro_batch_size_per_gpu": self.cfg.micro_batch_size,
            "gradient_accumulation_steps": self.cfg.mini_batch_size // self.cfg.micro_batch_size,
            "gradient_clipping": self.cfg.max_grad_norm,
            # steprl owns the accumulation boundary: backward per micro-batch, step() per mini-batch
            # (mini-batches may hold fewer micro-batches than configured at the end of an epoch).
            "managed_gradient_accumulation": False,
            "zero_optimization": {"stage": self.cfg.zero_stage},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }

    def _build(self, model_path: str | Path):
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(self.seed)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        model.config.use_cache = False
        # A client torch AdamW avoids compiling DeepSpeed's Adam ops on CPU.
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=self.cfg.learning_rate,
            betas=self.cfg.betas,
            weight_decay=self.cfg.weight_decay,
        )
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self._ds_config()
        )
        engine.train()
        return engine, tokenizer

    def _autocast(self):
        if self.cfg.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward_logprobs(self, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Response-token log-probs and entropies, both [B, R] (right-aligned like the mask)."""
        width = batch.response_mask.shape[1]
        with self._autocast():
            out = self.engine(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                logits_to_keep=width + 1,
                use_cache=False,
            )
        logits = out.logits.float()  # [B, R + 1, V]; position j predicts the token at j + 1
        targets = batch.input_ids[:, -width - 1 :]
        logp = token_logprobs(logits, targets, self.temperature)[:, 1:]
        with torch.no_grad():
            ent = token_entropy(logits, self.temperature)[:, 1:]
        return logp, ent

    def update(self, rows: list[TrainRow], iteration: int) -> UpdateMetrics:
        """Run `epochs` passes of clipped policy-gradient steps over `rows` (one optimizer step
        per mini-batch; its gradient is the token-mean over the mini-batch's response tokens)."""
        start = time.perf_counter()
        metrics = UpdateMetrics(rows=len(rows))
        lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
        sums = dict.fromkeys(("loss", "clip", "kl", "ratio", "ent", "norm"), 0.0)
        micro_count = 0
        for epoch in range(self.cfg.epochs):
            seed = self.seed + 1000 * iteration + epoch
            plan = plan_minibatches(
                lengths, self.cfg.mini_batch_size, self.cfg.micro_batch_size, seed
            )
            for mini in plan:
                token_count = sum(len(rows[i].response_ids) for micro in mini for i in micro)
                for micro in mini:
                    batch = collate([rows[i] for i in micro], self.pad_id).to(self.device)
                    try:
                        out, ent = self._micro_backward(batch, token_count)
                    except FloatingPointError:
                        metrics.nonfinite_losses += 1  # this micro-batch adds no gradient
                        continue
                    micro_count += 1
                    sums["loss"] += out.loss.item()
                    sums["clip"] += out.clip_fraction
                    sums["kl"] += out.approx_kl
                    sums["ratio"] += out.ratio_mean
                    sums["ent"] += ent
                    metrics.trained_tokens += batch.response_tokens
                    metrics.padded_tokens += int(batch.input_ids.numel())
                norm = self._grad_norm()
                if norm is not None and not math.isfinite(norm):
                    # a non-finite gradient never reaches the weights (or a checkpoint)
                    self.engine.zero_grad()
                    metrics.skipped_steps += 1
                    continue
                self.engine.step()
                norm = norm if norm is not None else self.engine.get_global_grad_norm()
                sums["norm"] += float(norm or 0.0)
                metrics.optimizer_steps += 1
        steps, n_micro = max(1, metrics.optimizer_steps), max(1, micro_count)
        metrics.policy_loss = sums["loss"] / steps
        metrics.grad_norm = sums["norm"] / steps
        metrics.clip_fraction = sums["clip"] / n_micro
        metrics.approx_kl = sums["kl"] / n_micro
        metrics.ratio_mean = sums["ratio"] / n_micro
        metrics.entropy = sums["ent"] / n_micro
        metrics.seconds = time.perf_counter() - start
        return metrics

    def _grad_norm(self) -> float | None:
        """L2 norm of the accumulated gradients before the step (ZeRO 0/1 keep full grads on
        the parameters); None under ZeRO 2/3, where DeepSpeed reports it after the step."""
        if self.cfg.zero_stage >= 2:
            return None
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])))

    def _micro_backward(
        self, batch: MicroBatch, token_count: int
    ) -> tuple[PolicyLossOutput, float]:
        logp, ent = self._forward_logprobs(batch)
        out = clipped_policy_loss(
            logp,
            batch.old_logprobs,
            batch.advantages,
            batch.response_mask,
            self.cfg.clip_eps,
            token_count=token_count,
        )
        if not torch.isfinite(out.loss):
            raise FloatingPointError("non-finite policy loss")
        self.engine.backward(out.loss, scale_wrt_gas=False)
        mean_ent = float((ent * batch.response_mask).sum() / batch.response_mask.sum().clamp(min=1))
        return out, mean_ent

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full (gathered) model weights, for the rollout engine and HF checkpoints."""
        if self.cfg.zero_stage == 3:
            return self.engine._zero3_consolidated_16bit_state_dict()
        return self.engine.module.state_dict()

    def save(self, checkpoint_dir: Path, metadata: dict) -> Path:
        """Write the HF folder (+ DeepSpeed state) to `checkpoint_dir` atomically."""
        tmp = checkpoint_dir.with_name(checkpoint_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.engine.module.save_pretrained(tmp, state_dict=self.state_dict())
        self.tokenizer.save_pretrained(tmp)
        if self.cfg.save_deepspeed_state:
            self.engine.save_checkpoint(str(tmp / DS_STATE_DIR), tag="state")
        (tmp / "steprl.json").write_text(json.dumps(metadata, indent=2, default=str))
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        tmp.rename(checkpoint_dir)
        return checkpoint_dir

    def load_state(self, checkpoint_dir: Path) -> bool:
        """Restore optimizer + weights from a checkpoint's DeepSpeed state; False if it has none."""
        state = checkpoint_dir / DS_STATE_DIR
        if not state.is_dir():
            return False
        self.engine.load_checkpoint(str(state), tag="state")
        return True


def metrics_dict(metrics: UpdateMetrics) -> dict[str, float]:
    """`UpdateMetrics` as a flat dict with finite floats."""
    return {
        k: (float(v) if math.isfinite(float(v)) else float("nan"))
        for k, v in asdict(metrics).items()
    }
