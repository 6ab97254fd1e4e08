"""Record the workflow histories that replay_test.py replays: `python -m tests.replay.record [GROUP...]`.

A fresh in-memory dev server, the real worker in-process and real process hosts, driven through
one scenario per code path; each workflow's history is written to histories/<name>.json. The
scenarios come in groups (`runs`: the Run, pool, scale-out and cleanup paths; `hosts`: the host
lifecycle, its HostWorkflow endings, the Runs that moved, the reconciler; `scale`, recorded alone:
a pool handing its hosts' slots over across continue-as-new; `apart`, recorded alone: the same
handover with the continue-as-new in a task of its own; `slow`: Runs whose registration outlasts
their workflow task; `endings`: Runs that close as they finish, their retention, a scheduled
Run; `alarm`: a pool's one timer for its next look moved earlier for a scale-in; `since`: a Run
indexing KrtPhaseSince with its phases; `queues`: an operator's pause, drain and resume of a
runtime's admission; `tenants`: a host scaled out for one tenant of a group taking the group's
other tenant's Run; `fair`: one tenant's backlog and another tenant's Run placed ahead of it;
`functions`: a Function rolled out, scaled, rolled back and deleted, one of a broken template,
one whose replica was terminated, and a Run refused as a replica; `function_continue`, recorded
alone: a Function continuing as new; `autoscale`: a Function its autoscaler scales up under load
and down after it, one scaled to zero and woken from zero by a storm of `wake` signals;
`traffic`: a canary split between two revisions, its older replica killed and replaced, then all
traffic to the latest and deleted; `split_wanted`: a canary dividing the replicas wanted between
its revisions; `zero_failing`: a Function of a broken template at zero replicas wanted, Pending);
naming groups records
only those, so the histories other groups recorded with earlier code stay (they are what shows
that a change still replays what older code started). When to record again, and what to keep:
docs/workflow-changes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle

from kruntimes.activities.hosts import ProcessProvider
from kruntimes.activities.hosts.process import list_records, stop_all
from kruntimes.api.function import TrafficTarget
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.function import ApplyResult, ReplicaOf, ScaleInput, ScaleResult
from kruntimes.contracts.host import HostActionInput, HostActionResult, HostRecord
from kruntimes.contracts.names import (
    QUERY_HOST,
    SIGNAL_CANCEL,
    SIGNAL_DELETE_NOW,
    SIGNAL_FUNCTION_WAKE,
    UPDATE_APPLY,
    UPDATE_COLLECT,
    UPDATE_DELETE,
    UPDATE_DELETE_HOST,
    UPDATE_DRAIN_HOST,
    UPDATE_DRAIN_QUEUE,
    UPDATE_PAUSE_QUEUE,
    UPDATE_RESUME_QUEUE,
    UPDATE_ROLLBACK,
    UPDATE_SCALE,
    cleanup_workflow_id,
    host_workflow_id,
    pool_workflow_id,
    reconcile_workflow_id,
    retention_workflow_id,
    run_workflow_id,
    scheduled_workflow_id,
)
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.pool import QUEUE_DRAINED, QueueActionInput, QueueActionResult
from kruntimes.contracts.providers import HostSpec
from kruntimes.contracts.reconcile import ReconcileReport
from kruntimes.contracts.run import RunInput
from kruntimes.contracts.scheduled import ScheduledRunInput
from kruntimes.decisions.scheduling.model import HostState
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.assembly import running_workers
from kruntimes.workers.settings import WorkerSettings
from kruntimes.workflows.run import ADMIT_GRACE
from tests.support import waiting
from tests.support.pki import TestPKI
from tests.support.procs import frozen
from tests.workflows.conftest import EXITS_LOADING, UNLOADABLE, Platform, run_manifest
from tests.workflows.functions import (
    function_manifest,
    function_rolled_out,
    function_status,
    replicas_of,
    start_function,
)
from tests.workflows.platform_hosts import (
    BEAT_S,
    address_of,
    host_handle,
    invoke_on_host,
    ready_elsewhere,
    ready_on_host,
    registrations,
    start_supervisor,
    tell_pool,
)

HISTORIES = Path(__file__).parent / "histories"
TTL = {"ttlSecondsAfterFinished": 1}  # finished Runs close a second later: complete histories
KEEP = {"ttlSecondsAfterFinished": 60}  # Runs that close when they finish: kept to be written
TASK_OK = "def run(p):\n    return {'answer': 42}\n"
TASK_SLOW = "import time\ndef run(p):\n    time.sleep(120)\n"

log = logging.getLogger("record")


def task_manifest(name: str, *, runtime: str, source: str = TASK_OK, **spec: Any) -> Run:
    """A task Run whose `run` handler is `source`."""
    return run_manifest(name, runtime=runtime, source=source, handler="main:run", mode={"task": {}}, **spec)


def retention_of(p: Platform, run: Run) -> WorkflowHandle[Any, Any]:
    """The RetentionWorkflow that keeps `run` once its workflow closed."""
    assert run.metadata.uid is not None
    return p.client.get_workflow_handle(retention_workflow_id(run.metadata.uid))


async def write(handle: WorkflowHandle[Any, Any], name: str) -> None:
    history = await handle.fetch_history()
    text = json.dumps(json.loads(history.to_json()), indent=1) + "\n"
    path = HISTORIES / f"{name}.json"
    path.write_text(text)
    log.info("%s: %s, %d events, %d bytes", name, handle.id, len(history.events), len(text))


async def closed(handle: WorkflowHandle[Any, Any], timeout: float = 60.0) -> None:
    """Once the workflow has closed, completed or failed (a Failed Run closes with its failure)."""
    with contextlib.suppress(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), timeout)


async def write_closed(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """Once the workflow has closed (its result, within 60 s), write its history as `name`."""
    await closed(handle)
    await write(handle, name)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
    """`check` polled every 100 ms (each poll may signal a workflow: the recorded histories keep
    the pace they were recorded at)."""
    await waiting.eventually(check, within=timeout, what=what, every=0.1)


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


async def scenarios(p: Platform) -> None:
    py, one, attach = p.runtime("python"), p.runtime("one"), p.runtime("attach")

    # A function Run: Ready, then cancelled (cleanup unregisters; the retention timer closes it).
    run = run_manifest("cancelled", runtime=py, **TTL)
    h = await p.start(run)
    await p.wait_phase(h, RunPhase.Ready)
    await h.signal(SIGNAL_CANCEL)
    await write_closed(h, "run_function_cancelled")
    assert run.metadata.uid is not None
    await write(p.client.get_workflow_handle(cleanup_workflow_id(run.metadata.uid)), "cleanup")

    # Started as the SDK starts it (the starter sends the admission): Ready, then cancelled.
    h = await p.start(run_manifest("starter-admits", runtime=py, **TTL), by_sdk=True)
    await p.wait_phase(h, RunPhase.Ready)
    await h.signal(SIGNAL_CANCEL)
    await write_closed(h, "run_starter_admits")

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
    await write_closed(h, "run_starter_lost")

    # Ready, then the delete update (cancel, cleanup, close without waiting out the retention).
    h = await p.start(run_manifest("deleted", runtime=py))
    await p.wait_phase(h, RunPhase.Ready)
    answer = await h.execute_update(UPDATE_DELETE, result_type=str)
    assert answer == f"deleted {h.id}: Cancelled", answer
    await write_closed(h, "run_function_deleted")

    # A handler that cannot be imported: Failed at attempt 1, its retry policy unused.
    h = await p.start(run_manifest("unloadable", runtime=py, source=UNLOADABLE, **TTL))
    status = await p.wait_phase(h, RunPhase.Failed)
    ready = status.condition("Ready")
    assert status.attempt == 1 and ready is not None and ready.reason == "HandlerLoadFailed", status
    await write_closed(h, "run_load_failed")

    # A handler whose process exits while loading: retried by spec.retryPolicy, then RetriesExhausted.
    h = await p.start(
        run_manifest(
            "bad-handler",
            runtime=py,
            source=EXITS_LOADING,
            retryPolicy={"limit": 2, "backoffSeconds": 0.1, "maxBackoffSeconds": 0.2},
            **TTL,
        )
    )
    status = await p.wait_phase(h, RunPhase.Failed)
    assert status.attempt == 2, status
    await write_closed(h, "run_retries_exhausted")

    # A task that succeeds; its cleanup cancels the (finished) task on the host.
    run = task_manifest("task-ok", runtime=py, **TTL)
    h = await p.start(run)
    status = await p.wait_phase(h, RunPhase.Succeeded)
    assert status.outputs == {"answer": 42}, status
    await write_closed(h, "run_task_succeeded")
    assert run.metadata.uid is not None
    await write(p.client.get_workflow_handle(cleanup_workflow_id(run.metadata.uid)), "cleanup_task")

    # A task cancelled while it runs: the activity is cancelled and waited for.
    run = task_manifest("task-cancelled", runtime=py, source=TASK_SLOW, **TTL)
    h = await p.start(run)
    await p.wait_phase(h, RunPhase.Running)

    async def task_on_host() -> bool:  # the execute_task activity reached the host
        return any((p.state_dir / "work").glob(f"*/task-{run.metadata.uid}.1"))

    await eventually(task_on_host, "the task running on its host")
    await h.signal(SIGNAL_CANCEL)
    await p.wait_phase(h, RunPhase.Cancelled)
    await write_closed(h, "run_task_cancelled")

    # Idle timeout: one invocation right after Ready moves the idle clock once (a re-armed timer),
    # then nothing more comes.
    run = run_manifest("idle", runtime=py, mode={"function": {"idleTimeoutSeconds": 1}}, **TTL)
    h, _, address = await ready_on_host(p, run)
    assert run.metadata.uid is not None
    await asyncio.to_thread(invoke_on_host, p.pki, address, run.metadata.uid)
    await p.wait_phase(h, RunPhase.Timeout)
    await write_closed(h, "run_idle_timeout")

    # One slot: a holder Run takes it, a second Run queues and is cancelled while Pending.
    holder = await p.start(run_manifest("holder", runtime=one))
    await p.wait_phase(holder, RunPhase.Ready)
    waiter = await p.start(run_manifest("waiter", runtime=one, **TTL))

    async def queued() -> bool:
        return len((await p.pool("one")).queue) == 1

    await eventually(queued, "the waiter queued")
    await waiter.signal(SIGNAL_CANCEL)
    await write_closed(waiter, "run_cancelled_pending")
    await holder.execute_update(UPDATE_DELETE, result_type=str)
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
    await write_closed(h, "run_rejected")

    # The pools as they are now (running workflows).
    await write(p.client.get_workflow_handle(pool_workflow_id(py)), "pool")
    await write(p.client.get_workflow_handle(pool_workflow_id(attach)), "pool_scale_out_failed")


def pid_of(p: Platform, host_uid: str | None) -> int:
    record = next(r for r in list_records(p.state_dir) if r.hostUid == host_uid)
    assert record.pid is not None
    return record.pid


async def host_scenarios(p: Platform) -> None:
    lost, ops, idle, once, stuck = (p.runtime(n) for n in ("lost", "ops", "idle", "once", "stuck"))

    # A host SIGKILLed under a Run: the HostWorkflow fences it (Lost); the Run moves (recoveries 1).
    h = await p.start(run_manifest("survivor", runtime=lost, **TTL))
    before = await p.wait_phase(h, RunPhase.Ready)
    os.kill(pid_of(p, before.assignedHostUID), signal.SIGKILL)
    await write_closed(host_handle(p, before.assignedHost or "", "lost"), "host_lost")
    await ready_elsewhere(p, h, before.assignedHostUID)
    await h.signal(SIGNAL_CANCEL)
    await write_closed(h, "run_host_lost_moved")

    # No recovery allowed: the host loss ends the Run (RecoveriesExhausted).
    h = await p.start(run_manifest("fragile", runtime=lost, recoveryLimit=0, **TTL))
    before = await p.wait_phase(h, RunPhase.Ready)
    os.kill(pid_of(p, before.assignedHostUID), signal.SIGKILL)
    status = await p.wait_phase(h, RunPhase.Failed)
    assert status.condition("Ready").reason == "RecoveriesExhausted", status  # type: ignore[union-attr]
    await write_closed(h, "run_recoveries_exhausted")

    # A registration removed behind the platform's back: registered again, the same attempt.
    h = await p.start(run_manifest("reregistered", runtime=lost, **TTL))
    before = await p.wait_phase(h, RunPhase.Ready)
    pool = await p.pool("lost")
    address = next(x.address for x in pool.hosts if x.hostUid == before.assignedHostUID)
    assert address is not None

    async def watched() -> bool:
        rec = await host_handle(p, before.assignedHost or "", "lost").query(
            QUERY_HOST, result_type=HostRecord
        )
        return rec is not None and rec.state is HostState.Ready

    await eventually(watched, "the host Ready on its HostWorkflow")
    old = await asyncio.to_thread(unregister_behind, p.pki, address, before.assignedHostUID or "")

    async def again() -> bool:
        found = await asyncio.to_thread(registrations, p.pki, address)
        return found.get(old[0]) not in (None, old[1])

    await eventually(again, "the registration back")
    await p.wait_phase(h, RunPhase.Ready)
    await h.signal(SIGNAL_CANCEL)
    await write_closed(h, "run_registration_lost")

    # An operator drains a host: its Run moves (HostDraining), the drained host is deleted.
    h = await p.start(run_manifest("drained", runtime=ops, **TTL))
    before = await p.wait_phase(h, RunPhase.Ready)
    drain = host_handle(p, before.assignedHost or "", "ops")
    await drain.execute_update(
        UPDATE_DRAIN_HOST, HostActionInput(message="recording"), result_type=HostActionResult
    )
    after = await ready_elsewhere(p, h, before.assignedHostUID)
    await write_closed(drain, "host_drained")
    await h.signal(SIGNAL_CANCEL)
    await write_closed(h, "run_drained_moved")

    # An operator deletes a host.
    h = await p.start(run_manifest("evicted", runtime=ops, **TTL))
    before = await p.wait_phase(h, RunPhase.Ready)
    delete = host_handle(p, before.assignedHost or "", "ops")
    await delete.execute_update(UPDATE_DELETE_HOST, HostActionInput(), result_type=HostActionResult)
    await write_closed(delete, "host_deleted")
    await ready_elsewhere(p, h, before.assignedHostUID)
    await h.signal(SIGNAL_CANCEL)
    await closed(h)
    del after

    # Idle hosts scale in down to the warm minimum.
    first = await p.start(run_manifest("idle-a", runtime=idle, **TTL))
    second = await p.start(run_manifest("idle-b", runtime=idle, **TTL))
    a, b = await p.wait_phase(first, RunPhase.Ready), await p.wait_phase(second, RunPhase.Ready)
    for x in (first, second):
        await x.signal(SIGNAL_CANCEL)
        await closed(x)

    async def one_left() -> bool:
        return len((await p.pool("idle")).hosts) == 1

    await eventually(one_left, "scale-in to one host")
    [kept] = (await p.pool("idle")).hosts
    gone = a.assignedHost if a.assignedHost != kept.hostId else b.assignedHost
    await write_closed(host_handle(p, gone or "", "idle"), "host_scaled_in")

    # A one-shot runtime: a task on a host of its own, deleted once the task ended.
    run = task_manifest("one-task", runtime=once, **TTL)
    h = await p.start(run)
    done = await p.wait_phase(h, RunPhase.Succeeded)
    await write_closed(host_handle(p, done.assignedHost or "", "once"), "host_released")
    await write_closed(h, "run_task_one_shot")

    # A host frozen before its supervisor heard from it: stuck, deleted, replaced for the Run.
    created = await ProcessProvider(state_dir=p.state_dir, issuer=p.pki.issuer()).create(
        HostSpec(
            runtime=stuck,
            hostId=f"{stuck}-frozen",
            adapter="python",
            provider="process",
            stateDir=str(p.state_dir),
        )
    )
    assert created.pid is not None
    with frozen(created.pid):
        host = await tell_pool(p, created, logical="stuck", request_id="recorded")
        supervisor = await start_supervisor(p, created, host, logical="stuck")
        await closed(supervisor)
    await write(supervisor, "host_stuck")

    # The reconciler: a Run terminated out of band; a round asked for frees what it held.
    h = await p.start(run_manifest("terminated", runtime=ops))
    await p.wait_phase(h, RunPhase.Ready)
    await h.terminate("recording: out of band")
    await asyncio.sleep(1.2)  # older than the reconciler's grace of one second
    reconciler = p.client.get_workflow_handle(reconcile_workflow_id(ops))
    report = await reconciler.execute_update(UPDATE_COLLECT, result_type=ReconcileReport)
    assert report.released and report.unregistered, report
    await write(reconciler, "reconcile")
    await write(p.client.get_workflow_handle(pool_workflow_id(ops)), "pool_housekeeping")
    await write(host_handle(p, (await p.pool("ops")).hosts[0].hostId, "ops"), "host_ready")


def unregister_behind(pki: TestPKI, address: str, host_uid: str) -> tuple[str, str]:
    """Unregister the host's one registration directly; (its run uid, its registration id)."""
    with pki.channel(address, as_=pki.control_plane) as channel:
        stub = pb_grpc.FunctionRuntimeStub(channel)
        info = stub.HostInfo(pb.HostInfoRequest(), timeout=10)
        assert info.host_uid == host_uid
        [reg] = info.registrations
        stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=reg.registration_id), timeout=30)
    return reg.run_uid, reg.registration_id


