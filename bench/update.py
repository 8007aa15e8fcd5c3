"""Policy-update throughput on the demo's batch shape: before (left-padded micro-batches of 8
unpacked rows, the old demo settings) vs after (the defaults: append-only packing and prefix-tree
micro-batches that process a shared prefix once), full fine-tuning and LoRA, plus steprl's
DeepSpeed `PolicyTrainer` vs a plain torch loop on the same batches (the framework's overhead).

Rows are shaped like the calculator demo's: one ~196-token system prompt with worked examples
shared by every row, a ~35-token task shared by a group of 4, 1-3 append-only steps of 30-48 then
5-40 response tokens with 10-20 tokens of tool output between. All variants train the same rows
with the same clipped PG loss, AdamW, clipping and dtype in one process, best of N. Prints
seconds, trained tokens/s, processed tokens, FLOP utilisation against a 2048-square matmul
roofline measured here, and after/before ratios.
Run: .venv/bin/python bench/update.py [--rows 32 --repeats 1 --tree-tokens 1024 --threads 2]
(~5 min on 2 cores); --smoke: a tiny random model, 8 rows, one round (seconds).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from offline import DEFAULT_MODEL, SMOKE_HELP, add_record_option, figure, prepare, write_record

from agent_core.algorithms.losses import clipped_policy_loss
from agent_core.trainer.batching import TrainRow, build_sequences, collate_tree
from agent_core.trainer.compute_dtype import resolve_compute_dtype
from agent_core.trainer.policy_module import PolicyModule
from agent_core.trainer.policy_trainer import PolicyTrainer
from configs.lora import LoraSection
from configs.trainer import TrainerSection

TEMPERATURE, SEED, GROUP = 0.7, 0, 4
SYSTEM, TASK, MAX_STEPS = 196, (30, 40), 3
FIRST, LATER, FEEDBACK = (30, 48), (5, 40), (10, 20)


def synthetic_rows(count: int, vocab: int, seed: int) -> list[TrainRow]:
    """`count` step rows of demo-shaped append-only trajectories, GROUP per task."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    system = tokens(SYSTEM)
    rows: list[TrainRow] = []
    while len(rows) < count:
        task = system + tokens(rng.randint(*TASK))
        for member in range(GROUP):
            traj, prompt = f"t{len(rows)}-{member}", list(task)
            for k in range(rng.randint(1, MAX_STEPS)):
                response = tokens(rng.randint(*(FIRST if k == 0 else LATER)))
                old = [-rng.uniform(0.05, 3.0) for _ in response]
                rows.append(TrainRow(prompt, response, old, rng.gauss(0, 1), 0.0, 0.0, traj, k))
                prompt = prompt + response + tokens(rng.randint(*FEEDBACK))
    return rows[:count]


