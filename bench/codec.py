"""Benchmark: what the payload codec (AES-256-GCM, kruntimes/temporal/codec.py) costs on warm create → Ready.

    .venv/bin/python bench/codec.py [--runs N]

Two sets of workers in this process on one Temporal dev server (SQLite file, its throughput
settings, as the embedded platform runs it): one whose client encrypts every payload and one
whose client does not, each with its own task queues and a runtime with one warm host. Runs are
created as the SDK creates them (kruntimes.sdk.starting.start_run), alternating between the two, one
at a time (create → Ready measured as bench/lifecycle.py measures it: until the Run's history
records the task that made it Ready), so background load hits both alike. Target: the codec's
p50 ≤ 1.1× the plain p50.

Prints both, the ratio and a final JSON line {"bench": "codec", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _benchlib as lib
from _pki import BenchPKI
from lifecycle import create_until_ready, run_manifest, wait_hosts, wait_terminal

from kruntimes.activities.hosts.process import stop_all
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.names import SIGNAL_CANCEL
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.temporal.codec import ensure_key
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.assembly import running_workers
from kruntimes.workers.settings import WorkerSettings

TARGET = 1.1
WARMUP = 4
BENCH_TIMEOUT_S = 600.0


def _settings(
    server: DevServer, state: Path, runtime: str, queue: str, codec_keys: Path | None, pki: BenchPKI
) -> WorkerSettings:
    return WorkerSettings(
        temporal=TemporalSettings(address=server.address, codecKeys=str(codec_keys) if codec_keys else None),
        config=parse_config(
            {"runtimes": [{"name": runtime, "adapter": "python", "minHosts": 1, "maxHosts": 1}]}
        ),
        platform=PlatformInfo(gatewayUrl="https://127.0.0.1:8443", stateDir=str(state)),
        trust=pki.worker_trust(),
        run_task_queue=queue,
        pool_task_queue=f"{queue}-pool",
    )


async def bench(server: DevServer, tmp: Path, runs: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    keys = ensure_key(tmp / "codec-keys")
    plain = await connect(server.address)
    sealed = await connect(TemporalSettings(address=server.address, codecKeys=str(keys)))
    sides = {
        "plain": (plain, f"plain-{tag}", f"krt-plain-{tag}"),
        "codec": (sealed, f"codec-{tag}", f"krt-codec-{tag}"),
    }
    latencies: dict[str, list[float]] = {name: [] for name in sides}
    state = tmp / "state"
    pki = BenchPKI(tmp / "pki")
    async with (
        running_workers(plain, _settings(server, state, sides["plain"][1], sides["plain"][2], None, pki)),
        running_workers(sealed, _settings(server, state, sides["codec"][1], sides["codec"][2], keys, pki)),
    ):
        lib.note("waiting for the warm hosts ...")
        await asyncio.gather(*(wait_hosts(client, runtime, 1) for client, runtime, _ in sides.values()))
        lib.note(f"{runs} Runs each after {WARMUP} warm-up, alternating ...")
        for i in range(WARMUP + runs):
            for name, (client, runtime, queue) in sides.items():
                created = await create_until_ready(
                    client, run_manifest(f"{name}-{tag}-{i}", runtime), task_queue=queue
                )
                await created.handle.signal(SIGNAL_CANCEL)
                await wait_terminal(created.handle)
                if i >= WARMUP:
                    latencies[name].append(created.latency_s)
    p50 = {name: lib.percentile(values, 50) for name, values in latencies.items()}
    p99 = {name: lib.percentile(values, 99) for name, values in latencies.items()}
    ratio = p50["codec"] / p50["plain"]
    print(f"\nwarm create→Ready, {runs} Runs each, alternating (codec: AES-256-GCM on every payload)")
    for name in sides:
        print(f"  {name:<6} p50 {p50[name] * 1000:.1f} ms, p99 {p99[name] * 1000:.1f} ms")
    verdict = "met" if ratio <= TARGET else "not met"
    print(f"  codec p50 / plain p50 = {ratio:.3f}× (target ≤ {TARGET}×: {verdict})")
    return {
        "bench": "codec",
        "runs": runs,
        "plain_p50_ms": round(p50["plain"] * 1000, 2),
        "codec_p50_ms": round(p50["codec"] * 1000, 2),
        "plain_p99_ms": round(p99["plain"] * 1000, 2),
        "codec_p99_ms": round(p99["codec"] * 1000, 2),
        "ratio_p50": round(ratio, 3),
        "target": TARGET,
        "met": ratio <= TARGET,
    }


async def main_async(runs: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="krt-bench-codec-"))
    server = DevServer(state_dir=tmp / "temporal", persistent=True)
    try:
        server.start()
        try:
            return await asyncio.wait_for(bench(server, tmp, runs), BENCH_TIMEOUT_S)
        finally:
            await stop_all(tmp / "state")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="Runs per side (after the warm-up)")
    args = parser.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    result = asyncio.run(main_async(args.runs))
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(result))
    os._exit(0)  # the Temporal client's threads can abort interpreter teardown (sdk-python#300)


if __name__ == "__main__":
    main()
