"""A `krt worker` whose activity poller fails fatally while a host's watch (watch_host, which runs
for the host's life) runs exits non-zero within a bound, naming what failed, and once started
again (as `krt up` and Kubernetes start it again) serves: a Run created afterwards gets Ready.

The fault is real: the worker reaches Temporal through a gRPC front (tests/support/grpc_gate.py)
that revokes its access to PollActivityTaskQueue (PERMISSION_DENIED, the polls in flight
included), as an authorizer does. The SDK's core retries even such an error for a fixed grace
(LONG_POLL_FATAL_GRACE, 60 s) before it reports it fatal, so this test waits that long; before the
fix, the worker then waited forever for the watch to finish and never exited.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflowservice.v1 import PollActivityTaskQueueRequest
from temporalio.client import Client, WorkflowHandle

from kruntimes.activities.hosts.process import stop_all
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.names import POOL_TASK_QUEUE, TASK_QUEUE, pool_workflow_id, run_workflow_id
from kruntimes.contracts.run import RunInput
from kruntimes.temporal.connect import connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.assembly import SHUTDOWN_BOUND_S
from kruntimes.workflows.run import RunWorkflow
from tests.support.grpc_gate import GrpcGate
from tests.support.pki import TestPKI
from tests.support.waiting import eventually
from tests.workflows.conftest import Platform, run_manifest, terminate_queue
from tests.workflows.worker_restart_test import WorkerProcess, worker_trust_args

POLL = "PollActivityTaskQueue"
CORE_FATAL_GRACE_S = 60.0  # the SDK core's LONG_POLL_FATAL_GRACE: a poll error is fatal after it
# a fatal poll error to the process's exit: the grace, one more poll's backoff, the bounded stop
EXIT_WITHIN_S = CORE_FATAL_GRACE_S + 10.0 + SHUTDOWN_BOUND_S


@pytest.fixture
async def gate(dev_server: DevServer) -> AsyncIterator[GrpcGate]:
    front = GrpcGate(dev_server.address)
    await front.start()
    try:
        yield front
    finally:
        await front.stop()


@pytest.fixture
async def worker(
    gate: GrpcGate, tmp_path: Path, pki: TestPKI
) -> AsyncIterator[tuple[WorkerProcess, str, str, Path]]:
    """A `krt worker` process reaching Temporal through the gate, on a runtime and task queues of
    its own; its runtime, Runs' task queue and state directory."""
    suffix = uuid.uuid4().hex[:6]
    runtime, queue = f"py-{suffix}", f"{TASK_QUEUE}-{suffix}"
    config = tmp_path / "platform.yaml"
    config.write_text(
        json.dumps({"runtimes": [{"name": runtime, "adapter": "python", "runs": 4, "maxHosts": 1}]})
    )
    state = tmp_path / "state"
    process = WorkerProcess(
        [sys.executable, "-m", "kruntimes.workers.worker", "--temporal-address", gate.address]
        + ["--state-dir", str(state), "--config", str(config), "--log-level", "warning"]
        + ["--task-queue", queue, "--pool-task-queue", f"{POOL_TASK_QUEUE}-{suffix}"]
        + ["--heartbeat-interval", "0.5", *worker_trust_args(pki)],
        tmp_path / "worker.log",
    )
    try:
        yield process, runtime, queue, state
    finally:
        await _stop(process)
        await stop_all(state)


async def _stop(process: WorkerProcess) -> None:
    """SIGTERM, then its exit awaited with this loop running: the gate it reaches Temporal
    through is served by this loop."""
    if process.proc is None or process.proc.poll() is not None:
        return
    process.proc.terminate()
    try:
        await eventually(process.proc.poll, until=lambda c: c is not None, within=30, every=0.05)
    finally:
        process.kill()


async def _start(platform: Platform, queue: str, runtime: str, name: str) -> WorkflowHandle[Any, Any]:
    run = run_manifest(f"{name}-{uuid.uuid4().hex[:6]}", runtime=runtime)
    handle = await platform.client.start_workflow(
        RunWorkflow.run,
        RunInput(run=run),
        id=run_workflow_id("default", run.metadata.name),
        task_queue=queue,  # the worker process serves this one (--task-queue)
    )
    platform.started.append(handle)
    return handle


def _queue_of(poll: bytes) -> str:
    return PollActivityTaskQueueRequest.FromString(poll).task_queue.name


async def _watching(client: Client, queue: str) -> bool:
    """Whether a HostWorkflow of `queue` has its host's watch (watch_host) started on a worker."""
    query = f"TaskQueue='{queue}' AND WorkflowType='HostWorkflow' AND ExecutionStatus='Running'"
    async for execution in client.list_workflows(query):
        described = await client.get_workflow_handle(execution.id).describe()
        for pending in described.raw_description.pending_activities:
            if (
                pending.activity_type.name == "watch_host"
                and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            ):
                return True
    return False


@pytest.mark.timeout(EXIT_WITHIN_S + 150)
async def test_a_worker_whose_activity_poller_fails_while_a_host_is_watched_exits_and_serves_once_started_again(
    dev_server: DevServer,
    gate: GrpcGate,
    worker: tuple[WorkerProcess, str, str, Path],
    pki: TestPKI,
) -> None:
    process, runtime, queue, state = worker
    client = await connect(dev_server.address, "default")
    platform = Platform(client, state, {"python": runtime}, None, pki)  # type: ignore[arg-type]
    process.start()
    try:
        first = await _start(platform, queue, runtime, "before")
        await platform.wait_phase(first, RunPhase.Ready, timeout=60)
        await eventually(lambda: _watching(client, queue), within=30, every=0.2, what="the host's watch")

        gate.deny(POLL, matching=lambda request: _queue_of(request) == queue)  # the watch's worker
        assert process.proc is not None
        code = await eventually(
            process.proc.poll,
            until=lambda c: c is not None,
            within=EXIT_WITHIN_S,
            every=0.2,
            what="the worker to exit",
        )
        assert code == 1
        log = process.log.read_text(errors="replace")
        assert f"the activity poller of task queue {queue!r} failed (PermissionDenied)" in log
        assert gate.answered_denied > 0

        gate.restore(POLL)  # access given back; the supervisor starts the worker again
        process.start()
        after = await _start(platform, queue, runtime, "after")
        await platform.wait_phase(after, RunPhase.Ready, timeout=60)
    except BaseException:
        print(process.log.read_text(errors="replace")[-6000:])  # shown by pytest on failure
        raise
    finally:
        for handle in [*platform.started, client.get_workflow_handle(pool_workflow_id(runtime))]:
            with contextlib.suppress(Exception):
                await handle.terminate("test finished")
        await terminate_queue(client, queue)
