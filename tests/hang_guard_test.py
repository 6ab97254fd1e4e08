"""A test stuck where pytest-timeout cannot reach it (its SIGALRM never delivered: a call blocked in
C, a wedged loop) ends the session with every thread's traceback (pyproject's
faulthandler_exit_on_timeout), rather than hanging CI until its own limit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STUCK = """
import signal, time

def test_stuck_beyond_pytest_timeout():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGINT})
    time.sleep(120)
"""


def test_a_test_stuck_beyond_pytest_timeout_ends_the_session_with_its_traceback(tmp_path: Path) -> None:
    (tmp_path / "stuck_test.py").write_text(STUCK)
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),  # the suite's own settings, its two bounds made short
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=1",
            "-o",
            "faulthandler_timeout=3",
            str(tmp_path / "stuck_test.py"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - began
    assert done.returncode != 0 and elapsed < 60
    assert "Timeout (0:00:03)!" in done.stderr, done.stderr[-2000:]
    assert "test_stuck_beyond_pytest_timeout" in done.stderr
