"""Temporal workflow histories, read for bench/lifecycle.py: when things happened, and where
create→Ready went.

Times are the server's (each event's event_time, epoch seconds). `history_steps` labels every
event; `run_milestones` picks a Run's steps from its history and its pool's, `segments`
names the spans between them; `pool_stats` and `run_task_stats` summarize workflow tasks.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from _benchlib import ms, percentile
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from kruntimes.contracts.names import pool_workflow_id
from kruntimes.wire import search


def wall(ev: HistoryEvent) -> float:
    """The server's time of an event, in epoch seconds."""
    return ev.event_time.ToNanoseconds() / 1e9


async def fetch_events(client: Client, workflow_id: str) -> list[HistoryEvent]:
    handle = client.get_workflow_handle(workflow_id)
    return [ev async for ev in handle.fetch_history_events()]


def phase_upserted(event: HistoryEvent) -> str | None:
    """The KrtPhase an UpsertWorkflowSearchAttributes event sets, if it sets one."""
    if event.event_type != EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        return None
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    if search.PHASE not in fields:
        return None
    value = json.loads(fields[search.PHASE].data)
    return str(value[0] if isinstance(value, list) else value)


CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}


def event_wall(events: list[HistoryEvent], done: Callable[[HistoryEvent], bool]) -> float | None:
    """The server's time (epoch seconds) of the first event `done` accepts."""
    for ev in events:
        if done(ev):
            return wall(ev)
    return None


@dataclass(frozen=True)
class Step:
    wall: float
    who: str  # run | pool | scaleout | client
    what: str


def _short(event_type: int) -> str:
    return EventType.Name(event_type).removeprefix("EVENT_TYPE_")  # type: ignore[arg-type]


def history_steps(events: list[HistoryEvent], who: str) -> list[Step]:
    """Label each event, with the activity / signal / child it concerns."""
    activities: dict[int, str] = {}
    steps = []
    for ev in events:
        what = _short(ev.event_type)
        kind = ev.WhichOneof("attributes")
        attrs = getattr(ev, kind) if kind else None
        if kind == "activity_task_scheduled_event_attributes":
            activities[ev.event_id] = attrs.activity_type.name
            what += f" {attrs.activity_type.name}"
        elif kind in (
            "activity_task_started_event_attributes",
            "activity_task_completed_event_attributes",
            "activity_task_failed_event_attributes",
        ):
            what += f" {activities.get(attrs.scheduled_event_id, '?')}"
        elif kind in (
            "workflow_execution_signaled_event_attributes",
            "signal_external_workflow_execution_initiated_event_attributes",
        ):
            what += f" {attrs.signal_name}"
        elif kind == "start_child_workflow_execution_initiated_event_attributes":
            what += f" {attrs.workflow_type.name}"
        elif kind == "marker_recorded_event_attributes":
            what += f" {attrs.marker_name}"
        steps.append(Step(ev.event_time.ToNanoseconds() / 1e9, who, what))
    return steps


def _child_ids(events: list[HistoryEvent], workflow_type: str) -> list[str]:
    ids = []
    for ev in events:
        if ev.WhichOneof("attributes") == "start_child_workflow_execution_initiated_event_attributes":
            attrs = ev.start_child_workflow_execution_initiated_event_attributes
            if attrs.workflow_type.name == workflow_type:
                ids.append(attrs.workflow_id)
    return ids


async def timeline(
    client: Client, workflow_id: str, runtime: str, *, t0_wall: float, ready_wall: float
) -> list[Step]:
    """Every event of the Run, its pool and the pool's scale-outs between create and Ready."""
    lo, hi = t0_wall - 0.001, ready_wall + 0.001
    run_events = await fetch_events(client, workflow_id)
    pool_events = await fetch_events(client, pool_workflow_id(runtime))
    steps = [s for s in history_steps(run_events, "run") if s.wall <= hi]
    steps += [s for s in history_steps(pool_events, "pool") if lo <= s.wall <= hi]
    window = [ev for ev in pool_events if lo <= ev.event_time.ToNanoseconds() / 1e9 <= hi]
    for child in _child_ids(window, "ScaleOutWorkflow"):
        steps += [s for s in history_steps(await fetch_events(client, child), "scaleout") if s.wall <= hi]
    steps.append(Step(t0_wall, "client", "start_workflow called"))
    steps.append(Step(ready_wall, "client", "status query answered Ready"))
    return sorted(steps, key=lambda s: s.wall)


