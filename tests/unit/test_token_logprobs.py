"""The chunked token log-probs equal the whole-tensor log-softmax form bit for bit (values,
entropies and gradients, fp32 and bf16 logits, under bf16 autocast through an LM head), and keep
only the logits for the backward, not an fp32 [N, V] log-softmax; the head form (hidden states
times the LM head a chunk of rows at a time) equals it too and keeps no logits at all."""

from __future__ import annotations

import pytest
import torch

from agent_core.algorithms.losses import token_entropy
from agent_core.trainer import token_logprobs as chunked


def whole(logits, targets, temperature):
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp_all.gather(-1, targets[:, None]).squeeze(-1), token_entropy(logp_all.detach())


@pytest.fixture
def small_chunks(monkeypatch):
    # 3 rows of a 97-token vocabulary per chunk: 23 rows run as 8 chunks
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 3 * 4 * 97)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_whole_form(small_chunks, dtype, temperature):
    gen = torch.Generator().manual_seed(0)
    base = (torch.randn(23, 97, generator=gen) * 4).to(dtype)
    targets = torch.randint(0, 97, (23,), generator=gen)
    weights = torch.randn(23, generator=gen)
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    want, want_entropy = whole(a, targets, temperature)
    got, entropy = chunked.token_logprobs(b, targets, temperature, with_entropy=True)
    assert torch.equal(got, want) and torch.equal(entropy, want_entropy)
    (want * weights).sum().backward()
    (got * weights).sum().backward()
    assert b.grad.dtype == dtype and torch.equal(b.grad, a.grad)


def test_an_lm_head_under_autocast_gets_the_same_gradient(small_chunks):
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(23, 16, generator=gen)
    targets = torch.randint(0, 97, (23,), generator=gen)
    heads = [torch.nn.Linear(16, 97, bias=False) for _ in range(2)]
    heads[1].load_state_dict(heads[0].state_dict())
    losses = []
    for i, head in enumerate(heads):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(hidden)
        if i == 0:
            logp, _ = whole(logits, targets, 1.0)
        else:
            logp, _ = chunked.token_logprobs(logits, targets, 1.0, with_entropy=False)
        losses.append(-logp.mean())
        losses[-1].backward()
    assert torch.equal(losses[0], losses[1])
    assert torch.equal(heads[0].weight.grad, heads[1].weight.grad)


def test_the_backward_keeps_the_logits_only():
    logits = torch.randn(40, 500, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 500, (40,))
    kept = []

    def pack(t):
        kept.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked.token_logprobs(logits, targets, 1.0, with_entropy=True)
    assert ((40, 500), torch.bfloat16) in kept
    assert not [k for k in kept if k[0] == (40, 500) and k[1] == torch.float32]


def _head_forms(dtype, frozen: bool):
    """Log-probs, entropies and gradients of a 97-token head over 23 hidden states: the whole
    form (autocast's F.linear, then the whole log-softmax) and `head_logprobs`."""
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(23, 16, generator=gen)
    weight = torch.randn(97, 16, generator=gen) * 0.3
    targets = torch.randint(0, 97, (23,), generator=gen)
    weights = torch.randn(23, generator=gen)
    out = []
    for form in ("whole", "head"):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_(not frozen)
        if form == "whole":
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                logits = torch.nn.functional.linear(h, w)
            logp, entropy = whole(logits, targets, 0.7)
        else:
            logp, entropy = chunked.head_logprobs(h, w, targets, 0.7, True, dtype)
        (logp * weights).sum().backward()
        out.append((logp, entropy, h.grad, w.grad))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("frozen", [False, True])
def test_the_head_form_equals_the_whole_form(small_chunks, dtype, frozen):
    (logp, entropy, h_grad, w_grad), got = _head_forms(dtype, frozen)
    assert torch.equal(got[0], logp) and torch.equal(got[1], entropy)
    assert got[2].dtype == torch.float32 and torch.equal(got[2], h_grad)
    if frozen:
        assert got[3] is None
    else:
        assert got[3].dtype == torch.float32 and torch.equal(got[3], w_grad)


def test_the_head_form_keeps_no_logits():
    hidden = torch.randn(40, 16, requires_grad=True)
    weight = torch.randn(500, 16, requires_grad=True)
    targets = torch.randint(0, 500, (40,))
    kept = []

    def pack(t):
        kept.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked.head_logprobs(hidden, weight, targets, 1.0, True, torch.bfloat16)
    assert not [shape for shape in kept if shape[-1] == 500]


def test_a_lora_wrapped_or_biased_head_is_not_chunked():
    assert chunked.head_chunkable(torch.nn.Linear(16, 97, bias=False))
    assert not chunked.head_chunkable(torch.nn.Linear(16, 97))
    wrapped = torch.nn.Sequential(torch.nn.Linear(16, 97, bias=False))
    assert not chunked.head_chunkable(wrapped)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_update_through_the_head_form_gives_the_same_weights(tiny_model_dir, monkeypatch, dtype):
    """The trainer's forward applies the LM head a chunk at a time (`head_logprobs`); an
    update through it ends at the same weights, bit for bit, as one through whole logits."""
    from agent_core.trainer import engine as engine_module
    from agent_core.trainer.batching import TrainRow
    from agent_core.trainer.policy_trainer import PolicyTrainer
    from configs.trainer import TrainerSection

    monkeypatch.setattr(chunked, "CHUNK_BYTES", 5 * 4 * 300)  # a few rows per chunk
    gen = torch.Generator().manual_seed(3)
    rows = []
    for k in range(6):
        prompt = torch.randint(0, 256, (10 + k,), generator=gen).tolist()
        response = torch.randint(0, 256, (4 + k,), generator=gen).tolist()
        old = (-5.5 + 0.2 * torch.randn(len(response), generator=gen)).tolist()
        rows.append(TrainRow(prompt, response, old, advantage=(-1.0) ** k, trajectory_id=str(k)))
    cfg = TrainerSection(
        dtype=dtype, learning_rate=1e-3, micro_batch_size=2, mini_batch_size=6, entropy_coef=0.0
    )
    weights = []
    for chunked_head in (True, False):
        if not chunked_head:
            monkeypatch.setattr(engine_module, "head_chunkable", lambda head: False)
        trainer = PolicyTrainer(tiny_model_dir, cfg, temperature=0.7, seed=0)
        trainer.update(rows, iteration=1)
        weights.append({n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()})
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