async def scale_scenarios(p: Platform, *, handed_over: str = "pool_slots_handed_over") -> None:
    """The pool continues as new with Ready Runs on a supervised host: it hands the host's slots
    to its HostWorkflow first, and its next run reads them back (recorded alone: its server
    suggests continue-as-new after a few events)."""
    rt = p.runtime("can")
    pool = p.client.get_workflow_handle(pool_workflow_id(rt))
    first = (await pool.describe()).run_id
    handles = [await p.start(run_manifest(f"slots-{i}", runtime=rt)) for i in range(4)]
    for h in handles:
        await p.wait_phase(h, RunPhase.Ready)

    async def continued() -> bool:
        return (await pool.describe()).run_id != first

    # It continues at its first batch after the suggestion; with no Run coming, its batches are its
    # probes, a minute apart, each a few events nearer the suggestion.
    await eventually(continued, "the pool to continue as new", timeout=300)
    await write(p.client.get_workflow_handle(pool.id, run_id=first), handed_over)
    if handed_over != "pool_slots_handed_over":
        return
    late = await p.start(run_manifest("slots-late", runtime=rt))
    status = await p.wait_phase(late, RunPhase.Ready)
    assert status.assignedHost is not None
    await write(pool, "pool_slots_read_back")
    await write(p.client.get_workflow_handle(host_workflow_id(rt, status.assignedHost)), "host_slots")


