"""The `evaluate` flow: held-out success rate, pass@k, reward and steps of any checkpoint.

`steprl eval --config calculator_grpo --checkpoint latest` (or base, iter_0002, or a model
folder). Results go to an MLflow run nested under the training run.
"""

from __future__ import annotations

import sys

from prefect import flow, runtime

from agent_core.config.deployment import deployment_limits
from agent_core.config.load import check_config
from configs.run_config import RunConfig
from tasks.evaluate import EvalRun, evaluate_checkpoint


@flow(name="evaluate", log_prints=True)
def evaluate(config: RunConfig, checkpoint: str = "latest") -> EvalRun:
    """Evaluate `checkpoint` of the run `config.run.name` on the env's held-out seeds."""
    # A deployment's parameters never went through load_config, and anyone with the UI or
    # API sets them: such a run gets only the names, folders and checkpoints `steprl serve`
    # allows.
    check_config(config, deployment_limits() if runtime.deployment.id else None, checkpoint)
    tags = {"prefect.flow_run_id": str(runtime.flow_run.id)}
    result = evaluate_checkpoint(config, checkpoint, tags)
    metrics = result.outcome.metrics
    print(
        f"{checkpoint}: success_rate={metrics['eval/success_rate']:.3f} "
        f"pass_at_1={metrics['eval/pass_at_1']:.3f} reward={metrics['eval/reward_mean']:.3f} "
        f"steps={metrics['eval/steps_mean']:.2f} over {int(metrics['eval/episodes'])} episodes"
    )
    return result


if __name__ == "__main__":
    sys.exit("the evaluate flow runs from the steprl command: steprl eval --config NAME")
