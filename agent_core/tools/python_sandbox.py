"""The `python` tool: runs model-written code in a throw-away, resource-limited sandbox process.

Owns the isolation levels (each probed once per process, never weakened silently), the plan of
one sandboxed run and its output capture; the launcher and the host-side watch have own modules.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, Literal

from agent_core.tools.base import BaseTool, ToolResult
from agent_core.tools.sandbox.launcher import launcher_source
from agent_core.tools.sandbox.watch import MEMORY_POLL_S, CallWatch, remove_owned, stop_tree

logger = logging.getLogger(__name__)

Isolation = Literal["namespaces", "uid", "none"]
LEVELS: tuple[Isolation, ...] = ("namespaces", "uid", "none")
# The parser takes a call of at most 4,000 characters (envs/tool_calls.py MAX_CALL_CHARS): a
# program this long fits even when JSON escapes each of its characters to two (quotes,
# backslashes, newlines, tabs), so what the schema advertises is what a call can carry.
MAX_CODE_CHARS = 1_900
# The launcher exits with this when it cannot build the sandbox or start the program.
SETUP_FAILED_EXIT = 125
SETUP_MARKER = "steprl-sandbox:"
# Each call runs as a fresh uid from this range (no /etc/passwd entry): RLIMIT_NPROC counts
# processes per uid, so a shared uid like `nobody` would let one call's fork bomb starve the
# concurrent calls of other episodes.
UID_BASE = 2_000_000_000
UID_SPAN = 100_000_000
SANDBOX_DIR = "/sandbox"
DEVICES = ("null", "zero", "random", "urandom")
TOP_LEVEL_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
UNSHARE_FLAGS = ("--pid", "--fork", "--kill-child", "--net", "--mount", "--ipc", "--uts")
USER_NAMESPACE_FLAGS = ("--user", "--map-root-user")
USERNS_SYSCTL = "/proc/sys/user/max_user_namespaces"
# What the weaker levels leave open; the file part depends on Landlock (see `weakness`).
WARNINGS: dict[Isolation, str] = {
    "namespaces": "",
    "uid": "no namespaces: the code shares the host's pid and network namespaces (seccomp still "
    "blocks network sockets and every unix socket but a connected stream pair)",
    "none": "no namespaces and no uid drop: the code runs as this user (as root: without any "
    "capability) and its process count is not limited; seccomp still blocks network sockets "
    "and every unix socket but a connected stream pair",
}
FILES_OPEN: dict[Isolation, str] = {
    "namespaces": "",
    "uid": "it can read world-readable host files (the project too)",
    "none": "it can read and write this user's files",
}
WEAKER: dict[Isolation, str] = {
    "uid": "isolation='uid' (root only: a fresh uid per call, no namespaces)",
    "none": "isolation='none' (runs as this user)",
}


class SandboxUnavailable(ValueError):
    """The requested isolation level cannot run here; the message says what is missing."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call resource limits; `cpu_s` defaults to the wall-clock timeout rounded up."""

    timeout_s: float = 5.0
    memory_mb: int = 256
    cpu_s: int | None = None
    max_processes: int = 16
    output_chars: int = 8192
    file_mb: int = 16
    scratch_mb: int = 64
    open_files: int = 64

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value is not None and value <= 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {value}")
        if self.memory_mb < 32:
            raise ValueError(f"memory_mb={self.memory_mb} is too small for Python; use >= 32")

    @property
    def cpu_seconds(self) -> int:
        return self.cpu_s or max(1, math.ceil(self.timeout_s))

    def rlimits(self, with_nproc: bool) -> dict[str, tuple[int, int]]:
        """(soft, hard) per RLIMIT name; NPROC only counts when the call has a uid of its own
        (a fresh uid, or root of its own user namespace)."""
        mib = 1024 * 1024
        limits = {
            # Per process; the whole call's total is held by the host's CallWatch.
            "RLIMIT_AS": (self.memory_mb * mib, self.memory_mb * mib),
            # SIGXCPU at the soft limit, SIGKILL one second later if it is caught.
            "RLIMIT_CPU": (self.cpu_seconds, self.cpu_seconds + 1),
            "RLIMIT_FSIZE": (self.file_mb * mib, self.file_mb * mib),
            "RLIMIT_NOFILE": (self.open_files, self.open_files),
            "RLIMIT_CORE": (0, 0),
        }
        if with_nproc:
            limits["RLIMIT_NPROC"] = (self.max_processes, self.max_processes)
        return limits


