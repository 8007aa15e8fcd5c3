"""Step-level replay: the Arrow schema and atomic, manifest-committed Parquet partitions."""

from agent_core.replay.invariants import PartitionInvariantError
from agent_core.replay.schema import STEP_SCHEMA, steps_to_table, table_to_steps
from agent_core.replay.store import (
    CorruptPartitionError,
    commit_partition,
    complete_iterations,
    read_partition,
    read_step_file,
    scan_steps,
    verify_partition,
)

__all__ = [
    "STEP_SCHEMA",
    "CorruptPartitionError",
    "PartitionInvariantError",
    "commit_partition",
    "complete_iterations",
    "read_partition",
    "read_step_file",
    "scan_steps",
    "steps_to_table",
    "table_to_steps",
    "verify_partition",
]
