"""The token sampler of the hf engine: one token per row of a logits batch, by a two-level
inverse CDF (one uniform per row) or, under top-p, over the nucleus found by a growing `topk`;
T = 0 is greedy. Log-probs are those of the full tempered distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SAMPLE_ROWS = 8  # rows sampled together (8 x 49k float32 logits fit in L2)
_CDF_BLOCK = 256  # vocabulary block of the two-level inverse-CDF sampler
_TOPK_START = 64  # first candidate count of the nucleus sampler (grows x4 while too small)


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [B, V]; return (tokens [B], log-probs [B] float32).

    Log-probs are of log_softmax(logits / T) over the whole vocabulary; T = 0 means greedy
    (argmax), with log-probs of the untempered distribution. Each row draws one uniform (inverse
    CDF; `torch.multinomial`'s exponential race draws V of them, ~40x slower on CPU), and rows
    go in chunks whose float32 copies stay in L2 cache across the few passes over them.
    """
    rows = logits.shape[0]
    device = logits.device
    uniforms = torch.rand(rows, 1, dtype=torch.float64, device=device, generator=generator)
    tokens = torch.empty(rows, dtype=torch.long, device=device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=device)
    for start in range(0, rows, _SAMPLE_ROWS):
        part = slice(start, start + _SAMPLE_ROWS)
        tokens[part], logprobs[part] = _sample_rows(
            logits[part].float(), temperature, top_p, uniforms[part]
        )
    return tokens, logprobs


def _sample_rows(
    x: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_tokens` on float32 logits `x` [b, V] with one uniform [b, 1] per row."""
    if temperature == 0.0:
        best, tokens = x.max(-1)  # max(dim) is ~3x faster than argmax on CPU
        return tokens, best - torch.logsumexp(x, -1)
    top = x.max(-1, keepdim=True).values
    weights = (x - top).mul_(1.0 / temperature).exp_()  # exp(x / T) up to a per-row factor
    if top_p < 1.0:
        tokens, total = _sample_nucleus(weights, top_p, uniforms)
    else:
        tokens, total = _sample_inverse_cdf(weights, uniforms)
    chosen = (x.gather(-1, tokens[:, None]) - top).squeeze(-1) / temperature
    return tokens, chosen - total.log().float()


def _sample_inverse_cdf(
    weights: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row from non-negative `weights` [b, V] given uniforms [b, 1]; also returns
    the row totals [b] (float64). Picks a block of `_CDF_BLOCK` tokens by its mass, then a token
    inside it by a float64 cumulative sum (a float32 cumsum over V would drift by ~1e-5)."""
    rows, vocab = weights.shape
    pad = (-vocab) % _CDF_BLOCK
    padded = F.pad(weights, (0, pad)) if pad else weights
    blocks = padded.view(rows, -1, _CDF_BLOCK)
    sums = blocks.sum(-1).double()  # [b, nb]
    cdf = sums.cumsum(-1)
    u = uniforms * cdf[:, -1:]
    block = torch.minimum(torch.searchsorted(cdf, u, right=True), _last_positive(cdf))
    inner = blocks.gather(1, block[:, :, None].expand(rows, 1, _CDF_BLOCK)).squeeze(1)
    inner = inner.double().cumsum(-1)  # [b, block]
    mass = sums.gather(-1, block)
    u = (u - (cdf.gather(-1, block) - mass)).clamp(min=0.0) / mass * inner[:, -1:]
    offset = torch.minimum(torch.searchsorted(inner, u, right=True), _last_positive(inner))
    return (block * _CDF_BLOCK + offset).squeeze(1), cdf[:, -1]


def _last_positive(cdf: torch.Tensor) -> torch.Tensor:
    """Index [b, 1] of the entry where the non-decreasing `cdf` [b, N] reaches its total: the
    last entry with positive mass, so rounding can never select a zero-probability token."""
    return (cdf < cdf[:, -1:]).sum(-1, keepdim=True)


def _sample_nucleus(
    weights: torch.Tensor, top_p: float, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Nucleus sampling: keep the smallest prefix of the sorted probabilities whose mass reaches
    `top_p` (the first token always stays). A full sort of the vocabulary costs ~150 ms per step
    on CPU, so candidates come from `topk`, grown until they hold every row's nucleus."""
    vocab = weights.shape[-1]
    total = weights.sum(-1, keepdim=True, dtype=torch.float64)
    k = min(_TOPK_START, vocab)
    while True:
        values, order = weights.topk(k, dim=-1)  # sorted, descending
        probs = values.double() / total
        if k == vocab or bool((probs.sum(-1) > top_p).all()):
            break
        k = min(4 * k, vocab)
    outside = probs.cumsum(-1) - probs > top_p
    pick, _ = _sample_inverse_cdf(probs.masked_fill(outside, 0.0), uniforms)
    return order.gather(-1, pick[:, None]).squeeze(-1), total.squeeze(-1)
