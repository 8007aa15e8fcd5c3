"""Append-only packing: one forward over a packed trajectory gives the same loss and parameter
gradients as step-by-step forwards (tiny random Llama, fp32), and non-append-only
trajectories are detected."""

from __future__ import annotations

import random

import pytest
import torch

from agent_core.algorithms.losses import clipped_policy_loss, token_logprobs
from agent_core.algorithms.packing import (
    collate_packed,
    is_append_only,
    logit_mask,
    pack_trajectory,
    scatter_to_packed,
    split_packed,
)

VOCAB = 300


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).float().eval()  # eval: no dropout, same math both ways


def _trajectory(rng: random.Random, n_steps: int) -> list[tuple[list[int], list[int]]]:
    """Append-only steps: system prompt, then response + feedback appended each step."""
    prompt = [rng.randrange(VOCAB) for _ in range(12)]
    steps = []
    for _ in range(n_steps):
        response = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 6))]
        steps.append((list(prompt), response))
        prompt = prompt + response + [rng.randrange(VOCAB) for _ in range(3)]
    return steps


def test_is_append_only_detects_edits_and_windows() -> None:
    steps = _trajectory(random.Random(0), 3)
    assert is_append_only(steps) and is_append_only(steps[:1]) and is_append_only([])
    prompt = list(steps[1][0])
    prompt[5] = (prompt[5] + 1) % VOCAB
    edited = [steps[0], (prompt, steps[1][1])]
    assert not is_append_only(edited)  # one re-tokenized prompt token
    window = [steps[0], (steps[1][0][4:], steps[1][1])]
    assert not is_append_only(window)  # a sliding context window drops the prefix
    shorter = [steps[0], (steps[0][0] + steps[0][1][:-1], [1])]
    assert not is_append_only(shorter)
    with pytest.raises(ValueError, match="append-only"):
        pack_trajectory(edited)


def test_pack_layout_and_scatter() -> None:
    steps = [([1, 2], [3, 4]), ([1, 2, 3, 4, 5], [6])]
    packed = pack_trajectory(steps)
    assert packed.input_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert packed.loss_mask.tolist() == [0, 0, 1, 1, 0, 1]
    assert packed.step_of_token.tolist() == [-1, -1, 0, 0, -1, 1]
    assert packed.response_slices == [(2, 4), (5, 6)]
    assert scatter_to_packed(packed, [0.5, -1.0]).tolist() == [0, 0, 0.5, 0.5, 0, -1.0]
    assert scatter_to_packed(packed, [[0.1, 0.2], [0.3]]).tolist() == pytest.approx(
        [0, 0, 0.1, 0.2, 0, 0.3]
    )
    assert [t.tolist() for t in split_packed(packed, torch.arange(6))] == [[2, 3], [5]]
    assert logit_mask(packed.loss_mask).tolist() == [False, True, True, False, True, False]
    with pytest.raises(ValueError, match="response tokens"):
        scatter_to_packed(packed, [[0.1], [0.3]])


def _unpacked_loss(model, trajectories, old, adv, mode: str) -> tuple[float, list[torch.Tensor]]:
    """Each step as its own forward; micro-batch losses share the global denominators."""
    tokens = sum(len(r) for steps in trajectories for _, r in steps)
    n_steps = sum(len(steps) for steps in trajectories)
    total, step_logps = 0.0, []
    for t, steps in enumerate(trajectories):
        for k, (prompt, response) in enumerate(steps):
            ids = torch.tensor([prompt + response])
            logp = token_logprobs(model(input_ids=ids).logits, ids, 1.0)[:, len(prompt) :]
            loss = clipped_policy_loss(
                logp,
                torch.tensor([old[t][k]]),
                torch.tensor([adv[t][k]]),
                torch.ones_like(logp),
                0.2,
                token_count=tokens,
                seq_count=n_steps,
                mode=mode,
            ).loss
            loss.backward()
            total += loss.item()
            step_logps.append(logp[0].detach())
    return total, step_logps


@torch.no_grad()
def _check_logit_mask(model, batch: dict[str, torch.Tensor], logp: torch.Tensor) -> None:
    """Projecting only the response-predicting positions (`logits_to_keep=logit_mask`) gives
    the same response log-probs as full logits."""
    keep = logit_mask(batch["loss_mask"])
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits_to_keep=keep
    )
    targets = batch["input_ids"][:, 1:][keep[:, :-1]]
    all_logp = torch.log_softmax(out.logits.reshape(-1, VOCAB), -1)
    picked = all_logp.gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(picked, logp[batch["loss_mask"] > 0], rtol=0, atol=1e-5)


def _packed_loss(model, trajectories, old, adv, mode: str) -> tuple[float, list[torch.Tensor]]:
    """One right-padded batch of packed trajectories, one forward."""
    packed = [pack_trajectory(steps) for steps in trajectories]
    batch = collate_packed(packed, pad_id=0)
    width = batch["input_ids"].shape[1]

    def layout(values: list) -> torch.Tensor:
        rows = [scatter_to_packed(p, v) for p, v in zip(packed, values, strict=True)]
        return torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows])

    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logp = token_logprobs(out.logits, batch["input_ids"], 1.0)
    loss = clipped_policy_loss(
        logp,
        layout(old),
        layout(adv),
        batch["loss_mask"],
        0.2,
        mode=mode,
        segments=batch["step_of_token"],
    ).loss
    loss.backward()
    step_logps = [s for i, p in enumerate(packed) for s in split_packed(p, logp[i].detach())]
    _check_logit_mask(model, batch, logp.detach())
    return loss.item(), step_logps


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_packed_equals_unpacked_loss_and_gradients(mode: str) -> None:
    rng = random.Random(1)
    trajectories = [_trajectory(rng, 3), _trajectory(rng, 2)]
    gen = torch.Generator().manual_seed(2)
    # old log-probs near the model's (ratios inside and outside the clip range), random signs
    old = [
        [(-5.7 + 0.3 * torch.randn(len(r), generator=gen)).tolist() for _, r in steps]
        for steps in trajectories
    ]
    adv = [torch.randn(len(steps), generator=gen).tolist() for steps in trajectories]
    model = _tiny_llama()
    unpacked_loss, unpacked_logps = _unpacked_loss(model, trajectories, old, adv, mode)
    unpacked_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    packed_loss, packed_logps = _packed_loss(model, trajectories, old, adv, mode)
    assert packed_loss == pytest.approx(unpacked_loss, abs=1e-5)
    for a, b in zip(packed_logps, unpacked_logps, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for p, g in zip(model.parameters(), unpacked_grads, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=1e-5)
    assert any(g.abs().max() > 1e-3 for g in unpacked_grads)  # the check is not vacuous
