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
from kruntimes.api.status import ConditionType, RunStatus

if TYPE_CHECKING:
    from kruntimes.api.function import FunctionStatus, ScaleEvent
    from kruntimes.api.spec import RunSpec
    from kruntimes.contracts.reconcile import ReconcileReport
    from kruntimes.sdk.events import RunEvent
    from kruntimes.sdk.functions import FunctionDescription
    from kruntimes.sdk.results import AsyncInvocation, FunctionObject, HostView, Invocation, RunObject
    from kruntimes.sdk.schedules import ScheduleView

RUN_COLUMNS = ("NAME", "NAMESPACE", "RUNTIME", "MODE", "PHASE", "REASON", "ATTEMPT", "HOST", "AGE")
# -o wide adds these after the others: what describe shows of a Run, one line each.
WIDE_COLUMNS = ("RECOVERIES", "TENANT", "UID", "ENDPOINT")
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


def reason(status: RunStatus) -> str:
    """Why the Run is in its phase: its Ready condition's reason (kubectl's STATUS reason)."""
    ready = status.condition(ConditionType.Ready)
    return ready.reason if ready is not None else NONE


def run_row(run: RunObject, *, now: datetime | None = None, wide: bool = False) -> list[str]:
    status = run.status
    row = [
        run.metadata.name,
        run.metadata.namespace,
        run.spec.runtime,
        run.spec.mode.kind,
        status.phase.value,
        reason(status),
        str(status.attempt),
        status.assignedHost or NONE,
        age(run.created, now=now),
    ]
    if wide:
        endpoint = status.endpoint.url if status.endpoint is not None else NONE
        row += [str(status.recoveries), run.spec.tenant or NONE, run.metadata.uid or NONE, endpoint]
    return row


def runs_table(
    runs: Sequence[RunObject], *, now: datetime | None = None, header: bool = True, wide: bool = False
) -> str:
    columns = RUN_COLUMNS + WIDE_COLUMNS if wide else RUN_COLUMNS
    return table(columns, [run_row(r, now=now, wide=wide) for r in runs], header=header)


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

    def remark(self, message: str) -> None:
        """Why the current phase lasts (a component it waits for is down), after the phases so far."""
        elapsed = f"({self.clock() - self.started:.1f}s)"
        if self.tty:
            arrow = " → " if self.fancy else " -> "
            icon = self._icon(self.phases[-1]) if self.phases else ""
            phases = arrow.join(p.value for p in self.phases)
            self.stream.write(f"\r{icon}{self.label}: {phases} {elapsed} - {message}\x1b[K")
            self._drawn = True
        else:
            # a Run no worker has started yet is Pending
            phase = (self.phases[-1] if self.phases else RunPhase.Pending).value
            self.stream.write(f"{self.label}: {phase} {elapsed} - {message}\n")
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


def _when(at: datetime | None, *, now: datetime | None) -> str:
    if at is None:
        return NONE
    return f"{at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} ({age(at, now=now)} ago)"


def describe(run: RunObject, events: Sequence[RunEvent], *, now: datetime | None = None) -> str:
    """`krt run describe`: the Run's spec and status in words, its conditions and its events.
    Env values, the task's input and outputs' values are left out (they may be secret)."""
    spec, status, meta = run.spec, run.status, run.metadata
    mode, source, env, env_from = _spec_words(spec)
    labels = ",".join(f"{k}={v}" for k, v in sorted(meta.labels.items())) or NONE
    lines = [
        ("Name", meta.name),
        ("Namespace", meta.namespace),
        ("UID", meta.uid or NONE),
        ("Labels", labels),
        ("Creator", str(meta.creator) if meta.creator is not None else NONE),
        ("Runtime", spec.runtime),
        ("Mode", mode),
        ("Handler", spec.handler),
        ("Source", source),
        ("Tenant", spec.tenant or NONE),
        ("Env", env),
        ("Env From", env_from),
        ("Timeout", f"{spec.timeoutSeconds} s" if spec.timeoutSeconds is not None else NONE),
        ("Created", _when(run.created, now=now)),
        ("Phase", status.phase.value),
        ("Reason", reason(status)),
        ("Message", status.message or NONE),
        ("Attempt", f"{status.attempt} of {spec.retryPolicy.limit}"),
        ("Recoveries", f"{status.recoveries} of {spec.recoveryLimit}"),
        ("Host", status.assignedHost or NONE),
        ("Endpoint", status.endpoint.url if status.endpoint is not None else NONE),
        ("Started", _when(status.startTime, now=now)),
        ("Completed", _when(status.completionTime, now=now)),
    ]
    if status.outputs is not None:
        lines.append(("Outputs", ", ".join(sorted(status.outputs)) + " (values: krt run get -o yaml)"))
    text = _fields(lines) + _conditions(status.conditions, now=now)
    text += "Events:\n"
    if events:
        rows = [
            [
                age(e.at, now=now),
                e.kind,
                e.reason,
                e.host or "-",
                str(e.attempt) if e.attempt is not None else "-",
                e.message or "-",
            ]
            for e in events
        ]
        text += _indent(table(("AGE", "KIND", "REASON", "HOST", "ATTEMPT", "MESSAGE"), rows))
    else:
        text += f"  {NONE}\n"
    return text


