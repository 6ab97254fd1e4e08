"""The zygote: a single-threaded process, started once per Runtime Server, that forks function processes.

Starting a function process by forking this already-initialised interpreter costs a fraction of
starting a fresh interpreter, and forking from a process with no
threads is safe (the gRPC server itself must never fork).

Protocol on the SOCK_SEQPACKET socket inherited as --fd (one JSON message per packet):
  server -> zygote  {"op": "spawn", "id", "spec"} with file descriptors [stdin, stdout, stderr, ctl?]
                    {"op": "kill", "pid"}            kill the process group of a child not yet reaped
                    {"op": "seeds", "base", "count"} keep `count` generic seeds planted with `base`
                    {"op": "plant", "base"}          plant one seed in the cgroup of `base` (one
                                                    function's), when no other request waits
                    {"op": "retire", "cgroup"}       no seed waits (or is to be planted) for the
                                                    cgroup whose procs files are `cgroup`: its
                                                    function starts no process of its own now
  zygote -> server  {"op": "ready", "namespaces", "networkNamespaces"}
                                                    once, when its imports are done; whether it
                                                    can give a child PID, mount and network
                                                    namespaces (runtime/sandbox)
                    {"op": "spawned", "id", "pid"} | {"op": "spawn_failed", "id", "error"}
                    {"op": "exited", "pid", "code"}  (code < 0: killed by that signal)
The zygote reaps its children, so a pid it has not reported as exited cannot be reused: killing
through the zygote never hits an unrelated process.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

from kruntimes.runtime import limits
from kruntimes.runtime.adapters import python_worker
from kruntimes.runtime.sandbox import child, fsview, landlock, launcher, seccomp, syscalls

MAX_MESSAGE = 256 * 1024
# A seed plants (namespaces, view, the fork of its function process) at the lowest priority, so
# that on a busy machine preparing the next function takes no CPU from what is serving; given a
# function it runs at the zygote's priority again.
SEED_NICE = 19
_work_nice: int | None = None  # in a seed: the priority it runs its function at
CTL_FD = 3
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _never_preempt_the_host() -> None:
    """Run function code as SCHED_BATCH: the same CPU share as the default policy (nice 0), but a
    function process woken by its request does not preempt the host's event loop; it runs when
    the loop blocks, on a free CPU, or at the next tick. The loop then answers a burst of
    requests in one go instead of being switched out at every write to a function's socket."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux: keep the default policy
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _child(spec: dict[str, Any], fds: list[int], server: socket.socket) -> None:
    """Runs in the forked child; never returns."""
    code = 127
    try:
        os.setsid()
        _die_with_parent()
        server.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target, inheritable=True)
        os.closerange(len(fds), os.sysconf("SC_OPEN_MAX"))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        sandbox = child.SandboxSpec.from_json(spec["sandbox"]) if spec.get("sandbox") else None
        if sandbox is not None:
            child.enter(sandbox)  # returns in the function process (its namespace's init stays)
        code = _become(spec, sandbox)
    except BaseException as exc:
        _failed(exc)
    os._exit(code)


def _become(spec: dict[str, Any], sandbox: child.SandboxSpec | None) -> int:
    """The function process's last steps: its directory, environment, limits and identity,
    then its adapter (never returns for `exec`)."""
    os.chdir(spec["cwd"])
    env = spec["env"]
    os.environ.clear()
    os.environ.update(env)
    limits.apply(limits.ProcessLimits.from_dict(spec["limits"]))
    if _work_nice is not None:  # a seed's: back to the zygote's priority (still privileged)
        os.setpriority(os.PRIO_PROCESS, 0, _work_nice)
    _never_preempt_the_host()
    if sandbox is not None:
        child.drop(sandbox)  # its own uid, no capabilities, no_new_privs: the last step
    if spec["kind"] == "exec":
        os.execve(spec["argv"][0], spec["argv"], env)
    if spec["kind"] == "launcher":  # starts the function's processes, a call at a time
        private = sandbox is not None and sandbox.mount_namespace
        scratch = launcher.SCRATCH if private else ()
        argv = list(spec["argv"])
        if private and launcher.forkable(argv, env):  # a Python lane: its calls are forks
            lane = launcher.python_lane(argv)
            os.execve(lane[0], lane, env)
        return launcher.serve(ctl_fd=CTL_FD, argv=argv, env=env, scratch=scratch)
    return python_worker.main(
        ctl_fd=CTL_FD,
        workdir=spec["cwd"],
        handler=spec["handler"],
        once=spec["kind"] == "python-once",
        context=spec.get("context", {}),
    )


def _failed(exc: BaseException) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"kruntimes: function process failed to start: {exc!r}\n".encode())


