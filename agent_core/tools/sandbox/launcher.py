"""What runs inside the python sandbox before the program: file view, privilege drops,
seccomp, Landlock. Shipped by source to a fresh `python -I -c` (a preexec_fn could deadlock a
multi-threaded trainer between fork and exec), so it uses only the stdlib and reads `cfg`."""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any


def _launch(cfg: dict[str, Any]) -> None:
    """Build the file view, fork the program, wait for it and exit with its status."""
    import ctypes
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
        # 0600 and owned by the call's uid: another call (another uid) cannot read this code.
        fd = os.open("main.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as handle:
            handle.write(program)
        if cfg["uid"] is not None:
            os.chown("main.py", cfg["uid"], cfg["uid"])
    except OSError as exc:
        print(f"steprl-sandbox: setup failed: {exc}", file=sys.stderr, flush=True)
        os._exit(cfg["setup_failed_exit"])

    def expire(*_: object) -> None:  # backstop if the parent died before its own deadline
        os.killpg(0, signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)

    # PR_SET_CHILD_SUBREAPER (36): orphans of the program stay our descendants, so the host
    # sees the call's whole process tree (in a pid namespace we are init and get them anyway).
    ctypes.CDLL(None).prctl(36, ctypes.c_ulong(1), 0, 0, 0)
    signal.signal(signal.SIGALRM, expire)
    signal.alarm(cfg["alarm_s"])
    pid = os.fork()
    if pid == 0:
        _exec_program(cfg)
    while True:  # reap orphans too; in a pid namespace our exit kills them all
        done, status = os.wait()
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            if not cfg["new_root"]:
                _end_descendants()
            os._exit(128 - code if code < 0 else code)


def _end_descendants() -> None:
    """Without a pid namespace nothing else ends what the program left running (a daemon that
    called setsid()): kill our children until none is left. We are the subreaper, so a killed
    child's own children are ours before os.wait() returns it."""
    import contextlib
    import os
    import signal

    me = os.getpid()
    while True:
        try:
            with open(f"/proc/{me}/task/{me}/children") as handle:
                children = [int(pid) for pid in handle.read().split()]
        except OSError:  # a kernel without CONFIG_PROC_CHILDREN; the host's kill still comes
            return
        for child in children:
            with contextlib.suppress(ProcessLookupError):  # it exited on its own meanwhile
                os.kill(child, signal.SIGKILL)
        try:
            os.wait()
        except ChildProcessError:
            return


def _enter_new_root(cfg: dict[str, Any]) -> None:
    """Mount a tmpfs root with read-only binds of the system dirs and a tmpfs scratch; chroot."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    ms_rdonly, ms_nosuid, ms_nodev, ms_remount, ms_bind, ms_rec = 1, 2, 4, 32, 4096, 16384
    # statvfs flag -> mount flag. In a user namespace a remount must keep the source's flags
    # (the kernel locks them), so they are carried over.
    kept_flags = {8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}  # noexec, noatime, ..., relatime

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
        source_flags = os.statvfs(path).f_flag
        flags |= sum(ms for st, ms in kept_flags.items() if source_flags & st)
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
        os.umask(0o077)  # what the code creates is private to its uid by default
        if cfg["drop_capabilities"]:
            _drop_capabilities()
        # Before the uid drop: the filter code imports ctypes, which the uid may not read.
        _install_syscall_filter(unix_sockets=cfg["new_root"] is not None)
        if cfg["landlock_abi"]:
            _restrict_files(cfg)
        if cfg["uid"] is not None:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
        os.execve(cfg["python"], [cfg["python"], "-I", "main.py"], cfg["env"])
    except (OSError, ValueError, KeyError) as exc:
        print(f"steprl-sandbox: cannot start the program: {exc}", file=sys.stderr, flush=True)
    os._exit(cfg["setup_failed_exit"])


def _drop_capabilities() -> None:
    """The program would run as a root (of its own user namespace, or the host's at level
    "none"): empty the bounding, ambient, inheritable and permitted sets, so that exec grants it
    no capability (no mount, chroot, remount, hostname, chown or setuid)."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    # PR_CAP_AMBIENT (47), PR_CAP_AMBIENT_CLEAR_ALL (4)
    libc.prctl(47, ctypes.c_ulong(4), zero, zero, zero)
    for cap in range(64):
        # PR_CAPBSET_DROP (24); EINVAL past the kernel's last capability
        if libc.prctl(24, ctypes.c_ulong(cap), zero, zero, zero) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL:
                break
            raise OSError(err, f"prctl(PR_CAPBSET_DROP, {cap}) failed")
    # capset, _LINUX_CAPABILITY_VERSION_3: exec as uid 0 would carry the inheritable set over
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two 32-bit halves
    if libc.capset(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _restrict_files(cfg: dict[str, Any]) -> None:
    """Landlock, for the levels without a chroot: read and run only the system and interpreter
    folders, use only the four devices, write only the scratch folder; from ABI 6 on, also no
    abstract unix socket or signal reaches outside the call."""
    import ctypes
    import os
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    abi = cfg["landlock_abi"]
    handled = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1  # every file right it knows
    fields = [handled] + [0b11] * ((abi >= 4) + (abi >= 6))  # TCP bind+connect; unix+signal
    attr = struct.pack(f"{len(fields)}Q", *fields)
    ruleset = libc.syscall(444, attr, len(attr), 0)  # landlock_create_ruleset
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    devices = 0b110 | 1 << 14 | 1 << 15  # read, write, truncate, ioctl
    rules = [(path, 0b1101) for path in cfg["binds"]]  # execute, read file, read dir
    rules += [(f"/dev/{name}", devices & handled) for name in cfg["devices"]]
    rules.append((cfg["scratch"], handled))
    for path, access in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = struct.pack("=Qi", access, fd)  # landlock_path_beneath_attr (packed)
        added = libc.syscall(445, ruleset, 1, rule, 0)  # landlock_add_rule, PATH_BENEATH
        os.close(fd)
        if added != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    if libc.syscall(446, ruleset, 0) != 0:  # landlock_restrict_self (no_new_privs is set)
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)


def _install_syscall_filter(unix_sockets: bool) -> None:
    """Seccomp (see `_syscall_filter`), after no_new_privs."""
    import ctypes

    code = _syscall_filter(unix_sockets)
    buffer = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    fprog = SockFprog(len(code) // 8, ctypes.addressof(buffer))  # 8 bytes per instruction
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    # PR_SET_NO_NEW_PRIVS (38): setuid binaries in /usr/bin cannot hand root back to the code.
    if libc.prctl(38, ctypes.c_ulong(1), zero, zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    # PR_SET_SECCOMP (22), SECCOMP_MODE_FILTER (2)
    if libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _syscall_filter(unix_sockets: bool) -> bytes:
    """The BPF program: only the native syscall ABI, no network sockets, no io_uring, and none
    of the ways to hold memory or leave state that the host's walk of the call's files and
    mappings would miss (memfd, SysV and POSIX IPC, kernel keys). Without `unix_sockets` (the
    host's named sockets are in reach) only connected stream pairs (asyncio's) remain."""
    import os
    import struct

    # audit arch, socket, socketpair; memfd_create, memfd_secret, shmget, shmat, semget, msgget,
    # mq_open, add_key, request_key, keyctl, io_uring_setup (which opens sockets unfiltered)
    arches = {
        "x86_64": (0xC000003E, 41, 53, (319, 447, 29, 30, 64, 68, 240, 248, 249, 250, 425)),
        "aarch64": (0xC00000B7, 198, 199, (279, 447, 194, 196, 190, 186, 180, 217, 218, 219, 425)),
    }
    if os.uname().machine not in arches:
        raise OSError(f"seccomp filter not written for {os.uname().machine}")
    audit_arch, nr_socket, nr_socketpair, denied = arches[os.uname().machine]
    ld, jeq, jge, and_k, ret = 0x20, 0x15, 0x35, 0x54, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, ...
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    unix = "allow" if unix_sockets else "deny"
    program: list[tuple[int, int | str, int | str, int]] = [
        (ld, 0, 0, 4),  # A = arch
        (jeq, 0, "deny", audit_arch),  # i386/x32 entry points could bypass the number checks
        (ld, 0, 0, 0),  # A = syscall number
        (jge, "deny", 0, 0x40000000),  # x32 syscall numbers
        *[(jeq, "deny", 0, nr) for nr in denied],
        (jeq, "socket", 0, nr_socket),
        (jeq, "socketpair", 0, nr_socketpair),
        (ret, 0, 0, allow),
        (ld, 0, 0, 16),  # socket: A = low word of the address family
        (jeq, unix, "deny", 1),  # AF_UNIX
        (ld, 0, 0, 16),  # socketpair: a connected stream pair reaches nothing outside the call
        (jeq, 0, "deny", 1),
        (ld, 0, 0, 24),  # A = the type
        (and_k, 0, 0, 0xF),  # without SOCK_NONBLOCK and SOCK_CLOEXEC
        (jeq, "allow", 0, 1),  # SOCK_STREAM
        (jeq, "allow", unix, 5),  # SOCK_SEQPACKET; a datagram pair could sendto() a named socket
        (ret, 0, 0, allow),
        (ret, 0, 0, deny),
    ]
    end = len(program)
    labels = {"socket": end - 10, "socketpair": end - 8, "allow": end - 2, "deny": end - 1}

    def jump(at: int, target: int | str) -> int:  # BPF jumps are relative and forward only
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(
        struct.pack("HBBI", op, jump(at, jt), jump(at, jf), k)
        for at, (op, jt, jf, k) in enumerate(program)
    )


@cache
def launcher_source() -> str:
    """The source a fresh `python -I -c` runs: these functions and a call of `_launch`."""
    functions = (_launch, _end_descendants, _enter_new_root, _exec_program, _drop_capabilities)
    filters = (_restrict_files, _install_syscall_filter, _syscall_filter)
    body = "\n\n".join(inspect.getsource(f) for f in (*functions, *filters))
    return f"from __future__ import annotations\n\n{body}\n\nimport json, sys\n" + (
        "_launch(json.loads(sys.argv[1]))\n"
    )