@dataclass(frozen=True)
class _Outcome:
    """What one sandboxed run produced: the raw exit status and the kept head of the output.

    `stopped_by` is "timeout", "memory" or "scratch" when the host killed the call (then
    `returncode` is None and `stop_reason` says what was exceeded)."""

    returncode: int | None
    output: bytes
    total_bytes: int
    stopped_by: str | None = None
    stop_reason: str = ""


@cache
def _interpreter() -> str:
    """The real interpreter behind this (maybe venv) Python: the venv itself lives in the repo."""
    return os.path.realpath(sys.executable)


@cache
def _system_view() -> tuple[tuple[str, ...], dict[str, str]]:
    """Read-only bind mounts and top-level symlinks that make the interpreter run after chroot."""
    binds: list[str] = []
    links: dict[str, str] = {}
    for top in TOP_LEVEL_SYSTEM:
        if os.path.islink(top):
            links[top] = os.readlink(top)
        elif os.path.isdir(top):
            binds.append(top)
    interpreter_dirs = (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(_interpreter()))
    for path in map(os.path.realpath, interpreter_dirs):
        if not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)
    return tuple(binds), links


@cache
def _landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 = none): it confines files of the levels without
    a chroot."""
    if not sys.platform.startswith("linux"):
        return 0
    import ctypes

    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(0, ctypes.CDLL(None).syscall(444, None, 0, 1))


def _environment(home: str) -> dict[str, str]:
    """A fresh environment: nothing of the trainer's (tokens, paths, proxies) leaks in."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        # glibc reserves 64 MB of address space per thread arena, which RLIMIT_AS would count.
        "MALLOC_ARENA_MAX": "2",
    }


def _user_namespace() -> bool:
    """Whether the namespaces level makes its own user namespace: without root there is no
    fresh uid to switch to, so the code runs as the root of a new user namespace instead."""
    return os.geteuid() != 0


def _call_uid(level: Isolation) -> int | None:
    """The fresh uid of one call, or None where the code keeps this process's uid."""
    if level == "none" or (level == "namespaces" and _user_namespace()):
        return None
    return random.randrange(UID_BASE, UID_BASE + UID_SPAN)


def _plan(
    level: Isolation, workdir: str, limits: SandboxLimits, uid: int | None
) -> tuple[list[str], dict[str, Any]]:
    """The command line and launcher config for one run at `level` inside host dir `workdir`."""
    namespaced = level == "namespaces"
    own_userns = namespaced and _user_namespace()
    scratch = SANDBOX_DIR if namespaced else os.path.join(workdir, "scratch")
    if namespaced:
        os.mkdir(os.path.join(workdir, "root"))
    else:
        os.mkdir(scratch, 0o700)
        if uid is not None:
            os.chown(scratch, uid, uid)
            os.chmod(workdir, 0o711)  # the uid must traverse into its scratch dir
    binds, links = _system_view()
    cfg = {
        "program": os.path.join(workdir, "main.py"),
        "new_root": os.path.join(workdir, "root") if namespaced else None,
        "binds": list(binds),
        "symlinks": links,
        "devices": list(DEVICES),
        "scratch": scratch,
        "scratch_mb": limits.scratch_mb,
        "uid": uid,
        # The code would be a root: of its own user namespace, or the host's at level "none".
        "drop_capabilities": own_userns or (level == "none" and os.geteuid() == 0),
        "landlock_abi": 0 if namespaced else _landlock_abi(),
        "python": _interpreter(),
        "env": _environment(scratch),
        "rlimits": limits.rlimits(with_nproc=uid is not None or own_userns),
        "alarm_s": math.ceil(limits.timeout_s) + 2,
        "setup_failed_exit": SETUP_FAILED_EXIT,
    }
    argv = [_interpreter(), "-I", "-c", launcher_source(), json.dumps(cfg)]
    if namespaced:
        flags = (*USER_NAMESPACE_FLAGS, *UNSHARE_FLAGS) if own_userns else UNSHARE_FLAGS
        argv = [shutil.which("unshare") or "unshare", *flags, "--", *argv]
    return argv, cfg


