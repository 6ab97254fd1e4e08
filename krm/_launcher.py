"""The exec evaluator's launcher: a small single-threaded process that starts function processes
under resource limits and reports when they end.

The launcher holds the functions' limits itself (soft and hard alike, set at its start), and a
child inherits them from the moment it exists: no instruction of a function runs before its
limits hold. It starts each one with posix_spawn (its own process group, the three descriptors
it was sent as stdin, stdout and stderr, the dispositions its interpreter set to "ignore" reset),
which is as cheap as a vfork. Standard library only (and kruntimes.system.fdpass, which is); run as
`python -I -S _launcher.py FD RESOURCE=VALUE ...`.

Protocol on the SOCK_SEQPACKET socket FD, one JSON object per message:
  request  {"id": N, "argv": [...], "cwd": "...", "env": {...}}
           with three descriptors (SCM_RIGHTS): the child's stdin, stdout and stderr
  started  {"id": N, "pid": P}  or  {"id": N, "errno": E, "error": "..."} when it did not start
  exited   {"id": N, "code": C}  (C negative: killed by signal -C), after its started
The child leads its own process group (its pid). When it ends, what it left in that group is
killed before it is reaped: a group is signalled only while its leader's pid cannot be reused.
At end of file on the socket every group still running is killed and the launcher exits. Its own
CPU time counts against the CPU limit it holds, so the evaluator replaces it long before (after a
number of starts that cost half the limit).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import sys
from typing import Any

if not __package__:  # run as a script (`python -I -S`) as kruntimes/krm/_launcher.py: import kruntimes
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from kruntimes.system import fdpass

MAX_MESSAGE_BYTES = 256 * 1024
FDS = 3
# Dispositions the launcher's interpreter set to "ignore", which a child would keep.
RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT)


def _hold(limits: list[tuple[int, int]]) -> None:
    for which, value in limits:
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _start(request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    try:
        os.chdir(request["cwd"])  # one thread: the child starts in it, then back
        argv = request["argv"]
        pid = os.posix_spawn(
            argv[0],
            argv,
            request["env"],
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)],
            setpgroup=0,
            setsigdef=RESTORED_SIGNALS,
        )
    except OSError as e:
        return {"id": request["id"], "errno": e.errno or 0, "error": e.strerror or str(e)}
    finally:
        os.chdir("/")
        for fd in fds:
            os.close(fd)
    return {"id": request["id"], "pid": pid}


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    data, fds = fdpass.receive(sock, MAX_MESSAGE_BYTES, FDS)  # ValueError: not one whole request
    if not data:
        return None
    return json.loads(data), fds


def main(fd: int, limits: list[tuple[int, int]]) -> None:
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    _hold(limits)
    os.chdir("/")
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    running: dict[int, tuple[int, int]] = {}  # pid -> (request id, pidfd)
    try:
        while True:
            for key, _ in selector.select():
                if key.data is None:
                    try:
                        message = _receive(sock)
                    except ValueError as e:
                        sock.send(json.dumps({"id": -1, "errno": 0, "error": str(e)}).encode())
                        continue
                    if message is None:
                        return
                    request, fds = message
                    answer = _start(request, fds)
                    if "pid" in answer:
                        pidfd = os.pidfd_open(answer["pid"])
                        running[answer["pid"]] = (request["id"], pidfd)
                        selector.register(pidfd, selectors.EVENT_READ, answer["pid"])
                    sock.send(json.dumps(answer).encode())
                else:
                    pid = key.data
                    selector.unregister(key.fd)
                    ident, pidfd = running.pop(pid)
                    os.close(pidfd)
                    # What the function left in its group goes with it, while the number is still
                    # ours: until it is reaped, no other process can be given it or its group's.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
                    _, status = os.waitpid(pid, 0)
                    sock.send(json.dumps({"id": ident, "code": os.waitstatus_to_exitcode(status)}).encode())
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    main(
        int(sys.argv[1]),
        [(int(w), int(v)) for w, v in (pair.split("=", 1) for pair in sys.argv[2:])],
    )
