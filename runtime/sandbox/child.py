"""The sandbox as the zygote applies it to one function process.

The zygote (single-threaded, root) prepares the PID namespace of its next child (`PidSpace`),
then forks. The child (`enter`) becomes PID 1 of its own namespace: it joins the function's
cgroup, makes its own mount (and, for `network: none`, network) namespace, builds the file
system view (fsview), mounts a private /proc, /tmp and /dev/shm, and forks the function process.
It stays behind as the namespace's init: it reaps whatever the function leaves orphaned and,
when the function process ends, exits with its status (128 + N when it was killed by signal
N, as shells report it), which ends every other process of the namespace. `enter` returns in
the function process, still privileged; the caller sets up the process and calls `drop` last.

Seeds take that work off the path of a registration: the zygote keeps a few children already
`plant`ed — PID 1 of a namespace of their own with the generic view (Python, shared and hidden
directories, private /proc, /tmp and /dev/shm, loopback), their function process forked and
waiting, privileged, for an assignment. Given one (its spec, its descriptors, and descriptors of
the paths only it may see, opened where they are visible), the waiting process `grow`s the view
by what is its own (its workspace), joins its cgroup, and goes on as an entered one would.

A seed may be planted for one function's cgroup (a base with `cgroup_procs`): it joins that
cgroup before it forks, as an entered child does, so joining (a cgroup migration waits for an
RCU grace period: milliseconds) is off the registration's path too. Such a seed only ever
becomes a process of that cgroup (`seeded_by`); a generic seed (no cgroup) joins at `grow`.
"""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass
from typing import Any

from kruntimes.runtime.sandbox import cgroups, fsview, landlock, seccomp, syscalls

PROC_OPTIONS = "hidepid=invisible"


