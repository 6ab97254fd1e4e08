"""How `krt` prints: tables, JSON and YAML documents, ages, and the progress line of `--wait`."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from kruntimes.api.phases import RunPhase, is_terminal
from kruntimes.api.run import API_VERSION
from kruntimes.api.status import RunStatus

if TYPE_CHECKING:
    from kruntimes.contracts.reconcile import ReconcileReport
    from kruntimes.sdk.results import HostView, RunObject
    from kruntimes.sdk.schedules import ScheduleView

RUN_COLUMNS = ("NAME", "NAMESPACE", "RUNTIME", "MODE", "PHASE", "ATTEMPT", "HOST", "AGE")
HOST_COLUMNS = ("HOST", "RUNTIME", "STATE", "SLOTS", "ADDRESS")
NONE = "<none>"


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, header: bool = True) -> str:
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)]
    lines = [columns, *rows] if header else list(rows)
    return "".join(
        "   ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in lines
    )


def age(since: datetime | None, *, now: datetime | None = None) -> str:
    """kubectl-style: 42s, 5m, 3h, 2d (a unit once there are two of it)."""
    if since is None:
        return NONE
    seconds = max(int(((now or datetime.now(UTC)) - since).total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def run_row(run: RunObject, *, now: datetime | None = None) -> list[str]:
    status = run.status
    return [
        run.metadata.name,
        run.metadata.namespace,
        run.spec.runtime,
        run.spec.mode.kind,
        status.phase.value,
        str(status.attempt),
        status.assignedHost or NONE,
        age(run.created, now=now),
    ]


def runs_table(runs: Sequence[RunObject], *, now: datetime | None = None, header: bool = True) -> str:
    return table(RUN_COLUMNS, [run_row(r, now=now) for r in runs], header=header)


def host_row(view: HostView) -> list[str]:
    host = view.host
    return [host.hostId, host.runtime, host.state.value, f"{view.used}/{host.capacity}", host.address or NONE]


def hosts_table(views: Sequence[HostView]) -> str:
    return table(HOST_COLUMNS, [host_row(v) for v in views])


def reconcile_line(report: ReconcileReport) -> str:
    """One runtime's orphan collection in one line: what it repaired, or that nothing needed it."""
    parts = [
        f"{name} {len(items)}"
        for name, items in (
            ("unregistered", report.unregistered),
            ("released", report.released),
            ("told", report.registrationsLost),
            ("deleted hosts", report.deletedHosts),
            ("removed workspaces", report.removedWorkspaces),
            ("supervised", report.supervised),
        )
        if items
    ]
    done = ", ".join(parts) if parts else "nothing to repair"
    errors = f"; {len(report.errors)} error(s): {report.errors[0]}" if report.errors else ""
    return f"{report.runtime}: {done}{errors}"


def run_list_document(runs: Sequence[RunObject]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "RunList", "items": [r.manifest() for r in runs]}


def host_document(view: HostView) -> dict[str, Any]:
    return {**view.host.model_dump(mode="json", exclude_none=True), "used": view.used}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line text (PEM bundles, source files) as a readable literal block.
    style = "|" if "\n" in value else None  # PyYAML quotes it when a block cannot hold it
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(document: Any, output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    return str(yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16))


class Progress:
    """Phase changes while waiting: one rewritten line on a terminal, plain lines otherwise.

    ⏳ Pending → Scheduled → Running → Ready (1.2s)
    """

    def __init__(self, stream: TextIO, *, label: str, clock: Any = time.monotonic) -> None:
        self.stream = stream
        self.label = label
        self.clock = clock
        self.started = clock()
        self.phases: list[RunPhase] = []
        self.tty = _isatty(stream)
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        self.fancy = encoding == "utf8"
        self._drawn = False

    def __call__(self, status: RunStatus) -> None:
        changed = not self.phases or self.phases[-1] is not status.phase
        if changed:
            self.phases.append(status.phase)
        elapsed = f"({self.clock() - self.started:.1f}s)"
        if self.tty:
            arrow = " → " if self.fancy else " -> "
            icon = self._icon(status.phase)
            self.stream.write(
                f"\r{icon}{self.label}: {arrow.join(p.value for p in self.phases)} {elapsed}\x1b[K"
            )
            self._drawn = True
            self.stream.flush()
        elif changed:
            message = f" - {status.message}" if status.message else ""
            self.stream.write(f"{self.label}: {status.phase.value} {elapsed}{message}\n")
            self.stream.flush()

    def _icon(self, phase: RunPhase) -> str:
        if not self.fancy:
            return ""
        if phase in (RunPhase.Ready, RunPhase.Succeeded):
            return "✅ "
        return "❌ " if is_terminal(phase) else "⏳ "

    def done(self) -> None:
        """End the rewritten line (call once waiting is over, however it ended)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


SCHEDULE_COLUMNS = ("NAME", "NAMESPACE", "WHEN", "OVERLAP", "PAUSED", "RUNTIME", "LAST RUN", "NEXT")


def schedules_table(views: Sequence[ScheduleView]) -> str:
    rows = []
    for v in views:
        when = v.cron if v.cron is not None else f"every {v.every.total_seconds():g}s" if v.every else "-"
        nxt = v.nextTimes[0].strftime("%Y-%m-%dT%H:%M:%SZ") if v.nextTimes and not v.paused else "-"
        rows.append(
            [
                v.name,
                v.namespace,
                when,
                v.overlap,
                "yes" if v.paused else "no",
                v.runtime or "-",
                v.recentRuns[-1] if v.recentRuns else "-",
                nxt,
            ]
        )
    return table(SCHEDULE_COLUMNS, rows)
