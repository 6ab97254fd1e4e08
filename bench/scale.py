"""Benchmark: a runtime scaled up to N Ready Runs, as a user would, with the SDK on the embedded
platform (`krt up --detach` in a fresh state dir: the dev server on SQLite, the worker, the
gateway, process hosts); bash functions on hosts of 500 Runs.

N Runs (default 10,000) are created through the SDK, IN_FLIGHT (32) at a time, each create
followed by its `wait` for Ready. Reported:

  create → Ready rate of the first and of the last 1,000 Runs (Runs/s over the span from the
     first create to the last Ready among them) and their ratio (target: the last within 1.2× of
     the first), and the create → Ready latency p50 of each;
  `wait` lateness p50/p99/max: for a sample of Runs, the time `wait` returned minus the server's
     time of the task that made the Run Ready (its KrtPhase upsert in the history; target: max
     ≤ 1 s);
  the largest payload in the pool's histories (every run of pool/bash: the input each run
     started with, which is what continue-as-new carried, and the largest event; target: the
     carried input < 256 KB);
  worker and gateway RSS at 0, N/2 and N Ready Runs (target: gateway ≤ 100 MB at N), and the
     worker's at N once more after it was killed and started again by its supervisor (what
     holding N idle Ready Runs costs it, without what the burst that made them left behind);
  `krt run list -A`: the time until its first page is printed (target < 2 s), the process
     started cold as a user would run it;
  a sample of invokes through the gateway (HTTPS, the SDK's invoke): p50/p99;
  CPU milliseconds per Run in the first and in the last 1,000 of the dev server, the worker, the
  gateway, this process (the SDK's creates and waits) and the rest of the machine (the hosts and
  their functions, mostly): on a machine the creates keep busy, a part that costs more per Run
  as Runs accumulate is where the last thousand's lower rate comes from;
  the CPU each of those parts uses per second with N Runs Ready and nothing asked of the
  platform (IDLE_S): work that grows with the Runs held, not with the Runs created;
  the dev server's persistence (its SQLite) per Run in the first and the last 1,000, from its
  own metrics: calls and milliseconds of each operation, the most costly ones named (a
  diagnostic: whether the server's extra CPU per Run comes from more calls or dearer ones).

    .venv/bin/python bench/scale.py [--runs N] [--in-flight 32] [--invokes 200]

Finishes on a 2-core machine within 15 minutes: creating stops MEASURE_RESERVE_S before that
so what was created is measured, and the first row says how many of the N were Ready in time
(lower N with --runs for a quick run). Prints a table and a final JSON line {"bench": "scale", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from _benchlib import CLK_TCK, ROOT, cpu_seconds, embedded_platform, krt_env, percentile
from temporalio.client import WorkflowExecutionStatus

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.contracts.names import pool_workflow_id, run_workflow_id
from kruntimes.sdk.client import Client
from kruntimes.temporal.front import unix_address
from kruntimes.wire import search
from kruntimes.workers.embedded.layout import Layout, recorded_components

RUNTIME = "bash"
HOST_RUNS = 500
WINDOW = 1000  # the first and the last this many Runs are compared
LATENESS_SAMPLES = 300
RATE_TARGET = 1.2
LATE_TARGET_S = 1.0
PAYLOAD_TARGET = 256 * 1024
GATEWAY_RSS_TARGET_MB = 100.0
LIST_TARGET_S = 2.0
DEADLINE_S = 15 * 60
# Creating stops this long before the deadline, so what was created is still measured (the bench
# then says how many of N it reached in time).
MEASURE_RESERVE_S = 150
IDLE_S = 20.0  # the platform left alone with every Run Ready, its CPU measured
RESTART_TIMEOUT_S = 120.0  # the worker killed at N: until it serves again
RESTART_SETTLE_S = 30.0  # then this long before its RSS is read
SCRIPT = "cat\n"  # answers with what it was given


def _run(name: str) -> Run:
    return Run.new(
        name, runtime=RUNTIME, handler="main.sh", inline={"main.sh": SCRIPT}, uid=str(uuid.uuid4()),
        mode={"function": {}},
    )  # fmt: skip


def _rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _rss(state: Path) -> dict[str, float]:
    components = recorded_components(Layout(state))
    rss = {name: round(_rss_mb(components.get(name)), 1) for name in ("worker", "gateway")}
    return {**rss, "cached": _cached_workflows(state)}


def _cached_workflows(state: Path) -> float:
    """How many workflows the worker keeps in Temporal's cache (the SDK's sticky cache, summed
    over its task queues), from its Prometheus endpoint; NaN when it does not answer."""
    text = _metrics(state, "workerMetrics") or ""
    sizes = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("temporal_sticky_cache_size")
    ]
    return sum(sizes) if sizes else float("nan")


CPU_PARTS = ("temporal", "worker", "gateway")


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (every CPU; /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / CLK_TCK  # all but idle and iowait


def _cpu(state: Path) -> dict[str, float]:
    """CPU seconds so far of each component, this process (the SDK's creates and waits) and the
    rest of the machine (the hosts and their functions, mostly)."""
    components = recorded_components(Layout(state))
    used = {name: cpu_seconds(components[name]) if name in components else 0.0 for name in CPU_PARTS}
    used["bench"] = cpu_seconds(os.getpid())
    used["rest"] = _machine_busy_s() - sum(used.values())
    return used


PERSISTENCE_OPS_SHOWN = 4
_METRIC_LINE = re.compile(r'^persistence_(requests|latency_sum)\{[^}]*operation="([^"]+)"[^}]*\} (\S+)$')


def _metrics(state: Path, port_name: str) -> str | None:
    """What the Prometheus endpoint on the platform's port `port_name` says now; None when it
    does not answer."""
    try:
        port = json.loads(Layout(state).ports.read_text())[port_name]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text: str = answer.read().decode()
    except (OSError, ValueError, KeyError):
        return None
    return text


def _dev_server_metrics(state: Path) -> str | None:
    """What the dev server's Prometheus endpoint says now, through its Unix socket (the dev
    server itself is in a network namespace of its own); None when it does not answer."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(unix_address(Layout(state).sockets / "metrics.sock"))
            sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
    except OSError:
        return None
    head, _, body = answer.partition(b"\r\n\r\n")
    return body.decode() if head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0] else None


