"""The sandbox as the zygote applies it to one function process.

The zygote (single-threaded, root) prepares the PID namespace of its next child (`PidSpace`),
then forks. The child (`enter`) becomes PID 1 of its own namespace: it joins the function's
cgroup, makes its own mount (and, for `network: none`, network) namespace, builds the file
system view (fsview), mounts a private /proc, /tmp and /dev/shm, and forks the function process.
It stays behind as the namespace's init: it reaps whatever the function leaves orphaned and,
when the function process ends, exits with its status (128 + N when it was killed by signal
N, as shells report it), which ends every other process of the namespace. `enter` returns in
the function process, still privileged; the caller sets up the process and calls `drop` last.
"""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass
from typing import Any

from runtime.sandbox import cgroups, fsview, syscalls

PROC_OPTIONS = "hidepid=invisible"


@dataclass(frozen=True)
class SandboxSpec:
    uid: int | None = None  # None: the host's own (same-user isolation)
    gid: int | None = None
    pid_namespace: bool = False
    mount_namespace: bool = False
    network_none: bool = False
    keep: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()
    cgroup_procs: tuple[str, ...] = ()
    tmp_bytes: int = 64 * 1024 * 1024

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SandboxSpec:
        return cls(
            uid=raw.get("uid"),
            gid=raw.get("gid"),
            pid_namespace=bool(raw.get("pid_namespace")),
            mount_namespace=bool(raw.get("mount_namespace")),
            network_none=bool(raw.get("network_none")),
            keep=tuple(raw.get("keep", ())),
            hide=tuple(raw.get("hide", ())),
            cgroup_procs=tuple(raw.get("cgroup_procs", ())),
            tmp_bytes=int(raw.get("tmp_bytes", 64 * 1024 * 1024)),
        )


class PidSpace:
    """The zygote's handle on PID namespaces: its own, and a fresh one for its next child."""

    def __init__(self) -> None:
        self.own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def next_child(self, *, new: bool) -> None:
        """The next fork goes into a new PID namespace (`new`) or into the zygote's own."""
        syscalls.setns(self.own, syscalls.CLONE_NEWPID)
        if new:
            syscalls.unshare(syscalls.CLONE_NEWPID)


def probe() -> tuple[bool, bool]:
    """(PID and mount namespaces usable, network namespaces usable), tried in a child process."""
    results = []
    for flags in (
        syscalls.CLONE_NEWNS | syscalls.CLONE_NEWPID,
        syscalls.CLONE_NEWNS | syscalls.CLONE_NEWNET,
    ):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                syscalls.unshare(flags)
                syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        results.append(os.waitstatus_to_exitcode(status) == 0)
    return results[0], results[1]


def enter(spec: SandboxSpec) -> None:
    """Runs in the freshly forked child; returns in the function process (see the docstring)."""
    cgroups.join(spec.cgroup_procs)
    if spec.mount_namespace:
        syscalls.unshare(syscalls.CLONE_NEWNS | (syscalls.CLONE_NEWNET if spec.network_none else 0))
        syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
        scratch = {"/tmp": spec.tmp_bytes, "/dev/shm": spec.tmp_bytes}
        fsview.apply(
            fsview.plan(keep=spec.keep, hide=spec.hide, scratch=scratch, needs_traversal=spec.uid is not None)
        )
        flags = syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC
        syscalls.mount("proc", "/proc", "proc", flags, PROC_OPTIONS)
        if spec.network_none:
            syscalls.loopback_up()
    if not spec.pid_namespace:
        return
    function = os.fork()
    if function == 0:
        return
    _init(function)


def _init(function: int) -> None:
    """PID 1 of the function's namespace: reap everything, end with the function process."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    os.closerange(0, os.sysconf("SC_OPEN_MAX"))
    code = 1
    try:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid == function:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                break
    finally:
        os._exit(code)


def drop(spec: SandboxSpec) -> None:
    """The function process's last privileged step: its own uid and gid, no supplementary
    groups, an empty capability bounding set, no_new_privs, death with its parent."""
    if spec.uid is not None and spec.gid is not None:
        syscalls.drop_bounding_set()
        os.setgroups([])
        os.setresgid(spec.gid, spec.gid, spec.gid)
        os.setresuid(spec.uid, spec.uid, spec.uid)
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
    # after the uid change, which clears the parent-death signal
    syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