async def apart_scenarios(p: Platform) -> None:
    """The scale group's handover, written on its own: the pool hands its slots over in one task
    and continues as new in the next (recorded alone, as the scale group)."""
    await scale_scenarios(p, handed_over="pool_handover_apart")


async def alarm_scenarios(p: Platform) -> None:
    """A pool that keeps one timer for its next look: three Runs at once (two
    scale-outs), each cancelled; the idle hosts' scale-in, due before the next probe, moves the
    timer earlier, and it rings for the scale-in."""
    idle = p.runtime("idle")
    handles = await asyncio.gather(
        *(p.start(run_manifest(f"alarm-{i}", runtime=idle, **TTL), by_sdk=True) for i in range(3))
    )
    for h in handles:
        await p.wait_phase(h, RunPhase.Ready)
    for h in handles:
        await h.signal(SIGNAL_CANCEL)
        await closed(h)

    async def one_left() -> bool:
        return len((await p.pool("idle")).hosts) == 1

    await eventually(one_left, "scale-in to one host")
    await write(p.client.get_workflow_handle(pool_workflow_id(idle)), "pool_one_alarm")


async def since_scenarios(p: Platform) -> None:
    """A Run that indexes KrtPhaseSince with each phase: Ready, then cancelled, and closed."""
    h = await p.start(run_manifest("since", runtime=p.runtime("python"), **KEEP), by_sdk=True)
    await p.wait_phase(h, RunPhase.Ready)
    await h.signal(SIGNAL_CANCEL)
    await write_closed(h, "run_phase_since")