def _seed(
    base: child.SandboxSpec,
    planned: fsview.Plan,
    theirs: socket.socket,
    server: socket.socket,
    work_nice: int | None,
) -> None:
    """Runs in a new seed (the zygote's child, PID 1 of a namespace of its own); never returns.
    Its function process waits on `theirs` for one assignment: {"spec", "grow": [[kind, path,
    options], ...], "writable": [path, ...]} with the function's descriptors (stdin, stdout,
    stderr[, control]) and one per bind of `grow`, in order. The zygote lowered its priority
    (`work_nice`: the one its function process takes back; None when it was not lowered)."""
    global _work_nice
    _work_nice = work_nice
    code = 127
    try:
        os.setsid()
        _die_with_parent()
        server.close()
        keep = theirs.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        child.plant(base, planned)  # returns in the waiting function process
        msg, fds, _flags, _addr = socket.recv_fds(theirs, MAX_MESSAGE, 16)
        if not msg:
            os._exit(0)  # retired before it was given anything
        theirs.close()
        assignment = json.loads(msg)
        spec = assignment["spec"]
        more = fsview.Plan(
            tuple(fsview.Op(kind, path, options) for kind, path, options in assignment["grow"]),
            tuple(assignment["writable"]),
        )
        binds = more.binds
        stdio, sources = (
            fds[: len(fds) - len(binds)],
            dict(zip(binds, fds[len(fds) - len(binds) :], strict=True)),
        )
        sandbox = child.SandboxSpec.from_json(spec["sandbox"])
        child.grow(sandbox, base, more, sources)
        for fd in sources.values():
            os.close(fd)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target, inheritable=True)
        os.closerange(len(stdio), os.sysconf("SC_OPEN_MAX"))
        code = _become(spec, sandbox)
    except BaseException as exc:
        _failed(exc)
    os._exit(code)


@dataclass
class _Seed:
    """A planted child waiting for a function: generic (a base without a cgroup) or planted in
    the cgroup of the one function it may become."""

    pid: int
    ours: socket.socket
    base: child.SandboxSpec
    planted: fsview.Plan  # the view it made

    @property
    def generic(self) -> bool:
        return not self.base.cgroup_procs


