"""Record the workflow histories that replay_test.py replays: `python -m tests.replay.record`.

A fresh in-memory dev server, the real worker in-process and real process hosts, driven through
one scenario per code path; each workflow's history is written to histories/<name>.json. Run it
again after a deliberate workflow change (one that is meant to be incompatible) and commit the
new histories together with that change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from activities.hosts.process import stop_all
from kruntimes.api.phases import RunPhase
from kruntimes.api.status import RunStatus
from kruntimes.config import parse_config
from kruntimes.devserver import DevServer
from kruntimes.lifecycle import (
    SIGNAL_CANCEL,
    UPDATE_DELETE,
    PlatformInfo,
    RunInput,
    cleanup_workflow_id,
    pool_workflow_id,
    run_workflow_id,
)
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.temporal import TemporalSettings, connect
from tests.pki import TestPKI
from tests.workflows.conftest import Platform, run_manifest
from workers.worker import WorkerSettings, running_workers
from workflows.run import ADMIT_GRACE

HISTORIES = Path(__file__).parent / "histories"
TTL = {"ttlSecondsAfterFinished": 1}  # finished Runs close a second later: complete histories
TASK_OK = "def run(p):\n    return {'answer': 42}\n"
TASK_SLOW = "import time\ndef run(p):\n    time.sleep(120)\n"

log = logging.getLogger("record")


async def write(handle: WorkflowHandle[Any, Any], name: str) -> None:
    history = await handle.fetch_history()
    text = json.dumps(json.loads(history.to_json()), indent=1) + "\n"
    path = HISTORIES / f"{name}.json"
    path.write_text(text)
    log.info("%s: %s, %d events, %d bytes", name, handle.id, len(history.events), len(text))


async def closed(handle: WorkflowHandle[Any, Any], timeout: float = 60.0) -> None:
    await asyncio.wait_for(handle.result(), timeout)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def scale_outs(client: Client, runtime: str) -> list[tuple[str, WorkflowExecutionStatus | None]]:
    found = []
    async for w in client.list_workflows("WorkflowType='ScaleOutWorkflow'"):
        if w.id.startswith(f"scaleout/{runtime}/"):
            found.append((w.id, w.status))
    return found


async def completed_scale_out(client: Client, runtime: str) -> str:
    ids: list[str] = []

    async def any_completed() -> bool:
        ids[:] = [i for i, s in await scale_outs(client, runtime) if s is WorkflowExecutionStatus.COMPLETED]
        return bool(ids)

    await eventually(any_completed, f"a completed scale-out of {runtime}")
    return sorted(ids)[0]


def invoke(pki: TestPKI, address: str, run_uid: str) -> None:
    """One invocation straight on the host (the gateway is not part of this), by HostInfo."""
    with pki.channel(address, as_=pki.control_plane) as channel:
        info = pb_grpc.FunctionRuntimeStub(channel).HostInfo(pb.HostInfoRequest(), timeout=10)
    reg = next(r for r in info.registrations if r.run_uid == run_uid)
    with pki.channel(address, as_=pki.gateway) as channel:
        pb_grpc.FunctionRuntimeStub(channel).InvokeFunction(
            pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=b"{}"), timeout=10
        )


async def scenarios(p: Platform) -> None:
    py, one, attach = p.runtime("python"), p.runtime("one"), p.runtime("attach")

    # A function Run: Ready, then cancelled (cleanup unregisters; the retention timer closes it).
    run = run_manifest("cancelled", runtime=py, **TTL)
    h = await p.start(run)
    await p.wait_phase(h, RunPhase.Ready)
    await h.signal(SIGNAL_CANCEL)
    await closed(h)
    await write(h, "run_function_cancelled")
    assert run.metadata.uid is not None
    await write(p.client.get_workflow_handle(cleanup_workflow_id(run.metadata.uid)), "cleanup")

    # Started as the SDK starts it (the starter sends the admission): Ready, then cancelled.
    h = await p.start(run_manifest("starter-admits", runtime=py, **TTL), by_sdk=True)
    await p.wait_phase(h, RunPhase.Ready)
    await h.signal(SIGNAL_CANCEL)
    await closed(h)
    await write(h, "run_starter_admits")

    # Three Runs created together by one process: their admissions reach the pool batched.
    together = await asyncio.gather(
        *(p.start(run_manifest(f"together-{i}", runtime=py, **TTL), by_sdk=True) for i in range(3))
    )
    for h in together:
        await p.wait_phase(h, RunPhase.Ready)
        await h.signal(SIGNAL_CANCEL)
        await closed(h)

    # A starter that never sent the admission: the Run asks the pool itself after its grace period.
    run = run_manifest("starter-lost", runtime=py, **TTL)
    h = await p.client.start_workflow(
        "RunWorkflow",
        RunInput(run=run, starterAdmits=True),
        id=run_workflow_id(run.metadata.namespace, run.metadata.name),
        task_queue=p.settings.run_task_queue,
    )
    p.started.append(h)
    await p.wait_phase(h, RunPhase.Ready, timeout=ADMIT_GRACE.total_seconds() + 30)
    await h.signal(SIGNAL_CANCEL)
    await closed(h)
    await write(h, "run_starter_lost")

    # Ready, then the delete update (cancel, cleanup, close without waiting out the retention).
    h = await p.start(run_manifest("deleted", runtime=py))
    await p.wait_phase(h, RunPhase.Ready)
    final = await h.execute_update(UPDATE_DELETE, result_type=RunStatus)
    assert final.phase is RunPhase.Cancelled, final
    await closed(h)
    await write(h, "run_function_deleted")

    # A handler that cannot load: registration retried by spec.retryPolicy, then RetriesExhausted.
    h = await p.start(
        run_manifest(
            "bad-handler",
            runtime=py,
            source="import nowhere_to_be_found\n",
            retryPolicy={"limit": 2, "backoffSeconds": 0.1, "maxBackoffSeconds": 0.2},
            **TTL,
        )
    )
    status = await p.wait_phase(h, RunPhase.Failed)
    assert status.attempt == 2, status
    await closed(h)
    await write(h, "run_retries_exhausted")

    # A task that succeeds; its cleanup cancels the (finished) task on the host.
    run = run_manifest("task-ok", runtime=py, source=TASK_OK, handler="main:run", mode={"task": {}}, **TTL)
    h = await p.start(run)
    status = await p.wait_phase(h, RunPhase.Succeeded)
    assert status.outputs == {"answer": 42}, status
    await closed(h)
    await write(h, "run_task_succeeded")
    assert run.metadata.uid is not None
    await write(p.client.get_workflow_handle(cleanup_workflow_id(run.metadata.uid)), "cleanup_task")

    # A task cancelled while it runs: the activity is cancelled and waited for.
    run = run_manifest(
        "task-cancelled", runtime=py, source=TASK_SLOW, handler="main:run", mode={"task": {}}, **TTL
    )
    h = await p.start(run)
    await p.wait_phase(h, RunPhase.Running)

    async def task_on_host() -> bool:  # the execute_task activity reached the host
        return any((p.state_dir / "work").glob(f"*/task-{run.metadata.uid}.1"))

    await eventually(task_on_host, "the task running on its host")
    await h.signal(SIGNAL_CANCEL)
    await p.wait_phase(h, RunPhase.Cancelled)
    await closed(h)
    await write(h, "run_task_cancelled")

    # Idle timeout: one invocation right after Ready moves the idle clock once (a re-armed timer),
    # then nothing more comes.
    run = run_manifest("idle", runtime=py, mode={"function": {"idleTimeoutSeconds": 1}}, **TTL)
    h = await p.start(run)
    status = await p.wait_phase(h, RunPhase.Ready)
    pool = await p.pool("python")
    address = next(x.address for x in pool.hosts if x.hostId == status.assignedHost)
    assert address is not None
    assert run.metadata.uid is not None
    await asyncio.to_thread(invoke, address, run.metadata.uid)
    await p.wait_phase(h, RunPhase.Timeout)
    await closed(h)
    await write(h, "run_idle_timeout")

    # One slot: a holder Run takes it, a second Run queues and is cancelled while Pending.
    holder = await p.start(run_manifest("holder", runtime=one))
    await p.wait_phase(holder, RunPhase.Ready)
    waiter = await p.start(run_manifest("waiter", runtime=one, **TTL))

    async def queued() -> bool:
        return len((await p.pool("one")).queue) == 1

    await eventually(queued, "the waiter queued")
    await waiter.signal(SIGNAL_CANCEL)
    await closed(waiter)
    await write(waiter, "run_cancelled_pending")
    await holder.execute_update(UPDATE_DELETE, result_type=RunStatus)
    await closed(holder)

    # A runtime nobody configured: signalling its pool fails.
    h = await p.start(run_manifest("unknown-runtime", runtime="no-such-runtime", **TTL))
    await closed(h)
    assert (await p.status(h)).phase is RunPhase.Failed
    await write(h, "run_runtime_unknown")

    # Scale-outs: a fulfilled one of the python runtime; a failed one of the attach runtime (its
    # warm host has no attach address, so create_host fails without retrying).
    await write(p.client.get_workflow_handle(await completed_scale_out(p.client, py)), "scaleout_fulfilled")
    await write(p.client.get_workflow_handle(await completed_scale_out(p.client, attach)), "scaleout_failed")

    # A Run on the attach runtime: each scale-out fails until the pool gives up and rejects it.
    h = await p.start(run_manifest("rejected", runtime=attach, **TTL))
    status = await p.wait_phase(h, RunPhase.Failed)
    await closed(h)
    await write(h, "run_rejected")

    # The pools as they are now (running workflows).
    await write(p.client.get_workflow_handle(pool_workflow_id(py)), "pool")
    await write(p.client.get_workflow_handle(pool_workflow_id(attach)), "pool_scale_out_failed")


async def main() -> None:
    HISTORIES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="krt-record-") as tmp:
        server = DevServer(state_dir=Path(tmp) / "temporal", persistent=False)
        server.start()
        state_dir = Path(tmp) / "state"
        pki = TestPKI.create(Path(tmp) / "pki")
        try:
            client = await connect(server.address, "default")
            suffix = uuid.uuid4().hex[:6]
            runtimes = {"python": f"py-{suffix}", "one": f"one-{suffix}", "attach": f"at-{suffix}"}
            config = parse_config(
                {
                    "runtimes": [
                        {"name": runtimes["python"], "adapter": "python", "runs": 10, "maxHosts": 2},
                        {"name": runtimes["one"], "adapter": "python", "runs": 1, "maxHosts": 1},
                        {
                            "name": runtimes["attach"],
                            "adapter": "python",
                            "provider": "attach",
                            "minHosts": 1,
                            "maxHosts": 1,
                        },
                    ]
                }
            )
            settings = WorkerSettings(
                temporal=TemporalSettings(address=server.address, namespace="default"),
                config=config,
                platform=PlatformInfo(gatewayUrl="https://127.0.0.1:8443", stateDir=str(state_dir)),
                trust=pki.worker_trust(),
            )
            platform = Platform(client, state_dir, runtimes, settings, pki)
            try:
                async with running_workers(client, settings):
                    try:
                        await scenarios(platform)
                    finally:
                        for handle in platform.started:
                            with suppress(Exception):
                                await handle.terminate("recording finished")
                        for runtime in runtimes.values():
                            with suppress(Exception):
                                await client.get_workflow_handle(pool_workflow_id(runtime)).terminate(
                                    "recording finished"
                                )
            finally:
                await stop_all(state_dir)
        finally:
            server.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)  # the expected failures
    asyncio.run(main())