def _persistence(state: Path) -> dict[str, tuple[float, float]]:
    """The dev server's persistence calls so far, by operation: (calls, seconds), from its
    Prometheus endpoint; empty when it does not answer (the rows are then left out)."""
    text = _dev_server_metrics(state)
    if text is None:
        return {}
    calls: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _METRIC_LINE.match(line)
        if match:
            kind, op, value = match.groups()
            (calls if kind == "requests" else seconds)[op] += float(value)
    return {op: (calls[op], seconds[op]) for op in calls}


def _persistence_per_run(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], runs: int
) -> dict[str, list[float]]:
    """Each operation's calls and milliseconds per Run between two samples."""
    out = {}
    for op, (calls, seconds) in after.items():
        calls0, seconds0 = before.get(op, (0.0, 0.0))
        if calls > calls0:  # operations the window did not call are left out
            per = 1 / max(runs, 1)
            out[op] = [round((calls - calls0) * per, 3), round((seconds - seconds0) * 1000 * per, 3)]
    return out


def _cpu_per_run(before: dict[str, float], after: dict[str, float], runs: int) -> dict[str, float]:
    return {k: round((after[k] - before[k]) * 1000 / max(runs, 1), 2) for k in after}


class Created:
    __slots__ = ("began", "ready", "returned_wall")

    def __init__(self) -> None:
        self.began = self.ready = self.returned_wall = 0.0