def _has_exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (a reaped leader's pgid could be reused)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _collect(
    pid: int, fd: int, deadline: float, cap: int, watch: CallWatch
) -> tuple[bytes, int, tuple[str, str] | None]:
    """Read merged output until `pid` exits, the deadline passes or `watch` sees a whole-call
    limit exceeded; keep the first `cap` bytes.

    Reading continues past the cap (and is discarded) so the program never blocks on a full
    pipe. Returns (kept bytes, total bytes, (stopped_by, reason) or None).
    """
    kept = bytearray()
    total = 0
    pipe_open = True
    os.set_blocking(fd, False)
    while True:
        exited = _has_exited(pid)
        remaining = deadline - time.monotonic()
        if not exited:
            stop = ("timeout", "") if remaining <= 0 else watch.check()
            if stop is not None:
                return bytes(kept), total, stop
        if pipe_open:
            wait = 0 if exited else min(remaining, MEMORY_POLL_S)
            readable, _, _ = select.select([fd], [], [], wait)
            chunks = 0  # a program that never stops printing must not starve the watch
            while readable and time.monotonic() < deadline and (exited or chunks < 16):
                chunks += 1
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    pipe_open = False
                    break
                total += len(chunk)
                kept += chunk[: max(0, cap - len(kept))]
        elif not exited:  # output closed early; the program may still be running
            time.sleep(min(remaining, 0.01))
        if exited:
            return bytes(kept), total, None


def _run_process(
    argv: list[str], cfg: dict[str, Any], cwd: str, limits: SandboxLimits, level: Isolation
) -> _Outcome:
    """Run `argv` in its own session under a CallWatch; on a stop (and after any exit) kill the
    whole process tree and group."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=cfg["env"],
        cwd=cwd,
        start_new_session=True,
    )
    assert proc.stdout is not None
    mib = 1024 * 1024
    on_host = level != "namespaces"  # the namespaces scratch is a size-limited tmpfs
    watch = CallWatch(
        proc.pid,
        memory_limit=limits.memory_mb * mib,
        scratch=cfg["scratch"] if on_host else None,
        scratch_limit=limits.scratch_mb * mib,
        owner=cfg["uid"] if on_host else None,
    )
    stop: tuple[str, str] | None = ("timeout", "")
    try:
        deadline = time.monotonic() + limits.timeout_s
        cap = 4 * limits.output_chars  # UTF-8: at most 4 bytes per character
        kept, total, stop = _collect(proc.pid, proc.stdout.fileno(), deadline, cap, watch)
    finally:
        # The leader is not reaped yet, so its pgid still names this group and its descendants
        # (the launcher is their subreaper) are still in its tree, stopped first so that none
        # forks past the kill; in namespaces the kernel kills the rest when the namespace's
        # init dies.
        tree = stop_tree(proc.pid)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        _await_exit(tree[1:])  # their memory is free again when the call returns
    if stop is None:
        return _Outcome(proc.returncode, kept, total)
    return _Outcome(None, kept, total, stopped_by=stop[0], stop_reason=stop[1])


def _await_exit(pids: list[int], limit_s: float = 5.0) -> None:
    """Wait (boundedly) until killed processes are dead: SIGKILL is delivered at once, but a
    process holding much memory takes a moment to exit. A zombie holds no memory."""
    deadline = time.monotonic() + limit_s
    for pid in pids:
        while not _dead(pid) and time.monotonic() < deadline:
            time.sleep(0.005)


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def _kill_uid(uid: int) -> None:
    """Without a pid namespace, kill what escaped the process group (e.g. via setsid()).

    kill(-1) as the private uid reaches exactly that uid's processes, nothing else.
    """
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [_interpreter(), "-I", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"],
            user=uid,
            group=uid,
            extra_groups=[],
            env=_environment("/"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=5,
            check=False,
        )


def run_sandboxed(code: str, level: Isolation, limits: SandboxLimits) -> tuple[_Outcome, str]:
    """Run `code` once at `level`; returns the outcome and a description of what was applied."""
    uid = _call_uid(level)
    workdir = tempfile.mkdtemp(prefix="steprl-python-")  # 0700: only this process reads it
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with open(os.open(os.path.join(workdir, "main.py"), flags, 0o600), "wb") as handle:
            handle.write(code.encode("utf-8", "surrogatepass"))
        argv, cfg = _plan(level, workdir, limits, uid)
        outcome = _run_process(argv, cfg, workdir, limits, level)
    finally:
        if level == "uid" and uid is not None:
            _kill_uid(uid)
            remove_owned(uid)  # what it wrote to /tmp, /var/tmp, /dev/shm, /run/lock
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome, _describe(level, limits, uid)


def _describe(level: Isolation, limits: SandboxLimits, uid: int | None) -> str:
    own_uid = uid is not None or level == "namespaces"  # a fresh uid or its own user namespace
    rlimits = (
        f"rlimits as={limits.memory_mb}MB cpu={limits.cpu_seconds}s fsize={limits.file_mb}MB "
        f"nofile={limits.open_files}" + (f" nproc={limits.max_processes}" if own_uid else "")
    )
    who = f"uid {uid}" if uid else "root of its own user namespace, no capabilities"
    scratch = f"host scratch dir {limits.scratch_mb}MB (polled, deleted files still held count)"
    parts = {
        "namespaces": [
            "pid+net+mount+ipc+uts namespaces",
            "chroot: read-only /usr and the interpreter, /dev/{null,zero,random,urandom}",
            f"tmpfs {SANDBOX_DIR} {limits.scratch_mb}MB",
            who,
        ],
        "uid": [scratch, f"uid {uid}"],
        "none": [
            scratch,
            "runs as the host user" + (", no capabilities" if os.geteuid() == 0 else ""),
        ],
    }[level]
    if level != "namespaces" and _landlock_abi():
        parts.append(f"landlock ABI {_landlock_abi()}: read system+interpreter, write scratch")
    tail = [
        f"memory: all processes of the call together <= {limits.memory_mb}MB (polled PSS)",
        "no_new_privs",
        "seccomp: no network sockets, memfd, SysV or POSIX IPC, kernel keys"
        + ("" if level == "namespaces" else ", unix sockets but stream pairs"),
        "minimal env",
        "process-tree kill",
    ]
    return "; ".join([*parts, rlimits, *tail])


def _missing(level: Isolation) -> str | None:
    """What this machine lacks for `level`, found without running anything; None if nothing."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux, not {sys.platform}"
    if level == "namespaces" and not shutil.which("unshare"):
        return "the `unshare` command (util-linux) is not installed"
    if level == "namespaces" and _user_namespace():
        with contextlib.suppress(OSError, ValueError), open(USERNS_SYSCTL) as handle:
            if int(handle.read()) == 0:
                return f"not root, and user namespaces are disabled ({USERNS_SYSCTL} is 0)"
    if level == "uid" and os.geteuid() != 0:
        return "level 'uid' needs root (each call switches to a fresh uid)"
    return None