def print_timeline(title: str, steps: list[Step]) -> None:
    print(f"\n{title}")
    print(f"  {'at ms':>8} {'+ms':>7}  {'who':<8} event")
    t0 = prev = steps[0].wall
    for s in steps:
        print(f"  {(s.wall - t0) * 1000:8.1f} {(s.wall - prev) * 1000:7.1f}  {s.who:<8} {s.what}")
        prev = s.wall


async def fetch_chain(client: Client, workflow_id: str, since_wall: float) -> list[HistoryEvent]:
    """The workflow's events since ``since_wall``, across continue-as-new (the pool's)."""
    events = [ev async for ev in client.get_workflow_handle(workflow_id).fetch_history_events()]
    while events and wall(events[0]) > since_wall:
        previous = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not previous:
            break
        handle = client.get_workflow_handle(workflow_id, run_id=previous)
        events = [ev async for ev in handle.fetch_history_events()] + events
    return [ev for ev in events if wall(ev) >= since_wall]


def _signal_target(ev: HistoryEvent) -> str | None:
    """The Run a pool event concerns: an admit signal's sender, an assigned signal's target."""
    kind = ev.WhichOneof("attributes")
    if kind == "workflow_execution_signaled_event_attributes":
        attrs = ev.workflow_execution_signaled_event_attributes
        if attrs.signal_name == "admit" and attrs.input.payloads:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return str(json.loads(attrs.input.payloads[0].data)["workflowId"])
    if kind == "signal_external_workflow_execution_initiated_event_attributes":
        return str(
            ev.signal_external_workflow_execution_initiated_event_attributes.workflow_execution.workflow_id
        )
    return None


# A Run's milestones after "create", in the order they happen, each with the name of the segment
# that ends at it (the one from the milestone before).
SEGMENT_ENDS = {
    "started": "start_workflow RPC",
    "wft1 started": "Run WFT1 dispatch (scheduled→started)",
    "wft1 completed": "Run WFT1 processing (started→completed)",
    "pool got admit": "admit signal → pool history",
    "pool wft started": "waiting for a pool WFT to start",
    "pool sent assigned": "pool WFT processing → assigned sent",
    "assigned": "assigned signal → Run history",
    "register scheduled": "Run WFT dispatch + processing → register scheduled",
    "register started": "register_function dispatch",
    "register completed": "register_function execution",
    "ready wft completed": "Run WFT → Ready (dispatch + processing)",
    "observed": "Ready → observed by the client",
}


def segments() -> Iterator[tuple[str, str, str]]:
    """(label, from milestone, to milestone) of each segment of create→Ready, in order."""
    start = "create"
    for end, label in SEGMENT_ENDS.items():
        yield label, start, end
        start = end


def run_milestones(
    events: list[HistoryEvent], pool: list[HistoryEvent], t0_wall: float, ready_wall: float
) -> dict[str, float]:
    steps = history_steps(events, "run")

    def first(what: str, after: float = 0.0) -> float:
        return next((s.wall for s in steps if s.what == what and s.wall >= after), math.nan)

    m = {"create": t0_wall, "observed": ready_wall}
    m["started"] = first("WORKFLOW_EXECUTION_STARTED")
    m["wft1 started"] = first("WORKFLOW_TASK_STARTED")
    m["wft1 completed"] = first("WORKFLOW_TASK_COMPLETED")
    m["assigned"] = first("WORKFLOW_EXECUTION_SIGNALED assigned")
    m["register scheduled"] = first("ACTIVITY_TASK_SCHEDULED register_function")
    m["register started"] = first("ACTIVITY_TASK_STARTED register_function")
    m["register completed"] = first("ACTIVITY_TASK_COMPLETED register_function")
    m["ready wft completed"] = first("WORKFLOW_TASK_COMPLETED", m["register completed"])
    workflow_id = events[0].workflow_execution_started_event_attributes.workflow_id if events else ""
    got = sent = math.nan
    for ev in pool:
        if _signal_target(ev) != workflow_id:
            continue
        if ev.WhichOneof("attributes") == "workflow_execution_signaled_event_attributes" and math.isnan(got):
            got = wall(ev)
        elif math.isnan(sent):
            sent = wall(ev)
    m["pool got admit"], m["pool sent assigned"] = got, sent
    m["pool wft started"] = next(
        (
            wall(ev)
            for ev in pool
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and wall(ev) >= got
        ),
        math.nan,
    )
    return m