async def queue_scenarios(p: Platform) -> None:
    """An operator's admission control of a runtime: paused, two Runs queue (no scale-out); a
    drain ends both QueueDrained; another Run queues while paused; resumed, the queue is decided
    again (a scale-out, the Run placed) and a Run that comes after is placed at once."""
    rt = p.runtime("queued")
    pool = p.client.get_workflow_handle(pool_workflow_id(rt))

    async def control(update: str, message: str, by: str) -> QueueActionResult:
        request = QueueActionInput(message=message, requestedBy=by)
        return await pool.execute_update(update, request, result_type=QueueActionResult)

    async def queued(n: int) -> bool:
        return len((await p.pool("queued")).queue) == n

    await eventually(lambda: queued(0), "the pool of the queued runtime")
    assert (await control(UPDATE_PAUSE_QUEUE, "maintenance", "alice")).paused
    drained = [await p.start(run_manifest(f"drained-{i}", runtime=rt, **TTL)) for i in range(2)]
    await eventually(lambda: queued(2), "two Runs queued while paused")
    state = await p.pool("queued")
    assert not state.hosts and not state.scaleOuts, state
    assert (await control(UPDATE_DRAIN_QUEUE, "closing for the night", "bob")).queued == 2
    for h in drained:
        status = await p.wait_phase(h, RunPhase.Failed)
        assert status.condition("Ready").reason == QUEUE_DRAINED, status  # type: ignore[union-attr]
    await write_closed(drained[0], "run_queue_drained")
    await closed(drained[1])

    resumed = await p.start(run_manifest("resumed", runtime=rt, **TTL))
    await eventually(lambda: queued(1), "a Run queued while still paused")
    assert not (await control(UPDATE_RESUME_QUEUE, "done", "alice")).paused
    first = await p.wait_phase(resumed, RunPhase.Ready)
    after = await p.start(run_manifest("after-resume", runtime=rt, **TTL))
    second = await p.wait_phase(after, RunPhase.Ready)
    assert first.assignedHost is not None and second.assignedHost == first.assignedHost
    for h in (resumed, after):
        await h.signal(SIGNAL_CANCEL)
        await closed(h)
    await write(pool, "pool_queue_paused_drained_resumed")


TENANT_GROUP = [
    {"name": "first", "mode": "Dedicated", "group": "grp"},
    {"name": "second", "mode": "Dedicated", "group": "grp"},
]


async def tenant_scenarios(p: Platform) -> None:
    """A host scaled out for one tenant of a group takes the group's other tenant's Run, queued
    behind that scale-out: on a runtime of two slots a host, both are placed as it is Ready; on a
    runtime of one host of one slot, the second is decided again as the host is Ready (no capacity
    on its way covers it: `uncovered`), waits, and takes the host once the first Run has left it."""
    for logical, write_as in (("grp", "pool_group_host_shared"), ("grp1", "pool_group_uncovered")):
        rt = p.runtime(logical)
        first = await p.start(run_manifest(f"{logical}-first", runtime=rt, tenant="first", **TTL))

        async def scaling_out(lg: str = logical) -> bool:
            return bool((await p.pool(lg)).scaleOuts)

        await eventually(scaling_out, f"the first tenant's scale-out of {rt}")
        second = await p.start(run_manifest(f"{logical}-second", runtime=rt, tenant="second", **TTL))

        async def both_queued(lg: str = logical) -> bool:
            state = await p.pool(lg)
            if state.hosts:
                raise AssertionError(f"the host of {lg} was Ready before the second Run queued: record again")
            return len(state.queue) == 2

        await eventually(both_queued, f"both tenants' Runs queued behind the scale-out of {rt}")
        one = await p.wait_phase(first, RunPhase.Ready)
        assert one.assignedHost is not None
        if logical == "grp1":
            await eventually(lambda lg=logical: _queued_one(p, lg), "the second Run waiting for a slot")
            await first.signal(SIGNAL_CANCEL)
            await closed(first)
        two = await p.wait_phase(second, RunPhase.Ready)
        assert two.assignedHost == one.assignedHost, (one, two)
        hosts = (await p.pool(logical)).hosts
        assert [(h.tenant, h.tenantGroup) for h in hosts] == [("first", "grp")], hosts
        for h in (second,) if logical == "grp1" else (first, second):
            await h.signal(SIGNAL_CANCEL)
            await closed(h)
        await write(p.client.get_workflow_handle(pool_workflow_id(rt)), write_as)
    await write(
        p.client.get_workflow_handle(await completed_scale_out(p.client, p.runtime("grp"))),
        "scaleout_for_group",
    )