@cache
def sandbox_problem(level: Isolation) -> str | None:
    """Why `level` cannot run `print('ok')` here (probed once per process), or None if it can."""
    missing = _missing(level)
    if missing is not None:
        return missing
    try:
        outcome, _ = run_sandboxed("print('ok')", level, SandboxLimits(timeout_s=10))
    except OSError as exc:
        return f"starting the sandbox failed: {exc}"
    if outcome.returncode == 0 and outcome.output.strip() == b"ok":
        if level != "namespaces":
            logger.warning("python sandbox at the weaker level %r: %s", level, weakness(level))
        return None
    said = outcome.output.decode("utf-8", "replace").strip()[-300:]
    hints = {
        "namespaces": "this process may not create namespaces (as root it needs CAP_SYS_ADMIN; "
        "without root, unprivileged user namespaces must be allowed)",
        "uid": f"a fresh uid must be able to run {_interpreter()} (every folder above it "
        "readable and searchable by others)",
        "none": "",
    }
    return "; ".join(p for p in (said or f"exit status {outcome.returncode}", hints[level]) if p)


def weakness(level: Isolation) -> str:
    """What `level` leaves open on this kernel ("" for namespaces)."""
    if level == "namespaces":
        return ""
    abi = _landlock_abi()
    if abi == 0:
        files = f"{FILES_OPEN[level]}, as this kernel has no Landlock"
    else:
        files = (
            "Landlock lets it read only the system folders and the interpreter, use four "
            "devices and write only its scratch folder"
        )
    if level == "none" and abi < 6:
        files += "; it can signal this user's processes (Landlock ABI < 6)"
    return f"{WARNINGS[level]}; {files}"


def unavailable_message(level: Isolation, problem: str) -> str:
    """The error for a level that cannot run: what is missing and how to ask for less."""
    below = LEVELS[LEVELS.index(level) + 1 :]
    options = [WEAKER[w] for w in below if w != "uid" or os.geteuid() == 0]
    weaker = f"; or accept weaker isolation explicitly: {' or '.join(options)}" if options else ""
    return f"python sandbox level {level!r} is unavailable here: {problem}. Fix that{weaker}"


