"""The syscall filter of every function process: the kernel's surface a function does not need.

A function runs without capabilities, with no_new_privs, in its own namespaces. What is left of
the kernel is still large, and some of it is reachable by an unprivileged process and shared with
the whole machine or a known way out of a container:

- **user namespaces** (`unshare` or `clone` with CLONE_NEWUSER): inside one a process holds every
  capability, and with them the mount, network and netfilter code of the kernel that only root
  reaches otherwise — the path of most container escapes. Refused (EPERM); `clone3`, whose flags
  a filter cannot read, is ENOSYS, so the C library falls back to `clone` (as Docker's default
  profile does);
- **keyrings** (`keyctl`, `add_key`, `request_key`): not namespaced; refused;
- `bpf`, `perf_event_open`, `userfaultfd`: refused;
- **io_uring** (`io_uring_setup`, `_enter`, `_register`): ENOSYS, so runtimes that try it fall
  back to ordinary I/O;
- with `network: none`, **Unix sockets of its own making** (`socket(AF_UNIX, ...)`): a network
  namespace does not scope a socket that has a path, and a read-only mount does not stop a
  connect, so a world-connectable socket of the host (a database's, the system bus, the
  journal) would be a way out. `socketpair` stays (asyncio's wake-up pipe, a process talking
  to its own children), as does every socket the function was handed.

Everything else is allowed. The filter is built once with libseccomp (the system's library,
through ctypes: it knows each architecture's numbers and refuses the other ABIs of the machine,
i386 and x32 calls on x86-64) and exported as a BPF program; each function process installs that
program (`install`: one prctl) as its last privileged step, after no_new_privs, and keeps it
across exec and in every process it starts. Without libseccomp (`program()` is None) functions
run without a filter and the host says so.
"""

from __future__ import annotations

import _thread
import ctypes
import errno
import os
import socket

from kruntimes.runtime.sandbox import syscalls

CLONE_NEWUSER = syscalls.CLONE_NEWUSER
REFUSED = ("keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd")
ABSENT = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")
NAMESPACED = ("unshare", "clone")  # refused when their flags (argument 0) ask for CLONE_NEWUSER

_ACT_ALLOW = 0x7FFF0000
_CMP_EQ = 4
_CMP_MASKED_EQ = 7
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def _act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# The zygote imports this module, and what it imports is in every process the zygote forks:
# `_thread`'s lock needs nothing more, and `ctypes.util` (tempfile, random with its at-fork
# reseed, shutil, subprocess) is imported only when the usual soname is not found: every module
# the zygote holds is pages each forked child copies and each Ready Python Run keeps.
_lock = _thread.allocate_lock()
_built: dict[bool, tuple[bytes | None, str]] = {}  # by network_none


def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:  # another soname: ask the linker's cache (ctypes.util imports tempfile and more)
        from ctypes.util import find_library

        lib = ctypes.CDLL(find_library("seccomp") or "libseccomp.so", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _build(network_none: bool) -> bytes:
    lib = _library()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:

        def rule(name: str, action: int, *compare: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return  # this architecture has no such call: nothing to filter
            array = (_ArgCmp * len(compare))(*compare) if compare else None
            result = lib.seccomp_rule_add_array(ctx, action, number, len(compare), array)
            if result < 0:
                raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")

        for name in REFUSED:
            rule(name, _act_errno(errno.EPERM))
        for name in ABSENT:
            rule(name, _act_errno(errno.ENOSYS))
        for name in NAMESPACED:
            rule(name, _act_errno(errno.EPERM), _ArgCmp(0, _CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
        if network_none:
            rule("socket", _act_errno(errno.EPERM), _ArgCmp(0, _CMP_EQ, socket.AF_UNIX, 0))
        fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
        try:
            result = lib.seccomp_export_bpf(ctx, fd)
            if result < 0:
                raise OSError(-result, f"seccomp_export_bpf: {os.strerror(-result)}")
            size = os.lseek(fd, 0, os.SEEK_END)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def program(*, network_none: bool = False) -> bytes | None:
    """The filter for a function with or without `network: none` as a BPF program (each built
    once per process), or None where it cannot be built (no libseccomp): see `unavailable`."""
    with _lock:
        if network_none not in _built:
            try:
                _built[network_none] = (_build(network_none), "")
            except (OSError, AttributeError) as exc:
                _built[network_none] = (None, f"no syscall filter ({exc})")
        return _built[network_none][0]


def unavailable() -> str:
    """Why there is no filter ("" when there is one)."""
    program()
    return _built[False][1]


def install(bpf: bytes) -> None:
    """Install `bpf` (from `program`) on this process; needs no_new_privs (or CAP_SYS_ADMIN).
    Every process it starts from now on inherits it, across exec."""
    if len(bpf) % 8 or not bpf:
        raise ValueError("not a BPF program")
    buffer = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = _SockFprog(len(bpf) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    syscalls.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))
