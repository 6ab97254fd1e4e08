"""Landlock scoping of every function process: what a network namespace would scope and the host's
network namespace does not.

- **abstract Unix sockets** (LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, ABI 6): their names live in the
  network namespace, not the file system, so neither the view nor the uid hides them; a function
  may connect only to those its own processes made.
- **signals** (LANDLOCK_SCOPE_SIGNAL, ABI 6): a function signals only its own processes, even
  those of a host running functions as its own user (`isolation: same-user`).
- **TCP bind** (LANDLOCK_ACCESS_NET_BIND_TCP with no rule, ABI 4), for `network: outbound`: a
  function cannot listen on a TCP port of the machine, so it cannot take a port a platform
  component would bind next (connect() still binds its own ephemeral port: not a bind()).

Each function process makes its own domain (`restrict`, after no_new_privs, in
runtime/sandbox/child.py drop): processes of two functions are in two domains and never scoped
together. Ptrace of a process outside its domain is refused by every Landlock ABI as well.

The kernel says its ABI (`abi`: 0 where it has no Landlock, or it is not enabled); where it lacks a
part, the part is left out and `describe` says so. Standard library only (the zygote imports it).
"""

from __future__ import annotations

import ctypes
import os

from kruntimes.runtime.sandbox import syscalls

# the same numbers on every architecture (the unified syscall table)
_SYS_CREATE_RULESET = 444
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0

ACCESS_NET_BIND_TCP = 1 << 0
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

NET_ABI = 4  # handled_access_net
SCOPE_ABI = 6  # scoped


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


_abi: int | None = None


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (not built, or not enabled)."""
    global _abi
    if _abi is None:
        try:
            _abi = _syscall(
                "landlock ABI", _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION
            )
        except OSError:
            _abi = 0  # ENOSYS (no Landlock) or EOPNOTSUPP (built, not enabled)
    return _abi


def restrict(*, deny_tcp_bind: bool, version: int | None = None) -> None:
    """Put this process (and all it starts from now on) in a Landlock domain of its own: abstract
    Unix sockets and signals scoped to it, and with `deny_tcp_bind` no TCP bind. Needs
    no_new_privs. Nothing where the kernel (`version`, default `abi()`) supports none of it."""
    version = abi() if version is None else version
    attr = _RulesetAttr(0, 0, 0)
    if version >= SCOPE_ABI:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    if deny_tcp_bind and version >= NET_ABI:
        attr.handled_access_net = ACCESS_NET_BIND_TCP
    if not (attr.scoped or attr.handled_access_net):
        return
    size = ctypes.sizeof(_RulesetAttr) if version >= SCOPE_ABI else _RulesetAttr.scoped.offset
    fd = _syscall(
        "landlock_create_ruleset", _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0
    )
    try:
        _syscall("landlock_restrict_self", _SYS_RESTRICT_SELF, ctypes.c_int(fd), 0)
    finally:
        os.close(fd)


def describe(version: int, *, deny_tcp_bind: bool) -> str:
    """What `restrict` puts in force on a kernel of Landlock ABI `version`, in words."""
    if version <= 0:
        return "no Landlock (the kernel lacks it): abstract Unix sockets and signals not scoped"
    parts = []
    if version >= SCOPE_ABI:
        parts.append("abstract Unix sockets and signals scoped")
    else:
        parts.append(f"abstract Unix sockets and signals not scoped (Landlock ABI {version} < {SCOPE_ABI})")
    if deny_tcp_bind:
        parts.append(
            "TCP bind denied" if version >= NET_ABI else f"TCP bind allowed (ABI {version} < {NET_ABI})"
        )
    return f"Landlock ABI {version}: " + ", ".join(parts)


def _syscall(what: str, number: int, *args: object) -> int:
    function = syscalls.libc().syscall
    function.restype = ctypes.c_long
    result = int(function(ctypes.c_long(number), *args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result