async def _queued_one(p: Platform, logical: str) -> bool:
    return len((await p.pool(logical)).queue) == 1


FAIR_TENANTS = [{"name": "burst", "queueLimit": 2}, {"name": "steady"}, {"name": "own", "mode": "Dedicated"}]


async def fair_scenarios(p: Platform) -> None:
    """A runtime's queue placed in fair order across tenants (pool-fair-queue): on one host of two
    slots, one tenant holds both and queues two more up to its queueLimit (a third is refused,
    QueueFull); another tenant's Run, queued last, takes the slot the first tenant's Run frees."""
    rt = p.runtime("fair")
    burst = [await p.start(run_manifest(f"burst-{i}", runtime=rt, tenant="burst", **TTL)) for i in range(2)]
    for handle in burst:
        await p.wait_phase(handle, RunPhase.Ready)
    backlog = [await p.start(run_manifest(f"burst-{i}", runtime=rt, tenant="burst", **TTL)) for i in (2, 3)]

    async def queued(n: int) -> bool:
        return len((await p.pool("fair")).queue) == n

    await eventually(lambda: queued(2), "the burst's backlog queued")
    over = await p.start(run_manifest("burst-4", runtime=rt, tenant="burst", **TTL))
    await failed(over)
    steady = await p.start(run_manifest("steady-0", runtime=rt, tenant="steady", **TTL))
    await eventually(lambda: queued(3), "the steady tenant's Run queued")
    await burst[0].signal(SIGNAL_CANCEL)
    await closed(burst[0])
    await p.wait_phase(steady, RunPhase.Ready)
    for h in (steady, burst[1], *backlog):
        await h.signal(SIGNAL_CANCEL)
        await closed(h)
    await write(p.client.get_workflow_handle(pool_workflow_id(rt)), "pool_fair_queue")
    await behind_queue_scenario(p)


async def behind_queue_scenario(p: Platform) -> None:
    """A Run that finds a free slot while another waits (a Dedicated tenant's, behind its own
    scale-out) queues behind it and is placed in fair order at the batch's end."""
    rt = p.runtime("fair2")

    async def warm() -> bool:
        return any(h.state is HostState.Ready for h in (await p.pool("fair2")).hosts)

    await eventually(warm, "the shared host of fair2 Ready")
    own = await p.start(run_manifest("own-0", runtime=rt, tenant="own", **TTL))

    async def waiting() -> bool:
        state = await p.pool("fair2")
        if len(state.hosts) > 1:
            raise AssertionError("the Dedicated host was Ready before the shared Run came: record again")
        return len(state.queue) == 1 and bool(state.scaleOuts)

    await eventually(waiting, "the Dedicated tenant's Run queued behind its scale-out")
    shared = await p.start(run_manifest("shared-0", runtime=rt, **TTL))
    await p.wait_phase(shared, RunPhase.Ready)
    await p.wait_phase(own, RunPhase.Ready)
    for h in (shared, own):
        await h.signal(SIGNAL_CANCEL)
        await closed(h)
    await write(p.client.get_workflow_handle(pool_workflow_id(rt)), "pool_fair_behind_queue")


SLOW_LOAD = "import time\ntime.sleep(8)\ndef handle(p):\n    return p\n"  # outlasts a Run's task timeout


async def slow_scenarios(p: Platform) -> None:
    """Runs whose registration takes longer than their workflow task timeout (the handler loads
    for 8 s): created by the SDK, the handoff gives the registration up and an ordinary activity
    does it; started plainly, the registration's local activity gives up after its bound and an
    ordinary activity does it."""
    rt = p.runtime("python")
    warm = await p.start(run_manifest("slow-warm", runtime=rt), by_sdk=True)
    await p.wait_phase(warm, RunPhase.Ready, timeout=90)
    handed = await p.start(run_manifest("slow-handed", runtime=rt, source=SLOW_LOAD, **TTL), by_sdk=True)
    await p.wait_phase(handed, RunPhase.Ready, timeout=120)
    plain = await p.start(run_manifest("slow-plain", runtime=rt, source=SLOW_LOAD, **TTL))
    await p.wait_phase(plain, RunPhase.Ready, timeout=120)
    for handle in (handed, plain):
        await handle.signal(SIGNAL_CANCEL)
        await closed(handle)
    await write(handed, "run_register_slow_handoff")
    await write(plain, "run_register_slow_local")


