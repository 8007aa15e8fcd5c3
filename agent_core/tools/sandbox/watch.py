"""What one sandboxed call uses on the host, seen from outside: the total memory of its whole
process tree (and its cgroup's kills), the bytes it wrote (deleted files it still holds too),
and the files it left in shared world-writable folders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from agent_core.tools.sandbox.cgroup import CallCgroup

# Folders any uid may write to; the fallback "uid" level must leave nothing in them.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
MEMORY_POLL_S = 0.05
DISK_POLL_S = 0.25


def process_tree(root: int) -> list[int]:
    """`root` and every live descendant, from one pass over /proc (parent links)."""
    children: dict[int, list[int]] = {}
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    line = handle.read()
            except OSError:  # exited while we looked
                continue
            ppid = int(line.rsplit(b")", 1)[1].split()[1])  # the command name may hold ")"
            children.setdefault(ppid, []).append(int(entry.name))
    tree, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        frontier.extend(children.get(pid, ()))
    return tree


def task_count(pids: list[int]) -> int:
    """Threads of `pids` together: each may hold a file table of its own (clone without
    CLONE_FILES), so each may fill its open files' pipe and socket buffers."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                total += int(handle.read().rsplit(b")", 1)[1].split()[17])  # num_threads
        except (OSError, ValueError, IndexError):  # exited while we looked
            continue
    return total


def stop_tree(root: int) -> list[int]:
    """SIGSTOP the descendants of `root` until a pass over /proc finds no new one, then return
    the tree: a stopped process cannot fork, so killing the tree leaves nothing behind."""
    stopped: set[int] = set()
    while True:
        tree = process_tree(root)
        new = [pid for pid in tree[1:] if pid not in stopped]
        if not new:
            return tree
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped.update(new)


def memory_bytes(pid: int) -> int:
    """Proportional set size plus swap of one process: pages shared by forks count once in all."""
    total_kb = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith((b"Pss:", b"SwapPss:")):
                    total_kb += int(line.split()[1])
    except (OSError, ValueError):
        return 0  # exited (or a zombie): it holds no memory any more
    return total_kb * 1024


def _entries(roots: list[str], descend) -> Iterator[tuple[os.DirEntry, os.stat_result]]:
    """(entry, lstat) of everything under `roots`, never following links; a folder is entered
    when `descend(info)` says so. Unreadable entries are skipped (they come and go)."""
    stack = list(roots)
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield entry, info
            if stat.S_ISDIR(info.st_mode) and descend(info):
                stack.append(entry.path)


def written_bytes(folder: str, owner: int | None = None) -> int:
    """Disk bytes of the files under `folder` (only those of uid `owner` when given), without
    following links; with an owner, only folders that uid can write into are entered."""

    def mine(info: os.stat_result) -> bool:
        return owner is None or info.st_uid == owner

    def descend(info: os.stat_result) -> bool:
        return mine(info) or bool(info.st_mode & stat.S_IWOTH)

    return sum(
        info.st_blocks * 512
        for _, info in _entries([folder], descend)
        if not stat.S_ISDIR(info.st_mode) and mine(info)
    )


