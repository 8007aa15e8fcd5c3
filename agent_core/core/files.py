"""The one way steprl writes a file that a rerun or a reader trusts (records, manifests, pointers,
configs): a temp file beside it, flushed to disk, renamed over it, so a crash leaves the old
file or the new one, never half of one.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` as `atomic_write_bytes` does."""
    atomic_write_bytes(path, text.encode("utf-8"))