def _failure_reason(outcome: _Outcome, limits: SandboxLimits) -> tuple[str | None, str | None]:
    """(reason shown to the model, killed_by) for a failed run; (None, None) for success."""
    if outcome.stopped_by == "timeout":
        return f"timed out after {limits.timeout_s:g}s; the process was killed", "timeout"
    if outcome.stopped_by is not None:
        return f"{outcome.stop_reason}; the call was killed", outcome.stopped_by
    code = outcome.returncode
    assert code is not None
    # The launcher reports a signal death as 128 + signal (the shell convention).
    number = -code if code < 0 else code - 128 if 128 < code < 128 + 65 else None
    if number is not None:
        name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
        hint = {
            "SIGXCPU": f" (CPU time limit {limits.cpu_seconds}s)",
            "SIGKILL": " (often a resource limit)",
            "SIGXFSZ": f" (file size limit {limits.file_mb}MB)",
        }.get(name, "")
        return f"killed by {name}{hint}", name
    if code == SETUP_FAILED_EXIT and SETUP_MARKER.encode() in outcome.output:
        return "the sandbox failed to start", None
    return (f"exit code {code}", None) if code != 0 else (None, None)


class PythonTool(BaseTool):
    """Runs a Python program in a sandbox and returns its merged stdout/stderr.

    At level "namespaces" (the default) the program sees only a read-only /usr, the
    interpreter's prefix, four /dev nodes and a tmpfs /sandbox (its cwd and HOME); /etc, /proc,
    /home, /root, /tmp and the repo do not exist for it. It runs in new pid/net/mount/ipc/uts
    namespaces as a fresh uid (as root) or as the capability-less root of its own user namespace
    (otherwise), under rlimits (address space, CPU, processes, file size, open files),
    no_new_privs and a seccomp filter that refuses network sockets, memfd, SysV and POSIX IPC
    and kernel keys (memory no walk of the call would see); the host kills the call when all
    its processes together use more than `memory_mb`. A level that cannot run here
    raises `SandboxUnavailable` at construction: "uid" and "none" (see `weakness`) run only when
    asked for by name.
    """

    name = "python"
    description = (
        "Run a Python 3 program and get its printed output. No network, no files outside the "
        "working directory; each call starts fresh. print() the results you need."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "description": "A complete Python program; print() what you want to see.",
                "maxLength": MAX_CODE_CHARS,
            }
        },
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 256,
        cpu_s: int | None = None,
        max_processes: int = 16,
        max_output_chars: int = 8192,
        file_mb: int = 16,
        scratch_mb: int = 64,
        open_files: int = 64,
        isolation: Isolation = "namespaces",
    ) -> None:
        super().__init__()
        self.limits = SandboxLimits(
            timeout_s,
            memory_mb,
            cpu_s,
            max_processes,
            max_output_chars,
            file_mb,
            scratch_mb,
            open_files,
        )
        if isolation not in LEVELS:
            raise ValueError(f"isolation={isolation!r}: use one of {', '.join(LEVELS)}")
        problem = sandbox_problem(isolation)
        if problem is not None:
            raise SandboxUnavailable(unavailable_message(isolation, problem))
        self.isolation: Isolation = isolation

    @property
    def time_limit_s(self) -> float:  # type: ignore[override]
        """The sandbox's own wall-clock limit: the env waits longer, so its report comes back."""
        return self.limits.timeout_s

    def execute(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            outcome, description = run_sandboxed(arguments["code"], self.isolation, self.limits)
        except Exception as exc:  # spawning failed (fds, disk): an observation, not a crash
            return ToolResult(text=f"Error: could not run the program: {exc}", error=True)
        return self._result(outcome, description)

    def _result(self, outcome: _Outcome, description: str) -> ToolResult:
        text = outcome.output.decode("utf-8", "replace")
        shown = min(len(text), self.limits.output_chars)
        truncated = outcome.total_bytes > len(outcome.output) or len(text) > shown
        if truncated:
            text = (
                f"{text[:shown]}\n[output truncated: {outcome.total_bytes} bytes, "
                f"showing the first {shown} characters]"
            )
        reason, killed_by = _failure_reason(outcome, self.limits)
        if reason is not None:
            text = f"Error: {reason}\n{text}".rstrip()
        elif not text.strip():
            text = "(no output; print() the values you need)"
        info: dict[str, Any] = {
            "exit_code": None if killed_by else outcome.returncode,
            "timed_out": outcome.stopped_by == "timeout",
            "killed_by": killed_by,
            "truncated": truncated,
            "output_bytes": outcome.total_bytes,
            "sandbox": f"{self.isolation}: {description}",
        }
        if self.isolation != "namespaces":
            info["sandbox_warning"] = weakness(self.isolation)
        return ToolResult(text=text, error=reason is not None, info=info)
