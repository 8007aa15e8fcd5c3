"""Replay on disk: one Parquet partition of step rows per iteration, committed atomically.

Layout under a run folder: `iter_<k>/steps.parquet` then `iter_<k>/manifest.json`, each written
to a temp file and renamed; the manifest (row count, byte size, sha256) is written last and is
the only mark of a complete partition. Staging files between tasks are Arrow IPC.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from agent_core.faults import crash_point
from agent_core.replay.schema import SCHEMA_VERSION, STEP_SCHEMA, check_schema

STEPS_FILE = "steps.parquet"
MANIFEST_FILE = "manifest.json"


class CorruptPartitionError(RuntimeError):
    """A partition's files disagree with its manifest."""


@dataclass(frozen=True)
class PartitionInfo:
    """What the manifest records about a committed partition."""

    iteration: int
    rows: int
    bytes: int
    sha256: str
    path: str
    schema_version: int = SCHEMA_VERSION


def iteration_dir(run_dir: str | Path, iteration: int) -> Path:
    """The folder of iteration `iteration` (1-based) under `run_dir`."""
    return Path(run_dir) / f"iter_{iteration:04d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_ipc(table: pa.Table, path: Path) -> Path:
    """Write a staging table as Arrow IPC, atomically."""
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return path


def read_ipc(path: Path) -> pa.Table:
    """Read a staging table written by `write_ipc`; a damaged file raises
    CorruptPartitionError naming it."""
    try:
        with pa.memory_map(str(path)) as source:
            table = ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptPartitionError(f"{path} is not a readable Arrow file ({exc})") from exc
    check_schema(table, str(path))
    return table


def commit_partition(run_dir: str | Path, iteration: int, table: pa.Table) -> PartitionInfo:
    """Write iteration `iteration`'s steps as zstd Parquet, then its manifest (the commit)."""
    check_schema(table, f"iteration {iteration} steps")
    folder = iteration_dir(run_dir, iteration)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / STEPS_FILE
    tmp = folder / f".{STEPS_FILE}.tmp-{os.getpid()}"
    pq.write_table(table, tmp, compression="zstd")
    with tmp.open("rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    crash_point("replay", iteration)
    info = PartitionInfo(
        iteration, table.num_rows, target.stat().st_size, _sha256(target), str(target)
    )
    atomic_write_bytes(folder / MANIFEST_FILE, json.dumps(asdict(info), indent=2).encode())
    return info


def partition_info(run_dir: str | Path, iteration: int) -> PartitionInfo | None:
    """The manifest of a committed partition, or None when the iteration was never committed."""
    manifest = iteration_dir(run_dir, iteration) / MANIFEST_FILE
    if not manifest.is_file():
        return None
    try:
        return PartitionInfo(**json.loads(manifest.read_text()))
    except (ValueError, TypeError) as exc:
        raise CorruptPartitionError(f"{manifest} is not a valid manifest ({exc})") from exc


def verify_partition(run_dir: str | Path, iteration: int) -> PartitionInfo:
    """The manifest of a complete partition after checking the data file against it."""
    info = partition_info(run_dir, iteration)
    if info is None:
        raise FileNotFoundError(
            f"iteration {iteration} has no committed replay partition under {run_dir}"
        )
    path = iteration_dir(run_dir, iteration) / STEPS_FILE
    if not path.is_file() or path.stat().st_size != info.bytes or _sha256(path) != info.sha256:
        raise CorruptPartitionError(
            f"{path} does not match its manifest: delete the iteration folder to redo it"
        )
    return info


def read_partition(run_dir: str | Path, iteration: int) -> pa.Table:
    """The verified step table of one iteration."""
    verify_partition(run_dir, iteration)
    table = pq.read_table(iteration_dir(run_dir, iteration) / STEPS_FILE, schema=STEP_SCHEMA)
    return table


def complete_iterations(run_dir: str | Path) -> list[int]:
    """Iterations with a manifest, ascending."""
    found = []
    for folder in Path(run_dir).glob("iter_*"):
        if (folder / MANIFEST_FILE).is_file():
            found.append(int(folder.name.split("_")[1]))
    return sorted(found)


def scan_steps(run_dir: str | Path) -> pl.LazyFrame:
    """A polars lazy scan over every complete partition of a run (for analysis, minibatching)."""
    paths = [str(iteration_dir(run_dir, k) / STEPS_FILE) for k in complete_iterations(run_dir)]
    if not paths:
        return pl.LazyFrame(schema=pl.from_arrow(STEP_SCHEMA.empty_table()).schema)
    return pl.scan_parquet(paths)