def matmul_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` GFLOP/s of a size² matmul: the roofline the model's FLOPs are held to."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b  # warm-up (kernel selection)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


@dataclass(frozen=True)
class FlopModel:
    """Forward FLOPs of the policy module: body matmuls per token, attention per token and
    context length, and the LM head only at response positions."""

    body_per_token: float
    attn_per_token_ctx: float
    head_per_logit: float

    @classmethod
    def of(cls, module: PolicyModule) -> FlopModel:
        cfg = module.lm.config
        decoder = module.lm.get_decoder()
        linear = sum(m.weight.numel() for m in decoder.modules() if isinstance(m, torch.nn.Linear))
        head_dim = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
        attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim  # QK^T and AV
        return cls(2.0 * linear, float(attn), 2.0 * cfg.hidden_size * cfg.vocab_size)

    def train_flops(
        self, widths_counts: list[tuple[int, int]], logits: int, frozen: bool = False
    ) -> float:
        """≈ 3 × forward FLOPs over micro-batches of `count` sequences of `width` tokens
        (forward, gradients of activations, gradients of weights); 2 × with `frozen` base
        weights (LoRA: no weight gradients but the adapters' few)."""
        fwd = sum(
            n * w * (self.body_per_token + self.attn_per_token_ctx * w) for w, n in widths_counts
        )
        return (2.0 if frozen else 3.0) * (fwd + self.head_per_logit * logits)


class PlainLoop:
    """The same update in plain torch on a trainer's own PolicyModule (same weights, no second
    copy in memory), with the trainer's micro-batches, its own fused AdamW, clip_grad_norm_ and
    autocast; the DeepSpeed engine is bypassed entirely."""

    def __init__(self, trainer: PolicyTrainer) -> None:
        self.trainer, self.cfg = trainer, trainer.cfg
        self.module: PolicyModule = trainer.engine.module
        self.optimizer = torch.optim.AdamW(
            [p for p in self.module.parameters() if p.requires_grad],
            lr=self.cfg.learning_rate,
            betas=self.cfg.betas,
            weight_decay=self.cfg.weight_decay,
            fused=True,
        )

    def update(self, rows: list[TrainRow], iteration: int) -> float:
        """One epoch over `rows` like `PolicyTrainer.update`; returns seconds."""
        start, cfg = time.perf_counter(), self.cfg
        sequences, _ = build_sequences(rows, cfg.pack_trajectories)
        for mini in self.trainer.rl_update.minibatch_plan(sequences, rows, iteration, 0):
            micros = [[sequences[i] for i in mb] for mb in mini]
            tokens = sum(e - s for seqs in micros for q in seqs for _, s, e in q.spans)
            steps = sum(len(q.spans) for seqs in micros for q in seqs)
            for seqs in micros:
                self._micro(self.trainer.train_engine.collate(seqs, rows), tokens, steps)
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    def _micro(self, batch, token_count: int, step_count: int) -> None:
        with self.trainer.train_engine.autocast():
            logits, _ = self.module(
                batch.input_ids, batch.attention_mask, batch.position_ids, batch.token_pos
            )
        logp = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
        logp = logp.gather(-1, batch.targets[:, None]).squeeze(-1)[None]
        loss = clipped_policy_loss(
            logp,
            batch.old_logprobs[None],
            batch.advantages[batch.token_step][None],
            torch.ones_like(logp),
            self.cfg.clip_eps,
            token_count=token_count,
            seq_count=step_count,
            mode=self.cfg.loss_agg_mode,
            segments=batch.token_step[None],
        ).loss
        loss.backward()


def micro_shapes(trainer: PolicyTrainer, rows: list[TrainRow]) -> list[tuple[int, int]]:
    """(width, sequences) of each micro-batch the trainer runs: a padded batch's longest
    sequence and its count, or a prefix tree's positions and 1."""
    sequences, _ = build_sequences(rows, trainer.cfg.pack_trajectories)
    shapes = []
    for mini in trainer.rl_update.minibatch_plan(sequences, rows, 1, 0):
        for micro in mini:
            seqs = [sequences[i] for i in micro]
            if trainer.train_engine.tree is not None:
                shapes.append((collate_tree(seqs, rows)[0].input_ids.shape[1], 1))
            else:
                shapes.append((max(len(q.input_ids) for q in seqs), len(seqs)))
    return shapes


@dataclass
class Result:
    """One variant's best update and what it processed."""

    name: str
    seconds: float
    trained_tokens: int
    processed_tokens: int
    flops: float  # processed, incl. padding / tree attention
    row_flops: float  # what the rows need trained one by one, unpadded and unshared
    plain_seconds: float | None = None


def run_variant(
    name: str, model: Path, cfg: TrainerSection, rows, repeats: int, plain: bool
) -> Result:
    """Build a trainer for `cfg`, warm it up on two rows, then best of `repeats` updates (and
    the plain torch loop on the same batches, alternating, when `plain`)."""
    trainer = PolicyTrainer(model, cfg, TEMPERATURE, SEED)
    loop = PlainLoop(trainer) if plain else None
    trainer.update(rows[:2], iteration=1)
    if loop is not None:
        loop.update(rows[:2], iteration=1)
    trainer.engine.zero_grad()
    best, plain_best = float("inf"), float("inf")
    for it in range(1, repeats + 1):
        metrics = trainer.update(rows, iteration=1)
        best = min(best, metrics.seconds)
        line = f"  {name} round {it}: {metrics.seconds:.2f} s"
        if loop is not None:
            plain_s = loop.update(rows, iteration=1)
            plain_best = min(plain_best, plain_s)
            line += f", plain torch {plain_s:.2f} s"
        print(line, flush=True)
    shapes = micro_shapes(trainer, rows)
    fm = FlopModel.of(trainer.engine.module)
    frozen = cfg.lora is not None
    flops = fm.train_flops(shapes, metrics.trained_tokens, frozen)
    real = [(len(r.prompt_ids) + len(r.response_ids), 1) for r in rows]
    result = Result(
        name,
        best,
        metrics.trained_tokens,
        metrics.padded_tokens,
        flops,
        fm.train_flops(real, metrics.trained_tokens, frozen),
        plain_best if loop is not None else None,
    )
    del trainer, loop
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--rows", type=int, default=32, help="step rows per update")
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds after warm-up")
    parser.add_argument("--tree-tokens", type=int, default=1024, help="trainer.micro_batch_tokens")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0 = torch's default). On a shared box 1 can beat 2: every "
        "parallel op waits for a thread the OS has given to another process",
    )
    add_record_option(parser)
    args = parser.parse_args()
    if args.smoke:  # 8 short rows, one timed round
        args.rows, args.repeats, args.tree_tokens = 8, 1, 256
    return args


def main() -> int:
    args = parse_args()
    if not prepare(args):
        return 0
    common = {
        "dtype": resolve_compute_dtype(args.dtype, "cpu"),  # the plain loop needs the real one
        "learning_rate": 5e-6,
        "mini_batch_size": 64,
        "save_deepspeed_state": False,
    }
    before = TrainerSection(
        **common, micro_batch_size=8, pack_trajectories=False, shared_prefix=False
    )
    after = TrainerSection(**common, micro_batch_size=64, micro_batch_tokens=args.tree_tokens)
    after_lora = after.model_copy(update={"lora": LoraSection()})
    vocab = vocab_size(args.model)
    rows = synthetic_rows(args.rows, vocab, SEED)
    print(
        f"{args.model.name}, {common['dtype']}, {torch.get_num_threads()} threads; {len(rows)} "
        f"rows ({len({r.trajectory_id for r in rows})} trajectories): prompts "
        f"{min(len(r.prompt_ids) for r in rows)}-{max(len(r.prompt_ids) for r in rows)} tokens, "
        f"responses {np.mean([len(r.response_ids) for r in rows]):.1f} tokens mean"
    )
    size = 256 if args.smoke else 2048
    # the roofline of the dtype the update computes in (a bf16 matmul without native bf16
    # runs a scalar fallback: timing it here would take minutes and mean nothing)
    roof_dtype = torch.bfloat16 if common["dtype"] == "bfloat16" else torch.float32
    roofs = [matmul_gflops(roof_dtype, size)]
    wall, cpu = time.perf_counter(), time.process_time()
    results = [
        run_variant("before", args.model, before, rows, args.repeats, plain=False),
        run_variant("after", args.model, after, rows, args.repeats, plain=True),
        run_variant("after, LoRA", args.model, after_lora, rows, args.repeats, plain=False),
    ]
    cores = (time.process_time() - cpu) / (time.perf_counter() - wall)
    roofs.append(matmul_gflops(roof_dtype, size))
    roof = max(roofs)
    print(
        f"CPU this process got while timed: {cores:.2f} of {torch.get_num_threads()} threads; "
        f"{common['dtype']} matmul roofline here ({size}², best of before/after): {roof:.0f} "
        "GFLOP/s"
    )
    figure(f"{common['dtype']} {size}² matmul: GFLOP/s", roof)
    report(results, roof)
    write_record(args, dtype=common["dtype"])
    return 0


def report(results: list[Result], roof: float) -> None:
    """Each variant's seconds, tokens/s and FLOP utilisation, after against before, and the
    DeepSpeed trainer against the plain loop."""
    print(
        f"{'variant':>12} {'seconds':>8} {'trained tok/s':>14} {'processed tok':>14} "
        f"{'HW util':>8} {'MFU (rows)':>11}"
    )
    for r in results:
        print(
            f"{r.name:>12} {r.seconds:8.2f} {r.trained_tokens / r.seconds:14.1f} "
            f"{r.processed_tokens:14d} {r.flops / r.seconds / 1e9 / roof:8.0%} "
            f"{r.row_flops / r.seconds / 1e9 / roof:11.0%}"
        )
        figure(f"{r.name}: seconds", r.seconds)
        figure(f"{r.name}: trained tokens/s", r.trained_tokens / r.seconds)
        figure(f"{r.name}: processed tokens", r.processed_tokens)
    print(
        "HW util: FLOPs processed (incl. padding and tree attention) per second / roofline; "
        "MFU (rows): the FLOPs the rows need trained one by one, unpadded and unshared, per "
        "second / roofline (above 100 % means work was shared)"
    )
    base = results[0]
    for r in results[1:]:
        print(
            f"{r.name} vs before: {base.seconds / r.seconds:.2f}x trained tokens/s, "
            f"{base.processed_tokens / r.processed_tokens:.2f}x fewer processed tokens"
        )
        figure(f"{r.name} / before: trained tokens/s", base.seconds / r.seconds)
    plain = results[1]
    overhead = plain.seconds / plain.plain_seconds - 1.0
    print(
        f"DeepSpeed PolicyTrainer overhead vs plain torch: {overhead:+.1%} (after: "
        f"{plain.seconds:.2f} s vs {plain.plain_seconds:.2f} s; goal <= 10%)"
    )
    figure("DeepSpeed trainer / plain torch loop: seconds", plain.seconds / plain.plain_seconds)


def vocab_size(model: Path) -> int:
    """The vocabulary size of the model folder's config."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).vocab_size


if __name__ == "__main__":
    sys.exit(main())
