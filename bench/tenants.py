"""Benchmark: two tenants on one runtime, one bursting: each tenant's create → Ready.

    .venv/bin/python bench/tenants.py [--burst 48] [--steady 8] [--every 0.25]

As bench/lifecycle.py runs it: the Temporal dev server (SQLite), the real worker in this process,
process hosts on 127.0.0.1, Runs started as the SDK starts them, create → Ready read from each
Run's history (long-polled). Each runtime has 2 warm hosts × 4 slots; every Run is cancelled as
soon as it is Ready, so slots free and the queue moves.

  1. one tenant: `steady` creates --steady Runs, one every --every seconds, alone on its runtime;
  2. one tenant: `burst` creates --burst Runs at once (16 starts in flight), alone on another;
  3. two tenants, on a third runtime: `burst` creates its Runs as in 2, and right after them
     `steady` creates its Runs as in 1.

A runtime's queue is placed in fair order across tenants (kruntimes.decisions.scheduling.admission
.fair_order): a freed slot goes to the tenant holding the fewest slots for its share, so steady's
Runs should not wait behind burst's backlog. Printed: each tenant's p50 and max create → Ready in
each round, and each tenant's ratio two-tenant / one-tenant; then a JSON line {"bench": "tenants", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _benchlib  # noqa: F401 - puts the repository root on sys.path
from _benchlib import percentile, ratio
from _pki import BenchPKI
from lifecycle import ready_in_history, wait_hosts
from temporalio.client import Client

from kruntimes.activities.hosts.process import stop_all
from kruntimes.api.run import Run
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.names import SIGNAL_CANCEL
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.sdk.starting import start_run
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.assembly import running_workers
from kruntimes.workers.settings import WorkerSettings

HOSTS, RUNS_PER_HOST = 2, 4
STARTS_IN_FLIGHT = 16
READY_TIMEOUT_S = 120.0
BENCH_TIMEOUT_S = 600.0
ECHO = "def handle(p):\n    return {'echo': p}\n"


def manifest(name: str, runtime: str, tenant: str) -> Run:
    return Run.new(
        name,
        runtime=runtime,
        handler="main:handle",
        inline={"main.py": ECHO},
        uid=str(uuid.uuid4()),
        tenant=tenant,
    )


async def create_ready_cancel(client: Client, run: Run, starts: asyncio.Semaphore) -> float:
    """create → Ready in seconds; the Run is cancelled once Ready (not timed)."""
    async with starts:
        t0 = time.perf_counter()
        handle = await start_run(client, run)
    ready = await asyncio.wait_for(ready_in_history(handle), READY_TIMEOUT_S)
    await handle.signal(SIGNAL_CANCEL)
    return ready - t0


async def steady_runs(client: Client, runtime: str, tag: str, n: int, every: float) -> list[float]:
    starts = asyncio.Semaphore(STARTS_IN_FLIGHT)
    tasks = []
    for i in range(n):
        run = manifest(f"steady-{tag}-{i}", runtime, "steady")
        tasks.append(asyncio.create_task(create_ready_cancel(client, run, starts)))
        await asyncio.sleep(every)
    return list(await asyncio.gather(*tasks))


def burst_runs(client: Client, runtime: str, tag: str, n: int) -> list[asyncio.Task[float]]:
    starts = asyncio.Semaphore(STARTS_IN_FLIGHT)
    return [
        asyncio.create_task(
            create_ready_cancel(client, manifest(f"burst-{tag}-{i}", runtime, "burst"), starts)
        )
        for i in range(n)
    ]


async def two_tenants(
    client: Client, runtime: str, tag: str, burst: int, steady: int, every: float
) -> tuple[list[float], list[float]]:
    bursting = burst_runs(client, runtime, tag, burst)
    await asyncio.sleep(0)  # the burst's starts go first
    steadies = await steady_runs(client, runtime, tag + "-2", steady, every)
    return list(await asyncio.gather(*bursting)), steadies


def stats(values: list[float]) -> dict[str, float]:
    return {"p50_s": round(percentile(values, 50), 3), "max_s": round(max(values), 3), "n": len(values)}


async def bench(server: DevServer, state: Path, pki: BenchPKI, args: argparse.Namespace) -> dict[str, Any]:
    client = await connect(server.address, "default")
    tag = uuid.uuid4().hex[:6]
    alone_rt, burst_rt, shared_rt = f"alone-{tag}", f"burst-{tag}", f"shared-{tag}"
    runtime = {"adapter": "python", "runs": RUNS_PER_HOST, "minHosts": HOSTS, "maxHosts": HOSTS}
    config = parse_config(
        {
            "runtimes": [{"name": name, **runtime} for name in (alone_rt, burst_rt, shared_rt)],
            "tenants": [{"name": "burst"}, {"name": "steady"}],
        }
    )
    settings = WorkerSettings(
        temporal=TemporalSettings(address=server.address, namespace="default"),
        config=config,
        platform=PlatformInfo(gatewayUrl="https://127.0.0.1:8443", stateDir=str(state)),
        trust=pki.worker_trust(),
    )
    async with running_workers(client, settings):
        await asyncio.gather(*(wait_hosts(client, rt, HOSTS) for rt in (alone_rt, burst_rt, shared_rt)))
        print("[one tenant: steady] ...", flush=True)
        alone = await steady_runs(client, alone_rt, tag, args.steady, args.every)
        print("[one tenant: burst] ...", flush=True)
        burst_alone = list(await asyncio.gather(*burst_runs(client, burst_rt, tag + "-1", args.burst)))
        print("[two tenants] ...", flush=True)
        bursting, beside = await two_tenants(client, shared_rt, tag, args.burst, args.steady, args.every)
    result = {
        "one_tenant_steady": stats(alone),
        "one_tenant_burst": stats(burst_alone),
        "two_tenants_burst": stats(bursting),
        "two_tenants_steady": stats(beside),
        "steady_p50_ratio": round(ratio(percentile(beside, 50), percentile(alone, 50)), 2),
        "steady_max_ratio": round(ratio(max(beside), max(alone)), 2),
        "burst_p50_ratio": round(ratio(percentile(bursting, 50), percentile(burst_alone, 50)), 2),
        "burst_max_ratio": round(ratio(max(bursting), max(burst_alone)), 2),
        "slots": HOSTS * RUNS_PER_HOST,
        "burst": args.burst,
        "steady": args.steady,
        "every_s": args.every,
    }
    return result


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="krt-bench-tenants-"))
    state = tmp / "state"
    server = DevServer(state_dir=tmp / "temporal", persistent=True)
    try:
        server.start()
        try:
            return await asyncio.wait_for(bench(server, state, BenchPKI(tmp / "pki"), args), BENCH_TIMEOUT_S)
        finally:
            await stop_all(state)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=48, help="Runs the bursting tenant creates at once")
    parser.add_argument("--steady", type=int, default=8, help="Runs the other tenant creates, spaced")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between the other tenant's Runs")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    rows = [
        ("one tenant: steady", result["one_tenant_steady"]),
        ("one tenant: burst", result["one_tenant_burst"]),
        ("two tenants: burst", result["two_tenants_burst"]),
        ("two tenants: steady", result["two_tenants_steady"]),
    ]
    print(f"{'create → Ready':<24}{'n':>4}{'p50 s':>9}{'max s':>9}")
    for name, s in rows:
        print(f"{name:<24}{s['n']:>4}{s['p50_s']:>9.3f}{s['max_s']:>9.3f}")
    p50, top = result["steady_p50_ratio"], result["steady_max_ratio"]
    print(f"steady two-tenant / one-tenant: p50 {p50}×, max {top}×")
    print(
        f"burst two-tenant / one-tenant: p50 {result['burst_p50_ratio']}×, max {result['burst_max_ratio']}×"
    )
    print(json.dumps({"bench": "tenants", **result}))


if __name__ == "__main__":
    main()
