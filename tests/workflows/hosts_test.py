"""Host lifecycle end to end (real dev server, worker, host processes): a killed or frozen host is
fenced before its Runs move, without spending their retry policy; a registration removed behind
the platform's back is registered again; idle hosts scale in down to minHosts; a stuck host is
deleted and replaced; one-shot hosts serve one task each; operators drain and delete hosts through
Updates; cleanup never retries against a host proven gone."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from kruntimes.activities.hosts.process import list_records, work_root
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.host import HostActionInput, HostActionResult, HostResult, ProviderReport
from kruntimes.contracts.names import (
    SIGNAL_CANCEL,
    SIGNAL_PROVIDER_REPORT,
    UPDATE_DELETE_HOST,
    UPDATE_DRAIN_HOST,
    cleanup_workflow_id,
)
from kruntimes.contracts.providers import CreatedHost
from kruntimes.decisions.hostlife import HostEnd
from kruntimes.decisions.scheduling.model import HostState
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.wire import search
from tests.support.procs import alive, frozen
from tests.workflows.conftest import Platform, run_manifest
from tests.workflows.platform_hosts import (
    BEAT_S,
    address_of,
    host_handle,
    host_serving,
    ready_elsewhere,
    registrations,
    start_supervisor,
    tell_pool,
)

TASK = "def run(p):\n    return {'done': True}\n"


def record_of(platform: Platform, host_id: str) -> CreatedHost:
    return next(r for r in list_records(platform.state_dir) if r.hostId == host_id)


async def host_ended(platform: Platform, host_id: str, timeout: float = 60.0) -> HostResult:
    return await asyncio.wait_for(host_handle(platform, host_id).result(), timeout)


async def phases(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The Run's phases in the order its history indexed them."""
    found = []
    async for event in handle.fetch_history_events():
        attrs = event.upsert_workflow_search_attributes_event_attributes
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            payload = attrs.search_attributes.indexed_fields.get(search.PHASE)
            if payload is not None:
                found.append(payload.data.decode().strip('"'))
    return found


async def test_a_killed_host_is_fenced_and_its_run_moves_without_spending_its_retries(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 2, "maxHosts": 3}) as platform:
        run = run_manifest("phoenix", runtime=platform.runtime(), retryPolicy={"limit": 1})
        handle = await platform.start(run)
        before = await platform.wait_phase(handle, RunPhase.Ready)
        record = record_of(platform, before.assignedHost)
        workspaces = work_root(platform.state_dir) / record.hostUid
        assert record.pid is not None and workspaces.exists()
        os.kill(record.pid, signal.SIGKILL)  # our own host process

        after = await ready_elsewhere(platform, handle, before.assignedHostUID)

        assert (after.attempt, after.recoveries) == (before.attempt + 1, 1)
        assert after.endpoint == before.endpoint, "the same URL"
        ended = await host_ended(platform, before.assignedHost)
        assert (ended.state, ended.reason) == (HostState.Lost, HostEnd.Lost)
        assert "Unreachable" in ended.message and "fenced" in ended.message
        assert not workspaces.exists(), "the dead host's workspaces are removed"
        history = await phases(handle)
        first_ready = history.index("Ready")
        assert history[first_ready:] == ["Ready", "Running", "Pending", "Running", "Ready"]
        pool = await platform.pool()
        assert before.assignedHostUID not in {h.hostUid for h in pool.hosts}
        assert [r.hostUid for r in pool.reservations] == [after.assignedHostUID]
        assert run.metadata.uid in registrations(platform.pki, await address_of(platform, after.assignedHost))


async def test_a_provider_report_fences_only_the_incarnation_it_names(platform_factory) -> None:  # type: ignore[no-untyped-def]
    """A pod watch's report ends the host it names (fenced, its Run moves to the same URL); a
    report about an older incarnation of the same host id is ignored."""
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 2, "maxHosts": 3}) as platform:
        handle = await platform.start(run_manifest("reported", runtime=platform.runtime()))
        before = await platform.wait_phase(handle, RunPhase.Ready)
        await host_serving(platform, before.assignedHost)
        host = host_handle(platform, before.assignedHost)
        older = ProviderReport(reason="OlderPodDeleted", hostUid=str(uuid.uuid4()))
        await host.signal(SIGNAL_PROVIDER_REPORT, older)
        current = ProviderReport(reason="PodDeleted", message="seen deleted", hostUid=before.assignedHostUID)
        await host.signal(SIGNAL_PROVIDER_REPORT, current)

        ended = await host_ended(platform, before.assignedHost)
        after = await ready_elsewhere(platform, handle, before.assignedHostUID)

        assert (ended.state, ended.reason) == (HostState.Lost, HostEnd.Lost)
        assert "PodDeleted: seen deleted" in ended.message and "OlderPodDeleted" not in ended.message
        assert after.endpoint == before.endpoint


