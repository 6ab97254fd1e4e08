"""The fault benches of bench/lifecycle.py, on the embedded platform (`krt up --detach` in a fresh
state dir: the dev server on SQLite, the worker, the gateway, process hosts, its supervisor):

  host SIGKILL → 200 again: Runs Ready on a host (a second warm host beside it); the host is
     SIGKILLed; for each of its Runs the time until an invocation at its (unchanged) URL answers
     200 again, polling every 20 ms. HOST_ROUNDS rounds, each once the pool is back to its warm
     hosts. Target: p50 ≤ 5 s.
  worker SIGKILL → Ready: the worker is SIGKILLed and WORKER_RUNS Runs are created at once (the
     platform's supervisor starts the worker again after its backoff); for each Run the time from
     the new worker's start (its pid recorded by the supervisor) until its status is Ready.
     WORKER_ROUNDS rounds. Target: every Run Ready ≤ 10 s after the restart.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from _benchlib import embedded_platform, percentile

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.contracts.names import pool_workflow_id
from kruntimes.contracts.pool import PoolState
from kruntimes.decisions.scheduling.model import HostState
from kruntimes.sdk import config as clientconfig
from kruntimes.sdk.client import Client
from kruntimes.temporal.connect import connect, query_pool
from kruntimes.workers.embedded.layout import Layout, recorded_components

HOST_ROUNDS, HOST_RUNS = 5, 6
WORKER_ROUNDS, WORKER_RUNS = 3, 5
POLL_S = 0.02
BOUND_S = 60.0
HOST_TARGET_S = 5.0
WORKER_TARGET_S = 10.0
ECHO = "def handle(p):\n    return {'echo': p}\n"
RUNTIMES = """\
runtimes:
  - {name: python, adapter: python, runs: 10, minHosts: 2, maxHosts: 4}
"""


def _run(name: str) -> Run:
    return Run.new(
        name, runtime="python", handler="main:handle", inline={"main.py": ECHO}, uid=str(uuid.uuid4()),
        mode={"function": {}},
    )  # fmt: skip


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"still waiting for {what}")
        await asyncio.sleep(0.05)


class _Platform:
    def __init__(self, state: Path, config: clientconfig.ClientConfig, client: Client) -> None:
        self.state, self.config, self.client = state, config, client

    async def pool(self) -> PoolState:
        temporal = await self.client.temporal()
        return await query_pool(temporal, pool_workflow_id("python"))

    async def warm(self) -> bool:
        pool = await self.pool()
        return sum(1 for h in pool.hosts if h.state is HostState.Ready) >= 2

    def components(self) -> dict[str, int]:
        return recorded_components(Layout(self.state))


async def _host_rounds(p: _Platform, session: aiohttp.ClientSession) -> list[float]:
    names = [f"victim-{i}" for i in range(HOST_RUNS)]
    urls = {}
    for name in names:
        await p.client.create(_run(name))
    for name in names:
        ready = await p.client.wait(name, timeout=BOUND_S)
        assert ready.status.endpoint is not None
        urls[name] = ready.status.endpoint.url
    headers = {"Authorization": f"Bearer {p.config.token}"}

    async def answers(name: str) -> bool:
        try:
            async with session.post(urls[name], data=b"{}", headers=headers) as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    latencies: list[float] = []
    for _ in range(HOST_ROUNDS):
        await _until(p.warm, "two Ready hosts")
        await _until(lambda: _all_ready(p, names), "every Run Ready")
        pool = await p.pool()
        uid, _ = Counter(r.hostUid for r in pool.reservations).most_common(1)[0]
        on_it = [r.runUid for r in pool.reservations if r.hostUid == uid]
        victims = [n for n in names if (await p.client.status(n)).assignedHostUID == uid]
        assert len(victims) == len(on_it)
        record = next(r for r in _records(p.state) if r.hostUid == uid)
        killed = time.perf_counter()
        os.kill(record.pid, signal.SIGKILL)  # a host this bench's platform started

        latencies += await asyncio.gather(*(_back(n, answers, killed) for n in victims))
    return latencies


async def _back(name: str, answers: Any, killed: float) -> float:
    """Seconds from the kill until `name` answers 200 again."""
    deadline = killed + BOUND_S
    while not await answers(name):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{name} never answered 200 again")
        await asyncio.sleep(POLL_S)
    return time.perf_counter() - killed


async def _all_ready(p: _Platform, names: list[str]) -> bool:
    for name in names:
        if (await p.client.status(name)).phase is not RunPhase.Ready:
            return False
    return True


async def _replaced(p: _Platform, worker: int) -> bool:
    return p.components().get("worker", worker) != worker


def _records(state: Path) -> list[Any]:
    from kruntimes.activities.hosts.process import list_records

    return list_records(state)


async def _worker_rounds(p: _Platform) -> tuple[list[float], list[float]]:
    """(Ready after the worker's restart, Ready after the kill) of every Run created meanwhile."""
    after_restart: list[float] = []
    after_kill: list[float] = []
    for r in range(WORKER_ROUNDS):
        await _until(p.warm, "two Ready hosts")
        worker = p.components()["worker"]
        killed = time.perf_counter()
        os.kill(worker, signal.SIGKILL)  # this bench's platform's worker
        names = [f"outage-{r}-{i}" for i in range(WORKER_RUNS)]
        await asyncio.gather(*(p.client.create(_run(n)) for n in names))
        await _until(lambda worker=worker: _replaced(p, worker), "the worker started again")
        restarted = time.perf_counter()

        async def ready(name: str) -> float:
            await p.client.wait(name, timeout=BOUND_S, interval=POLL_S)
            return time.perf_counter()

        for at in await asyncio.gather(*(ready(n) for n in names)):
            after_restart.append(at - restarted)
            after_kill.append(at - killed)
        await asyncio.gather(*(p.client.delete(n) for n in names))
    return after_restart, after_kill


async def fault_benches() -> dict[str, Any]:
    async with (
        embedded_platform(prefix="krt-bench-faults-", runtimes=RUNTIMES) as (state, config),
        Client(config) as client,
    ):
        await connect(config.temporal_settings())  # reachable before anything is timed
        platform = _Platform(state, config, client)
        context = ssl.create_default_context(cafile=config.caFile)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=10)
        ) as session:
            host = await _host_rounds(platform, session)
        restart, kill = await _worker_rounds(platform)
    return {
        "host_kill_to_200": {
            "n": len(host),
            "p50_s": round(percentile(host, 50), 3),
            "p99_s": round(percentile(host, 99), 3),
            "max_s": round(max(host), 3),
            "met": percentile(host, 50) <= HOST_TARGET_S,
        },
        "worker_kill_to_ready": {
            "n": len(restart),
            "after_restart_p50_s": round(percentile(restart, 50), 3),
            "after_restart_max_s": round(max(restart), 3),
            "after_kill_p50_s": round(percentile(kill, 50), 3),
            "after_kill_max_s": round(max(kill), 3),
            "met": max(restart) <= WORKER_TARGET_S,
        },
    }
