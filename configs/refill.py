"""The `refill` section: dynamic sampling, i.e. which groups of an iteration are left out of its
update (zero reward variance, failed, stale) and replaced by groups of new tasks collected in
extra rounds until the batch is full, and what a failed group gets. Off by default (`drop: []`):
every collected group trains, as before."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from configs.base import Section

DropReason = Literal["zero_variance", "uniform_outcome", "no_success", "failed", "stale"]


class RefillSection(Section):
    """Dynamic sampling (DAPO): drop groups that teach nothing or went wrong, refill the batch
    from new tasks (docs/algorithms.md, Dynamic sampling and refill)."""

    drop: list[DropReason] = Field(
        default_factory=list,
        description="Which groups are left out of the update and replaced: 'zero_variance' "
        "(every episode of the task got the same total reward, within algorithm.epsilon: no "
        "contrast for a group baseline), 'uniform_outcome' (every episode succeeded, or every "
        "one failed: DAPO's accuracy filter; such a group's advantages come only from other "
        "reward differences, such as an env's per-step penalties or shaping terms), "
        "'no_success' (every episode failed: the half of that filter that costs nothing on "
        "an env the policy already solves, where every group succeeds), 'failed' "
        "(an episode ended in an env error or an agent error, timeout or refused call, or left "
        "no row), 'stale' (a row is older than "
        "overlap.max_staleness; needs overlap.on_stale=drop). Empty (the default) = every "
        "group trains as collected. A task with no row at all is always replaced once any "
        "reason is listed: it has no group to keep.",
    )
    max_rounds: int = Field(
        3,
        ge=0,
        le=100,
        description="Extra collection rounds per iteration. Each round draws as many new tasks "
        "as the batch lacks groups (plus retried ones), so the batch never overshoots "
        "rollout.tasks_per_iteration; when the rounds run out first, the update trains on the "
        "groups kept (refill/batch_full = 0). 0 = drop without refilling.",
    )
    on_failed: Literal["retry", "refill", "fail"] = Field(
        "retry",
        description="What a failed group gets when 'failed' is in drop: 'retry' (the default) "
        "runs the same task again in the next round with fresh envs and episode seeds, so a "
        "transient failure (a flaky tool, a sandbox or agent timeout) does not remove the task "
        "and the batch keeps the task mix it drew (dropping failures biases training toward "
        "tasks that never fail); a task still failing when the rounds run out is dropped and "
        "counted. 'refill': replace it with a new task. 'fail': stop the iteration with an "
        "error naming the task and the failure.",
    )

    @field_validator("drop")
    @classmethod
    def _distinct(cls, drop: list[str]) -> list[str]:
        if len(set(drop)) != len(drop):
            raise ValueError("a reason is listed twice: list each once")
        return drop
