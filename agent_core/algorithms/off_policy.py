"""Off-policy correction between the behaviour policy (the one that sampled a row: the rollout
engine, or an older policy) and the proximal policy (the trainer's own log-probs, recomputed
before the update): per-token weights on the policy-gradient loss and their distribution.
Pure torch; shapes per function. Token-level only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agent_core.algorithms.losses import MAX_LOG_RATIO, masked_mean

# "none": no weight. The others anchor the PPO clip at the proximal log-probs and weigh each
# token's clipped loss by w(rho), rho = pi_proximal / pi_behaviour:
#   "decoupled"  w = rho                               (AReaL's decoupled PPO objective)
#   "tis"        w = min(rho, cap)                     (truncated IS, Yao et al. 2025)
#   "mis"        w = rho if low <= rho <= high else 0  (masked IS, IcePop)
CORRECTIONS = ("none", "decoupled", "tis", "mis")


@dataclass
class OffPolicyWeights:
    """Per-token weights (None for "none": the loss is left as it is) and, over the tokens of
    `mask`, how rho = pi_proximal / pi_behaviour and the weights are distributed."""

    weights: torch.Tensor | None
    ratio_mean: float = 0.0
    ratio_max: float = 0.0
    ratio_min: float = 0.0
    weight_mean: float = 0.0
    truncated_share: float = 0.0
    masked_share: float = 0.0
    # mean of log pi_behaviour - log pi_proximal: the k1 estimate of KL(behaviour || proximal)
    kl: float = 0.0
    # |log pi_behaviour - log pi_proximal| per token: its mean and max
    logprob_diff_mean: float = 0.0
    logprob_diff_max: float = 0.0


def off_policy_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    correction: str = "none",
    *,
    tis_cap: float = 2.0,
    mis_low: float = 0.5,
    mis_high: float = 5.0,
) -> OffPolicyWeights:
    """Per-token weights on the clipped policy-gradient loss for `correction` (`CORRECTIONS`).

    proximal_logprobs, behaviour_logprobs, mask: [B, L] (mask 1 on response tokens) ->
    weights [B, L] (detached, 0 off the mask) or None for "none". rho = exp(proximal -
    behaviour), its log clamped to +-MAX_LOG_RATIO. "decoupled": w = rho; "tis": w = min(rho,
    tis_cap); "mis": w = rho where mis_low <= rho <= mis_high, else 0 (the token is masked: it
    adds nothing to the loss but still counts in the aggregation's denominator). The statistics
    are computed for every correction, "none" included (then weight_mean is 1).
    """
    if correction not in CORRECTIONS:
        raise ValueError(
            f"unknown off-policy correction {correction!r}: choose one of {', '.join(CORRECTIONS)}"
        )
    with torch.no_grad():
        diff = (proximal_logprobs - behaviour_logprobs).float() * mask
        rho = torch.exp(torch.clamp(diff, -MAX_LOG_RATIO, MAX_LOG_RATIO))
        truncated = torch.zeros_like(rho, dtype=torch.bool)
        masked = torch.zeros_like(rho, dtype=torch.bool)
        if correction == "none":
            weights = None
        elif correction == "decoupled":
            weights = rho * mask
        elif correction == "tis":
            truncated = rho > tis_cap
            weights = torch.clamp(rho, max=tis_cap) * mask
        else:
            masked = (rho < mis_low) | (rho > mis_high)
            weights = torch.where(masked, torch.zeros_like(rho), rho) * mask
        return _distribution(diff, rho, mask, weights, truncated, masked)


def _distribution(
    diff: torch.Tensor,
    rho: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None,
    truncated: torch.Tensor,
    masked: torch.Tensor,
) -> OffPolicyWeights:
    """Statistics over the tokens of `mask` (all 0 when it has none)."""
    keep = mask > 0
    if not bool(keep.any()):
        return OffPolicyWeights(weights)
    applied = torch.ones_like(rho) if weights is None else weights
    return OffPolicyWeights(
        weights,
        ratio_mean=masked_mean(rho, mask).item(),
        ratio_max=rho[keep].max().item(),
        ratio_min=rho[keep].min().item(),
        weight_mean=masked_mean(applied, mask).item(),
        truncated_share=masked_mean(truncated.float(), mask).item(),
        masked_share=masked_mean(masked.float(), mask).item(),
        kl=masked_mean(-diff, mask).item(),
        logprob_diff_mean=masked_mean(diff.abs(), mask).item(),
        logprob_diff_max=diff.abs()[keep].max().item(),
    )
