"""The `ray` section (module not named `ray`, so it never shadows the ray package): which Ray
the rollout workers and trainer ranks run on, how new weights reach the workers, and the
timeouts that find dead or hung actors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from configs.base import Section


class RaySection(Section):
    """Where rollout workers and trainer ranks run when `rollout.workers` > 0 or
    `trainer.ranks` > 1 (unused otherwise)."""

    address: str = Field(
        "",
        description="'' = start a local Ray in this process; 'auto' = join the cluster started "
        "on this node with `ray start --head`; 'ray://host:10001' = a remote cluster's client "
        "server.",
        pattern=r"^$|^auto$|^ray://[A-Za-z0-9_.\[\]:-]+$|^[A-Za-z0-9_.-]+:[0-9]+$",
    )
    num_cpus: int | None = Field(
        None,
        ge=1,
        description="CPUs of a local Ray ('' address only); None = what the workers and ranks "
        "reserve (a 2-core box can host 2 workers and 2 ranks at once).",
    )
    weight_sync: Literal["checkpoint", "object_store"] = Field(
        "checkpoint",
        description="How rollout workers get policy k+1 after an update: 'checkpoint' = each "
        "loads the HF checkpoint folder (storage every node sees; works multi-node); "
        "'object_store' = the trainer puts its weights into Ray's object store once and every "
        "worker reads them from memory.",
    )
    collect_timeout_s: float = Field(
        1800.0,
        gt=0.0,
        description="A rollout shard that has not finished after this many seconds is "
        "abandoned: its worker is killed and the shard redone on a fresh one.",
    )
    shard_attempts: int = Field(
        3,
        ge=1,
        description="Attempts per shard on (fresh) workers before the collect task fails; a "
        "dead or hung worker's shard is redone from scratch (its staged file is written once).",
    )
    start_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="Rollout workers or trainer ranks that Ray has not started after this many "
        "seconds (e.g. the cluster lacks the CPUs/GPUs they reserve) fail the run with the "
        "resources asked for and those the cluster has.",
    )
    update_timeout_s: float = Field(
        3600.0,
        gt=0.0,
        description="A multi-rank update call (update, save, values) that has not finished "
        "after this many seconds fails, naming the ranks that did not answer; all ranks are "
        "then stopped so nothing waits in a collective forever.",
    )
    heartbeat_timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="While a rollout worker or trainer rank runs a call, it answers heartbeats "
        "on a thread of its own; one that answers none for this many seconds (a stopped or "
        "frozen process, which Ray still takes for alive) is found within about twice this "
        "and taken for dead: a worker is replaced and its shard redone, a rank fails the call "
        "by name. Raise it if a loaded node answers slowly.",
    )