def print_segments(title: str, all_milestones: list[dict[str, float]]) -> list[dict[str, Any]]:
    print(f"\n{title} (n={len(all_milestones)}; ms)")
    print(f"  {'segment':<52} {'p50':>8} {'p90':>8} {'max':>8}")
    rows = []
    for label, a, b in segments():
        values = [m[b] - m[a] for m in all_milestones if not math.isnan(m[b] - m[a])]
        if not values:
            continue
        p50, p90, top = (percentile(values, q) * 1000 for q in (50, 90, 100))
        print(f"  {label:<52} {p50:8.1f} {p90:8.1f} {top:8.1f}")
        rows.append(
            {"segment": label, "p50_ms": round(p50, 1), "p90_ms": round(p90, 1), "max_ms": round(top, 1)}
        )
    return rows


def pool_stats(pool: list[HistoryEvent], lo: float, hi: float) -> dict[str, Any]:
    """How the pool workflow spent the window: its workflow tasks and the admits each one took."""
    window = [ev for ev in pool if lo <= wall(ev) <= hi]
    scheduled: float | None = None
    started: float | None = None
    tasks: list[tuple[float, float, int]] = []  # (schedule→start, start→complete, admits before it)
    # Of each task with local activities: started → its last local activity completed, and that
    # → the task completed (the completion's round trip, mostly the server's: its marker's time).
    split: list[tuple[float, float]] = []
    admits = 0
    busy = 0.0
    for i, ev in enumerate(window):
        t = ev.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            admits += _admissions(ev)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = wall(ev)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = wall(ev)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started is not None:
            wait = started - scheduled if scheduled is not None else math.nan
            tasks.append((wait, wall(ev) - started, admits))
            done = _local_activities_done(window[i + 1 :])
            if done is not None:
                split.append((done - started, wall(ev) - done))
            busy += wall(ev) - (scheduled if scheduled is not None else started)
            admits, scheduled, started = 0, None, None
    counts = Counter(ev.event_type for ev in window)
    with_admits = [n for _, _, n in tasks if n]
    return {
        "events": len(window),
        "workflow_tasks": len(tasks),
        "tasks_with_admits": len(with_admits),
        "admits_per_task_p50": percentile(with_admits, 50) if with_admits else 0,
        "admits_per_task_max": max(with_admits, default=0),
        "task_wait_p50_ms": ms(percentile([w for w, _, _ in tasks], 50)),
        "task_wait_max_ms": ms(max((w for w, _, _ in tasks if not math.isnan(w)), default=0.0)),
        "task_timeouts": counts[EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT],
        "signals_sent_completed": counts[EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED],
        "task_processing_p50_ms": ms(percentile([p for _, p, _ in tasks], 50)),
        "task_processing_p90_ms": ms(percentile([p for _, p, _ in tasks], 90)),
        "task_processing_max_ms": ms(max((p for _, p, _ in tasks), default=0.0)),
        "busy_fraction": round(busy / (hi - lo), 2) if hi > lo else None,
        "tasks_with_local_activities": len(split),
        "until_local_activities_done_p50_ms": ms(percentile([a for a, _ in split], 50)) if split else None,
        "after_local_activities_p50_ms": ms(percentile([b for _, b in split], 50)) if split else None,
        "after_local_activities_p90_ms": ms(percentile([b for _, b in split], 90)) if split else None,
        "continued_as_new": counts[EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW],
    }


def _admissions(ev: HistoryEvent) -> int:
    """The admissions a pool's signal carries: one for `admit`, each of an `admit_many`."""
    attrs = ev.workflow_execution_signaled_event_attributes
    if attrs.signal_name == "admit":
        return 1
    if attrs.signal_name != "admit_many":
        return 0
    with contextlib.suppress(IndexError, ValueError, AttributeError):
        return len(json.loads(attrs.input.payloads[0].data).get("admissions", []))
    return 0


