"""Advantage estimators on step rows, by name. Each is pure: StepArrays (+ options) -> arrays.

Every estimator returns `(returns [N], advantages [N])` for the N steps of a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent_core.algorithms.returns import StepArrays, discounted_returns, trajectory_groups


@dataclass(frozen=True)
class AdvantageOptions:
    """Options shared by estimators (each reads those it needs)."""

    gamma: float = 1.0
    norm_by_std: bool = True
    epsilon: float = 1e-6


@dataclass(frozen=True)
class AdvantageResult:
    """Per-step returns and advantages, plus group diagnostics."""

    returns: np.ndarray
    advantages: np.ndarray
    zero_variance_groups: int
    groups: int


def group_stats(
    scores: np.ndarray, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group (mean, unbiased std, size) of trajectory `scores` [T] grouped by `groups` [T]."""
    n = int(groups.max()) + 1 if groups.size else 0
    size = np.bincount(groups, minlength=n).astype(np.float64)
    mean = np.bincount(groups, weights=scores, minlength=n) / np.maximum(size, 1)
    sq = np.bincount(groups, weights=(scores - mean[groups]) ** 2, minlength=n)
    std = np.sqrt(sq / np.maximum(size - 1, 1))
    return mean, std, size


def grpo(arrays: StepArrays, options: AdvantageOptions) -> AdvantageResult:
    """GRPO: each trajectory's return from its first step, centred (and scaled by the unbiased
    std unless `norm_by_std` is False) within its group; every step of the trajectory gets it.
    A group of one, or with equal returns, has zero advantage."""
    returns = discounted_returns(arrays, options.gamma)
    first = arrays.step == 0
    scores = np.zeros(int(arrays.trajectory.max()) + 1 if arrays.trajectory.size else 0)
    scores[arrays.trajectory[first]] = returns[first]
    groups = trajectory_groups(arrays)
    mean, std, size = group_stats(scores, groups)
    centred = scores - mean[groups]
    if options.norm_by_std:
        centred = centred / (std[groups] + options.epsilon)
    flat = (size[groups] < 2) | (std[groups] <= options.epsilon)
    traj_adv = np.where(flat, 0.0, centred)
    zero_groups = int(np.sum((size < 2) | (std <= options.epsilon)))
    return AdvantageResult(returns, traj_adv[arrays.trajectory], zero_groups, int(size.size))


Estimator = Callable[[StepArrays, AdvantageOptions], AdvantageResult]

ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
}
