"""Resource limits of a function process: which rlimits a limit set lowers, and lowering them.

Both places that start function processes lower the same limits the same way: soft == hard (so
user code cannot raise them again), never above a hard limit already lower than asked, and no
core files.
"""

from __future__ import annotations

import contextlib
import resource
from typing import Protocol


class Rlimits(Protocol):
    """A limit set: the caps a function process runs under."""

    @property
    def open_files(self) -> int: ...
    @property
    def processes(self) -> int: ...  # RLIMIT_NPROC counts the user's processes; not enforced for root
    @property
    def address_space_bytes(self) -> int: ...
    @property
    def cpu_seconds(self) -> int: ...
    @property
    def file_size_bytes(self) -> int: ...


def pairs(limits: Rlimits) -> list[tuple[int, int]]:
    """The (rlimit, value) pairs ``limits`` sets, core files included (always 0)."""
    return [
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_AS, limits.address_space_bytes),
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_CORE, 0),
    ]


def apply(limits: Rlimits, *, pid: int | None = None) -> None:
    """Lower the limits of this process (``pid`` None) or of the process ``pid`` (prlimit: one
    that has exited meanwhile is left alone)."""
    for which, wanted in pairs(limits):
        if pid is None:
            _soft, hard = resource.getrlimit(which)
            value = _capped(wanted, hard)
            resource.setrlimit(which, (value, value))
            continue
        with contextlib.suppress(ProcessLookupError):
            _soft, hard = resource.prlimit(pid, which)
            value = _capped(wanted, hard)
            resource.prlimit(pid, which, (value, value))


def _capped(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)
