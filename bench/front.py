"""Benchmark: what the embedded platform's front adds to a Temporal call.

    .venv/bin/python bench/front.py [--calls 2000] [--seconds 3]

Two dev servers as `krt up` runs them (SQLite file, its throughput settings): one bare on
127.0.0.1, and one as the platform has it — in a network namespace of its own behind its Unix
sockets (python -m kruntimes.workers.embedded.hidden_temporal), reached through the front's
mutual TLS (python -m kruntimes.workers.temporal_front), each forwarder a process of its own. One
SDK client each, from this process: sequential calls (p50/p99) and 32 concurrent callers for
--seconds (calls/s), in interleaved rounds so background load hits both alike. The call is
GetSystemInfo (the frontend answers it without the database: the front's share is all there is to
see) and DescribeNamespace (one database read). Temporal is not on the invoke path
(bench/invoke.py), only on the control plane's. The dev server limits its frontend's calls per
second (RESOURCE_EXHAUSTED, not counted), so the 32-way figures of both paths may meet that
limit. Needs root or unprivileged user namespaces (the dev server's namespace); prints a table
and a final JSON line {"bench": "front", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import _benchlib as lib
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.pki.local import ensure_front_tls
from kruntimes.temporal.codec import ensure_key
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer, free_port
from kruntimes.workers.embedded import supervise
from kruntimes.workers.embedded.layout import Layout, admin_token, ensure_login_key, make_root

ROUNDS = 10
CONCURRENCY = 32
READY_TIMEOUT_S = 90.0


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)


def _wait(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise lib.BenchError(f"{proc.args!r} did not get ready")
        time.sleep(0.05)


def _start_fronted(layout: Layout) -> tuple[list[subprocess.Popen[bytes]], TemporalSettings]:
    """The dev server and its front as `krt up` starts them, on ports picked now."""
    make_root(layout)
    layout.temporal.mkdir(exist_ok=True)
    front = ensure_front_tls(layout.front)
    ensure_login_key(layout)
    ensure_key(layout.codec_keys)
    admin_token(layout)
    ports = {"temporal": free_port(), "temporalUi": free_port()}
    hidden = _spawn(supervise._hidden_temporal_argv(layout, ports=ports), layout.log("temporal"))
    fronted = _spawn(supervise._front_argv(layout, ports=ports, front=front), layout.log("front"))
    _wait(layout.temporal_ready, hidden)
    _wait(layout.front_ready, fronted)
    if json.loads(layout.temporal_ready.read_text())["mode"] == "exposed":
        lib.note("the dev server could not be hidden here: this measures the front alone")
    return [hidden, fronted], supervise.temporal_settings(layout, ports, front)


async def _sequential(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        took.append(time.perf_counter() - started)
    return took


async def _concurrent(call: Callable[[], Awaitable[object]], seconds: float) -> int:
    """Calls answered by CONCURRENCY callers in `seconds` (those the dev server's own rate limit
    refuses are not counted: it limits both paths alike)."""
    done = 0
    deadline = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            try:
                await call()
                done += 1
            except RPCError as e:
                if e.status != RPCStatusCode.RESOURCE_EXHAUSTED:
                    raise
                await asyncio.sleep(0.01)

    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    return done


def _calls(client: Client) -> dict[str, Callable[[], Awaitable[object]]]:
    service = client.workflow_service
    return {
        "GetSystemInfo": lambda: service.get_system_info(GetSystemInfoRequest()),
        "DescribeNamespace": lambda: service.describe_namespace(
            DescribeNamespaceRequest(namespace="default")
        ),
    }


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    bare = DevServer(state_dir=tmp / "bare", persistent=True, log_file=tmp / "bare.log")
    await asyncio.to_thread(bare.start)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs, settings = await asyncio.to_thread(_start_fronted, Layout(tmp / "state"))
        clients = {"direct": await connect(bare.address), "front": await connect(settings)}
        calls = {path: _calls(client) for path, client in clients.items()}
        for path in calls:  # warm-up: connections made, caches filled
            for call in calls[path].values():
                await _sequential(call, 100)
        seq: dict[tuple[str, str], list[float]] = {}
        rate: dict[tuple[str, str], int] = {}
        for _ in range(ROUNDS):
            for name in ("GetSystemInfo", "DescribeNamespace"):
                for path in calls:
                    key = (path, name)
                    seq.setdefault(key, []).extend(await _sequential(calls[path][name], args.calls // ROUNDS))
                    rate[key] = rate.get(key, 0) + await _concurrent(calls[path][name], args.seconds / ROUNDS)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        bare.stop()
    result: dict[str, object] = {}
    print(f"{'call':<18} {'path':<7} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9}")
    for (path, name), took in sorted(seq.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p50, p99 = lib.percentile(took, 50), lib.percentile(took, 99)
        per_s = rate[(path, name)] / args.seconds
        print(f"{name:<18} {path:<7} {lib.ms(p50):>8.3f} {lib.ms(p99):>8.3f} {per_s:>9.0f}")
        result[f"{name}.{path}"] = {"p50_ms": lib.ms(p50), "p99_ms": lib.ms(p99), "per_s": round(per_s)}
    for name in ("GetSystemInfo", "DescribeNamespace"):
        added = lib.percentile(seq[("front", name)], 50) - lib.percentile(seq[("direct", name)], 50)
        print(f"{name}: the front adds {lib.ms(added):.3f} ms to the p50")
        result[f"{name}.added_p50_ms"] = lib.ms(added)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls per path and call")
    parser.add_argument("--seconds", type=float, default=3.0, help="32-way load per path and call")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="krt-bench-front-"))
    try:
        result = asyncio.run(run(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"bench": "front", "python": sys.version.split()[0], "pid": os.getpid(), **result}))


if __name__ == "__main__":
    main()