async def test_a_frozen_host_is_killed_before_its_run_registers_elsewhere(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 2, "maxHosts": 3}) as platform:
        handle = await platform.start(run_manifest("frozen", runtime=platform.runtime()))
        before = await platform.wait_phase(handle, RunPhase.Ready)
        record = record_of(platform, before.assignedHost)
        assert record.pid is not None
        with frozen(record.pid):
            after = await ready_elsewhere(platform, handle, before.assignedHostUID)
            assert not alive(record.pid), "fenced: the frozen host was killed before the Run moved"
        assert after.recoveries == 1
        ended = await host_ended(platform, before.assignedHost)
        assert ended.state is HostState.Lost and "Silent" in ended.message


async def test_a_registration_removed_behind_the_platforms_back_is_registered_again(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 1}) as platform:
        run = run_manifest("again", runtime=platform.runtime())
        handle = await platform.start(run)
        before = await platform.wait_phase(handle, RunPhase.Ready)
        await host_serving(platform, before.assignedHost)  # its watch sees every change from now on
        address = await address_of(platform, before.assignedHost)
        old = registrations(platform.pki, address)[run.metadata.uid]  # type: ignore[index]
        with platform.pki.channel(address, as_=platform.pki.control_plane) as channel:
            pb_grpc.FunctionRuntimeStub(channel).UnregisterFunction(
                pb.UnregisterFunctionRequest(registration_id=old), timeout=30
            )

        async def registered_again() -> bool:
            return registrations(platform.pki, address).get(run.metadata.uid, old) != old  # type: ignore[arg-type]

        await platform.eventually(registered_again, timeout=30, what="a new registration on the same host")
        after = await platform.wait_phase(handle, RunPhase.Ready)
        assert (after.attempt, after.recoveries, after.assignedHostUID) == (1, 0, before.assignedHostUID)
        history = await phases(handle)
        assert history[history.index("Ready") :] == ["Ready", "Running", "Ready"]


async def test_idle_hosts_scale_in_down_to_the_warm_minimum(platform_factory) -> None:  # type: ignore[no-untyped-def]
    settings = {"runs": 1, "minHosts": 1, "maxHosts": 3, "scaleInDelaySeconds": 1.0}
    async with platform_factory(heartbeat_s=BEAT_S, python=settings) as platform:
        handles = [await platform.start(run_manifest(f"s{i}", runtime=platform.runtime())) for i in range(2)]
        statuses = [await platform.wait_phase(h, RunPhase.Ready) for h in handles]
        hosts = {s.assignedHost for s in statuses}
        assert len(hosts) == 2
        for h in handles:
            await h.signal(SIGNAL_CANCEL)
        for h in handles:
            await platform.wait_phase(h, RunPhase.Cancelled)

        async def one_left() -> bool:
            return len((await platform.pool()).hosts) == 1

        await platform.eventually(one_left, timeout=60, what="scale-in to one host")
        [kept] = (await platform.pool()).hosts
        [gone] = hosts - {kept.hostId}
        ended = await host_ended(platform, gone)  # type: ignore[arg-type]
        assert (ended.state, ended.reason) == (HostState.Terminating, HostEnd.ScaledIn)
        assert all(r.hostId != gone for r in list_records(platform.state_dir))
        assert [h.hostId for h in (await platform.pool()).hosts] == [kept.hostId], "never below minHosts"