async def _create_all(
    client: Client, state: Path, n: int, in_flight: int, stop_at: float
) -> tuple[list[Created], dict[str, Any], dict[str, Any]]:
    created = [Created() for _ in range(n)]
    rss: dict[str, Any] = {"0": _rss(state)}
    window = min(WINDOW, n // 2) or n
    cpu: dict[int, dict[str, float]] = {0: _cpu(state)}  # at these counts of Runs Ready
    persistence: dict[int, dict[str, tuple[float, float]]] = {0: _persistence(state)}
    next_index = 0
    done = 0
    t0 = time.perf_counter()

    async def loop() -> None:
        nonlocal next_index, done
        while next_index < n and time.perf_counter() < stop_at:
            i, next_index = next_index, next_index + 1
            c = created[i]
            c.began = time.perf_counter()
            await client.create(_run(f"scale-{i:05d}"))
            ready = await client.wait(f"scale-{i:05d}", timeout=600)
            c.returned_wall = time.time()
            c.ready = time.perf_counter()
            if ready.status.phase is not RunPhase.Ready:
                raise RuntimeError(f"scale-{i:05d} is {ready.status.phase}")
            done += 1
            if done == n // 2:
                rss["half"] = _rss(state)
            if done in (window, n - window, n):
                cpu[done] = _cpu(state)
                persistence[done] = _persistence(state)
            if done % 500 == 0:
                elapsed = time.perf_counter() - t0
                print(
                    f"  {done} Ready after {elapsed:.0f} s ({done / elapsed:.1f}/s)",
                    file=sys.stderr,
                    flush=True,
                )

    await asyncio.gather(*(loop() for _ in range(in_flight)))
    rss["n"] = _rss(state)
    per_run: dict[str, Any] = {}  # empty when creating stopped before N
    if n in cpu and n - window in cpu and window in cpu:
        per_run = {
            "first": _cpu_per_run(cpu[0], cpu[window], window),
            "last": _cpu_per_run(cpu[n - window], cpu[n], window),
        }
        if all(persistence.get(k) for k in (0, window, n - window, n)):
            per_run["persistence"] = {
                "first": _persistence_per_run(persistence[0], persistence[window], window),
                "last": _persistence_per_run(persistence[n - window], persistence[n], window),
            }
    return created[:next_index], rss, per_run  # every one started is Ready (or the bench failed)


def _rate(window: list[Created]) -> float:
    span = max(c.ready for c in window) - min(c.began for c in window)
    return len(window) / span if span > 0 else float("inf")


async def _ready_at(temporal: Any, name: str) -> float | None:
    handle = temporal.get_workflow_handle(run_workflow_id("default", name))
    async for event in handle.fetch_history_events():
        attrs = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        if search.PHASE in attrs:
            value = json.loads(attrs[search.PHASE].data)
            if (value[0] if isinstance(value, list) else value) == RunPhase.Ready.value:
                return float(event.event_time.ToMicroseconds()) / 1e6
    return None


async def _lateness(client: Client, created: list[Created]) -> list[float]:
    temporal = await client.temporal()
    step = max(1, len(created) // LATENESS_SAMPLES)
    picked = list(range(0, len(created), step))
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> float | None:
        async with gate:
            at = await _ready_at(temporal, f"scale-{i:05d}")
        return None if at is None else created[i].returned_wall - at

    found = await asyncio.gather(*(one(i) for i in picked))
    return [x for x in found if x is not None]


async def _pool_payloads(client: Client) -> dict[str, Any]:
    temporal = await client.temporal()
    carried: list[int] = []
    largest, largest_type = 0, ""
    runs = 0
    histories: list[int] = []  # each run's whole history: what a worker replays to take it up
    current = 0
    async for execution in temporal.list_workflows(f"WorkflowId = '{pool_workflow_id(RUNTIME)}'"):
        runs += 1
        handle = temporal.get_workflow_handle(execution.id, run_id=execution.run_id)
        histories.append(0)
        async for event in handle.fetch_history_events():
            size = event.ByteSize()
            histories[-1] += size
            if event.HasField("workflow_execution_started_event_attributes"):
                carried.append(event.workflow_execution_started_event_attributes.input.ByteSize())
            if size > largest:
                largest, largest_type = size, event.WhichOneof("attributes") or ""
        if execution.status == WorkflowExecutionStatus.RUNNING:
            current = histories[-1]
    return {
        "runs": runs,
        "largest_history_bytes": max(histories, default=0),
        "current_history_bytes": current,
        "largest_carried_bytes": max(carried, default=0),
        "largest_event_bytes": largest,
        "largest_event": largest_type.removesuffix("_event_attributes"),
    }


def _list_first_page(state: Path) -> float:
    """Seconds from starting `krt run list -A` until its first page is printed (then stopped)."""
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "kruntimes.workers.krt", "run", "list", "-A"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=krt_env(state), cwd=ROOT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        for lines, _ in enumerate(process.stdout, start=1):
            if lines >= 2:  # the header and a first row
                return time.perf_counter() - began
        return float("nan")
    finally:
        process.kill()  # the process this bench started
        process.wait()


async def _invokes(client: Client, n_runs: int, count: int) -> list[float]:
    latencies = []
    step = max(1, n_runs // max(count, 1))
    for i in range(0, n_runs, step)[:count]:
        began = time.perf_counter()
        answer = await client.invoke(f"scale-{i:05d}", {"i": i})
        if not answer.ok:
            raise RuntimeError(f"invoke of scale-{i:05d} failed: {answer}")
        latencies.append(time.perf_counter() - began)
    return latencies


async def _restarted_worker(client: Client, state: Path) -> dict[str, float]:
    """`_rss` of a worker holding the N Ready Runs without the burst that made them: the worker is
    killed (SIGKILL, by the pid the platform recorded) and its supervisor starts it again; once
    a new Run is Ready through it and RESTART_SETTLE_S more have passed (its hosts' and pools'
    workflows replayed, a reconcile round), what it holds is what N idle Ready Runs cost it."""
    layout = Layout(state)
    old = recorded_components(layout).get("worker")
    if old is None:
        return _rss(state)  # no worker to restart: NaN
    os.kill(old, signal.SIGKILL)
    async with asyncio.timeout(RESTART_TIMEOUT_S):
        while recorded_components(layout).get("worker") in (None, old):
            await asyncio.sleep(0.2)
        name = f"scale-restarted-{uuid.uuid4().hex[:6]}"
        await client.create(_run(name))
        await client.wait(name, timeout=RESTART_TIMEOUT_S)
    await asyncio.sleep(RESTART_SETTLE_S)
    return _rss(state)


async def bench(n: int, in_flight: int, invokes: int, began: float) -> dict[str, Any]:
    hosts = math.ceil(n / HOST_RUNS) + 1
    runtimes = (
        f"runtimes:\n  - {{name: {RUNTIME}, adapter: bash, runs: {HOST_RUNS}, minHosts: 1, "
        f"maxHosts: {hosts}}}\n"
    )
    async with (
        embedded_platform(prefix="krt-bench-scale-", runtimes=runtimes) as (state, config),
        Client(config) as client,
    ):
        t0 = time.perf_counter()
        stop_at = began + DEADLINE_S - MEASURE_RESERVE_S
        created, rss, cpu_per_run = await _create_all(client, state, n, in_flight, stop_at)
        create_s = time.perf_counter() - t0
        before, idle_began = _cpu(state), time.perf_counter()
        await asyncio.sleep(IDLE_S)
        idle = _cpu(state)
        idle_s = time.perf_counter() - idle_began
        idle_cpu = {k: round((idle[k] - before[k]) / idle_s, 3) for k in idle}
        ready = len(created)
        window = min(WINDOW, ready // 2) or ready
        first, last = created[:window], created[-window:]
        lateness = await _lateness(client, created)
        payloads = await _pool_payloads(client)
        list_s = await asyncio.to_thread(_list_first_page, state)
        invoke_s = await _invokes(client, ready, invokes)
        rss["after"] = _rss(state)
        rss["restarted"] = await _restarted_worker(client, state)
    first_rate, last_rate = _rate(first), _rate(last)
    latency = [c.ready - c.began for c in created]
    return {
        "runs": n,
        "ready": ready,
        "in_flight": in_flight,
        "create_s": round(create_s, 1),
        "window": window,
        "first_rate": round(first_rate, 2),
        "last_rate": round(last_rate, 2),
        "rate_ratio": round(first_rate / last_rate, 3),
        "first_p50_s": round(percentile([c.ready - c.began for c in first], 50), 3),
        "last_p50_s": round(percentile([c.ready - c.began for c in last], 50), 3),
        "ready_p99_s": round(percentile(latency, 99), 3),
        "wait_late_p50_s": round(percentile(lateness, 50), 3),
        "wait_late_p99_s": round(percentile(lateness, 99), 3),
        "wait_late_max_s": round(max(lateness), 3),
        "wait_late_n": len(lateness),
        "pool": payloads,
        "rss_mb": rss,
        "cpu_ms_per_run": cpu_per_run,
        "idle_cpu_per_s": idle_cpu,
        "list_first_page_s": round(list_s, 3),
        "invoke_p50_ms": round(percentile(invoke_s, 50) * 1000, 1),
        "invoke_p99_ms": round(percentile(invoke_s, 99) * 1000, 1),
        "invokes": len(invoke_s),
    }


def rows(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    rss = r["rss_mb"]
    return [
        (
            f"Runs Ready before creating stopped ({DEADLINE_S - MEASURE_RESERVE_S} s)",
            f"{r['ready']} of {r['runs']}",
            f"all {r['runs']}",
            r["ready"] == r["runs"],
        ),
        (
            f"create→Ready rate, first/last {r['window']}",
            f"{r['first_rate']}/s / {r['last_rate']}/s = {r['rate_ratio']}×",
            f"≤ {RATE_TARGET}×",
            r["rate_ratio"] <= RATE_TARGET,
        ),
        ("create→Ready p50, first/last", f"{r['first_p50_s']} s / {r['last_p50_s']} s", "", None),
        (
            f"wait lateness p50/p99/max (n={r['wait_late_n']})",
            f"{r['wait_late_p50_s']} / {r['wait_late_p99_s']} / {r['wait_late_max_s']} s",
            f"max ≤ {LATE_TARGET_S:g} s",
            r["wait_late_max_s"] <= LATE_TARGET_S,
        ),
        (
            f"pool: largest carried input ({r['pool']['runs']} runs)",
            f"{r['pool']['largest_carried_bytes'] / 1024:.1f} KB",
            "< 256 KB",
            r["pool"]["largest_carried_bytes"] < PAYLOAD_TARGET,
        ),
        (
            "pool: largest history of a run / the running one's",
            f"{r['pool']['largest_history_bytes'] / 1e6:.1f} / "
            f"{r['pool']['current_history_bytes'] / 1e6:.1f} MB",
            "",
            None,
        ),
        (
            "pool: largest event",
            f"{r['pool']['largest_event_bytes'] / 1024:.1f} KB ({r['pool']['largest_event']})",
            "< 256 KB",
            r["pool"]["largest_event_bytes"] < PAYLOAD_TARGET,
        ),
        (
            "worker RSS at 0 / N/2 / N",
            f"{rss['0']['worker']} / {rss.get('half', {}).get('worker')} / {rss['n']['worker']} MB",
            "",
            None,
        ),
        (
            "worker RSS at N after a restart (N idle Ready Runs, no burst)",
            f"{rss.get('restarted', {}).get('worker')} MB",
            "",
            None,
        ),
        (
            "workflows in the worker's cache at 0 / N / N after the restart",
            f"{rss['0'].get('cached')} / {rss['n'].get('cached')} / {rss.get('restarted', {}).get('cached')}",
            "",
            None,
        ),
        (
            "gateway RSS at 0 / N/2 / N",
            f"{rss['0']['gateway']} / {rss.get('half', {}).get('gateway')} / {rss['n']['gateway']} MB",
            f"≤ {GATEWAY_RSS_TARGET_MB:g} MB",
            rss["n"]["gateway"] <= GATEWAY_RSS_TARGET_MB,
        ),
        (
            "krt run list -A: first page",
            f"{r['list_first_page_s']} s",
            f"< {LIST_TARGET_S:g} s",
            r["list_first_page_s"] < LIST_TARGET_S,
        ),
        (f"invoke p50/p99 (n={r['invokes']})", f"{r['invoke_p50_ms']} / {r['invoke_p99_ms']} ms", "", None),
        *(
            (
                f"CPU ms per Run, first/last {r['window']}: {part}",
                f"{first} / {last}" + (f" = {last / first:.2f}×" if first > 0 else ""),
                "",
                None,
            )
            for part, first, last in _cpu_rows(r["cpu_ms_per_run"])
        ),
        *_idle_row(r["idle_cpu_per_s"]),
        *_persistence_rows(r["cpu_ms_per_run"].get("persistence"), r["window"]),
    ]


def _persistence_rows(per_run: dict[str, Any] | None, window: int) -> list[tuple[str, str, str, bool | None]]:
    """The server's persistence per Run, first and last window: in all, then the operations that
    cost the most in the last (calls per Run, and mean milliseconds a call)."""
    if not per_run:
        return []
    first, last = per_run["first"], per_run["last"]

    def total(side: dict[str, list[float]], i: int) -> float:
        return round(sum(v[i] for v in side.values()), 2)

    out: list[tuple[str, str, str, bool | None]] = [
        (
            f"server persistence per Run, first/last {window}",
            f"{total(first, 0)} / {total(last, 0)} calls, {total(first, 1)} / {total(last, 1)} ms",
            "",
            None,
        )
    ]
    for op in sorted(last, key=lambda o: -last[o][1])[:PERSISTENCE_OPS_SHOWN]:
        (c0, ms0), (c1, ms1) = first.get(op, [0.0, 0.0]), last[op]
        mean0, mean1 = (ms0 / c0 if c0 else 0.0), (ms1 / c1 if c1 else 0.0)
        out.append((f"  {op}", f"{c0} / {c1} a Run, {mean0:.2f} / {mean1:.2f} ms a call", "", None))
    return out


def _idle_row(idle: dict[str, float]) -> list[tuple[str, str, str, bool | None]]:
    parts = ", ".join(f"{k} {v:.3f}" for k, v in idle.items())
    return [(f"idle at N for {IDLE_S:g} s: CPU s/s", f"{sum(idle.values()):.3f} ({parts})", "", None)]


def _cpu_rows(per_run: dict[str, Any]) -> list[tuple[str, float, float]]:
    """Where the last window's extra time went: each part's CPU per Run, first and last window
    (none when creating stopped before N)."""
    if not per_run:
        return []
    return [(part, per_run["first"][part], per_run["last"][part]) for part in per_run["first"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="Runs to create (default 10,000)")
    parser.add_argument("--in-flight", type=int, default=32, help="creates (each with its wait) at a time")
    parser.add_argument("--invokes", type=int, default=200, help="invokes through the gateway at the end")
    args = parser.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    result = asyncio.run(asyncio.wait_for(bench(args.runs, args.in_flight, args.invokes, t0), DEADLINE_S))
    width = max(len(name) for name, *_ in rows(result))
    for name, value, target, met in rows(result):
        verdict = "" if met is None else ("met" if met else "NOT MET")
        print(f"{name.ljust(width)}  {value:<40} {target:<12} {verdict}")
    load1 = os.getloadavg()[0]
    print(f"load average (1 min) at start {load0:.2f}, at end {load1:.2f} on {os.cpu_count()} CPUs")
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg"] = [round(load0, 2), round(load1, 2)]
    print(json.dumps({"bench": "scale", **result}))


if __name__ == "__main__":
    main()
