"""Prefect tasks of evaluation: held-out episodes of a checkpoint, one verb each."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from agent_core.core.results import RunHandle
from agent_core.run import evaluate as evaluation
from agent_core.run.evaluate import EvalOutcome, EvalRun
from configs.run_config import RunConfig


@task(name="evaluate_policy", cache_policy=NONE)
def evaluate_policy(
    config: RunConfig, run: RunHandle, version: int, before_warmup: bool = False
) -> EvalOutcome:
    """Evaluate policy `version` of a training run; eval/* metrics go to that run."""
    return evaluation.evaluate_in_training(config, run, version, before_warmup)


@task(name="evaluate_checkpoint", cache_policy=NONE)
def evaluate_checkpoint(config: RunConfig, checkpoint: str, tags: dict[str, str]) -> EvalRun:
    """Evaluate a checkpoint in an MLflow run of its own (nested under the training run)."""
    return evaluation.evaluate_checkpoint(config, checkpoint, tags)
