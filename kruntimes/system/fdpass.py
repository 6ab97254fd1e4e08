"""Descriptors passed with a message on a SOCK_SEQPACKET socket (SCM_RIGHTS), as both call
launchers take them: the sandbox's (runtime/sandbox/launcher.py, in the forked zygote) and the
exec evaluator's (krm/_launcher.py, a `python -I -S` script). Standard library only."""

from __future__ import annotations

import _socket as socket  # the C module: `socket`'s enums are not on a Python lane's start's path
import os
import sys

_INT = 4  # bytes of a descriptor in SCM_RIGHTS


def receive(sock: socket.socket, max_bytes: int, count: int) -> tuple[bytes, list[int]]:
    """One message and the `count` descriptors that came with it (close-on-exec); `(b"", [])` at
    end of file. A message cut short, or with another number of descriptors, raises ValueError;
    whatever descriptors it brought are closed."""
    fds: list[int] = []
    data, ancillary, flags, _ = sock.recvmsg(
        max_bytes, socket.CMSG_SPACE(count * _INT), socket.MSG_CMSG_CLOEXEC
    )
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = len(payload) - len(payload) % _INT
            fds += (int.from_bytes(payload[i : i + _INT], sys.byteorder) for i in range(0, whole, _INT))
    if not data or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != count:
        for fd in fds:
            os.close(fd)
        if not data:
            return b"", []
        raise ValueError(f"a request must be one whole message with {count} descriptors")
    return data, fds
