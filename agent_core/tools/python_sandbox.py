"""The `python` tool: runs model-written code in a throw-away, resource-limited sandbox process.

Owns the isolation levels (probed once per process), the in-sandbox launcher and output capture.
"""

from __future__ import annotations

import contextlib
import inspect
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
from typing import Any, ClassVar, Literal, cast

from agent_core.tools.base import BaseTool, ToolResult

logger = logging.getLogger(__name__)

Isolation = Literal["namespaces", "uid", "none"]
IsolationRequest = Literal["auto", "namespaces", "uid", "none"]
MAX_CODE_CHARS = 20_000
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
WARNINGS: dict[Isolation, str] = {
    "namespaces": "",
    "uid": "no namespaces: the code can read world-readable host files (the project too) and "
    "talk to abstract unix sockets; network sockets are still blocked by seccomp",
    "none": "no namespaces and no uid drop: the code runs as this user and can read its files; "
    "process count is not limited and a process that calls setsid() can outlive the call; "
    "network sockets are still blocked by seccomp",
}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call resource limits; `cpu_s` defaults to the wall-clock timeout rounded up."""

    timeout_s: float = 5.0
    memory_mb: int = 256
    cpu_s: int | None = None
    max_processes: int = 16
    output_bytes: int = 8192
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
        """(soft, hard) per RLIMIT name; NPROC only counts when the code runs as its own uid."""
        mib = 1024 * 1024
        limits = {
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
    """What one sandboxed run produced: the raw exit status and the kept head of the output."""

    returncode: int | None
    output: bytes
    total_bytes: int
    timed_out: bool


# ---------------------------------------------------------------------------------------------
# Inside the sandbox. These four functions are shipped by source to a fresh `python -I -c`
# (a preexec_fn would run Python between fork and exec of a multi-threaded trainer, which can
# deadlock), so they use only the stdlib, import locally and read everything from `cfg`.


def _launch(cfg: dict[str, Any]) -> None:
    """Build the file view, fork the program, wait for it and exit with its status."""
    import os
    import signal
    import sys

    try:
        with open(cfg["program"], "rb") as handle:  # read before the chroot hides it
            program = handle.read()
        if cfg["new_root"]:
            _enter_new_root(cfg)
        else:
            os.chdir(cfg["scratch"])
        with open("main.py", "wb") as handle:
            handle.write(program)
        if cfg["uid"] is not None:
            os.chown("main.py", cfg["uid"], cfg["uid"])
    except OSError as exc:
        print(f"steprl-sandbox: setup failed: {exc}", file=sys.stderr, flush=True)
        os._exit(cfg["setup_failed_exit"])

    def expire(*_: object) -> None:  # backstop if the parent died before its own deadline
        os.killpg(0, signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(cfg["alarm_s"])
    pid = os.fork()
    if pid == 0:
        _exec_program(cfg)
    # In a pid namespace this process is init: it reaps orphans, and its exit kills them all.
    while True:
        done, status = os.wait()
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def _enter_new_root(cfg: dict[str, Any]) -> None:
    """Mount a tmpfs root with read-only binds of the system dirs and a tmpfs scratch; chroot."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    ms_rdonly, ms_nosuid, ms_nodev, ms_remount, ms_bind, ms_rec = 1, 2, 4, 32, 4096, 16384

    def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str) -> None:
        def raw(text: str | None) -> bytes | None:
            return None if text is None else text.encode()

        if libc.mount(raw(source), raw(target), raw(fstype), flags, raw(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount: {os.strerror(err)}", target)

    root = cfg["new_root"]
    mount("tmpfs", root, "tmpfs", ms_nosuid | ms_nodev, "size=1m,mode=755")
    for path in cfg["binds"]:
        os.makedirs(root + path, exist_ok=True)
        mount(path, root + path, None, ms_bind | ms_rec, "")
        flags = ms_bind | ms_remount | ms_rdonly | ms_nosuid | ms_nodev
        mount(None, root + path, None, flags, "")
    for link, target in cfg["symlinks"].items():
        os.symlink(target, root + link)
    os.makedirs(root + "/dev")
    for name in cfg["devices"]:
        with open(f"{root}/dev/{name}", "w"):
            pass
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, ms_bind, "")
    scratch = root + cfg["scratch"]
    os.makedirs(scratch)
    owner = f",uid={cfg['uid']},gid={cfg['uid']}" if cfg["uid"] is not None else ""
    size = f"size={cfg['scratch_mb']}m,nr_inodes=4096,mode=700{owner}"
    mount("tmpfs", scratch, "tmpfs", ms_nosuid | ms_nodev, size)
    os.symlink(cfg["scratch"], root + "/tmp")
    os.chroot(root)
    os.chdir(cfg["scratch"])


def _exec_program(cfg: dict[str, Any]) -> None:
    """In the forked child: rlimits, the private uid, the seccomp filter, then exec Python."""
    import os
    import resource
    import sys

    try:
        for name, (soft, hard) in cfg["rlimits"].items():
            which = getattr(resource, name)
            ceiling = resource.getrlimit(which)[1]
            if ceiling != resource.RLIM_INFINITY:  # we may lower limits, never raise them
                soft, hard = min(soft, ceiling), min(hard, ceiling)
            resource.setrlimit(which, (soft, hard))
        # Before the uid drop: the filter code imports ctypes, which the uid may not read.
        _forbid_network_sockets()
        if cfg["uid"] is not None:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
        os.execve(cfg["python"], [cfg["python"], "-I", "main.py"], cfg["env"])
    except (OSError, ValueError, KeyError) as exc:
        print(f"steprl-sandbox: cannot start the program: {exc}", file=sys.stderr, flush=True)
    os._exit(cfg["setup_failed_exit"])


def _forbid_network_sockets() -> None:
    """Seccomp: socket() only for AF_UNIX, no io_uring, and only the native syscall ABI."""
    import ctypes
    import os
    import struct

    arches = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
    if os.uname().machine not in arches:
        raise OSError(f"seccomp filter not written for {os.uname().machine}")
    audit_arch, nr_socket = arches[os.uname().machine]
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    program = [
        (ld, 0, 0, 4),  # 0: A = arch
        (jeq, 1, 0, audit_arch),  # 1: native ABI -> 3
        (ret, 0, 0, deny),  # 2: i386/x32 entry points could bypass the number checks
        (ld, 0, 0, 0),  # 3: A = syscall number
        (jge, 5, 0, 0x40000000),  # 4: x32 syscall numbers -> deny
        (jeq, 4, 0, 425),  # 5: io_uring_setup can create sockets behind seccomp's back
        (jeq, 0, 2, nr_socket),  # 6: socket() -> 7, anything else -> allow
        (ld, 0, 0, 16),  # 7: A = low word of the address family
        (jeq, 0, 1, 1),  # 8: AF_UNIX -> allow, else deny
        (ret, 0, 0, allow),  # 9
        (ret, 0, 0, deny),  # 10
    ]
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    fprog = SockFprog(len(program), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    # PR_SET_NO_NEW_PRIVS (38): setuid binaries in /usr/bin cannot hand root back to the code.
    if libc.prctl(38, ctypes.c_ulong(1), zero, zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    # PR_SET_SECCOMP (22), SECCOMP_MODE_FILTER (2)
    if libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# ---------------------------------------------------------------------------------------------
# In the host process.


@cache
def _launcher_source() -> str:
    functions = (_launch, _enter_new_root, _exec_program, _forbid_network_sockets)
    body = "\n\n".join(inspect.getsource(function) for function in functions)
    return f"from __future__ import annotations\n\n{body}\n\nimport json, sys\n" + (
        "_launch(json.loads(sys.argv[1]))\n"
    )


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


def _plan(
    level: Isolation, workdir: str, limits: SandboxLimits, uid: int | None
) -> tuple[list[str], dict[str, Any]]:
    """The command line and launcher config for one run at `level` inside host dir `workdir`."""
    namespaced = level == "namespaces"
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
        "python": _interpreter(),
        "env": _environment(scratch),
        "rlimits": limits.rlimits(with_nproc=uid is not None),
        "alarm_s": math.ceil(limits.timeout_s) + 2,
        "setup_failed_exit": SETUP_FAILED_EXIT,
    }
    argv = [_interpreter(), "-I", "-c", _launcher_source(), json.dumps(cfg)]
    if namespaced:
        argv = [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, "--", *argv]
    return argv, cfg


def _has_exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (a reaped leader's pgid could be reused)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _collect(pid: int, fd: int, deadline: float, cap: int) -> tuple[bytes, int, bool]:
    """Read merged output until `pid` exits or the deadline passes; keep the first `cap` bytes.

    Reading continues past the cap (and is discarded) so the program never blocks on a full
    pipe. Returns (kept bytes, total bytes, timed_out).
    """
    kept = bytearray()
    total = 0
    pipe_open = True
    os.set_blocking(fd, False)
    while True:
        exited = _has_exited(pid)
        remaining = deadline - time.monotonic()
        if not exited and remaining <= 0:
            return bytes(kept), total, True
        if pipe_open:
            readable, _, _ = select.select([fd], [], [], 0 if exited else min(remaining, 0.05))
            while readable and time.monotonic() < deadline:
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
            return bytes(kept), total, False


def _run_process(argv: list[str], env: dict[str, str], cwd: str, limits: SandboxLimits) -> _Outcome:
    """Run `argv` in its own session; on timeout (and after any exit) kill the whole group."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    assert proc.stdout is not None
    timed_out = True
    try:
        deadline = time.monotonic() + limits.timeout_s
        kept, total, timed_out = _collect(
            proc.pid, proc.stdout.fileno(), deadline, limits.output_bytes
        )
    finally:
        # The leader is not reaped yet, so its pgid still names this group: stragglers that
        # stayed in it (fallback levels) die here; in namespaces the kernel already killed them.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return _Outcome(None if timed_out else proc.returncode, kept, total, timed_out)


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
    uid = None if level == "none" else random.randrange(UID_BASE, UID_BASE + UID_SPAN)
    workdir = tempfile.mkdtemp(prefix="steprl-python-")
    try:
        with open(os.path.join(workdir, "main.py"), "wb") as handle:
            handle.write(code.encode("utf-8", "surrogatepass"))
        argv, cfg = _plan(level, workdir, limits, uid)
        outcome = _run_process(argv, cfg["env"], workdir, limits)
    finally:
        if level == "uid" and uid is not None:
            _kill_uid(uid)
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome, _describe(level, limits, uid)


def _describe(level: Isolation, limits: SandboxLimits, uid: int | None) -> str:
    rlimits = (
        f"rlimits as={limits.memory_mb}MB cpu={limits.cpu_seconds}s fsize={limits.file_mb}MB "
        f"nofile={limits.open_files}" + (f" nproc={limits.max_processes}" if uid else "")
    )
    parts = {
        "namespaces": [
            "pid+net+mount+ipc+uts namespaces",
            "chroot: read-only /usr and the interpreter, /dev/{null,zero,random,urandom}",
            f"tmpfs {SANDBOX_DIR} {limits.scratch_mb}MB",
            f"uid {uid}",
        ],
        "uid": ["host scratch dir", f"uid {uid}"],
        "none": ["host scratch dir", "runs as the host user"],
    }[level]
    tail = ["no_new_privs", "seccomp: no network sockets", "minimal env", "process-group kill"]
    return "; ".join([*parts, rlimits, *tail])


def _candidate_levels() -> list[Isolation]:
    if not sys.platform.startswith("linux"):
        return []
    root = os.geteuid() == 0
    levels: list[Isolation] = []
    if root and shutil.which("unshare"):
        levels.append("namespaces")
    if root:
        levels.append("uid")
    return [*levels, "none"]


@cache
def select_isolation(requested: IsolationRequest = "auto") -> tuple[Isolation | None, str]:
    """The strongest level that runs `print('ok')` here (probed once), or None and why not."""
    candidates = _candidate_levels() if requested == "auto" else [cast(Isolation, requested)]
    failures: list[str] = []
    for level in candidates:
        try:
            outcome, _ = run_sandboxed("print('ok')", level, SandboxLimits(timeout_s=10))
        except OSError as exc:
            failures.append(f"{level}: {exc}")
            continue
        if outcome.returncode == 0 and outcome.output.strip() == b"ok":
            if WARNINGS[level]:
                weaker = f" ({'; '.join(failures)})" if failures else ""
                logger.warning("python sandbox at level %r%s: %s", level, weaker, WARNINGS[level])
            return level, ""
        failures.append(f"{level}: {outcome.output.decode('utf-8', 'replace').strip()[-300:]}")
    return None, "; ".join(failures) or f"unsupported platform {sys.platform}"


def _failure_reason(outcome: _Outcome, limits: SandboxLimits) -> tuple[str | None, str | None]:
    """(reason shown to the model, killed_by) for a failed run; (None, None) for success."""
    if outcome.timed_out:
        return f"timed out after {limits.timeout_s:g}s; the process was killed", "timeout"
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

    At level "namespaces" (root + `unshare`, probed once per process) the program sees only a
    read-only /usr, the interpreter's prefix, four /dev nodes and a tmpfs /sandbox (its cwd and
    HOME); /etc, /proc, /home, /root, /tmp and the repo do not exist for it. It runs as a fresh
    uid in new pid/net/mount/ipc/uts namespaces under rlimits (address space, CPU, processes, file
    size, open files), no_new_privs and a seccomp filter that refuses non-unix sockets. Without
    namespaces it degrades to "uid" then "none" (see WARNINGS) and says so in `info`.
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
        output_bytes: int = 8192,
        file_mb: int = 16,
        scratch_mb: int = 64,
        open_files: int = 64,
        isolation: IsolationRequest = "auto",
    ) -> None:
        super().__init__()
        self.limits = SandboxLimits(
            timeout_s,
            memory_mb,
            cpu_s,
            max_processes,
            output_bytes,
            file_mb,
            scratch_mb,
            open_files,
        )
        if isolation not in ("auto", "namespaces", "uid", "none"):
            raise ValueError(f"isolation={isolation!r}: use 'auto', 'namespaces', 'uid' or 'none'")
        self.isolation = isolation

    def execute(self, arguments: dict[str, Any]) -> ToolResult:
        level, problem = select_isolation(self.isolation)
        if level is None:
            return ToolResult(
                text="Error: the python sandbox is unavailable on this machine",
                error=True,
                info={"sandbox": None, "sandbox_problem": problem},
            )
        try:
            outcome, description = run_sandboxed(arguments["code"], level, self.limits)
        except Exception as exc:  # spawning failed (fds, disk): an observation, not a crash
            return ToolResult(text=f"Error: could not run the program: {exc}", error=True)
        return self._result(outcome, level, description)

    def _result(self, outcome: _Outcome, level: Isolation, description: str) -> ToolResult:
        text = outcome.output.decode("utf-8", "replace")
        truncated = outcome.total_bytes > len(outcome.output)
        if truncated:
            text += (
                f"\n[output truncated: {outcome.total_bytes} bytes, "
                f"showing the first {len(outcome.output)}]"
            )
        reason, killed_by = _failure_reason(outcome, self.limits)
        if reason is not None:
            text = f"Error: {reason}\n{text}".rstrip()
        elif not text.strip():
            text = "(no output; print() the values you need)"
        info: dict[str, Any] = {
            "exit_code": None if killed_by else outcome.returncode,
            "timed_out": outcome.timed_out,
            "killed_by": killed_by,
            "truncated": truncated,
            "output_bytes": outcome.total_bytes,
            "sandbox": f"{level}: {description}",
        }
        if WARNINGS[level]:
            info["sandbox_warning"] = WARNINGS[level]
        return ToolResult(text=text, error=reason is not None, info=info)
