"""The small results the phases of an iteration return and the Prefect tasks pass along: where a
run lives (`RunHandle`), a rollout shard, the scored steps, the committed partition, the update.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class RunHandle(BaseModel):
    """Where a run lives and where it (re)starts."""

    run_dir: str
    mlflow_run_id: str
    base_model: str
    start_weights: str = Field(
        "", description="Policy version 0: the warm-up checkpoint when warm-up is on, else base."
    )
    start_iteration: int
    iterations: int
    shards: int = Field(
        1, description="Rollout shards each iteration's tasks split into (`rollout.shard`)."
    )
    tracking_uri: str = Field("", description="The MLflow tracking URI the run logs to.")
    repairs: int = Field(
        0,
        description="Reruns that removed damaged files; part of the task cache key, so the "
        "tasks whose files were removed run again instead of returning their cached results.",
    )


class ShardResult(BaseModel):
    """One rollout shard's staging file and counts."""

    iteration: int
    shard: int
    path: str
    episodes: int
    steps: int
    generate_calls: int
    generated_tokens: int
    prompt_tokens: int
    generate_seconds: float
    seconds: float = Field(description="Wall seconds of the shard, its failed tries included.")
    pid: int = Field(0, description="Process that ran the shard (the flow's, or a worker's).")
    attempts: int = Field(
        1, description="Tries it took: more than one when its rollout worker died or stalled."
    )
    failed_seconds: float = Field(
        0.0, description="Seconds of the failed tries (until each was found out), in `seconds`."
    )
    episode_ends: dict[str, int] = Field(
        default_factory=dict,
        description="Agent functions: episodes per way they ended (agent, answer, agent_error, "
        "timeout, refused).",
    )
    lost_episodes: dict[str, str] = Field(
        default_factory=dict,
        description="Agent functions: episodes that left no row (no answered call), and why.",
    )


class ScoreResult(BaseModel):
    """Scored steps (staging) and the iteration's reward and advantage statistics."""

    iteration: int
    path: str
    steps: int
    trajectories: int
    metrics: dict[str, float]
    seconds: float


class PartitionResult(BaseModel):
    """The committed replay partition."""

    iteration: int
    path: str
    rows: int
    sha256: str
    seconds: float


class UpdateResult(BaseModel):
    """The policy update's metrics and the checkpoint it produced."""

    iteration: int
    policy_version: int
    checkpoint: str
    metrics: dict[str, float]
    seconds: float
    replayed: list[tuple[int, str, int]] = Field(
        default_factory=list,
        description="The past rows the update mixed in (replay.past_iterations > 0), each as "
        "(iteration, trajectory_id, step_index); empty without replay.",
    )
    tasks: dict[str, str] = Field(
        default_factory=dict,
        description="Every task id the iteration drew -> 'trained' (some row of it was in the "
        "update), or why not: 'stale' (older than overlap.max_staleness), 'zero_variance' (no "
        "row with a nonzero advantage), 'failed' (no row: every episode lost).",
    )