async def test_a_host_stuck_before_ready_is_deleted_and_replaced_for_the_run_that_needs_it(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    settings = {"minHosts": 0, "maxHosts": 2, "assignmentTimeoutSeconds": 1.0}
    async with platform_factory(heartbeat_s=BEAT_S, python=settings) as platform:
        runtime = platform.runtime()
        # A host created as the scale-out creates one, frozen before its supervisor ever heard it.
        stuck = await platform.create_host("stuck")
        assert stuck.pid is not None
        with frozen(stuck.pid):
            await start_supervisor(platform, stuck, await tell_pool(platform, stuck))
            # The pool believes the host Ready and assigns a Run to it; the registration hangs.
            handle = await platform.start(run_manifest("needs-a-host", runtime=runtime))
            ended = await host_ended(platform, stuck.hostId)
            assert (ended.state, ended.reason) == (HostState.Terminating, HostEnd.Stuck)
            assert not alive(stuck.pid)
            status = await platform.wait_phase(handle, RunPhase.Ready, timeout=60)
        assert status.assignedHostUID != stuck.hostUid, "a new host replaced the stuck one"
        assert stuck.hostUid not in {h.hostUid for h in (await platform.pool()).hosts}


async def test_a_one_shot_runtime_gives_each_task_a_fresh_host_deleted_when_it_ends(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(
        heartbeat_s=BEAT_S, python={"oneshot": True, "minHosts": 1, "maxHosts": 2}
    ) as platform:
        used = []
        for i in range(2):
            run = run_manifest(
                f"once-{i}", runtime=platform.runtime(), source=TASK, handler="main:run", mode={"task": {}}
            )
            handle = await platform.start(run)
            done = await platform.wait_phase(handle, RunPhase.Succeeded)
            assert done.outputs == {"done": True}
            ended = await host_ended(platform, done.assignedHost)  # type: ignore[arg-type]
            assert (ended.state, ended.reason) == (HostState.Terminating, HostEnd.Released)
            used.append(done.assignedHostUID)
        assert len(set(used)) == 2, "every task had a host of its own"

        async def warm_again() -> bool:
            pool = await platform.pool()
            return [h.state for h in pool.hosts] == [HostState.Ready] and pool.hosts[0].hostUid not in used

        await platform.eventually(warm_again, timeout=30, what="a fresh warm host for the next task")


async def test_an_operator_drains_a_host_its_run_moves_and_the_host_is_deleted(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 2, "maxHosts": 3}) as platform:
        handle = await platform.start(run_manifest("moving", runtime=platform.runtime()))
        before = await platform.wait_phase(handle, RunPhase.Ready)
        drained = await host_handle(platform, before.assignedHost).execute_update(
            UPDATE_DRAIN_HOST,
            HostActionInput(message="maintenance", requestedBy="ops"),
            result_type=HostActionResult,
        )
        assert drained.accepted and drained.state is HostState.Draining
        after = await ready_elsewhere(platform, handle, before.assignedHostUID)
        assert after.recoveries == 1 and after.attempt == before.attempt + 1
        ended = await host_ended(platform, before.assignedHost)
        assert (ended.state, ended.reason) == (HostState.Terminating, HostEnd.Drained)
        history = await phases(handle)
        assert history[history.index("Ready") :] == ["Ready", "Running", "Pending", "Running", "Ready"]
        updates = [
            e
            async for e in host_handle(platform, before.assignedHost).fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
        ]
        assert len(updates) == 1, "the drain is on the host's record"


async def test_an_operator_deletes_a_host_its_run_moves_once_it_is_gone(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 2, "maxHosts": 3}) as platform:
        handle = await platform.start(run_manifest("evicted", runtime=platform.runtime()))
        before = await platform.wait_phase(handle, RunPhase.Ready)
        record = record_of(platform, before.assignedHost)
        deleted = await host_handle(platform, before.assignedHost).execute_update(
            UPDATE_DELETE_HOST, HostActionInput(), result_type=HostActionResult
        )
        assert deleted.accepted and deleted.state is HostState.Terminating
        assert record.pid is not None and not alive(record.pid), "acknowledged once it is gone"
        after = await ready_elsewhere(platform, handle, before.assignedHostUID)
        assert after.recoveries == 1
        ended = await host_ended(platform, before.assignedHost)
        assert ended.reason == HostEnd.Deleted


async def test_cleanup_never_retries_against_a_host_proven_gone(platform_factory) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 1}) as platform:
        run = run_manifest("orphaned", runtime=platform.runtime())
        handle = await platform.start(run)
        before = await platform.wait_phase(handle, RunPhase.Ready)
        record = record_of(platform, before.assignedHost)
        assert record.pid is not None
        os.kill(record.pid, signal.SIGKILL)
        await handle.signal(SIGNAL_CANCEL)  # before or after the loss is known: either way
        await platform.wait_phase(handle, RunPhase.Cancelled)
        cleanup = platform.client.get_workflow_handle(cleanup_workflow_id(run.metadata.uid))  # type: ignore[arg-type]
        await asyncio.wait_for(cleanup.result(), 30)
        attempts = [
            e.activity_task_started_event_attributes.attempt
            async for e in cleanup.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        ]
        assert attempts in ([], [1]), f"no retry against the dead host: {attempts}"
