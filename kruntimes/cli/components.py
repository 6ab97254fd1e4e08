"""The embedded platform's record of its processes (up.json in its state directory) and the state
of each component read from it: running, restarting (attempt and last error), or down.

The supervisor (kruntimes.workers.embedded) writes the record whenever a component starts, dies
or starts again; `krt status`, `krt up` (which refuses while any recorded process runs), `krt
down` and the `--wait` progress line read it. A process is named by its pid and its start time,
so a pid the machine has given to another process since is never taken for a component.

    {"pid": supervisor, "components": {name: pid}, "started": {pid: start time},
     "restarting": {name: {"attempt": n, "lastError": "..."}}}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kruntimes.api.phases import RunPhase
from kruntimes.cli.output import Progress

RECORD_FILE = "up.json"
SUPERVISOR = "platform"
# Every component a running platform has, in the order they start (and `krt status` lists them).
COMPONENTS = ("temporal", "front", "gateway", "worker")
RUNNING, RESTARTING, DOWN = "running", "restarting", "down"
# Without these a Run waits in vain; `--wait` names them once it waited this long.
NEEDED_BY_RUNS = ("worker", "gateway")


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), None when no such process runs: with the
    pid, it names one process, where a pid alone may since have been given to another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not); one of another user's processes counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


@dataclass(frozen=True)
class Restarting:
    """A component that died and is being started again: which attempt comes, and why it died."""

    attempt: int
    lastError: str


@dataclass(frozen=True)
class Record:
    """What up.json says: the supervisor's pid, the components' pids, their start times."""

    pid: int = 0
    components: dict[str, int] = field(default_factory=dict)
    started: dict[str, int | None] | None = None
    restarting: dict[str, Restarting] = field(default_factory=dict)

    def same(self, pid: int) -> bool:
        """Whether `pid` is still the process recorded, and runs (a record without start times
        trusts the pid)."""
        if not pid:
            return False
        if self.started is None:
            return alive(pid)
        recorded = self.started.get(str(pid))
        return recorded is not None and recorded == start_time(pid) and alive(pid)

    def supervisor(self) -> int:
        """The supervisor's pid while it runs, else 0."""
        return self.pid if self.same(self.pid) else 0

    def live_components(self) -> dict[str, int]:
        """The recorded components still running (name → pid)."""
        return {name: pid for name, pid in self.components.items() if self.same(pid)}


def read(path: Path) -> Record:
    """The record at `path`; an empty one when there is none or it cannot be read."""
    try:
        data: Any = json.loads(path.read_text())
        components = {str(k): int(v) for k, v in data.get("components", {}).items()}
        started = data.get("started")
        restarting = {
            str(k): Restarting(attempt=int(v["attempt"]), lastError=str(v["lastError"]))
            for k, v in data.get("restarting", {}).items()
        }
        return Record(
            pid=int(data.get("pid", 0)),
            components=components,
            started=(
                {str(k): (int(v) if v is not None else None) for k, v in started.items()}
                if isinstance(started, dict)
                else None
            ),
            restarting=restarting,
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return Record()


def write(
    path: Path, *, pid: int, components: dict[str, int], restarting: dict[str, Restarting] | None = None
) -> None:
    """Record the supervisor's pid and its components', each with its start time (rewritten
    whole, at once: a reader never sees half of it)."""
    started = {str(p): start_time(p) for p in (pid, *components.values())}
    document = {
        "pid": pid,
        "components": components,
        "started": started,
        "restarting": {
            name: {"attempt": r.attempt, "lastError": r.lastError} for name, r in (restarting or {}).items()
        },
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    tmp.replace(path)


@dataclass(frozen=True)
class ComponentState:
    """One component as `krt status` shows it."""

    name: str
    state: str  # RUNNING | RESTARTING | DOWN
    pid: int = 0
    attempt: int = 0
    lastError: str = ""

    def describe(self) -> str:
        """ "the worker is down", "the gateway is restarting (attempt 2; exited with code 1)"."""
        what = "the dev server" if self.name == "temporal" else f"the {self.name}"
        if self.state == RESTARTING:
            return f"{what} is restarting (attempt {self.attempt}; {self.lastError})"
        return f"{what} is {self.state}"


def states(record: Record) -> list[ComponentState]:
    """The supervisor and every component: restarting while the running supervisor starts it
    again (until it serves), running when its recorded process runs, down otherwise."""
    supervisor = record.supervisor()
    rows = [ComponentState(SUPERVISOR, RUNNING if supervisor else DOWN, supervisor)]
    names = [*COMPONENTS, *(n for n in record.components if n not in COMPONENTS)]
    for name in names:
        pid = record.components.get(name, 0)
        again = record.restarting.get(name)
        if supervisor and again is not None:  # dead, or started again but not serving yet
            rows.append(ComponentState(name, RESTARTING, pid, again.attempt, again.lastError))
        elif pid and record.same(pid):
            rows.append(ComponentState(name, RUNNING, pid))
        else:
            rows.append(ComponentState(name, DOWN, pid))
    return rows


def not_running(state_dir: Path, names: tuple[str, ...] = NEEDED_BY_RUNS) -> list[ComponentState]:
    """Those of `names` not running on the embedded platform of `state_dir`; none when no
    embedded platform was ever started there (another platform's parts are not seen here)."""
    path = state_dir / RECORD_FILE
    if not path.exists():
        return []
    return [s for s in states(read(path)) if s.name in names and s.state != RUNNING]


# How long a Run waits in Pending before `--wait` looks for a missing component, and how often then.
PENDING_GRACE_S = 3.0
CHECK_EVERY_S = 1.0


async def name_what_is_missing(
    progress: Progress, state_dir: str, *, after_s: float = PENDING_GRACE_S, every_s: float = CHECK_EVERY_S
) -> None:
    """While the Run waited `after_s` and is still Pending, say on the progress line which
    component of the embedded platform in `state_dir` it waits for in vain (the worker or the
    gateway down or restarting), each time that changes; runs until cancelled. Without a state
    dir (a platform not run by `krt up`) it says nothing."""
    if not state_dir:
        return
    await asyncio.sleep(after_s)
    said = ""
    while True:
        missing = ""
        if not progress.phases or progress.phases[-1] is RunPhase.Pending:
            found = not_running(Path(state_dir))
            missing = "; ".join(s.describe() for s in found)
        if missing and missing != said:
            progress.remark(f"{missing}: the Run waits for it (`krt status` shows the platform)")
        said = missing
        await asyncio.sleep(every_s)
