"""The Linux system calls the sandbox needs and Python 3.11 does not expose (ctypes, libc).

Each raises OSError with the errno on failure. Linux only; importing this elsewhere works, and
the first call raises OSError(ENOSYS).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError as exc:  # pragma: no cover - not a libc platform
            raise OSError(errno.ENOSYS, "no libc") from exc
    return _libc


def libc() -> ctypes.CDLL:
    """The C library, loaded once (OSError ENOSYS where there is none)."""
    return _lib()


def _call(what: str, name: str, restype: type[ctypes.c_int] | type[ctypes.c_long], *args: object) -> int:
    """libc's `name`(*args), returning `restype`; a negative result raises OSError(errno), its
    message starting with `what`."""
    function = getattr(_lib(), name)
    function.restype = restype
    result = int(function(*args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def unshare(flags: int) -> None:
    _call("unshare", "unshare", ctypes.c_int, ctypes.c_int(flags))


def setns(fd: int, nstype: int) -> None:
    _call("setns", "setns", ctypes.c_int, ctypes.c_int(fd), ctypes.c_int(nstype))


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(
        f"mount {target}",
        "mount",
        ctypes.c_int,
        _bytes(source),
        _bytes(target),
        _bytes(fstype),
        ctypes.c_ulong(flags),
        _bytes(data),
    )


_SYS_OPEN_TREE = 428  # the same number on every architecture (the unified syscall table)
_SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100


def open_tree(path: str) -> int:
    """A detached copy of the mount tree at `path` (a bind that can be attached in another
    mount namespace with `move_mount`); the descriptor is close-on-exec."""
    return _call(
        f"open_tree {path}",
        "syscall",
        ctypes.c_long,
        ctypes.c_long(_SYS_OPEN_TREE),
        ctypes.c_int(_AT_FDCWD),
        os.fsencode(path),
        ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE),
    )


def move_mount(tree: int, target: str) -> None:
    """Attach a detached tree (from `open_tree`) at `target` in this mount namespace."""
    _call(
        f"move_mount {target}",
        "syscall",
        ctypes.c_long,
        ctypes.c_long(_SYS_MOVE_MOUNT),
        ctypes.c_int(tree),
        b"",
        ctypes.c_int(_AT_FDCWD),
        os.fsencode(target),
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
    )


_SYS_MOUNT_SETATTR = 442  # Linux 5.12
MOUNT_ATTR_RDONLY = 0x1


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def mount_setattr(path: str, *, add: int = 0, clear: int = 0, recursive: bool = False) -> None:
    """Set (`add`) and clear (`clear`) MOUNT_ATTR_* flags of the mount at `path`, and with
    `recursive` of every mount under it, in this mount namespace; the mounts' other flags are
    left as they are."""
    attr = _MountAttr(add, clear, 0, 0)
    _call(
        f"mount_setattr {path}",
        "syscall",
        ctypes.c_long,
        ctypes.c_long(_SYS_MOUNT_SETATTR),
        ctypes.c_int(_AT_FDCWD),
        os.fsencode(path),
        ctypes.c_uint(AT_RECURSIVE if recursive else 0),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _call(
        f"prctl {option}",
        "prctl",
        ctypes.c_int,
        ctypes.c_int(option),
        ctypes.c_ulong(arg2),
        ctypes.c_ulong(arg3),
        ctypes.c_ulong(arg4),
        ctypes.c_ulong(arg5),
    )


def last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def drop_bounding_set() -> None:
    """Remove every capability from the bounding set (needs CAP_SETPCAP): nothing this process
    or its descendants execute can gain one, setuid binaries included."""
    for cap in range(last_capability() + 1):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: the kernel does not know that capability
                raise
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def loopback_up() -> None:
    """Bring `lo` up in this (new) network namespace: a function in `network: none` keeps its
    own loopback and nothing else."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))


def effective_capabilities() -> int:
    """This process's effective capability set (the CapEff bits of /proc/self/status)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def in_initial_user_namespace() -> bool:
    """Whether this process is in the machine's own user namespace (not a pod's: Kubernetes
    `hostUsers: false`), where its capabilities are the machine's."""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split()[:3] == ["0", "0", "4294967295"]
    except OSError:
        return True


def may_raise_priority() -> bool:
    """Whether this process may lower its nice value again: CAP_SYS_NICE, which counts only in
    the initial user namespace."""
    return bool(effective_capabilities() & (1 << CAP_SYS_NICE)) and in_initial_user_namespace()


CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_SYS_NICE = 23
