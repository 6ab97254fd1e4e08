"""Whether a process a test started still runs, read from /proc (any user's process)."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead (a zombie nobody reaped yet has
    stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
