"""`krt` commands against the embedded platform of one state directory, as a user types them: a
child `python -m kruntimes.workers.krt` from the repository root whose environment names that state
directory and no other `KRT_*` setting of the calling process (which would point it elsewhere)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def krt_env(state: Path) -> dict[str, str]:
    """The environment of a `krt` command against the embedded platform in ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRT_")}
    env["KRT_STATE_DIR"] = str(state)
    return env


def krt(state: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`krt ARGS` against the embedded platform in ``state``, its output captured; never raises
    on a non-zero exit (the caller checks ``returncode``)."""
    return subprocess.run(
        [sys.executable, "-m", "kruntimes.workers.krt", *args],
        capture_output=True,
        text=True,
        env=krt_env(state),
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
