"""How functions are isolated on this host: the settings, and what is actually in force.

isolation   uid        every function gets its own uid/gid from a range (the host is root or
                       holds CAP_SETUID and CAP_SETGID), no capabilities, no_new_privs
            same-user  functions run as the host's own uid (a host that cannot switch uids
                       must be told so explicitly: it refuses to start otherwise)
network     outbound   the host's network namespace, but packet rules keyed to the functions'
                       uids refuse the machine's own addresses (loopback included: every
                       platform listener), link-local, private and multicast ranges, but DNS to
                       the resolvers and a runtime's allow list (runtime/sandbox/egress.py),
                       and TCP bind is denied (Landlock); enforced only by a root host (the
                       rules need CAP_NET_ADMIN), which refuses to start without them
            host       the host's network namespace, unrestricted (an explicit opt-out)
            none       a network namespace of its own with only loopback
landlock    every function: abstract Unix sockets and signals scoped to its own processes
            (runtime/sandbox/landlock.py), where the kernel has it
namespaces  a PID namespace per function (its processes are one unit: they all end with
            it, setsid() and double forks included, and it sees only its own processes)
            and a mount namespace (private /proc, /tmp and /dev/shm, the state directory
            and other workspaces hidden), where the kernel lets the host create them
cgroup      a memory limit across all of a function's processes and a process cap, where a
            writable cgroup exists (cgroups.detect); otherwise rlimits per process and the
            uid's process limit
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kruntimes.config.egress import AllowRule
from kruntimes.runtime.sandbox import syscalls
from kruntimes.runtime.sandbox.identity import DEFAULT_LOCK_DIR, UidRange

MiB = 1024 * 1024


class Isolation(StrEnum):
    UID = "uid"
    SAME_USER = "same-user"


class Network(StrEnum):
    OUTBOUND = "outbound"
    HOST = "host"
    NONE = "none"


@dataclass(frozen=True)
class SandboxSettings:
    """A host's isolation settings (flags of `krt host`, runtime settings of the runtimes file)."""

    isolation: Isolation = Isolation.UID
    network: Network = Network.OUTBOUND
    # `network: outbound` only: destinations its functions reach although the rules refuse them
    egress_allow: tuple[AllowRule, ...] = ()
    uids: UidRange = field(default_factory=UidRange)
    lock_dir: str = DEFAULT_LOCK_DIR
    memory_bytes: int | None = 1024 * MiB  # across all of a function's processes
    max_processes: int = 256  # processes and threads of one function
    tmp_bytes: int = 64 * MiB  # its private /tmp and /dev/shm
    hide: tuple[str, ...] = ()  # directories a function must never see (state directories)
    # directories every function sees with their real content and permissions (data the
    # operator hands to functions; tests use one to exchange files with them)
    shared: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.egress_allow and self.network is not Network.OUTBOUND:
            raise ValueError(f"an egress allow list is for network outbound, not {self.network.value}")


class IsolationUnavailable(Exception):
    """The host cannot isolate functions the way it was asked to."""


def can_switch_uid() -> bool:
    caps = syscalls.effective_capabilities()
    both = (1 << syscalls.CAP_SETUID) | (1 << syscalls.CAP_SETGID)
    return os.geteuid() == 0 or caps & both == both


def can_filter_packets() -> bool:
    """Whether this process may change the packet rules of its network namespace."""
    return bool(syscalls.effective_capabilities() & (1 << syscalls.CAP_NET_ADMIN))


UNENFORCED = (
    "outbound unenforced: no packet rules without root — functions reach loopback and the machine's addresses"
)


@dataclass(frozen=True)
class InForce:
    """What the host actually does, for its heartbeat, HostInfo and `krt status`."""

    isolation: Isolation
    network: Network
    pid_namespace: bool
    mount_namespace: bool
    cgroup: str  # "cgroup v1", "cgroup v2" or "none"
    seccomp: bool = False  # the syscall filter (runtime/sandbox/seccomp.py)
    # the network as enforced, in words ("" : as `network` says, e.g. `none`)
    egress: str = ""
    landlock: str = ""  # what Landlock scopes, in words (runtime/sandbox/landlock.py)

    def describe(self) -> str:
        parts = [
            "own uid per function" if self.isolation is Isolation.UID else "same user as the host",
            "PID namespace" if self.pid_namespace else "no PID namespace",
            "private read-only mounts and IPC" if self.mount_namespace else "shared mounts",
            self.egress or f"network {self.network.value}",
            self.cgroup if self.cgroup != "none" else "no cgroup (rlimits only)",
            "syscall filter" if self.seccomp else "no syscall filter",
        ]
        if self.landlock:
            parts.append(self.landlock)
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "isolation": self.isolation.value,
            "network": self.network.value,
            "pidNamespace": self.pid_namespace,
            "mountNamespace": self.mount_namespace,
            "cgroup": self.cgroup,
            "seccomp": self.seccomp,
            "egress": self.egress,
            "landlock": self.landlock,
        }
