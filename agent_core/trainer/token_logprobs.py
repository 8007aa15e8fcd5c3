"""Log-probabilities of the sampled tokens, a chunk of rows at a time: from a micro-batch's
logits [N, V] (`token_logprobs`: the fp32 log-softmax over the vocabulary exists for one chunk
only, in the forward and again in the backward, which keeps just the logits), or from the last
hidden states [N, H] and the LM head's weight (`head_logprobs`: the logits too exist for one
chunk only, the backward keeps the hidden states and recomputes each chunk's logits). The same
operations as one `log_softmax(head(hidden).float() / T).gather(...)` over all rows, applied
row by row, so the values and gradients are those of the whole-tensor form, bit for bit
(tests/unit/test_token_logprobs.py), wherever the GEMM rounds a row alike whatever the rows
beside it: fp32 here; in bf16 oneDNN picks its kernel by row count, so a chunk's logits may
round as a micro-batch of that many rows would (at most 2.4e-5 in a log-prob, measured).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from agent_core.algorithms.losses import token_entropy

# fp32 bytes of one chunk's log-softmax [rows, V]: 64 MiB is 341 rows of a 49152-token vocabulary
CHUNK_BYTES = 64 * 2**20


def chunk_rows(vocab: int) -> int:
    """Rows per chunk for a vocabulary of `vocab` tokens."""
    return max(1, CHUNK_BYTES // (4 * vocab))


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, dim=-1)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """logits [N, V], targets [N] -> log-probs [N] (differentiable) and entropies [N] (a
    metric: no gradient), keeping only `logits` for the backward."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy):
        rows = chunk_rows(logits.shape[-1])
        logp = logits.new_empty(logits.shape[0], dtype=torch.float32)
        entropy = logp.new_empty(logits.shape[0]) if with_entropy else logp.new_empty(0)
        for start in range(0, logits.shape[0], rows):
            part = slice(start, start + rows)
            logp_all = _log_softmax(logits[part], temperature)
            logp[part] = logp_all.gather(-1, targets[part, None]).squeeze(-1)
            if with_entropy:
                entropy[part] = token_entropy(logp_all)
        ctx.save_for_backward(logits, targets)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        logits, targets = ctx.saved_tensors
        temperature = ctx.temperature
        rows = chunk_rows(logits.shape[-1])
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], rows):
            part = slice(start, start + rows)
            logp_all = _log_softmax(logits[part], temperature)  # as the forward computed it
            # what autograd does for gather, log_softmax, the division and the cast back
            g = torch.zeros_like(logp_all).scatter_add_(
                -1, targets[part, None], grad_logp[part, None]
            )
            g = torch._log_softmax_backward_data(g, logp_all, -1, torch.float32) / temperature
            grad[part] = g.to(logits.dtype)
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row of `logits` [N, V]: the log-probability of its `targets` [N] token under
    softmax(logits / temperature) [N] and, when `with_entropy`, the distribution's entropy [N]
    (without gradient)."""
    logp, entropy = _ChunkedTokenLogprobs.apply(logits, targets, temperature, with_entropy)
    return logp, entropy if with_entropy else None


class _ChunkedHeadLogprobs(torch.autograd.Function):
    """hidden [N, H], the head's weight [V, H], targets [N] -> log-probs [N] (differentiable in
    hidden and weight) and entropies [N] (a metric), the head multiplying in `dtype` as
    autocast's F.linear would; keeps hidden (and the weight, a parameter) for the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy, dtype):
        rows = chunk_rows(weight.shape[0])
        h, w = hidden.to(dtype), weight.to(dtype)
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = logp.new_empty(hidden.shape[0]) if with_entropy else logp.new_empty(0)
        for start in range(0, hidden.shape[0], rows):
            part = slice(start, start + rows)
            logp_all = _log_softmax(F.linear(h[part], w), temperature)
            logp[part] = logp_all.gather(-1, targets[part, None]).squeeze(-1)
            if with_entropy:
                entropy[part] = token_entropy(logp_all)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.dtype = temperature, dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, targets = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        rows, dtype = chunk_rows(weight.shape[0]), ctx.dtype
        h, w = hidden.to(dtype), weight.to(dtype)
        # the weight's gradient sums over every row: one GEMM over all of them, as autograd's
        # for F.linear (a sum of per-chunk GEMMs would round differently)
        grad_logits = h.new_empty(h.shape[0], w.shape[0]) if want_weight else None
        grad_h = torch.empty_like(h) if want_hidden else None
        for start in range(0, h.shape[0], rows):
            part = slice(start, start + rows)
            logp_all = _log_softmax(F.linear(h[part], w), ctx.temperature)
            g = torch.zeros_like(logp_all).scatter_add_(
                -1, targets[part, None], grad_logp[part, None]
            )
            g = torch._log_softmax_backward_data(g, logp_all, -1, torch.float32) / ctx.temperature
            g = g.to(dtype)
            if want_hidden:
                grad_h[part] = g.mm(w)
            if want_weight:
                grad_logits[part] = g
        grad_w = grad_logits.t().mm(h).to(weight.dtype) if want_weight else None
        grad_h = grad_h.to(hidden.dtype) if want_hidden else None
        return grad_h, grad_w, None, None, None, None


def head_chunkable(head: nn.Module) -> bool:
    """Whether `head_logprobs` can stand in for `head`: a plain bias-free linear layer whose
    weight is whole in this process (not a LoRA-wrapped head, not a ZeRO-3 partition)."""
    return type(head) is nn.Linear and head.bias is None and not hasattr(head.weight, "ds_id")


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row of the last hidden states `hidden` [N, H]: the log-probability of its `targets`
    [N] token under softmax(hidden @ weight.T / temperature), the LM head's `weight` [V, H]
    multiplying in `dtype` (autocast's), and, when `with_entropy`, the entropy [N] (without
    gradient); no [N, V] logits are kept, only the weight's gradient needs an [N, V] buffer."""
    logp, entropy = _ChunkedHeadLogprobs.apply(
        hidden, weight, targets, temperature, with_entropy, dtype
    )
    return logp, entropy if with_entropy else None
