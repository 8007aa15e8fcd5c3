"""The expected policy gradient of GRPO on a stochastic payout: the default estimator must push
towards the option with the higher mean payout, even when it pays less often."""

from __future__ import annotations

import numpy as np
import pytest

from agent_core.algorithms import ESTIMATORS, AdvantageOptions
from agent_core.algorithms.returns import StepArrays
from configs.run_config import RunConfig

# risky: 4 points with probability 0.24 (mean 0.96); safe: 1 point with probability 0.8 (0.8)
RISKY, SAFE = (4.0, 0.24), (1.0, 0.8)
GROUP_SIZE, GROUPS = 4, 20_000


def expected_gradient(options: AdvantageOptions, p_risky: float, seed: int = 0) -> float:
    """Monte-Carlo E[sum_i A_i * d log pi(a_i) / d logit] for a two-armed policy with
    pi(risky) = sigmoid(logit) = p_risky: > 0 moves the policy towards the risky option."""
    rng = np.random.default_rng(seed)
    risky = rng.random((GROUPS, GROUP_SIZE)) < p_risky
    pay, prob = np.where(risky, RISKY[0], SAFE[0]), np.where(risky, RISKY[1], SAFE[1])
    reward = (pay * (rng.random(risky.shape) < prob)).ravel()
    n = reward.size
    arrays = StepArrays.from_columns(
        np.repeat(np.arange(GROUPS), GROUP_SIZE), np.arange(n), np.zeros(n, int), reward
    )
    advantages = ESTIMATORS["grpo"](arrays, options).advantages
    return float(np.mean(advantages * (risky.ravel() - p_risky)))


def default_options() -> AdvantageOptions:
    algo = RunConfig().algorithm
    return AdvantageOptions(
        gamma=algo.gamma, norm_by_std=algo.norm_by_std, batch_std=algo.batch_std
    )


@pytest.mark.parametrize("p_risky", [0.2, 0.5, 0.8])
def test_default_estimator_prefers_the_higher_mean(p_risky: float) -> None:
    assert expected_gradient(default_options(), p_risky) > 0


@pytest.mark.parametrize("p_risky", [0.2, 0.5, 0.8])
def test_group_std_prefers_the_frequent_payout(p_risky: float) -> None:
    """Why the default changed: dividing by each group's std weighs groups whose payouts
    happen to agree most, and those are the safe option's, so GRPO as published learns the
    worse option here."""
    assert expected_gradient(AdvantageOptions(norm_by_std=True), p_risky) < 0


def test_batch_std_scales_every_group_alike() -> None:
    arrays = StepArrays.from_columns(["g", "g", "h", "h"], [0, 1, 2, 3], [0] * 4, [0, 2, 0, 8])
    centred = ESTIMATORS["grpo"](arrays, AdvantageOptions(norm_by_std=False)).advantages
    scaled = ESTIMATORS["grpo"](arrays, AdvantageOptions(norm_by_std=False, batch_std=True))
    np.testing.assert_allclose(scaled.advantages, centred / centred.std(ddof=1), rtol=1e-5)
