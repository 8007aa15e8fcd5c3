"""Step-level structure of a batch: ids as dense indices, and discounted returns across steps.

All functions here are pure numpy over flat step arrays (one entry per step row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepArrays:
    """Flat per-step columns of a batch. Shapes: all [N] (N = number of steps).

    `group` and `trajectory` are dense integer ids (0..G-1, 0..T-1); `step` is the step index
    within its trajectory (0-based, contiguous).
    """

    group: np.ndarray
    trajectory: np.ndarray
    step: np.ndarray
    reward: np.ndarray

    @staticmethod
    def from_columns(group_ids, trajectory_ids, step_index, reward) -> StepArrays:
        """Build from raw id columns (any hashable ids) and numeric columns."""
        _, group = np.unique(np.asarray(group_ids, dtype=object).astype(str), return_inverse=True)
        _, traj = np.unique(
            np.asarray(trajectory_ids, dtype=object).astype(str), return_inverse=True
        )
        return StepArrays(
            group=group.astype(np.int64),
            trajectory=traj.astype(np.int64),
            step=np.asarray(step_index, dtype=np.int64),
            reward=np.asarray(reward, dtype=np.float64),
        )


def dense_rewards(arrays: StepArrays) -> np.ndarray:
    """Rewards scattered into a [T, S_max] matrix (T trajectories, S_max steps), zeros padded."""
    n_traj = int(arrays.trajectory.max()) + 1 if arrays.trajectory.size else 0
    n_steps = int(arrays.step.max()) + 1 if arrays.step.size else 0
    dense = np.zeros((n_traj, n_steps), dtype=np.float64)
    dense[arrays.trajectory, arrays.step] = arrays.reward
    return dense


def discounted_returns(arrays: StepArrays, gamma: float) -> np.ndarray:
    """G_t = sum_{t' >= t} gamma^(t'-t) r_t' within each trajectory. Returns shape [N]."""
    dense = dense_rewards(arrays)
    returns = np.zeros_like(dense)
    running = np.zeros(dense.shape[0], dtype=np.float64)
    for t in range(
        dense.shape[1] - 1, -1, -1
    ):  # loop over steps (few), vectorised over trajectories
        running = dense[:, t] + gamma * running
        returns[:, t] = running
    return returns[arrays.trajectory, arrays.step]


def trajectory_groups(arrays: StepArrays) -> np.ndarray:
    """The group id of each trajectory. Shape [T]."""
    n_traj = int(arrays.trajectory.max()) + 1 if arrays.trajectory.size else 0
    groups = np.zeros(n_traj, dtype=np.int64)
    groups[arrays.trajectory] = arrays.group
    return groups
