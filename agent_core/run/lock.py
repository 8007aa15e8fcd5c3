"""One writer per run folder: an exclusive `flock` on `<run>/run.lock`, held from prepare_run
to finish_run. The kernel drops it when the holding process dies, so a crashed or killed run
never leaves the folder locked; the file names the holder (pid, host, start) for the message.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import IO

from agent_core.core.run_folder import LOCK_FILE

_HELD: dict[str, IO[str]] = {}  # resolved run folder -> its open, locked file
_GUARD = threading.Lock()


class RunLockedError(RuntimeError):
    """Another live process is training this run folder."""


def _holder(handle: IO[str]) -> str:
    handle.seek(0)
    try:
        info = json.loads(handle.read() or "{}")
    except ValueError:
        info = {}
    if not info:
        return "a process that is starting"
    here = " (this process)" if info.get("pid") == os.getpid() else ""
    return f"pid {info.get('pid')}{here} on {info.get('host')} since {info.get('started')}"


def acquire(run_dir: Path, run_name: str) -> None:
    """Lock `run_dir` for this process, or raise RunLockedError naming the live holder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = (run_dir / LOCK_FILE).open("a+")  # never truncated before it is ours
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        handle.close()
        raise RunLockedError(
            f"run {run_name!r} is already being trained by {holder} (lock {run_dir / LOCK_FILE}): "
            "wait for it to finish, stop it, or choose another run.name"
        ) from None
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": started}, handle)
    handle.flush()
    with _GUARD:
        _HELD[str(run_dir.resolve())] = handle


def release(run_dir: Path) -> None:
    """Unlock `run_dir` if this process holds it (the file stays: removing a lock file races
    with a process that has just opened it)."""
    with _GUARD:
        handle = _HELD.pop(str(Path(run_dir).resolve()), None)
    if handle is not None:
        handle.truncate(0)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
