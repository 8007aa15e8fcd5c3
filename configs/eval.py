"""The `eval` section: evaluation on held-out seeds (the env's eval range), standalone or every K
iterations during training; pass@k over several samples per task."""

from __future__ import annotations

from pydantic import Field

from configs.base import Section


class EvalSection(Section):
    """Evaluation on held-out seeds (the env's eval range), standalone or during training."""

    episodes: int = Field(
        32, ge=1, description="Held-out task instances evaluated (the first N eval seeds)."
    )
    samples_per_task: int = Field(
        1,
        ge=1,
        description="Samples per task (n); pass@k is reported for k = 1 and k = n. Needs "
        "temperature > 0 to be more than one distinct sample.",
    )
    temperature: float = Field(
        0.0, ge=0.0, description="Sampling temperature for evaluation; 0 = greedy."
    )
    every: int = Field(
        0,
        ge=0,
        description="During training, evaluate every K iterations (and the base policy before "
        "iteration 1) and log eval/* metrics; 0 = never.",
    )
