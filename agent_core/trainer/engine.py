"""`TrainEngine`: the policy (and optional value head) inside a DeepSpeed engine, built once per
process; its forward in the run's compute dtype, micro-batches onto its device (a VLM's with the
pixel values of the images their prompts show), the backward, the guarded optimizer step with
its learning rate, and the state checkpoints hold. A team's engine trains one LoRA adapter per
adapter role beside the shared one (`RoleAdapters`): each micro-batch's forward runs its role's
adapter, each adapter is a param group with its role's learning rate, and each adapter's
gradient is clipped on its own.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch
import torch.distributed as dist

from agent_core.algorithms.losses import token_entropy
from agent_core.models import is_vision_folder
from agent_core.prompting.vision import FIXED_TOKENS, vision_inputs
from agent_core.trainer import lora
from agent_core.trainer.batching import (
    MicroBatch,
    TrainRow,
    TrainSequence,
    collate,
    collate_tree,
    sequence_images,
    sequence_role,
    split_by_role,
    tree_keys,
    tree_microbatches,
)
from agent_core.trainer.checkpoint import gathered_state, load_checkpoint_state, save_checkpoint
from agent_core.trainer.compute_dtype import resolve_compute_dtype
from agent_core.trainer.distributed import (
    any_rank,
    init_process_group,
    select_accelerator,
    single_process_env,
)
from agent_core.trainer.flat_grads import FlatGrads
from agent_core.trainer.optimizers import build_optimizer, set_lr
from agent_core.trainer.policy_module import PolicyModule, freeze_vision_tower, pretrained_lm
from agent_core.trainer.role_adapters import RoleAdapters
from agent_core.trainer.token_logprobs import head_chunkable, head_logprobs, token_logprobs
from agent_core.trainer.update_metrics import UpdateMetrics
from configs.trainer import TrainerSection


class TrainEngine:
    """Owns the DeepSpeed engine of one run (built once per process, reused across
    iterations) and everything that touches it directly."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: TrainerSection,
        seed: int,
        roles: dict[str, str] | None = None,
    ) -> None:
        """`roles`: a team's env.roles (role -> 'shared' | 'adapter'); the adapter roles get
        adapters of their own (needs cfg.lora)."""
        self.cfg = cfg
        self.team = dict(roles or {})
        self.roles: RoleAdapters | None = None
        self.accelerator = select_accelerator(cfg.accelerator)
        with single_process_env():
            init_process_group(self.accelerator)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.engine, self.tokenizer = self._build(Path(model_path), seed)
        self.device = self.engine.device
        self.compute_dtype = resolve_compute_dtype(cfg.dtype, self.device.type)
        if cfg.dtype == "auto" and any_rank(self.compute_dtype != "bfloat16", self.world):
            self.compute_dtype = "float32"  # every rank computes in the same dtype
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        # a VLM's image token: in a prefix tree it carries its picture's digest (`tree_keys`)
        self.image_token = None
        if self.processor is not None:
            self.image_token = self.tokenizer.convert_tokens_to_ids(self.processor.image_token)
        # prefix-tree micro-batches of at most this many positions (None: left-padded ones); a
        # VLM's only where every picture is the same number of image tokens
        seen = self.processor is None or self.module.lm.config.model_type in FIXED_TOKENS
        self.tree = cfg.micro_batch_tokens if cfg.shared_prefix and seen else None
        # one process, ZeRO 0: a step's gradients in one buffer (ranks and ZeRO keep their own)
        self.flat_grads = None
        if cfg.zero_stage == 0 and self.world == 1:
            self.flat_grads = FlatGrads(self.engine.module)

    def _ds_config(self) -> dict:
        return {
            "train_micro_batch_size_per_gpu": self.cfg.micro_batch_size,
            "gradient_accumulation_steps": max(
                1, self.cfg.mini_batch_size // (self.cfg.micro_batch_size * self.world)
            ),
            # a team's adapters are clipped one by one in `step`
            "gradient_clipping": 0.0 if self._own_roles() else self.cfg.max_grad_norm,
            # steprl owns the accumulation boundary: backward per micro-batch, step() per
            # mini-batch (the last mini-batch of an epoch may hold fewer micro-batches).
            "managed_gradient_accumulation": False,
            "zero_optimization": {"stage": self.cfg.zero_stage},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }

    def _own_roles(self) -> tuple[str, ...]:
        return tuple(sorted(r for r, policy in self.team.items() if policy == "adapter"))

    def _build(self, model_path: Path, seed: int):
        import deepspeed
        from transformers import AutoProcessor, AutoTokenizer

        torch.manual_seed(seed)
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=False)
        self.processor = None  # a VLM's: its image inputs, and checkpoints carry it
        if is_vision_folder(lora.base_model_of(model_path)):
            self.processor = AutoProcessor.from_pretrained(model_path, trust_remote_code=False)
        if self.cfg.lora is not None:
            lm = lora.load_lm(model_path, self.cfg.lora)
            if self._own_roles():
                self.roles = RoleAdapters.attach(
                    lm, self._own_roles(), model_path, self.cfg.lora, self.team
                )
        else:
            lm = pretrained_lm(model_path)
        if not self.cfg.train_vision_tower:
            freeze_vision_tower(lm)
        lm.config.use_cache = False
        if self.cfg.gradient_checkpointing:
            lm.gradient_checkpointing_enable()
            if self.cfg.lora is not None:
                lm.enable_input_require_grads()  # frozen embeddings: keep the graph alive
        module = PolicyModule(lm, value_head=self.cfg.value_head)
        module.load_value_head(model_path)
        trainable = [p for p in module.parameters() if p.requires_grad]
        if self.roles is not None:  # a param group per adapter, one for the rest (value head)
            lora_ids = {id(p) for n in self.roles.names for p in self.roles.parameters(n)}
            others = [p for p in trainable if id(p) not in lora_ids]
            trainable = self.roles.param_groups(others, self.cfg.learning_rate)
        optimizer = build_optimizer(trainable, self.cfg)  # LoRA: adapters + value head
        engine, *_ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=self._ds_config()
        )
        if self.cfg.zero_stage == 0 and self.world == 1:
            # One process has nothing to average: skip DeepSpeed's flatten + all-reduce + copy
            # back of every gradient at each step (0.66 s per 135M-parameter step on 1 CPU core).
            engine.enable_backward_allreduce = False
        engine.train()
        return engine, tokenizer

    @property
    def module(self) -> PolicyModule:
        """The policy module the engine trains."""
        return self.engine.module

    def autocast(self):
        """The forward's autocast: bf16 when the compute dtype is bf16, else none."""
        if self.compute_dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def logprobs(
        self,
        module,
        batch: MicroBatch,
        with_values: bool,
        temperature: float,
        entropy: str = "none",
    ):
        """A forward of `module` (the engine, the policy module or a reference) over `batch`:
        per-token log-probs [N] under softmax(logits / temperature), each token's entropy [N]
        (`entropy`: 'metric' = without gradient, 'loss' = differentiable, 'none' = None) and
        values [S] (or None); a team's forward runs the batch's adapter. The logits [N, V] and
        their fp32 log-softmax exist a chunk of rows at a time (`head_logprobs`); a head that
        is not a plain linear layer in this process gives whole logits, log-softmaxed a chunk
        at a time (`token_logprobs`); a differentiable entropy needs all of both."""
        team = self.roles.active(batch.adapter) if self.roles else contextlib.nullcontext()
        lm_head = getattr(module, "module", module).lm.get_output_embeddings()
        chunked = entropy != "loss" and head_chunkable(lm_head)
        with self.autocast(), team:
            out, values = module(
                batch.input_ids,
                batch.attention_mask,
                batch.position_ids,
                batch.token_pos,
                batch.value_pos if with_values else None,
                batch.vision,
                head=not chunked,
            )
        if chunked:  # `out`: the last hidden states
            dtype = torch.bfloat16 if self.compute_dtype == "bfloat16" else lm_head.weight.dtype
            logp, entropies = head_logprobs(
                out, lm_head.weight, batch.targets, temperature, entropy == "metric", dtype
            )
            return logp, entropies, values
        logits = out
        if entropy == "loss":
            logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
            logp = logp_all.gather(-1, batch.targets[:, None]).squeeze(-1)
            return logp, token_entropy(logp_all), values
        logp, entropies = token_logprobs(logits, batch.targets, temperature, entropy == "metric")
        return logp, entropies, values

    def collate(self, sequences: list[TrainSequence], rows: list[TrainRow]) -> MicroBatch:
        """One micro-batch of `sequences` on the engine's device: a prefix tree with
        trainer.shared_prefix, else left-padded rows (a VLM's with the pixel values of the
        images each sequence shows)."""
        first = rows[sequences[0].spans[0][0]]
        model_type = self.module.lm.config.model_type
        if self.tree is not None:  # a prefix tree's pictures: one prompt showing each once
            batch, pictures = collate_tree(sequences, rows, self.tree_keys(sequences, rows))
            shown = [pictures] if pictures else []
        else:
            batch = collate(sequences, rows, self.pad_id)
            shown = sequence_images(sequences, rows) if self.processor is not None else []
        if any(shown):
            batch.vision = vision_inputs(self.processor, model_type, shown)
        batch.role, batch.adapter = first.role, first.adapter
        return batch.to(self.device)

    def micro_batches(
        self, sequences: list[TrainSequence], rows: list[TrainRow] | None = None
    ) -> list[list[TrainSequence]]:
        """`sequences` in micro-batches of trainer.micro_batch_size (with shared_prefix, prefix
        trees within micro_batch_tokens positions); rows of several roles (a team's, `rows`
        given) are split so that each micro-batch holds one role's."""
        size, everything = self.cfg.micro_batch_size, list(range(len(sequences)))
        if self.tree is not None:
            keys = self.tree_keys(sequences, rows)
            micros = tree_microbatches(keys, everything, size, self.tree)
        else:
            micros = [everything[start : start + size] for start in range(0, len(everything), size)]
        if rows is not None and any(r.role for r in rows):
            micros = split_by_role(micros, [sequence_role(s, rows) for s in sequences])
        return [[sequences[i] for i in micro] for micro in micros]

    def tree_keys(
        self, sequences: list[TrainSequence], rows: list[TrainRow] | None
    ) -> list[list[int]]:
        """What prefix trees of `sequences` merge on: their token ids, a VLM's image tokens
        standing for their pictures (`batching.tree_keys`)."""
        if self.tree is None or rows is None:
            return [seq.input_ids for seq in sequences]
        return tree_keys(sequences, sequence_images(sequences, rows), self.image_token)

    def backward(self, loss: torch.Tensor, weight: float) -> None:
        """Backward of a micro-batch loss that is already a share of the global mini-batch
        aggregate. DeepSpeed averages gradients over ranks, so the loss is scaled by the rank
        count to make the reduced gradient the global sum (`weight` 0: a padding pass). A
        non-finite loss on any rank skips this backward on every rank."""
        if any_rank(not torch.isfinite(loss), self.world):
            raise FloatingPointError("non-finite loss")
        self.engine.backward(loss * (weight * self.world), scale_wrt_gas=False)

    def begin_step(self, backwards: int) -> None:
        """Before an optimizer step's `backwards` backward passes: with several, the step's
        gradients go into one buffer (`FlatGrads`: no arena fragments from them); a single one
        lets autograd allocate each weight's gradient as the backward frees the activations
        above it, so the gradients never sit beside a whole micro-batch's activations."""
        if self.flat_grads is not None and backwards > 1:
            self.flat_grads.install()

    def zero_grad(self) -> None:
        """Drop the accumulated gradients (a mini-batch whose step is not taken)."""
        self.engine.zero_grad()
        if self.flat_grads is not None:
            self.flat_grads.release()

    def step(self, metrics: UpdateMetrics, sums: dict, done: int, scheduled: bool) -> None:
        """One optimizer step on the accumulated gradients, unless no micro-batch of any rank
        added a finite one or the gradient is not finite (then the step is skipped).
        `scheduled`: the step's learning rate is RL's (`_set_lr`), else the param groups keep
        the one they hold (the warm-up's)."""
        if not any_rank(done > 0, self.world):  # every micro-batch had a non-finite loss
            self.zero_grad()
            metrics.skipped_steps += 1
            return
        if self.flat_grads is not None:
            self.flat_grads.settle()
        norm = self._grad_norm()
        if norm is not None and self.roles is not None and math.isfinite(norm):
            for adapter, own in self._clip_each_group().items():
                for key, value in ((f"grad_norm/{adapter}", own), (f"grad_steps/{adapter}", 1)):
                    sums[key] = sums.get(key, 0.0) + value
        if norm is not None and any_rank(not math.isfinite(norm), self.world):
            # a non-finite gradient never reaches the weights (or a checkpoint)
            self.zero_grad()
            metrics.skipped_steps += 1
            return
        sums["lr"] = sums.get("lr", 0.0) + self._set_lr(scheduled)
        self.engine.step()
        if self.flat_grads is not None:
            self.flat_grads.release()
        if norm is None or self.world > 1:  # the local norm is not the global one
            norm = self.engine.get_global_grad_norm()
        sums["norm"] = sums.get("norm", 0.0) + float(norm or 0.0)
        metrics.optimizer_steps += 1

    def _clip_each_group(self) -> dict[str, float]:
        """A team's param groups clipped one by one to trainer.max_grad_norm (one role's large
        gradient does not shrink another's step); returns each adapter's norm before clipping
        (a group with no gradient, an adapter with no rows in this step, is left out)."""
        norms = {}
        for group in self.engine.optimizer.param_groups:
            grads = [p.grad for p in group["params"] if p.grad is not None]
            if not grads:
                continue
            norm = torch.nn.utils.clip_grad_norm_(
                [p for p in group["params"] if p.grad is not None], self.cfg.max_grad_norm
            )
            if group.get("adapter") is not None:
                norms[group["adapter"]] = float(norm)
        return norms

    @contextlib.contextmanager
    def training_only(self, parts: tuple[str, ...]):
        """Within the block only the trainable weights whose name has one of `parts` (module
        names, e.g. a VLM's projector) get gradients and optimizer steps; the others keep
        their weights and optimizer state untouched. `parts` empty: everything trains as
        configured. Needs trainer.zero_stage 0 (ZeRO 1-3 partition the weights at build)."""
        if not parts:
            yield
            return
        if self.cfg.zero_stage != 0:
            raise ValueError(
                f"training only {', '.join(parts)} needs trainer.zero_stage=0 (now "
                f"{self.cfg.zero_stage}): ZeRO partitions every trainable weight when the "
                "engine is built"
            )
        held = [
            param
            for name, param in self.engine.module.named_parameters()
            if param.requires_grad and not set(parts) & set(name.split("."))
        ]
        if len(held) == sum(p.requires_grad for p in self.engine.module.parameters()):
            raise ValueError(f"the policy has no trainable weights under {', '.join(parts)}")
        for param in held:
            param.requires_grad_(False)
        try:
            yield
        finally:
            for param in held:
                param.requires_grad_(True)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set every param group's learning rate (the warm-up's own; an RL step sets its own
        again)."""
        for group in self.engine.optimizer.param_groups:
            set_lr(group, learning_rate)

    def _set_lr(self, scheduled: bool) -> float:
        """The learning rate of the coming optimizer step, set on every param group: an RL
        step's is trainer.learning_rate, times (t / lr_warmup_steps) while the optimizer's t-th
        step is within trainer.lr_warmup_steps (t counts every step of its AdamW state: a state
        carried from the warm-up counts the warm-up's); the warm-up keeps its own."""
        groups = self.engine.optimizer.param_groups
        if not scheduled:
            return float(groups[0]["lr"])
        lr = self.cfg.learning_rate
        ramp = 1.0
        if self.cfg.lr_warmup_steps:
            ramp = min(1.0, (self._optimizer_age() + 1) / self.cfg.lr_warmup_steps)
        for group in groups:
            base = self.roles.base_rate(group, lr) if self.roles is not None else lr
            set_lr(group, base * ramp)
        return lr * ramp

    def _optimizer_age(self) -> int:
        """Optimizer steps the AdamW state has taken (0 for fresh moments): the most any
        parameter's state counts (AdamW skips a parameter in a step that gave it no gradient)."""
        optimizer = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        steps = [int(s["step"]) for s in optimizer.state.values() if "step" in s]
        return max(steps, default=0)

    def _grad_norm(self) -> float | None:
        """L2 norm of the accumulated gradients before the step (ZeRO 0/1 keep full grads on
        the parameters); None under ZeRO 2/3, where DeepSpeed reports it after the step."""
        if self.cfg.zero_stage >= 2:
            return None
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])))

    def lm_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (gathered) LM weights, for the rollout engine and HF checkpoints. Under ZeRO-3
        every rank must call it (a collective gather); only rank 0 gets the weights. A team's:
        the base weights and every adapter (`RoleAdapters.engine_state`)."""
        if self.roles is not None:
            return self.roles.engine_state()
        return gathered_state(self.engine, self.cfg, "lm.")

    def save(self, checkpoint_dir: Path, metadata: dict, on_half_written=None) -> Path:
        """Write checkpoint `checkpoint_dir` (every rank calls this; see `save_checkpoint`)."""
        return save_checkpoint(
            self.engine,
            self.processor or self.tokenizer,  # a VLM's folder carries its processor
            self.cfg,
            self.rank,
            self.world,
            checkpoint_dir,
            metadata,
            on_half_written,
            self.roles,
        )

    def load_state(self, checkpoint_dir: Path) -> bool:
        """Restore optimizer + weights from a checkpoint's DeepSpeed state; False if it has none.
        The optimizer's moments come from the checkpoint, its settings (learning rate, betas,
        weight decay) from this run's config: the saved param groups would otherwise replace a
        learning rate changed since the checkpoint was written."""
        loaded = load_checkpoint_state(self.engine, self.cfg, self.world, checkpoint_dir)
        for group in self.engine.optimizer.param_groups:
            set_lr(group, self.cfg.learning_rate)
            group["betas"] = tuple(self.cfg.betas)
            group["weight_decay"] = self.cfg.weight_decay
        return loaded