@dataclass(frozen=True)
class SandboxSpec:
    uid: int | None = None  # None: the host's own (same-user isolation)
    gid: int | None = None
    pid_namespace: bool = False
    mount_namespace: bool = False
    network_none: bool = False
    # `network: outbound`: no TCP bind (Landlock; applied at `drop`, so seeds need not match it)
    deny_tcp_bind: bool = False
    keep: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()
    # kept paths the function may write (its workspace, shared directories); with a mount
    # namespace every other path of the host is read-only to it (fsview.seal)
    writable: tuple[str, ...] = ()
    cgroup_procs: tuple[str, ...] = ()
    tmp_bytes: int = 64 * 1024 * 1024
    # the function runs as another uid than the files' owner: directories closed to others
    # block it on the way to a kept path and are covered (fsview.plan needs_traversal)
    foreign_uid: bool = False

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
            deny_tcp_bind=bool(raw.get("deny_tcp_bind")),
            keep=tuple(raw.get("keep", ())),
            hide=tuple(raw.get("hide", ())),
            writable=tuple(raw.get("writable", ())),
            cgroup_procs=tuple(raw.get("cgroup_procs", ())),
            tmp_bytes=int(raw.get("tmp_bytes", 64 * 1024 * 1024)),
            foreign_uid=bool(raw.get("foreign_uid", raw.get("uid") is not None)),
        )

    def seeded_by(self, base: SandboxSpec) -> bool:
        """Whether a process planted with `base` can become this one (its view only grows; a
        seed planted in a cgroup becomes a process of that cgroup and of no other)."""
        return (
            (not base.cgroup_procs or base.cgroup_procs == self.cgroup_procs)
            and self.pid_namespace
            and self.mount_namespace
            and base.pid_namespace
            and base.mount_namespace
            and (self.network_none, self.hide, self.tmp_bytes, self.foreign_uid)
            == (base.network_none, base.hide, base.tmp_bytes, base.foreign_uid)
            and set(base.keep) <= set(self.keep)
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
                if flags & syscalls.CLONE_NEWPID:
                    # the view is sealed read-only (Linux 5.12), and IPC is the function's own:
                    # without either, no namespaces (the host says so)
                    syscalls.unshare(syscalls.CLONE_NEWIPC)
                    syscalls.mount_setattr("/", add=syscalls.MOUNT_ATTR_RDONLY, recursive=True)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        results.append(os.waitstatus_to_exitcode(status) == 0)
    return results[0], results[1]


def view(spec: SandboxSpec) -> fsview.Plan:
    """The file system view of `spec` as fsview plans it, from the real file system."""
    scratch = {"/tmp": spec.tmp_bytes, "/dev/shm": spec.tmp_bytes}
    return fsview.plan(
        keep=spec.keep,
        hide=spec.hide,
        scratch=scratch,
        writable=spec.writable,
        needs_traversal=spec.foreign_uid,
    )


def _namespaces(spec: SandboxSpec, planned: fsview.Plan | None = None) -> fsview.Plan:
    """Mount, IPC (and network) namespaces of this process's own, with the view of `spec` (as
    `planned` when given), which it returns; not sealed yet (`_seal`). The IPC namespace keeps
    System V shared memory, semaphores and message queues, and POSIX message queues, to the
    function: none of another's can be reached, and what it leaves ends with its namespace."""
    syscalls.unshare(
        syscalls.CLONE_NEWNS | syscalls.CLONE_NEWIPC | (syscalls.CLONE_NEWNET if spec.network_none else 0)
    )
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    applied = planned if planned is not None else view(spec)
    fsview.apply(applied)
    flags = syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC
    syscalls.mount("proc", "/proc", "proc", flags, PROC_OPTIONS)
    if spec.network_none:
        syscalls.loopback_up()
    return applied


def _seal(writable: tuple[str, ...]) -> None:
    """The view read-only but the mounts at `writable` and the namespace's own /proc."""
    fsview.seal((*writable, "/proc"))


def enter(spec: SandboxSpec) -> None:
    """Runs in the freshly forked child; returns in the function process (see the docstring)."""
    cgroups.join(spec.cgroup_procs)
    if spec.mount_namespace:
        _seal(_namespaces(spec).writable)
    if not spec.pid_namespace:
        return
    function = os.fork()
    if function == 0:
        return
    _init(function)


def plant(base: SandboxSpec, planned: fsview.Plan) -> None:
    """Runs in a fresh seed (PID 1 of its namespace): its cgroup if the base has one, the view
    `planned` for the base, then the fork; returns in the waiting function process, privileged."""
    cgroups.join(base.cgroup_procs)
    _namespaces(base, planned)
    function = os.fork()
    if function == 0:
        return
    _init(function)


def growth(spec: SandboxSpec, base: SandboxSpec, planted: fsview.Plan | None = None) -> fsview.Plan:
    """What a process planted with `base` (the view `planted`, when known) must add to its view
    to have the view of `spec` (planned where the real file system is visible: in the zygote)."""
    done = set((planted if planted is not None else view(base)).ops)
    whole = view(spec)
    return fsview.Plan(tuple(op for op in whole.ops if op not in done), whole.writable)


def grow(spec: SandboxSpec, base: SandboxSpec, more: fsview.Plan, trees: dict[str, int]) -> None:
    """In a process planted with `base` given its assignment: its cgroup (unless the seed was
    planted in it), and `more` of the view (its binds as detached mount trees in `trees`: path →
    syscalls.open_tree made where it is visible)."""
    if not base.cgroup_procs:
        cgroups.join(spec.cgroup_procs)
    fsview.apply(more, trees=trees)
    _seal(more.writable)


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
    groups, an empty capability bounding set, no_new_privs, death with its parent, its Landlock
    domain (runtime/sandbox/landlock.py), the syscall filter (runtime/sandbox/seccomp.py)."""
    if spec.uid is not None and spec.gid is not None:
        syscalls.drop_bounding_set()
        os.setgroups([])
        os.setresgid(spec.gid, spec.gid, spec.gid)
        os.setresuid(spec.uid, spec.uid, spec.uid)
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
    # after the uid change, which clears the parent-death signal
    syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
    landlock.restrict(deny_tcp_bind=spec.deny_tcp_bind)  # the kernel's ABI, read by the zygote
    bpf = seccomp.program(network_none=spec.network_none)  # built by the zygote before it forked
    if bpf is not None:
        seccomp.install(bpf)