def held_deleted_bytes(pids: list[int]) -> int:
    """Disk bytes of the files that `pids` keep open or mapped after unlinking them: a walk of
    the folders no longer sees those, yet they hold their space until the last holder exits.
    Each file counts once; a mapping is only seen with CAP_SYS_ADMIN (root), an open one always.
    """
    sizes: dict[tuple[int, int], int] = {}
    for pid in pids:
        for path in _held_paths(pid):
            try:
                info = os.stat(path)  # follows the magic link to the file itself
            except OSError:  # closed or exited while we looked; or a mapping without root
                continue
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
                sizes[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return sum(sizes.values())


def _held_paths(pid: int) -> list[str]:
    """/proc links to what `pid` holds: its open files, and its mappings of deleted files."""
    paths: list[str] = []
    with contextlib.suppress(OSError):
        paths += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as handle:
        deleted = (line.split(maxsplit=1)[0] for line in handle if line.endswith(" (deleted)\n"))
        paths += [f"/proc/{pid}/map_files/{span}" for span in deleted]
    return paths


def remove_owned(owner: int, folders: tuple[str, ...] = SHARED_WRITABLE) -> list[str]:
    """Delete what uid `owner` created under the shared folders (never following links); the
    paths removed. Only others' world-writable folders are searched further (the owner's own
    go whole)."""
    removed = []

    def descend(info: os.stat_result) -> bool:
        return info.st_uid != owner and bool(info.st_mode & stat.S_IWOTH)

    for entry, info in _entries([f for f in folders if os.path.isdir(f)], descend):
        if info.st_uid != owner:
            continue
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        removed.append(entry.path)
    return removed


@dataclass
class CallWatch:
    """Polled by the host while a call runs: which whole-call limit, if any, it went over.

    Memory is the summed PSS of the call's process tree (the launcher keeps orphans in it), so
    forked children cannot multiply the limit; between two polls each process is still held to
    the limit by its own RLIMIT_AS, and where the call has a memory cgroup the kernel caps all it
    holds at every allocation (a kill there stops the whole call). Where no RLIMIT_NPROC holds
    the call, its processes and threads are counted against `max_tasks`. Written bytes count the
    scratch folder (None: a tmpfs bounds it), for a private uid that uid's files in the shared
    writable folders, and deleted files the call still holds.
    """

    root_pid: int
    memory_limit: int
    scratch: str | None
    scratch_limit: int
    owner: int | None
    cgroup: CallCgroup | None = None
    max_tasks: int | None = None  # where no RLIMIT_NPROC holds the call (level none)
    peak_memory: int = 0
    _next_memory: float = 0.0
    _next_disk: float = 0.0
    _in_folders: int = 0
    pids: list[int] = field(default_factory=list)

    def check(self) -> tuple[str, str] | None:
        """(killed_by, reason) once a limit is exceeded, else None; cheap between polls."""
        now = time.monotonic()
        if now < self._next_memory:
            return None
        self._next_memory = now + MEMORY_POLL_S
        over = self.kernel_kill()
        if over is not None:
            return over
        self.pids = process_tree(self.root_pid)
        used = sum(memory_bytes(pid) for pid in self.pids)
        self.peak_memory = max(self.peak_memory, used)
        mib = 1024 * 1024
        if used > self.memory_limit:
            return "memory", (
                f"memory limit: the call's {len(self.pids)} processes used "
                f"{used // mib}MB together (limit {self.memory_limit // mib}MB)"
            )
        tasks = task_count(self.pids) if self.max_tasks is not None else 0
        if self.max_tasks is not None and tasks > self.max_tasks:
            return "processes", (
                f"process limit: the call ran {tasks} processes and threads, its launcher "
                f"included (limit {self.max_tasks})"
            )
        return self._check_disk(now)

    def kernel_kill(self) -> tuple[str, str] | None:
        """("memory", reason) once the call's cgroup killed one of its processes, else None."""
        if self.cgroup is None or self.cgroup.oom_kills() == 0:
            return None
        mib = 1024 * 1024
        return "memory", (
            f"memory limit: the kernel counted {self.cgroup.peak_bytes() // mib}MB held by the "
            f"call (its processes, scratch and pipe and socket buffers; limit "
            f"{self.cgroup.limit_bytes // mib}MB = memory_mb {self.memory_limit // mib}MB "
            f"+ scratch_mb {self.scratch_limit // mib}MB + "
            f"{(self.cgroup.limit_bytes - self.memory_limit - self.scratch_limit) // mib}MB "
            f"for buffers)"
        )

    def _check_disk(self, now: float) -> tuple[str, str] | None:
        if self.scratch is None and self.owner is None:
            return None
        if now >= self._next_disk:  # walking folders costs more than reading a few /proc links
            self._next_disk = now + DISK_POLL_S
            self._in_folders = written_bytes(self.scratch) if self.scratch else 0
            if self.owner is not None:
                self._in_folders += sum(written_bytes(f, self.owner) for f in SHARED_WRITABLE)
        held = held_deleted_bytes(self.pids)
        if self._in_folders + held <= self.scratch_limit:
            return None
        mib = 1024 * 1024
        also = f", {held // mib}MB of it in deleted files still held" if held else ""
        return "scratch", (
            f"scratch limit: {(self._in_folders + held) // mib}MB written{also} (limit "
            f"{self.scratch_limit // mib}MB)"
        )
