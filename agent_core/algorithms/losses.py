"""Policy-gradient losses on response tokens. Pure torch; shapes documented per function.

Notation: B = rows (steps) in a micro-batch, L = padded sequence length, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Log-prob of each next token under log_softmax(logits / T).

    logits [B, L, V], input_ids [B, L] -> [B, L] where entry t is log p(input_ids[t] | <t);
    entry 0 (no context) is 0.
    """
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of the next-token distribution at each position whose token is predicted.

    logits [B, L, V] -> [B, L], aligned like `token_logprobs` (entry 0 is 0).
    """
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.nn.functional.pad(ent, (1, 0))


@dataclass
class PolicyLossOutput:
    """The scalar loss and detached diagnostics (means over response tokens)."""

    loss: torch.Tensor
    clip_fraction: float
    approx_kl: float
    ratio_mean: float


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (any equal shapes); 0 when the mask is empty."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    token_count: float | None = None,
) -> PolicyLossOutput:
    """PPO/GRPO clipped importance-ratio loss, token-mean over response tokens.

    logprobs, old_logprobs, mask: [B, L] (mask 1 on response tokens); advantages: [B] (one per
    step row, broadcast over its tokens). `token_count` is the mean's denominator: pass the
    response-token count of the whole mini-batch when micro-batches accumulate, so the
    accumulated gradient is the token-mean over the mini-batch (None = this micro-batch).
    """
    adv = advantages[:, None].expand_as(logprobs)
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(unclipped, clipped) * mask
    denominator = token_count if token_count is not None else mask.sum().clamp(min=1)
    loss = per_token.sum() / denominator
    with torch.no_grad():
        clip_frac = masked_mean((clipped > unclipped).float(), mask).item()
        approx_kl = masked_mean(0.5 * log_ratio**2, mask).item()
        ratio_mean = masked_mean(ratio, mask).item()
    return PolicyLossOutput(loss, clip_frac, approx_kl, ratio_mean)
