"""Resource limits applied to every function process (set in the forked child, before user code)."""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    open_files: int = 1024
    processes: int = 512  # RLIMIT_NPROC counts the user's processes; not enforced for root
    address_space_bytes: int = 4096 * MiB
    cpu_seconds: int = 3600  # cumulative for a warm process; per invocation for bash
    file_size_bytes: int = 256 * MiB

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, int]) -> ProcessLimits:
        return cls(**raw)


def apply(limits: ProcessLimits) -> None:
    """Lower this process's limits; soft == hard so user code cannot raise them again."""
    pairs = [
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_AS, limits.address_space_bytes),
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_CORE, 0),
    ]
    for which, value in pairs:
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))