async def ending_scenarios(p: Platform) -> None:
    """Runs that close their workflow when they finish (Completed or Failed), each handing its
    execution to a RetentionWorkflow, with KrtHost indexed; and a scheduled Run."""
    py = p.runtime("python")

    # A task that succeeds: Completed with its status (kept a minute, to be written).
    run = task_manifest("closed-ok", runtime=py, **KEEP)
    h = await p.start(run, by_sdk=True)
    await write_closed(h, "run_closed_succeeded")

    # Another, whose retention deletes it a second after it closed.
    run = task_manifest("closed-gone", runtime=py, **TTL)
    h = await p.start(run, by_sdk=True)
    await closed(h)
    retention = retention_of(p, run)
    await write_closed(retention, "retention_deleted")

    # A handler that cannot load: Failed with an ApplicationError of type RetriesExhausted.
    h = await p.start(
        run_manifest(
            "closed-failed",
            runtime=py,
            source=EXITS_LOADING,
            retryPolicy={"limit": 1},
            **KEEP,
        ),
        by_sdk=True,
    )
    await failed(h)
    await write(h, "run_closed_failed")

    # Idle timeout: Failed with type IdleTimeout.
    h = await p.start(
        run_manifest("closed-idle", runtime=py, mode={"function": {"idleTimeoutSeconds": 1}}, **KEEP)
    )
    await failed(h)
    await write(h, "run_closed_timeout")

    # Ready, then cancelled: Completed with the Cancelled status.
    h = await p.start(run_manifest("closed-cancelled", runtime=py, **KEEP), by_sdk=True)
    await p.wait_phase(h, RunPhase.Ready)
    await h.signal(SIGNAL_CANCEL)
    await write_closed(h, "run_closed_cancelled")

    # Ready, then deleted: it indexes KrtPhase=Deleted before it closes (mark-deleted), and its
    # retention deletes the execution at once.
    run = run_manifest("closed-deleted", runtime=py, **KEEP)
    h = await p.start(run, by_sdk=True)
    await p.wait_phase(h, RunPhase.Ready)
    answer = await h.execute_update(UPDATE_DELETE, result_type=str)
    assert answer == f"deleted {h.id}: Cancelled", answer
    await write_closed(h, "run_deleted_marked")
    retention = retention_of(p, run)
    await write_closed(retention, "retention_deleted_with_its_run")

    # Finished and kept, then deleted: its retention's delete_now ends the wait (marked first).
    run = task_manifest("kept-deleted", runtime=py, **KEEP)
    h = await p.start(run, by_sdk=True)
    await closed(h)
    retention = retention_of(p, run)
    await retention.signal(SIGNAL_DELETE_NOW)
    await write_closed(retention, "retention_delete_now")

    # A schedule's start: one task Run named after the schedule and the time.
    template = task_manifest("nightly", runtime=py, **KEEP)
    template = template._replace(metadata=template.metadata._replace(uid=None))
    h = await p.client.start_workflow(
        "ScheduledRunWorkflow",
        ScheduledRunInput(run=template, schedule="nightly"),
        id=scheduled_workflow_id("default", "nightly") + "-recorded",
        task_queue=p.settings.run_task_queue,
    )
    await write_closed(h, "scheduled_run")


async def function_scenarios(p: Platform) -> None:
    py = p.runtime("python")

    # A Function: two replicas Ready, a scale-only apply, a new template rolled out (revision 1's
    # replicas deleted once revision 2's are Ready), scaled, rolled back, then deleted.
    fn = function_manifest("fn", runtime=py, scale={"min": 2, "max": 3}, env={"V": "1"})
    h = await start_function(p, fn)
    await function_rolled_out(p, h, revision=1, ready=2)
    first = await replicas_of(h)
    rescaled = fn._replace(spec=fn.spec._replace(scale=fn.spec.scale._replace(max=4)))
    await h.execute_update(UPDATE_APPLY, rescaled, result_type=ApplyResult)
    await h.execute_update(
        UPDATE_APPLY, rescaled._replace(spec=rescaled.spec._replace(env={"V": "2"})), result_type=ApplyResult
    )
    await function_rolled_out(p, h, revision=2, ready=2)
    old_replica = run_workflow_id(fn.metadata.namespace, first[0].name)
    await write_closed(p.client.get_workflow_handle(old_replica), "run_replica_deleted")
    await h.execute_update(UPDATE_SCALE, ScaleInput(replicas=3), result_type=ScaleResult)
    await function_rolled_out(p, h, revision=2, ready=3)
    await h.execute_update(UPDATE_ROLLBACK, result_type=ApplyResult)
    await function_rolled_out(p, h, revision=3, ready=3)
    await write(h, "function_rolled_out")  # still running
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_deleted")

    # A template whose handler cannot load: each replica fails before Ready, the next waits a
    # growing backoff; a replica's workflow terminated from outside is replaced too; deleted.
    broken = function_manifest("broken", runtime=py, source=UNLOADABLE, retryPolicy={"limit": 1})
    h = await start_function(p, broken)

    async def failing_twice() -> bool:
        failure = (await function_status(h)).condition("ReplicaFailure")
        return failure is not None and failure.message.startswith(("2 replicas", "3 replicas"))

    await eventually(failing_twice, "two replicas of a broken template failed")
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_broken_deleted")

    # A replica whose workflow is terminated (not by its Function): replaced.
    fn = function_manifest("terminated", runtime=py)
    h = await start_function(p, fn)
    await function_rolled_out(p, h, revision=1, ready=1)
    [replica] = await replicas_of(h)
    await p.client.get_workflow_handle(run_workflow_id(fn.metadata.namespace, replica.name)).terminate(
        "recorded"
    )

    async def replaced() -> bool:
        now = await replicas_of(h)
        return len(now) == 1 and now[0].runUid != replica.runUid and now[0].phase == "Ready"

    await eventually(replaced, "the terminated replica replaced")
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_replica_terminated")

    # A Run that says it is a replica, started by a client: Failed, NotStartedByFunction.
    run = run_manifest("impostor", runtime=py, **TTL)
    impostor = await p.client.start_workflow(
        "RunWorkflow",
        RunInput(run=run, replicaOf=ReplicaOf(functionUid=str(uuid.uuid4()), functionName="fn", revision=1)),
        id=run_workflow_id(run.metadata.namespace, run.metadata.name),
        task_queue=p.settings.run_task_queue,
    )
    p.started.append(impostor)
    await write_closed(impostor, "run_replica_refused")


SLEEPS = "import time\ndef handle(p):\n    time.sleep(0.3)\n    return p\n"
QUICK_SCALE = {"stableWindowSeconds": 6, "scaleDownDelaySeconds": 2, "targetConcurrency": 1}


