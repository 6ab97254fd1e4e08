"""Whether a process a test started still runs, read from /proc (any user's process), a process
frozen for a while, and the processes below one known by pid and start time, so that a check or
a kill long after they were seen never reaches a later process that got the same pid (pids wrap
at /proc/sys/kernel/pid_max, 32768 here, many times over in one run of the suite)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def thread_names(pid: int | str = "self") -> set[str]:
    """The system's names of a process's threads (/proc/PID/task/*/comm)."""
    names = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.add((task / "comm").read_text().strip())
    return names


def alive(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead (a zombie nobody reaped yet has
    stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP) inside the block and continued (SIGCONT) after it, unless it
    is gone by then (a frozen host is fenced: killed)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@dataclass(frozen=True)
class Proc:
    """A process as it was seen: its pid and its start time (clock ticks after boot)."""

    pid: int
    start: int


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time, or None if there is no such pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def descendants(pid: int) -> set[Proc]:
    """Every live process below `pid` (a host's zygote and function processes)."""
    found: set[Proc] = set()
    seen: set[int] = set()
    stack = [pid]
    while stack:
        parent = stack.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                with contextlib.suppress(OSError):
                    for child in map(int, (task / "children").read_text().split()):
                        stat = _stat(child)
                        if child not in seen and stat is not None:
                            seen.add(child)
                            found.add(Proc(child, stat[1]))
                            stack.append(child)
    return found


def same_alive(proc: Proc) -> bool:
    """That very process (not a later one with its pid) is running and not a zombie."""
    stat = _stat(proc.pid)
    return stat is not None and stat[1] == proc.start and stat[0] not in ("Z", "X")


def kill(proc: Proc) -> None:
    """SIGKILL that very process, never a later one with its pid: a pidfd is opened first, then
    the start time checked (the pidfd names the process it was opened on, gone or not)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return
    try:
        if same_alive(proc):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)
