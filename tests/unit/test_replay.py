"""Arrow replay: rows round-trip exactly, commits are atomic and verified, polars reads them."""

from __future__ import annotations

import gc
from pathlib import Path

import polars as pl
import pytest

from agent_core.records import Step
from agent_core.replay import (
    commit_partition,
    complete_iterations,
    read_partition,
    scan_steps,
    steps_to_table,
    table_to_steps,
)
from agent_core.replay.store import (
    MANIFEST_FILE,
    STEPS_FILE,
    CorruptPartitionError,
    iteration_dir,
    read_ipc,
    write_ipc,
)


def make_steps(n: int, iteration: int = 1) -> list[Step]:
    return [
        Step(
            run_id="r",
            iteration=iteration,
            policy_version=iteration - 1,
            group_id=f"g{i // 4}",
            trajectory_id=f"t{i // 2}",
            step_index=i % 2,
            task_id=f"task{i // 4}",
            env="calculator",
            prompt_ids=list(range(i, i + 5)),
            response_ids=[7, 8, i],
            response_logprobs=[-0.5, -0.25, -0.125],
            response_text=f"reply {i} ✓",
            feedback_text="5" if i % 2 == 0 else "",
            reward=0.5 * i,
            done=i % 2 == 1,
            truncated=False,
            anchor_key=None if i % 3 else f"pos={i}",
            env_reward=0.0,
            success=i % 4 == 3,
            return_=1.0 * i,
            advantage=-0.5 + i,
            value=None,
            info={"tool_calls_ok": i, "nested": {"a": [1, 2]}},
        )
        for i in range(n)
    ]


def test_table_round_trip() -> None:
    steps = make_steps(10)
    assert table_to_steps(steps_to_table(steps)) == steps


def test_table_to_steps_restores_the_garbage_collector_state() -> None:
    table = steps_to_table(make_steps(4))
    assert gc.isenabled()
    table_to_steps(table)
    assert gc.isenabled()
    gc.disable()
    try:
        table_to_steps(table)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_ipc_round_trip(tmp_path: Path) -> None:
    steps = make_steps(6)
    write_ipc(steps_to_table(steps), tmp_path / "a.arrow")
    assert table_to_steps(read_ipc(tmp_path / "a.arrow")) == steps


def test_commit_and_read(tmp_path: Path) -> None:
    steps = make_steps(8)
    info = commit_partition(tmp_path, 1, steps_to_table(steps))
    assert info.rows == 8
    folder = iteration_dir(tmp_path, 1)
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST_FILE, STEPS_FILE]
    assert table_to_steps(read_partition(tmp_path, 1)) == steps
    commit_partition(tmp_path, 2, steps_to_table(make_steps(4, iteration=2)))
    assert complete_iterations(tmp_path) == [1, 2]
    frame = scan_steps(tmp_path).group_by("iteration").agg(pl.len()).sort("iteration").collect()
    assert frame.to_dicts() == [{"iteration": 1, "len": 8}, {"iteration": 2, "len": 4}]


def test_partition_without_manifest_is_not_complete(tmp_path: Path) -> None:
    commit_partition(tmp_path, 1, steps_to_table(make_steps(2)))
    (iteration_dir(tmp_path, 1) / MANIFEST_FILE).unlink()
    assert complete_iterations(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="no committed replay partition"):
        read_partition(tmp_path, 1)


def test_corrupt_partition_is_detected(tmp_path: Path) -> None:
    commit_partition(tmp_path, 1, steps_to_table(make_steps(4)))
    data = iteration_dir(tmp_path, 1) / STEPS_FILE
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptPartitionError, match=str(data)):
        read_partition(tmp_path, 1)


def test_wrong_schema_refused(tmp_path: Path) -> None:
    table = steps_to_table(make_steps(2)).drop_columns(["reward"])
    with pytest.raises(ValueError, match="reward"):
        commit_partition(tmp_path, 1, table)