class Zygote:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: set[int] = set()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        # What a function orphans (a double fork) is reparented here, not to the machine's init,
        # and reaped here: where its function has no PID namespace (whose init reaps it) nothing
        # else might (a host that is PID 1 of its pod does not), and its zombie would count
        # toward its uid's process limit, keeping the uid from its next function.
        syscalls.prctl(syscalls.PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the server, which stops us
        self.namespaces, self.network_namespaces = child.probe()
        for network_none in (False, True):  # built once, here: every child installs one (child.drop)
            seccomp.program(network_none=network_none)
        landlock.abi()  # asked once, here: every child makes its domain (child.drop)
        self.pids = child.PidSpace() if self.namespaces else None
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        # seeds wait niced only where they can come back (not in a pod's user namespace, whose
        # root lacks the node's CAP_SYS_NICE): a function never runs at the seed's priority
        self.seed_work_nice = self.nice if syscalls.may_raise_priority() else None
        self.generic: child.SandboxSpec | None = None  # the base of the generic seeds
        self.generic_count = 0
        self.waiting: list[_Seed] = []
        # seeds asked for one function's cgroup each, planted when no request is waiting
        self.to_plant: list[child.SandboxSpec] = []

    def send(self, message: dict[str, Any]) -> None:
        self.sock.send(json.dumps(message).encode())

    def serve(self) -> None:
        gc.freeze()  # forked children share these pages instead of touching them in a collection
        self.send(
            {"op": "ready", "namespaces": self.namespaces, "networkNamespaces": self.network_namespaces}
        )
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, "sock")
        sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            events = sel.select(0 if self.to_plant else None)
            if not events and self.to_plant:  # nothing else to do: plant the next asked-for seed
                self.plant(self.to_plant.pop(0))
            for key, _ in events:
                if key.data == "wake":
                    try:
                        while os.read(self.wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                elif not self.handle_message():
                    return
            self.reap()

    def handle_message(self) -> bool:
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 8)
        if not msg:
            return False  # the server went away
        try:
            request = json.loads(msg)
            if request["op"] == "spawn":
                self.spawn(request, fds)
            elif request["op"] == "kill":
                self.kill(int(request["pid"]))
            elif request["op"] == "seeds":
                self.configure_seeds(request)
            elif request["op"] == "plant" and self.pids is not None:
                self.to_plant.append(child.SandboxSpec.from_json(request["base"]))
            elif request["op"] == "retire":
                self.retire(tuple(request["cgroup"]))
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def configure_seeds(self, request: dict[str, Any]) -> None:
        if self.pids is None:
            return
        self.generic = child.SandboxSpec.from_json(request["base"])
        self.generic_count = max(0, int(request["count"]))
        self.replant()

    def replant(self) -> None:
        """Bring the generic seeds back to their count (after one was given, or died unused)."""
        if self.generic is None:
            return
        while sum(1 for seed in self.waiting if seed.generic) < self.generic_count:
            if not self.plant(self.generic):
                return  # no seed now: functions are started the direct way meanwhile

    def retire(self, cgroup: tuple[str, ...]) -> None:
        """End the seeds planted (and drop those asked for) in one function's cgroup: a
        function whose processes are started per call would otherwise keep one waiting, two
        processes and their memory, for as long as it is registered without being called."""
        if not cgroup:
            return
        self.to_plant = [b for b in self.to_plant if b.cgroup_procs != cgroup]
        for seed in [seed for seed in self.waiting if seed.base.cgroup_procs == cgroup]:
            self.waiting.remove(seed)
            seed.ours.close()  # the seed's function process reads the end and exits; reaped here

    def plant(self, base: child.SandboxSpec) -> bool:
        """Fork a seed planted with `base`; whether it could."""
        if self.pids is None:
            return False
        planned = child.view(base)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.pids.next_child(new=True)
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return False
        if pid == 0:
            ours.close()
            _seed(base, planned, theirs, self.sock, self.seed_work_nice)
        if self.seed_work_nice is not None:
            # lowered here, before the seed can be handed out: set by the seed itself, it could
            # land after `_at_work` raised it for its function and leave the function's init niced
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, SEED_NICE)
        theirs.close()
        self.children.add(pid)
        self.waiting.append(_Seed(pid, ours, base, planned))
        return True

    def _use_seed(self, request: dict[str, Any], fds: list[int]) -> int | None:
        """Give the spawn to a waiting seed (the one planted in its cgroup first); its pid, or
        None to start the function directly."""
        raw = request["spec"].get("sandbox")
        if not raw:
            return None
        sandbox = child.SandboxSpec.from_json(raw)
        if sandbox.cgroup_procs:  # one asked for but not planted yet: too late to be of use
            self.to_plant = [b for b in self.to_plant if b.cgroup_procs != sandbox.cgroup_procs]
        candidates = sorted(
            (seed for seed in self.waiting if sandbox.seeded_by(seed.base)), key=lambda seed: seed.generic
        )
        for seed in candidates:
            more = child.growth(sandbox, seed.base, seed.planted)
            opened: list[int] = []
            try:
                for path in more.binds:  # a bind cannot cross mount namespaces: detached trees can
                    opened.append(syscalls.open_tree(path))
            except OSError:
                for fd in opened:
                    os.close(fd)
                return None
            self.waiting.remove(seed)
            self._at_work(seed.pid)
            try:
                grow = [[op.kind, op.path, op.options] for op in more.ops]
                message = json.dumps(
                    {"spec": request["spec"], "grow": grow, "writable": list(more.writable)}
                ).encode()
                socket.send_fds(seed.ours, [message], fds + opened)
            except OSError:
                continue  # that seed died: try the next
            finally:
                seed.ours.close()
                for fd in opened:
                    os.close(fd)
            return seed.pid
        return None

    def _at_work(self, pid: int) -> None:
        """A seed given a function runs at the zygote's priority again: its init, and its
        waiting function process (its child, once forked; one forked meanwhile resets its own
        priority before it runs the function)."""
        for target in (pid, *_children(pid)):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, target, self.nice)

    def spawn(self, request: dict[str, Any], fds: list[int]) -> None:
        pid = self._use_seed(request, fds)
        if pid is not None:
            self.send({"op": "spawned", "id": request["id"], "pid": pid})
            self.replant()
            return
        try:
            if self.pids is not None:  # a sandboxed child is PID 1 of a namespace of its own
                sandbox = request["spec"].get("sandbox") or {}
                self.pids.next_child(new=bool(sandbox.get("pid_namespace")))
            pid = os.fork()
        except OSError as exc:
            self.send({"op": "spawn_failed", "id": request["id"], "error": str(exc)})
            return
        if pid == 0:
            _child(request["spec"], fds, self.sock)
        self.children.add(pid)
        self.send({"op": "spawned", "id": request["id"], "pid": pid})

    def kill(self, pid: int) -> None:
        if pid not in self.children:
            return  # already reaped (and reported): the pid may belong to someone else now
        try:
            os.killpg(pid, signal.SIGKILL)  # the child leads its own process group
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def reap(self) -> None:
        """Reap every ended child: its own (reported) and the orphans it adopted (not)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.children:
                continue  # an adopted orphan: nobody asked for it, nobody waits for it
            self.children.discard(pid)
            for seed in list(self.waiting):
                if seed.pid == pid:  # a seed died before it was given a function
                    self.waiting.remove(seed)
                    seed.ours.close()
            self.send({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    ns = parser.parse_args()
    _die_with_parent()
    sock = socket.socket(fileno=ns.fd)
    try:
        Zygote(sock).serve()
    finally:
        sys.exit(0)


if __name__ == "__main__":
    main()
