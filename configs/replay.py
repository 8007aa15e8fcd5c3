"""The `replay` section: the replay buffer, i.e. which step rows of earlier committed iterations
each update mixes in beside its own (a window, an age bound, a share, a sampling rule). Off by
default: each update trains on its own iteration's rows only."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from configs.base import Section


class ReplaySection(Section):
    """Replay buffer: rows of earlier iterations mixed into each update (off by default). They
    are off-policy: they keep their stored advantage, response log-probs and policy version;
    pair them with an off-policy correction of the loss (docs/algorithms.md, Replay buffer)."""

    past_iterations: int = Field(
        0,
        ge=0,
        description="Window N: the update of iteration k may mix in rows of the committed "
        "partitions of iterations k-N .. k-1 (never an uncommitted one); 0 = off, each update "
        "trains on its own iteration's rows only.",
    )
    max_age: int = Field(
        2,
        ge=0,
        description="Policy-version age bound: a past row is used only when (the version the "
        "update trains, k-1) - its policy_version <= max_age; older rows are left out and "
        "counted (actor/replay_dropped_for_age). Rows of iteration k-j are at least j old.",
    )
    share: float = Field(
        1.0,
        gt=0.0,
        description="Past rows per own row: the update mixes in floor(share x the iteration's "
        "own trained rows) past rows, or every eligible one when fewer are.",
    )
    rule: Literal["recent", "uniform", "prioritized"] = Field(
        "recent",
        description="Which eligible past rows are taken: 'recent' = newest iteration first "
        "(whole trajectories in order); 'uniform' = uniformly without replacement; "
        "'prioritized' = without replacement with probability proportional to |advantage|. "
        "Draws are seeded by run.seed and the iteration, so a rerun takes the same rows.",
    )

    @model_validator(mode="after")
    def _window_within_age(self) -> ReplaySection:
        if self.past_iterations > self.max_age:
            raise ValueError(
                f"replay.past_iterations={self.past_iterations} reaches rows at least "
                f"{self.past_iterations} policy versions old, beyond replay.max_age="
                f"{self.max_age}, which would always be dropped: set replay.past_iterations <= "
                f"{self.max_age} or raise replay.max_age"
            )
        return self
