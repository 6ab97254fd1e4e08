"""A call launcher: the process that starts a per-call function's processes (bash, krm) inside
its sandbox, one call at a time, as a pod's wrapper server would.

The zygote makes it like any function process (runtime/zygote.py, kind "launcher"): its own PID
namespace (it is PID 2, under the namespace's privileged init), the function's mount namespace
and view, its cgroup, its limits, then its uid, no capabilities and no_new_privs. Then, instead
of the function, it runs `serve`: for each call it starts the entrypoint with posix_spawn (vfork
semantics: no page table copied, nothing to copy on write), in a session and process group of
its own, with the three descriptors it was sent as stdin, stdout and stderr; it waits for that
process and, before it reports the end, kills everything else in the namespace (`kill(-1)`:
every process the namespace holds but the launcher and the init, all of the function's uid),
waits until nothing is left, and removes what the call left in the private /tmp and /dev/shm.
Each call so starts in a namespace holding the launcher alone, with scratch directories as the
view made them, as a process started directly did; what the calls share is the function's
workspace, uid and cgroup.

It is not dumpable (a process of its uid cannot ptrace it or read its memory) and ignores every
signal that would end it, except those it cannot ignore: a call that kills it (SIGKILL) ends
the namespace and its own processes with it; one that stops it (SIGSTOP) never gets its end
reported and times out; either way the host discards the lane (runtime/lanes.py) and the next
call starts in a new one.

Protocol on the SOCK_SEQPACKET socket `ctl_fd`, one JSON object per message:
  request  {"op": "run"} with three descriptors (SCM_RIGHTS): the call's stdin, stdout, stderr
  started  {"op": "started", "pid": P}  (P in the lane's namespace)
           or {"op": "failed", "error": "..."} when it did not start
  exited   {"op": "exited", "code": C, "clean": B}  C as waitstatus_to_exitcode; B false when
           something of the call outlived the bound: the launcher exits after this message
At end of file on the socket it exits. Standard library only (and kruntimes.fdpass, which is):
it runs in the forked zygote.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import time
from typing import Any

from kruntimes import fdpass

MAX_MESSAGE = 4096
FDS = 3
CLEAN_TIMEOUT_S = 2.0  # how long the leftovers of a call may take to disappear
SCRATCH = ("/tmp", "/dev/shm")  # in a mount namespace of its own: private tmpfs, emptied after each call
_CLEAN_POLL_S = 0.0005
_PR_SET_DUMPABLE = 4
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
# what its own processes report to it, and faults (only ever sent: ignoring them is undefined)
_KEPT = {signal.SIGCHLD, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


def _undumpable() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl PR_SET_DUMPABLE: {os.strerror(code)}")


def _shield() -> tuple[int, ...]:
    """Ignore every signal that could end or stop this process and that it may ignore; the ones
    a call must get back as they were (its inherited dispositions: what the function process of
    a direct start had)."""
    restore = []
    for sig in range(1, signal.NSIG):
        if sig in _UNCATCHABLE or sig in _KEPT:
            continue
        try:
            before = signal.getsignal(sig)
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            continue  # not a signal this platform lets a process handle
        if before != signal.SIG_IGN:
            restore.append(sig)
    return tuple(restore)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    try:
        data, fds = fdpass.receive(sock, MAX_MESSAGE, FDS)
    except ValueError:
        return None  # the host does not speak this protocol: nothing to serve
    if not data:
        return None  # the host went away
    return json.loads(data), fds


def _clean() -> bool:
    """Kill every other process of the namespace (the init and this one are spared by the
    kernel) and wait until none is left; whether that happened within the bound."""
    deadline = time.monotonic() + CLEAN_TIMEOUT_S
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True  # nothing to signal: nothing left (zombies the init has not reaped count)
        except PermissionError:
            return False  # something of another uid: never the function's; the lane must end
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if time.monotonic() > deadline:
            return False
        time.sleep(_CLEAN_POLL_S)


def _contents(scratch: tuple[str, ...]) -> dict[str, tuple[int, frozenset[str]]]:
    """What the view put in each scratch directory (the way to a path kept under it, a bind of
    a shared directory): its device and entries, which `_scrub` never touches."""
    found = {}
    for directory in scratch:
        with contextlib.suppress(OSError):  # none there, or not listable: not scrubbed
            found[directory] = (os.stat(directory).st_dev, frozenset(os.listdir(directory)))
    return found


def _scrub(contents: dict[str, tuple[int, frozenset[str]]]) -> bool:
    """Remove what a call left in the private /tmp and /dev/shm (entries the view did not put
    there, on the scratch tmpfs itself), so that each call finds them as a process started
    directly did; whether that worked (what cannot be removed ends the lane)."""
    for directory, (device, planted) in contents.items():
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name in planted:
                        continue
                    if entry.stat(follow_symlinks=False).st_dev != device:
                        return False  # not the call's: nothing it could have made
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
        except OSError:
            return False
    return True


def _run(argv: list[str], env: dict[str, str], fds: list[int], restore: tuple[int, ...]) -> int | str:
    """Start one call's process; its pid, or why it did not start."""
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
    try:
        return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True, setsigdef=restore)
    except OSError as exc:
        return f"{argv[0]}: {exc.strerror or exc}"
    finally:
        for fd in fds:
            os.close(fd)


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        return os.waitstatus_to_exitcode(status)


def serve(*, ctl_fd: int, argv: list[str], env: dict[str, str], scratch: tuple[str, ...]) -> int:
    """The launcher's loop (never returns before end of file on `ctl_fd`); its exit code.
    `scratch`: the directories to empty after each call (SCRATCH in a mount namespace of its
    own, never the host's)."""
    os.set_inheritable(ctl_fd, False)
    _undumpable()
    restore = _shield()
    sock = socket.socket(fileno=ctl_fd)
    if not _clean():  # what the start left (nothing; the namespace is new): the same rule
        return 1
    contents = _contents(scratch)
    while True:
        try:
            message = _receive(sock)
        except (OSError, ValueError):
            return 1
        if message is None:
            return 0
        _request, fds = message
        pid = _run(argv, env, fds, restore)
        try:
            if isinstance(pid, str):
                sock.send(json.dumps({"op": "failed", "error": pid}).encode())
                continue
            sock.send(json.dumps({"op": "started", "pid": pid}).encode())
            code = _wait(pid)
            clean = _clean() and _scrub(contents)
            sock.send(json.dumps({"op": "exited", "code": code, "clean": clean}).encode())
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
            return 0  # the host went away mid-call: the namespace ends with this process
        if not clean:
            return 1
