"""The `evaluate` flow: held-out success rate, pass@k, reward and steps of any checkpoint.

`python -m flows.evaluate --config calculator_grpo --checkpoint latest` (or base, iter_0002,
or a model folder). Results go to an MLflow run nested under the training run.
"""

from __future__ import annotations

import argparse
import json
import sys

from prefect import flow, runtime

from agent_core.config.load import (
    ConfigError,
    RunConfig,
    check_config,
    deployment_limits,
    load_config,
)
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


def main(argv: list[str] | None = None) -> int:
    """Command line for the evaluate flow."""
    parser = argparse.ArgumentParser(description="Evaluate a steprl checkpoint (a Prefect flow).")
    parser.add_argument("--config", default="calculator_grpo", help="preset name or YAML path")
    parser.add_argument(
        "--checkpoint", default="latest", help="base, latest, iter_000k or a folder"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.set)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    result = evaluate(config, args.checkpoint)
    print(json.dumps(result.model_dump(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