def _stamp(value: object) -> float:
    """A marker's time (core writes a protobuf Timestamp as {"seconds", "nanos"}) in seconds
    since the epoch; NaN for anything else."""
    if isinstance(value, dict):
        return float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    return math.nan


def _local_activities_done(after: list[HistoryEvent]) -> float | None:
    """When the last local activity a task recorded completed (the markers that follow its
    WORKFLOW_TASK_COMPLETED; the worker's clock, the server's machine here). Their
    original_schedule_time is not used: core writes it when it records the marker."""
    last = -math.inf
    for ev in after:
        if ev.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            if ev.event_type in (
                EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
            ):
                break
            continue
        attrs = ev.marker_recorded_event_attributes
        if attrs.marker_name != "core_local_activity":
            continue
        with contextlib.suppress(KeyError, IndexError, ValueError):
            data = json.loads(attrs.details["data"].payloads[0].data)
            last = max(last, _stamp(data.get("complete_time")))
    return None if last == -math.inf or math.isnan(last) else last


def run_task_stats(histories: list[list[HistoryEvent]]) -> dict[str, Any]:
    """Schedule→start and start→complete of every workflow task of the Runs (worker saturation)."""
    waits, runs = [], []
    for events in histories:
        scheduled = started = None
        for ev in events:
            t = ev.event_type
            if t == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                scheduled = wall(ev)
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                started = wall(ev)
                if scheduled is not None:
                    waits.append(started - scheduled)
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started is not None:
                runs.append(wall(ev) - started)
                scheduled = started = None
    return {
        "tasks": len(runs),
        "per_run": round(len(runs) / max(len(histories), 1), 1),
        "wait_p50_ms": ms(percentile(waits, 50)),
        "wait_p90_ms": ms(percentile(waits, 90)),
        "processing_p50_ms": ms(percentile(runs, 50)),
        "processing_p90_ms": ms(percentile(runs, 90)),
    }


def _local_activity(ev: HistoryEvent) -> tuple[str, dict[str, Any] | None, bool] | None:
    """A local activity's marker: (activity type, its result decoded, whether it failed)."""
    if ev.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return None
    attrs = ev.marker_recorded_event_attributes
    if attrs.marker_name != "core_local_activity":
        return None
    kind, result = "?", None
    with contextlib.suppress(KeyError, IndexError, ValueError):
        kind = json.loads(attrs.details["data"].payloads[0].data).get("activity_type", "?")
    with contextlib.suppress(KeyError, IndexError, ValueError):
        result = json.loads(attrs.details["result"].payloads[0].data)
    return kind, result if isinstance(result, dict) else None, attrs.HasField("failure")


def run_paths(histories: list[list[HistoryEvent]]) -> dict[str, int]:
    """How the Runs got to Ready: how the assignment came (handed over in process or by signal),
    where attempt 1 was registered (the handoff, a local activity, an ordinary activity), what
    was given up, and the workflow tasks that timed out or failed."""
    paths: Counter[str] = Counter()
    for events in histories:
        tasks = 0
        for ev in events:
            t = ev.event_type
            if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                tasks += 1
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                paths["workflow task timed out"] += 1
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                paths["workflow task failed"] += 1
            elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                name = ev.workflow_execution_signaled_event_attributes.signal_name
                paths[f"signal {name}"] += 1
            elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                paths[f"activity {ev.activity_task_scheduled_event_attributes.activity_type.name}"] += 1
            elif phase_upserted(ev) == "Ready":
                paths[f"Ready in workflow task {tasks}"] += 1
                break
            marker = _local_activity(ev)
            if marker is None:
                continue
            kind, result, failed = marker
            if kind != "await_assignment":
                paths[f"local {kind}{' failed' if failed else ''}"] += 1
            elif failed:
                paths["handoff failed (timed out)"] += 1
            elif not result or not result.get("assignment"):
                paths["handoff: no answer in time"] += 1
            elif result.get("registration"):
                paths["handoff: answer and registered"] += 1
            else:
                reason = str(result.get("registerError") or "").split(":")[0]
                paths[f"handoff: answer, not registered ({reason})"] += 1
    return dict(sorted(paths.items()))
