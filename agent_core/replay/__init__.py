"""Step-level replay: the Arrow schema and atomic, manifest-committed Parquet partitions."""

from agent_core.replay.schema import STEP_SCHEMA, steps_to_table, table_to_steps
from agent_core.replay.store import (
    commit_partition,
    complete_iterations,
    iteration_dir,
    read_partition,
    scan_steps,
)

__all__ = [
    "STEP_SCHEMA",
    "commit_partition",
    "complete_iterations",
    "iteration_dir",
    "read_partition",
    "scan_steps",
    "steps_to_table",
    "table_to_steps",
]
