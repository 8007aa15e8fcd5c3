"""The `evaluate` flow on the tiny model: metrics equal a hand count of its episode table,
and the MLflow eval run is nested under the training run."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient

from agent_core.config.load import load_config
from agent_core.envs.calculator import CalculatorEnv
from agent_core.run.evaluate import pass_at_k
from flows.evaluate import evaluate

pytestmark = pytest.mark.slow


class CoinFlipEnv(CalculatorEnv):
    """The calculator task, but an even-length final reply counts as a success."""

    def is_success(self, final_text: str, task) -> bool:
        return len(final_text) % 2 == 0


def test_evaluate_base_checkpoint_hand_count(prefect_harness, tmp_path: Path) -> None:
    config = load_config(
        "smoke",
        [
            f"model.path={tmp_path / 'tiny'}",
            f"run.output_dir={tmp_path / 'runs'}",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "eval.episodes=4",
            "eval.samples_per_task=3",
            "eval.temperature=1.0",
            # the random base model never solves a real task: judge by reply length instead,
            # so the table holds a mix of successes and failures to count
            "env.name=tests.integration.test_evaluate_flow:CoinFlipEnv",
        ],
    )
    result = evaluate(config, "base")
    table = pl.read_parquet(result.outcome.table_path)
    assert table.height == 4 * 3
    assert set(table["seed"]) == set(
        range(config.env.eval_seed_start, config.env.eval_seed_start + 4)
    )
    m = result.outcome.metrics
    successes = table["success"].to_list()
    assert 0 < sum(successes) < len(successes)
    assert m["eval/success_rate"] == pytest.approx(sum(successes) / len(successes))
    per_task = {}
    for row in table.iter_rows(named=True):
        per_task.setdefault(row["task_id"], []).append(row["success"])
    hand_pass3 = sum(pass_at_k(3, sum(v), 3) for v in per_task.values()) / len(per_task)
    assert m["eval/pass_at_3"] == pytest.approx(hand_pass3)
    assert m["eval/reward_mean"] == pytest.approx(sum(table["reward"]) / table.height)
    assert m["eval/steps_mean"] == pytest.approx(sum(table["steps"]) / table.height)
    for row in table.iter_rows(named=True):
        assert len(row["replies"]) == row["steps"]
        assert row["replies"][-1] == row["final_response"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(result.mlflow_run_id)
    assert run.data.tags["steprl.kind"] == "eval"
    assert run.data.metrics["eval/success_rate"] == pytest.approx(m["eval/success_rate"])
    assert "eval/episodes.json" in {
        a.path for a in client.list_artifacts(result.mlflow_run_id, "eval")
    }