def _spec_words(spec: RunSpec) -> tuple[str, str, str, str]:
    """A Run's (or a Function's template's) mode, source, env names and envFrom in words (no
    value: env values and a task's input may be secret)."""
    if spec.mode.function is not None:
        fn = spec.mode.function
        said = [f"idle timeout {fn.idleTimeoutSeconds} s"] if fn.idleTimeoutSeconds is not None else []
        if fn.concurrency is not None:
            said.append(f"concurrency {fn.concurrency}")
        if fn.queue:
            said.append(f"queue {fn.queue}, waiting at most {fn.queue_timeout_seconds:g} s")
        mode = "function" + (f" ({', '.join(said)})" if said else "")
    else:
        given = spec.mode.task is not None and spec.mode.task.input is not None
        size = len(spec.mode.task.encoded_input()) if spec.mode.task is not None and given else 0
        mode = "task" + (f" (input: {size} bytes, not shown)" if given else "")
    source = spec.source.path or f"inline ({len(spec.source.inline or [])} files)"
    env = ", ".join(sorted(spec.env)) or NONE
    env_from = ", ".join(f"secret/{e.secretRef.name}" for e in spec.envFrom) or NONE
    return mode, source, env + (" (values not shown)" if spec.env else ""), env_from


def _fields(lines: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in lines) + 2
    return "".join(f"{k + ':':<{width}}{v}\n" for k, v in lines)


def _conditions(conditions: Sequence[Any], *, now: datetime | None) -> str:
    text = "Conditions:\n"
    if conditions:
        rows = [
            [c.type, c.status.value, c.reason, _when(c.lastTransitionTime, now=now), c.message or NONE]
            for c in conditions
        ]
        return text + _indent(table(("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"), rows))
    return text + f"  {NONE}\n"


# --- Functions ----------------------------------------------------------------------------------

FUNCTION_COLUMNS = ("NAME", "NAMESPACE", "RUNTIME", "READY", "REVISION", "PHASE", "AGE")
# -o wide adds these: the scale bounds, the uid and the URL.
FUNCTION_WIDE_COLUMNS = ("MIN", "MAX", "UID", "ENDPOINT")


def function_row(function: FunctionObject, *, now: datetime | None = None, wide: bool = False) -> list[str]:
    status = function.status
    row = [
        function.metadata.name,
        function.metadata.namespace,
        function.spec.runtime,
        f"{status.replicas.ready}/{status.replicas.wanted}",
        str(status.revision),
        status.phase.value,
        age(function.created, now=now),
    ]
    if wide:
        scale = function.spec.scale
        endpoint = status.endpoint.url if status.endpoint is not None else NONE
        row += [str(scale.min), str(scale.max), function.metadata.uid or NONE, endpoint]
    return row


def functions_table(
    functions: Sequence[FunctionObject], *, now: datetime | None = None, wide: bool = False
) -> str:
    columns = FUNCTION_COLUMNS + FUNCTION_WIDE_COLUMNS if wide else FUNCTION_COLUMNS
    return table(columns, [function_row(f, now=now, wide=wide) for f in functions])


def function_list_document(functions: Sequence[FunctionObject]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "FunctionList", "items": [f.manifest() for f in functions]}


def rollout_line(name: str, status: FunctionStatus) -> str:
    """Where a Function's rollout is, in one line (kubectl's `rollout status` words)."""
    from kruntimes.sdk.functions import rolled_out

    replicas = status.replicas
    if rolled_out(status):
        done = f"{replicas.ready}/{replicas.wanted} ready"
        return f"function/{name}: revision {status.revision} rolled out ({done})"
    if status.revision == 0:
        return f"function/{name}: waiting for its first revision ({status.phase.value})"
    return (
        f"function/{name}: waiting for revision {status.revision} to roll out: {replicas.ready} of "
        f"{replicas.wanted} replicas ready, {replicas.total} in all ({status.phase.value})"
        + (f": {status.message}" if status.message else "")
    )


