"""Credit assignment and losses: advantage estimators over steps, the policy-gradient, KL,
entropy and value losses, and the off-policy correction's per-token weights. (Append-only
packing is the trainer's: agent_core.trainer.batching.)"""

from agent_core.algorithms.advantages import (
    ESTIMATOR_NEEDS,
    ESTIMATORS,
    AdvantageOptions,
    AdvantageResult,
    check_estimator_needs,
    gae,
    gigpo,
    grpo,
    reinforce_pp,
    rloo,
)
from agent_core.algorithms.losses import (
    AGG_MODES,
    KL_ESTIMATORS,
    PolicyLossOutput,
    ValueLossOutput,
    aggregate,
    clipped_policy_loss,
    entropy_bonus,
    kl_penalty,
    masked_mean,
    token_entropy,
    token_logprobs,
    value_loss,
)
from agent_core.algorithms.off_policy import CORRECTIONS, OffPolicyWeights, off_policy_weights
from agent_core.algorithms.returns import StepArrays, discounted_returns

__all__ = [
    "AGG_MODES",
    "CORRECTIONS",
    "ESTIMATORS",
    "ESTIMATOR_NEEDS",
    "KL_ESTIMATORS",
    "AdvantageOptions",
    "AdvantageResult",
    "OffPolicyWeights",
    "PolicyLossOutput",
    "StepArrays",
    "ValueLossOutput",
    "aggregate",
    "check_estimator_needs",
    "clipped_policy_loss",
    "discounted_returns",
    "entropy_bonus",
    "gae",
    "gigpo",
    "grpo",
    "kl_penalty",
    "masked_mean",
    "off_policy_weights",
    "reinforce_pp",
    "rloo",
    "token_entropy",
    "token_logprobs",
    "value_loss",
]
