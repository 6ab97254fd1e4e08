"""The worker is a real process here: SIGKILLed mid-lifecycle and restarted, nothing leaks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from kruntimes.activities.hosts.process import list_records, stop_all
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.names import (
    POOL_TASK_QUEUE,
    QUERY_POOL,
    TASK_QUEUE,
    pool_workflow_id,
    run_workflow_id,
)
from kruntimes.contracts.pool import PoolState
from kruntimes.contracts.run import RunInput
from kruntimes.temporal.devserver import DevServer, free_port
from kruntimes.workflows.run import RunWorkflow
from tests.support.pki import TestPKI
from tests.support.waiting import eventually
from tests.workflows.conftest import Platform, run_manifest
from tests.workflows.platform_hosts import registrations

SLOW_IMPORT = "import time\ntime.sleep(4)\ndef handle(p):\n    return p\n"


async def _registering(state: Path, run_uid: str) -> bool:
    return any((state / "work").glob(f"*/{run_uid}.1")) if (state / "work").exists() else False


async def _metrics(address: str) -> str:
    return str(
        await eventually(
            lambda: urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode(),
            within=20,
            every=0.2,
            ignoring=(OSError,),
            what="the worker's /metrics",
        )
    )


def worker_trust_args(pki: TestPKI) -> list[str]:
    """The `krt worker` flags of the test CA's control-plane identity."""
    trust = pki.worker_trust()
    return [
        "--peer-tls",
        str(trust.peer_tls),
        "--assignment-key",
        str(trust.assignment_key),
        "--platform-ca",
        str(trust.platform_ca),
    ]


class WorkerProcess:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def worker_process(
    dev_server: DevServer, tmp_path: Path, pki: TestPKI
) -> Iterator[tuple[WorkerProcess, str, Path, str, str]]:
    suffix = uuid.uuid4().hex[:6]
    runtime, queue = f"py-{suffix}", f"{TASK_QUEUE}-{suffix}"
    config = tmp_path / "platform.yaml"
    config.write_text(
        json.dumps({"runtimes": [{"name": runtime, "adapter": "python", "runs": 2, "maxHosts": 1}]})
    )
    state = tmp_path / "state"
    metrics = f"127.0.0.1:{free_port()}"
    worker = WorkerProcess(
        [sys.executable, "-m", "kruntimes.workers.worker", "--temporal-address", dev_server.address]
        + [
            "--state-dir",
            str(state),
            "--config",
            str(config),
            "--metrics-address",
            metrics,
            "--log-level",
            "warning",
            "--task-queue",
            queue,
            "--pool-task-queue",
            f"{POOL_TASK_QUEUE}-{suffix}",
            *worker_trust_args(pki),
        ],
        tmp_path / "worker.log",
    )
    try:
        yield worker, runtime, state, metrics, queue
    finally:
        worker.stop()
        asyncio.run(stop_all(state))


async def test_a_worker_killed_mid_registration_is_replaced_and_the_run_is_ready_exactly_once(
    client: Client, worker_process: tuple[WorkerProcess, str, Path, str, str], pki: TestPKI
) -> None:
    worker, runtime, state, metrics, queue = worker_process
    worker.start()
    platform = Platform(client, state, {"python": runtime}, None, pki)  # type: ignore[arg-type]
    run = run_manifest("survivor", runtime=runtime, source=SLOW_IMPORT)
    handle = await client.start_workflow(
        RunWorkflow.run,
        RunInput(run=run),
        id=run_workflow_id("default", run.metadata.name),
        task_queue=queue,  # the worker process serves this one (--task-queue)
    )
    try:
        # registering: the host made the workspace and the handler's import sleeps
        await platform.eventually(
            lambda: _registering(state, run.metadata.uid), timeout=60, what="the registration to start"
        )
        assert "temporal_" in await _metrics(metrics), "the worker exposes the SDK's metrics for Prometheus"
        worker.kill()
        worker.start()
        status = await platform.wait_phase(handle, RunPhase.Ready, timeout=90)
        assert status.attempt == 1, "a retried RegisterFunction of the same attempt does not count again"
        records = list_records(state)
        assert len(records) == 1, "exactly one host was created"
        assert list(registrations(pki, records[0].address)) == [run.metadata.uid]
        pool = await client.get_workflow_handle(pool_workflow_id(runtime)).query(
            QUERY_POOL, result_type=PoolState
        )
        assert [r.runUid for r in pool.reservations] == [run.metadata.uid]
        history = await handle.fetch_history()
        registered = [
            e
            for e in history.events
            if e.HasField("marker_recorded_event_attributes")
            and b"register_function" in e.SerializeToString()
        ]
        assert len(registered) == 1, "registration is recorded once (a local activity's marker)"
    except BaseException:
        print(worker.log.read_text(errors="replace")[-4000:])  # shown by pytest on failure
        raise
    finally:
        with contextlib.suppress(Exception):
            await handle.terminate("test finished")
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(pool_workflow_id(runtime)).terminate("test finished")
