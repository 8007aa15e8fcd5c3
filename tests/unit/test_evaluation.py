"""Evaluation maths: pass@k against its definition, aggregate metrics against a hand count."""

from __future__ import annotations

import itertools

import polars as pl
import pytest

from agent_core.config.load import load_config
from agent_core.run.evaluate import eval_tasks, pass_at_k, table_metrics


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """Share of all k-subsets of the samples that contain a success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_pass_at_k_matches_subset_definition(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k))


def test_table_metrics_by_hand() -> None:
    table = pl.DataFrame(
        {
            "task_id": ["a", "a", "b", "b", "c", "c"],
            "success": [True, False, False, False, True, True],
            "reward": [1.2, 0.2, 0.0, 0.1, 1.3, 1.3],
            "steps": [2, 1, 3, 3, 2, 2],
        }
    )
    m = table_metrics(table, samples_per_task=2)
    assert m["eval/success_rate"] == pytest.approx(3 / 6)
    assert m["eval/pass_at_1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert m["eval/pass_at_2"] == pytest.approx((1 + 0 + 1) / 3)
    assert m["eval/reward_mean"] == pytest.approx(4.1 / 6)
    assert m["eval/steps_mean"] == pytest.approx(13 / 6)
    assert m["eval/episodes"] == 6 and m["eval/tasks"] == 3


def test_eval_tasks_are_held_out() -> None:
    config = load_config("smoke", ["eval.episodes=5"])
    seeds = [t.meta["seed"] for t in eval_tasks(config)]
    assert seeds == list(range(config.env.eval_seed_start, config.env.eval_seed_start + 5))
    train_end = config.env.train_seed_start + config.env.train_seed_count
    assert all(s >= train_end for s in seeds)
