"""Whether a test function's processes are gone: each holds an exclusive flock on a file it made,
and the lock is free once the last of them (forked children too) has exited."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def lock_free(path: Path) -> bool:
    """Nobody holds `path` locked; False while it does not exist (no process has made it yet)."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
