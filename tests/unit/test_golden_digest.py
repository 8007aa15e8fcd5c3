"""The golden run's comparison: bit for bit on rows that are not the policy's floats, within the
measured rounding gap on log-probs and weights, and a real change of either is named."""

from __future__ import annotations

import copy

import numpy as np

from tests.golden.golden_run import LOGPROB_ATOL, WEIGHT_ATOL, _tensor_digest, differences


def _digest(matrix: np.ndarray) -> dict:
    return {
        "checkpoint": "iter_0002",
        "rows": {
            "iter_0001": {
                "response_ids": "a" * 64,
                "response_logprobs": [[-0.5, -1.25], [-2.0]],
                "value": [None, None],
            }
        },
        "weights": {"w": _tensor_digest("w", matrix)},
    }


def test_rounding_gaps_pass_and_real_changes_are_named() -> None:
    rng = np.random.default_rng(0)
    matrix = rng.normal(0, 0.02, (64, 128)).astype(np.float32)
    recorded = _digest(matrix)

    # the gap measured between boxes: log-probs 2.4e-6 apart, a weight tensor's gap 2.4e-5 in L2
    noise = rng.normal(size=matrix.shape)
    rounded = _digest(matrix + (2.4e-5 * noise / np.linalg.norm(noise)).astype(np.float32))
    rounded["rows"]["iter_0001"]["response_logprobs"][0][1] += 2.4e-6
    assert differences(recorded, rounded) == []

    moved = copy.deepcopy(recorded)
    moved["rows"]["iter_0001"]["response_logprobs"][1][0] += 10 * LOGPROB_ATOL
    moved["rows"]["iter_0001"]["response_ids"] = "b" * 64
    moved["rows"]["iter_0001"]["value"] = [None, 0.5]
    assert differences(recorded, moved) == [
        "iter_0001: step-row column response_ids",
        "iter_0001: step-row column response_logprobs",
        "iter_0001: step-row column value",
    ]

    trained = _digest(matrix + np.float32(1e-4) * rng.choice([-1, 1], matrix.shape))
    gap = max(
        abs(a - b) for a, b in zip(recorded["weights"]["w"], trained["weights"]["w"], strict=True)
    )
    assert gap > 5 * WEIGHT_ATOL
    assert [line.split(" (")[0] for line in differences(recorded, trained)] == ["final weights: w"]


def test_a_missing_row_or_iteration_is_named() -> None:
    recorded = _digest(np.ones((4, 4), np.float32))
    short = copy.deepcopy(recorded)
    short["rows"]["iter_0001"]["response_logprobs"].pop()
    short["rows"]["iter_0002"] = {}
    short["weights"]["head"] = [1.0, 0.0, 0.0]
    assert differences(recorded, short) == [
        "iterations: ['iter_0001', 'iter_0002'], recorded ['iter_0001']",
        "iter_0001: step-row column response_logprobs",
        "weight tensors: ['head', 'w'], recorded ['w']",
    ]