async def autoscale_scenarios(p: Platform) -> None:
    py = p.runtime("python")

    # Autoscaled (min 1, max 3): a load on its replica's host (one running, more queued there)
    # scales it up; once the load is gone, back down to one. Written running, then deleted.
    fn = function_manifest(
        "auto",
        runtime=py,
        source=SLEEPS,
        mode={"function": {"concurrency": 1, "queue": 8}},
        scale={**QUICK_SCALE, "min": 1, "max": 3},
    )
    h = await start_function(p, fn)
    await function_rolled_out(p, h, revision=1, ready=1)
    [replica] = await replicas_of(h)
    status = await p.status(p.client.get_workflow_handle(run_workflow_id("default", replica.name)))  # type: ignore[arg-type]
    assert status.assignedHost is not None
    address = await address_of(p, status.assignedHost)
    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            await asyncio.to_thread(invoke_on_host, p.pki, address, replica.runUid)

    loads = [asyncio.create_task(load()) for _ in range(4)]
    try:

        async def scaled_up() -> bool:
            last = (await function_status(h)).lastScale
            return last is not None and last.wanted > last.previous

        await eventually(scaled_up, "scaled up by the autoscaler")
    finally:
        stop.set()
        await asyncio.gather(*loads, return_exceptions=True)

    async def scaled_down() -> bool:
        status = await function_status(h)
        return status.replicas.wanted == 1 and status.lastScale is not None and status.lastScale.previous > 1

    await eventually(scaled_down, "scaled down by the autoscaler")
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_autoscaled_deleted")

    # min 0: idle to zero replicas; a storm of wakes starts exactly one; deleted.
    fn = function_manifest("zero", runtime=py, source=SLEEPS, scale={**QUICK_SCALE, "min": 0, "max": 2})
    h = await start_function(p, fn)
    await function_rolled_out(p, h, revision=1, ready=1)

    async def at_zero() -> bool:
        status = await function_status(h)
        return status.replicas.wanted == 0 and status.replicas.total == 0

    await eventually(at_zero, "scaled to zero")
    await asyncio.gather(*(h.signal(SIGNAL_FUNCTION_WAKE) for _ in range(5)))

    async def woken() -> bool:
        status = await function_status(h)
        return status.replicas.ready == 1 and status.replicas.total == 1

    await eventually(woken, "one replica after the wakes")
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_woken_deleted")


async def function_continue_scenarios(p: Platform) -> None:
    """Recorded alone: the server suggests continue-as-new after 40 events."""
    fn = function_manifest("continued", runtime=p.runtime("python"), scale={"min": 1, "max": 2})
    h = await start_function(p, fn)
    first_run = (await h.describe()).run_id
    await function_rolled_out(p, h, revision=1, ready=1)
    wanted = 1

    async def continued() -> bool:
        nonlocal wanted
        if (await h.describe()).run_id != first_run:
            return True
        wanted = 3 - wanted
        await h.execute_update(UPDATE_SCALE, ScaleInput(replicas=wanted), result_type=ScaleResult)
        return False

    await eventually(continued, "the Function continued as new")
    await write(p.client.get_workflow_handle(h.id, run_id=first_run), "function_continued")
    await function_rolled_out(p, h, revision=1, ready=wanted)
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(p.client.get_workflow_handle(h.id), "function_continued_deleted")


async def failed(handle: WorkflowHandle[Any, Any], timeout: float = 60.0) -> None:
    try:
        await asyncio.wait_for(handle.result(), timeout)
    except WorkflowFailureError:
        return
    raise AssertionError(f"{handle.id} did not fail")


async def traffic_scenarios(p: Platform) -> None:
    py = p.runtime("python")

    # A canary: revision 2 applied with 50% of the traffic, revision 1 keeping its replica (one
    # terminated from outside is replaced by another of revision 1); then all to the latest:
    # revision 1's replica deleted; then the Function deleted.
    fn = function_manifest("canary", runtime=py, scale={"min": 1, "max": 1}, env={"V": "1"})
    h = await start_function(p, fn)
    await function_rolled_out(p, h, revision=1, ready=1)
    split = [TrafficTarget(revision=1, percent=50), TrafficTarget(revision=0, percent=50)]
    canary = fn._replace(spec=fn.spec._replace(env={"V": "2"}, traffic=split))
    await h.execute_update(UPDATE_APPLY, canary, result_type=ApplyResult)

    async def both(older: str = "") -> bool:
        ready = [r for r in await replicas_of(h) if r.phase == "Ready"]
        return sorted(r.revision for r in ready) == [1, 2] and older not in {r.name for r in ready}

    await eventually(both, "a Ready replica of revisions 1 and 2")
    assert [(t.revision, t.percent) for t in (await function_status(h)).traffic] == [(1, 50), (2, 50)]
    [older] = [r for r in await replicas_of(h) if r.revision == 1]
    await p.client.get_workflow_handle(run_workflow_id("default", older.name)).terminate("gone")  # type: ignore[arg-type]
    await eventually(lambda: both(older.name), "revision 1's replica replaced")
    latest = canary._replace(spec=canary.spec._replace(traffic=[TrafficTarget(revision=0, percent=100)]))
    await h.execute_update(UPDATE_APPLY, latest, result_type=ApplyResult)
    await function_rolled_out(p, h, revision=2, ready=1)
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_split_deleted")


async def split_wanted_scenarios(p: Platform) -> None:
    # A canary dividing the replicas wanted (patch function-split-wanted): 4 of revision 1, then
    # revision 2 with 25% of the traffic: 1 of revision 2 and 3 of revision 1 (one deleted), not
    # 4 + 1; then all to the latest: 4 of revision 2, revision 1's deleted; then the Function.
    fn = function_manifest("divided", runtime=p.runtime("python"), scale={"min": 4, "max": 4}, env={"V": "1"})
    h = await start_function(p, fn)
    await function_rolled_out(p, h, revision=1, ready=4)
    split = [TrafficTarget(revision=1, percent=75), TrafficTarget(revision=0, percent=25)]
    canary = fn._replace(spec=fn.spec._replace(env={"V": "2"}, traffic=split))
    await h.execute_update(UPDATE_APPLY, canary, result_type=ApplyResult)

    async def divided() -> bool:
        replicas = await replicas_of(h)
        return (
            sorted(r.revision for r in replicas if r.phase == "Ready") == [1, 1, 1, 2] and len(replicas) == 4
        )

    await eventually(divided, "3 Ready replicas of revision 1 and 1 of revision 2, no other")
    status = await function_status(h)
    assert (status.replicas.wanted, status.replicas.ready, status.observedRevision) == (4, 4, 2), status
    latest = canary._replace(spec=canary.spec._replace(traffic=None))
    await h.execute_update(UPDATE_APPLY, latest, result_type=ApplyResult)
    await function_rolled_out(p, h, revision=2, ready=4)
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_split_divided_deleted")