def describe_function(description: FunctionDescription, *, now: datetime | None = None) -> str:
    """`krt function describe`: the Function's template, scale and status in words, its
    conditions and each replica (no env value, as for a Run)."""
    function = description.function
    spec, status, meta = function.spec, function.status, function.metadata
    mode, source, env, env_from = _spec_words(spec)
    scale = spec.scale
    target = f"{spec.target_concurrency}" + (
        "" if scale.targetConcurrency is not None else " (the replica's concurrency)"
    )
    replicas = status.replicas
    observed = (
        "" if status.observedRevision == status.revision else f" (rolled out: {status.observedRevision})"
    )
    lines = [
        ("Name", meta.name),
        ("Namespace", meta.namespace),
        ("UID", meta.uid or NONE),
        ("Labels", ",".join(f"{k}={v}" for k, v in sorted(meta.labels.items())) or NONE),
        ("Creator", str(meta.creator) if meta.creator is not None else NONE),
        ("Runtime", spec.runtime),
        ("Mode", mode),
        ("Handler", spec.handler),
        ("Source", source),
        ("Tenant", spec.tenant or NONE),
        ("Env", env),
        ("Env From", env_from),
        (
            "Scale",
            f"min {scale.min}, max {scale.max}, target concurrency {target}, "
            f"scale down after {scale.scaleDownDelaySeconds} s",
        ),
        ("Created", _when(function.created, now=now)),
        ("Phase", status.phase.value),
        ("Message", status.message or NONE),
        ("Revision", f"{status.revision}{observed}"),
        (
            "Traffic",
            ", ".join(f"{t.percent}% to revision {t.revision}" for t in status.traffic)
            or "all to the latest",
        ),
        ("Replicas", f"{replicas.wanted} wanted, {replicas.ready} ready, {replicas.total} in all"),
        ("Last Scale", _last_scale(status.lastScale, now=now)),
        ("Endpoint", status.endpoint.url if status.endpoint is not None else NONE),
    ]
    text = _fields(lines) + _conditions(status.conditions, now=now)
    text += "Replica Runs:\n"
    if description.replicas:
        rows = [[r.name, str(r.revision), r.phase, r.runUid] for r in description.replicas]
        text += _indent(table(("RUN", "REVISION", "PHASE", "UID"), rows))
    else:
        text += f"  {NONE}\n"
    return text


def _last_scale(event: ScaleEvent | None, *, now: datetime | None) -> str:
    """The Function's own last change of its replicas wanted: from, to, why, when."""
    if event is None:
        return NONE
    why = f"{event.reason}: {event.message}" if event.message else event.reason
    return f"{event.previous} -> {event.wanted} ({why or 'no reason given'}) at {_when(event.at, now=now)}"


def _indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


INVOCATION_COLUMNS = ("ID", "STATE", "ATTEMPTS", "REASON", "AGE")
# -o wide adds these: when it ran and ended, when its id is forgotten, why it was last retried.
INVOCATION_WIDE_COLUMNS = ("STARTED", "ENDED", "EXPIRES", "RETRIED")


def invocation_row(invocation: Invocation, *, now: datetime | None = None, wide: bool = False) -> list[str]:
    error = invocation.error
    row = [
        invocation.invocationId,
        invocation.state.value,
        str(invocation.attemptCount),
        error.reason if error is not None else NONE,
        age(invocation.acceptedAt, now=now),
    ]
    if wide:
        row += [
            _stamp(invocation.startedAt),
            _stamp(invocation.endedAt),
            _stamp(invocation.expiresAt),
            invocation.retried or NONE,
        ]
    return row


def _stamp(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else NONE


def invocations_table(
    invocations: Sequence[Invocation], *, now: datetime | None = None, wide: bool = False
) -> str:
    columns = INVOCATION_COLUMNS + INVOCATION_WIDE_COLUMNS if wide else INVOCATION_COLUMNS
    return table(columns, [invocation_row(i, now=now, wide=wide) for i in invocations])


def invocation_list_document(invocations: Sequence[Invocation]) -> dict[str, Any]:
    return {"kind": "InvocationList", "items": [i.document() for i in invocations]}


def accepted_line(accepted: AsyncInvocation) -> str:
    """`krt invoke --async`'s answer: the id and where to read the invocation."""
    return f"invocation/{accepted.invocationId} accepted ({accepted.state.value}): {accepted.location}"
