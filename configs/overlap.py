"""The `overlap` section: asynchronous training, i.e. how far rollout collection may run ahead of
the policy update (a bound on policy-version age), what happens to rows older than the bound, and
whether an episode in flight takes new weights at its next turn. Off by default (`max_staleness:
0`): each iteration collects with the policy the previous update produced, as before."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from configs.base import Section


class OverlapSection(Section):
    """Collection of later iterations while iteration k updates, bounded by policy-version age
    (docs/algorithms.md, Asynchronous training)."""

    max_staleness: int = Field(
        0,
        ge=0,
        le=8,
        description="S: the most policy versions a trained row may lag the policy it trains "
        "(trained version k-1 minus the row's policy_version). 0 = the sequential loop (collect, "
        "score, write, update, in turn). With S >= 1, collection of iterations k+1..k+S runs "
        "while iteration k updates, each sampling with the newest policy committed when it "
        "starts. Needs an off-policy correction (trainer.off_policy_correction).",
    )
    on_stale: Literal["wait", "drop"] = Field(
        "wait",
        description="'wait' (the default): an iteration's collection starts only once a policy "
        "at most S versions behind its update exists, so no row of its own is ever too old. "
        "'drop': collection runs one iteration further ahead (S+1) without waiting; rows older "
        "than S when their update runs are left out, counted (async/dropped_stale_rows) and "
        "recorded per task in the update's record.",
    )
    partial_rollouts: bool = Field(
        True,
        description="An episode in flight when a newer policy is committed continues under it "
        "from its next turn (each step keeps the version that sampled it; async/"
        "mixed_version_trajectories counts trajectories with more than one). False: a "
        "collection keeps the policy it started with to its end.",
    )