async def zero_failing_scenarios(p: Platform) -> None:
    # A Function of a broken template with min 0 (patch function-zero-failing-phase): its first
    # replica fails before Ready, then it scales to zero wanted, and stays Pending (not Ready)
    # with its ReplicaFailure condition; then deleted.
    broken = function_manifest(
        "zerobroken",
        runtime=p.runtime("python"),
        source=UNLOADABLE,
        retryPolicy={"limit": 1},
        scale={**QUICK_SCALE, "min": 0, "max": 1},
    )
    h = await start_function(p, broken)

    async def at_zero_not_ready() -> bool:
        status = await function_status(h)
        failure = status.condition("ReplicaFailure")
        return (
            status.replicas.wanted == 0
            and failure is not None
            and failure.status == "True"
            and status.phase.value == "Pending"
        )

    await eventually(at_zero_not_ready, "no replica wanted, the last failed, the Function Pending")
    await h.execute_update(UPDATE_DELETE, result_type=str)
    await write_closed(h, "function_zero_broken_deleted")


GROUPS = {
    "runs": scenarios,
    "hosts": host_scenarios,
    "scale": scale_scenarios,
    "apart": apart_scenarios,
    "slow": slow_scenarios,
    "endings": ending_scenarios,
    "alarm": alarm_scenarios,
    "since": since_scenarios,
    "queues": queue_scenarios,
    "tenants": tenant_scenarios,
    "fair": fair_scenarios,
    "functions": function_scenarios,
    "function_continue": function_continue_scenarios,
    "autoscale": autoscale_scenarios,
    "traffic": traffic_scenarios,
    "split_wanted": split_wanted_scenarios,
    "zero_failing": zero_failing_scenarios,
}
ALONE = {"scale", "apart", "function_continue"}  # their server continues workflows as new early


async def main(groups: list[str]) -> None:
    HISTORIES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="krt-record-") as tmp:
        alone = ALONE & set(groups)
        if alone and len(groups) > 1:
            raise SystemExit(
                f"the {sorted(alone)[0]} group is recorded alone (its server continues pools as new early)"
            )
        server = DevServer(
            state_dir=Path(tmp) / "temporal",
            persistent=False,
            extra_dynamic_config=("limit.historyCount.suggestContinueAsNew=40",) if alone else (),
        )
        server.start()
        state_dir = Path(tmp) / "state"
        pki = TestPKI.create(Path(tmp) / "pki")
        try:
            client = await connect(server.address, "default")
            suffix = uuid.uuid4().hex[:6]
            runtimes = {
                name: f"{name}-{suffix}"
                for name in (
                    "py",
                    "one",
                    "at",
                    "lost",
                    "ops",
                    "idle",
                    "once",
                    "stuck",
                    "can",
                    "queued",
                    "grp",
                    "grp1",
                    "fair",
                    "fair2",
                )
            }
            runtimes["python"], runtimes["attach"] = runtimes.pop("py"), runtimes.pop("at")
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
                        *(
                            [
                                {"name": runtimes["lost"], "adapter": "python", "minHosts": 2, "maxHosts": 3},
                                {"name": runtimes["ops"], "adapter": "python", "minHosts": 2, "maxHosts": 4,
                                 "assignmentTimeoutSeconds": 0.5},
                                {"name": runtimes["idle"], "adapter": "python", "runs": 1, "minHosts": 1,
                                 "maxHosts": 3, "scaleInDelaySeconds": 1.0},
                                {"name": runtimes["once"], "adapter": "python", "oneshot": True, "minHosts": 1,
                                 "maxHosts": 2},
                                {"name": runtimes["stuck"], "adapter": "python", "maxHosts": 2,
                                 "assignmentTimeoutSeconds": 1.0},
                            ]
                            if "hosts" in groups
                            else []
                        ),
                        *(
                            [{"name": runtimes["idle"], "adapter": "python", "runs": 1, "minHosts": 1,
                              "maxHosts": 3, "scaleInDelaySeconds": 1.0}]
                            if "alarm" in groups and "hosts" not in groups
                            else []
                        ),
                        *(
                            [{"name": runtimes["can"], "adapter": "python", "runs": 20, "maxHosts": 1}]
                            if alone
                            else []
                        ),
                        *(
                            [{"name": runtimes["queued"], "adapter": "python", "runs": 2, "maxHosts": 1}]
                            if "queues" in groups
                            else []
                        ),
                        *(
                            [{"name": runtimes["grp"], "adapter": "python", "runs": 2, "maxHosts": 2},
                             {"name": runtimes["grp1"], "adapter": "python", "runs": 1, "maxHosts": 1}]
                            if "tenants" in groups
                            else []
                        ),
                        *(
                            [{"name": runtimes["fair"], "adapter": "python", "runs": 2, "maxHosts": 1},
                             {"name": runtimes["fair2"], "adapter": "python", "runs": 2, "minHosts": 1,
                              "maxHosts": 2}]
                            if "fair" in groups
                            else []
                        ),
                    ],
                    "tenants": [*(TENANT_GROUP if "tenants" in groups else []),
                                *(FAIR_TENANTS if "fair" in groups else [])],
                }
            )  # fmt: skip
            settings = WorkerSettings(
                temporal=TemporalSettings(address=server.address, namespace="default"),
                config=config,
                platform=PlatformInfo(
                    gatewayUrl="https://127.0.0.1:8443",
                    stateDir=str(state_dir),
                    heartbeatIntervalSeconds=BEAT_S if "hosts" in groups else 5.0,
                ),
                trust=pki.worker_trust(),
            )
            platform = Platform(client, state_dir, runtimes, settings, pki)
            try:
                async with running_workers(client, settings):
                    try:
                        for group in groups:
                            await GROUPS[group](platform)
                    finally:
                        await platform.terminate("recording finished")
            finally:
                await stop_all(state_dir)
        finally:
            server.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)  # the expected failures
    chosen = sys.argv[1:] or list(GROUPS)
    unknown = set(chosen) - set(GROUPS)
    if unknown:
        raise SystemExit(f"unknown groups {sorted(unknown)}; there are {sorted(GROUPS)}")
    asyncio.run(main(chosen))
