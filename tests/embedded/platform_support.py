"""Helpers of the embedded platform's tests: the platform itself (tests.support.embedded, named
here too), the dev servers on a state dir's database, and a process that sleeps."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.embedded import Embedded, same_alive_pid

__all__ = ["Embedded", "dev_servers_on", "same_alive_pid", "sleeper"]


def dev_servers_on(state: Path) -> list[int]:
    """The pids of the Temporal dev servers whose database is in `state` (from their command lines)."""
    database = str(state / "temporal" / "temporal.db")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if database.encode() in argv:
                found.append(int(entry.name))
    return found


# Says "ready" once its SIGTERM disposition is set, then sleeps (at most 5 minutes).
SLEEPER = "import signal, sys, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(300)\n"


@contextlib.contextmanager
def sleeper(*, ignore_term: bool = False, argv: tuple[str, ...] = ()) -> Iterator[subprocess.Popen[str]]:
    setup = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER.format(setup=setup), *argv],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as the supervisor starts its components
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
