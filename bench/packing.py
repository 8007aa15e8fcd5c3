"""Append-only packing vs unpacked steps: tokens processed and forward+backward seconds of one
trajectory's clipped policy loss, for T = 2, 4, 8 steps, on a small random-init Llama (CPU).

Unpacked = the trainer's way: the T steps left-padded into one micro-batch, logits kept for the
last R + 1 positions. Packed = one sequence, logits only where a response token is predicted.
Best of 3, same process. Run: .venv/bin/python bench/packing.py (about a minute on 2 cores).
"""

from __future__ import annotations

import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agent_core.algorithms.losses import clipped_policy_loss, token_logprobs
from agent_core.algorithms.packing import logit_mask, pack_trajectory, scatter_to_packed
from agent_core.trainer.batching import TrainRow, collate

VOCAB, SYSTEM, RESPONSE, FEEDBACK = 32000, 200, 40, 30
REPEATS = 3


def build_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    return LlamaForCausalLM(config).float().train()


def trajectory(n_steps: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Append-only: system prompt, then each step appends a response and the env's feedback."""
    prompt = [rng.randrange(VOCAB) for _ in range(SYSTEM)]
    steps = []
    for _ in range(n_steps):
        response = [rng.randrange(VOCAB) for _ in range(RESPONSE)]
        steps.append((list(prompt), response))
        prompt = prompt + response + [rng.randrange(VOCAB) for _ in range(FEEDBACK)]
    return steps


def unpacked_step(model, steps, advantages: list[float]) -> int:
    """Forward+backward of the steps as padded rows (like PolicyTrainer); returns tokens."""
    rows = [
        TrainRow(p, r, [-10.4] * len(r), a) for (p, r), a in zip(steps, advantages, strict=True)
    ]
    batch = collate(rows, pad_id=0)
    width = batch.response_mask.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=width + 1,
    )
    logp = token_logprobs(out.logits, batch.input_ids[:, -width - 1 :], 1.0)[:, 1:]
    loss = clipped_policy_loss(
        logp, batch.old_logprobs, batch.advantages, batch.response_mask, 0.2
    ).loss
    loss.backward()
    return int(batch.input_ids.numel())


def packed_step(model, steps, advantages: list[float]) -> int:
    """Forward+backward of the trajectory as one packed sequence; returns tokens."""
    packed = pack_trajectory(steps)
    ids, mask = packed.input_ids[None], packed.loss_mask[None]
    keep = logit_mask(mask)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=keep)
    targets = ids[:, 1:][keep[:, :-1]]
    logp = torch.log_softmax(out.logits.reshape(-1, VOCAB), -1).gather(-1, targets[:, None])
    flat_mask = mask > 0
    old = torch.full_like(packed.loss_mask, -10.4)[None][flat_mask]
    adv = scatter_to_packed(packed, advantages)[None][flat_mask]
    loss = clipped_policy_loss(logp.T, old[None], adv[None], torch.ones_like(logp.T), 0.2).loss
    loss.backward()
    return int(ids.numel())


def best_seconds(model, steps, advantages: list[float]) -> dict[str, tuple[int, float]]:
    """Best-of-REPEATS (tokens, seconds) per path; the paths alternate within each repeat so
    load from other processes hits both alike."""
    best = {name: (0, float("inf")) for name in PATHS}
    for _ in range(REPEATS):
        for name, fn in PATHS.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            tokens = fn(model, steps, advantages)
            best[name] = (tokens, min(best[name][1], time.perf_counter() - start))
    return best


PATHS = {"unpacked": unpacked_step, "packed": packed_step}


def main() -> None:
    model = build_model()
    rng = random.Random(0)
    print(
        f"random Llama hidden 256, 4 layers, vocab {VOCAB}; steps: {SYSTEM}-token system prompt, "
        f"{RESPONSE}-token responses, {FEEDBACK}-token feedback; best of {REPEATS}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"{'T':>2} {'tok unpacked (real/padded)':>26} {'tok packed':>10} {'s unpacked':>10} "
        f"{'s packed':>8} {'tok ratio (real/padded)':>23} {'time ratio':>10}"
    )
    best_seconds(model, trajectory(2, random.Random(1)), [1.0, -1.0])  # warm-up (allocations)
    for n_steps in (2, 4, 8):
        steps = trajectory(n_steps, rng)
        advantages = [rng.gauss(0.0, 1.0) for _ in steps]
        best = best_seconds(model, steps, advantages)
        (tok_u, sec_u), (tok_p, sec_p) = best["unpacked"], best["packed"]
        real = sum(len(p) + len(r) for p, r in steps)
        print(
            f"{n_steps:>2} {f'{real}/{tok_u}':>26} {tok_p:>10} {sec_u:>10.3f} {sec_p:>8.3f} "
            f"{f'{real / tok_p:.2f}/{tok_u / tok_p:.2f}':>23} {sec_u / sec_p:>10.2f}"
        )


if __name__ == "__main__":
    main()
