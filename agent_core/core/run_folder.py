"""Every path inside a run folder (`<output_dir>/<run.name>`): checkpoints and the `latest`
pointer, the warm-up checkpoint, per-iteration folders and the records a rerun reads, the repair
count. Nothing else in steprl spells these names.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from agent_core.core.files import atomic_write_bytes
from agent_core.core.results import RunHandle
from configs.run_config import RunConfig

CHECKPOINTS = "checkpoints"


LATEST = "latest"


LOGGED_MARK = "logged.json"


REPAIRS = "repairs"


def run_dir_of(cfg: RunConfig) -> Path:
    """The folder of this run: `<output_dir>/<name>`."""
    return Path(cfg.run.output_dir) / cfg.run.name


def iteration_dir(run_dir: str | Path, iteration: int) -> Path:
    """The folder of iteration `iteration` (1-based) under `run_dir`."""
    return Path(run_dir) / f"iter_{iteration:04d}"


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    """The checkpoint written by iteration `iteration` (holds policy version `iteration`)."""
    return run_dir / CHECKPOINTS / f"iter_{iteration:04d}"


WARMUP = "warmup"


def warmup_dir(run_dir: Path) -> Path:
    """The checkpoint written by the supervised warm-up (policy version 0 when enabled)."""
    return Path(run_dir) / CHECKPOINTS / WARMUP


def policy_weights(run: RunHandle, version: int) -> Path:
    """The HF folder holding policy `version` (0 = the warm-up checkpoint or the base model)."""
    if version == 0:
        return Path(run.start_weights or run.base_model)
    return checkpoint_dir(Path(run.run_dir), version)


def is_logged(run_dir: Path, iteration: int) -> bool:
    return (iteration_dir(run_dir, iteration) / LOGGED_MARK).is_file()


def repairs(run_dir: Path, bump: bool = False) -> int:
    """How many times damaged files of this run were removed (`bump` counts one more)."""
    path = Path(run_dir) / REPAIRS
    count = int(path.read_text()) if path.is_file() else 0
    if bump:
        count += 1
        atomic_write_bytes(path, str(count).encode())
    return count


def write_latest(run_dir: Path, iteration: int) -> None:
    pointer = run_dir / CHECKPOINTS / LATEST
    tmp = pointer.with_name(LATEST + ".tmp")
    tmp.write_text(f"iter_{iteration:04d}\n")
    tmp.replace(pointer)


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    folders = sorted((run_dir / CHECKPOINTS).glob("iter_[0-9][0-9][0-9][0-9]"))
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
