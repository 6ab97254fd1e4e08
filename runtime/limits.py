"""Resource limits applied to every function process (set in the forked child, before user code)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kruntimes.system.rlimits import apply as apply  # the one place limits are lowered

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
