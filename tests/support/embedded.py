"""A real embedded platform (`krt up --detach` through the CLI) for the tests that need one, the
processes it is made of (pid and start time, read from its state dir), and a way to end every one
of them by pid whatever the test did to its supervisor."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kruntimes.activities.hosts.process import list_records
from kruntimes.cli import components
from tests.support import krt_cli
from tests.support.procs import Proc, descendants, kill, same_alive


@dataclass
class Embedded:
    """One state directory and the `krt` commands against it."""

    state: Path

    def krt(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return krt_cli.krt(self.state, *args, timeout=timeout)

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self.krt(*args)
        assert done.returncode == 0, f"krt {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
        return done

    def record(self) -> components.Record:
        return components.read(self.state / components.RECORD_FILE)

    def status(self) -> tuple[int, dict[str, dict[str, Any]]]:
        """`krt status -o json`: its exit code and its rows by component."""
        done = self.krt("status", "-o", "json")
        rows = {row["component"]: row for row in json.loads(done.stdout)["components"]}
        return done.returncode, rows

    def proc(self, name: str) -> Proc:
        """A component's process as recorded now ("platform": the supervisor)."""
        record = self.record()
        pid = record.pid if name == components.SUPERVISOR else record.components[name]
        start = components.start_time(pid)
        assert start is not None, f"{name} (pid {pid}) does not run"
        return Proc(pid, start)

    def processes(self) -> set[Proc]:
        """Every process of the platform running now: the supervisor, the components, the hosts
        and everything below each of them."""
        record = self.record()
        pids = [record.pid, *record.components.values()]
        if (self.state / "hosts").exists():
            pids += [h.pid for h in list_records(self.state) if h.pid]
        found: set[Proc] = set()
        for pid in pids:
            start = components.start_time(pid)
            if start is not None:
                found.add(Proc(pid, start))
                found |= descendants(pid)
        return found

    def hosts_running(self) -> set[str]:
        if not (self.state / "hosts").exists():
            return set()
        return {h.hostId for h in list_records(self.state) if h.pid and same_alive_pid(h.pid)}


def same_alive_pid(pid: int) -> bool:
    start = components.start_time(pid)
    return start is not None and same_alive(Proc(pid, start))


@contextlib.contextmanager
def embedded_platform(state: Path) -> Iterator[Embedded]:
    """A platform started with `krt up --detach`; afterwards `krt down`, then every process it
    was seen made of that still runs is killed by pid."""
    platform = Embedded(state)
    platform.ok("up", "--detach")
    seen = platform.processes()
    try:
        yield platform
    finally:
        seen |= platform.processes()
        platform.krt("down")
        for proc in seen:
            kill(proc)
