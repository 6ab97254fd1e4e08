"""A Run whose host is lost but cannot be fenced stays off Ready and registers nowhere else until
a fence holds (the seed's first safety rule), through a real HostWorkflow: the host's supervisor
runs in this test's own worker, whose process provider withholds every fence until the test lets
one through."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.worker import Worker

from kruntimes.activities.host_manager import HostActivities
from kruntimes.activities.host_watch import HostWatchActivities, signal_ready_with, signal_run_with
from kruntimes.activities.hosts import HostManager, ProcessProvider
from kruntimes.activities.hosts.base import Fenced
from kruntimes.api.phases import RunPhase
from kruntimes.api.status import ConditionReason, ConditionStatus, ConditionType, RunStatus
from kruntimes.contracts.host import HostInput, HostRecord, HostResult
from kruntimes.contracts.names import QUERY_HOST, host_workflow_id, pool_workflow_id
from kruntimes.contracts.providers import CreatedHost
from kruntimes.decisions.scheduling.model import HostState
from kruntimes.wire import search
from kruntimes.workflows.host import HostWorkflow
from tests.support.procs import alive, frozen
from tests.support.waiting import eventually
from tests.workflows.conftest import Platform, run_manifest
from tests.workflows.platform_hosts import BEAT_S, registrations, tell_pool


class WithheldFence(ProcessProvider):
    """The process provider, except that no fence holds until `release` is set: each fence
    until then is counted and answered "not fenced" (as an unreachable attached host is)."""

    def __init__(self, platform: Platform) -> None:
        super().__init__(state_dir=platform.state_dir, issuer=platform.pki.issuer())
        self.release = asyncio.Event()
        self.withheld = 0
        self.let_through_at: datetime | None = None  # when the first fence that could hold began

    async def fence(self, host: CreatedHost) -> Fenced:
        if not self.release.is_set():
            self.withheld += 1
            return Fenced(False, "the test withholds the fence")
        self.let_through_at = self.let_through_at or datetime.now(UTC)
        return await super().fence(host)


@asynccontextmanager
async def supervising(platform: Platform, provider: WithheldFence) -> AsyncIterator[str]:
    """This test's worker, serving HostWorkflows (and their watch, fence and delete) on a task
    queue of its own with `provider`; the task queue."""
    queue = f"unfenced-{uuid.uuid4().hex[:6]}"
    manager = HostActivities(HostManager([provider]))
    client = platform.client
    watch = HostWatchActivities(signal_run=signal_run_with(client), signal_ready=signal_ready_with(client))
    activities = [manager.fence_host, manager.delete_host, watch.watch_host]
    async with Worker(client, task_queue=queue, workflows=[HostWorkflow], activities=activities):
        yield queue


async def phase_times(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, datetime]]:
    """The Run's phases in the order its history indexed them, each with when it was indexed."""
    found = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            attrs = event.upsert_workflow_search_attributes_event_attributes
            payload = attrs.search_attributes.indexed_fields.get(search.PHASE)
            if payload is not None:
                found.append(
                    (payload.data.decode().strip('"'), event.event_time.ToDatetime().replace(tzinfo=UTC))
                )
    return found


def ready(status: RunStatus) -> tuple[str, str] | None:
    """The Run's Ready condition: its status and reason."""
    found = status.condition(ConditionType.Ready)
    return None if found is None else (found.status, found.reason)


async def test_a_run_whose_lost_host_cannot_be_fenced_waits_off_ready_until_a_fence_holds(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    async with platform_factory(heartbeat_s=BEAT_S, python={"minHosts": 0, "maxHosts": 3}) as platform:
        provider = WithheldFence(platform)
        async with supervising(platform, provider) as queue:
            runtime = platform.runtime()
            created = await platform.create_host("unfenceable")
            assert created.pid is not None
            host = await platform.client.start_workflow(
                "HostWorkflow",
                HostInput(
                    host=await tell_pool(platform, created),
                    created=created,
                    poolWorkflowId=pool_workflow_id(runtime),
                    stateDir=str(platform.state_dir),
                    watchIntervalSeconds=BEAT_S,
                ),
                id=host_workflow_id(runtime, created.hostId),
                task_queue=queue,
                result_type=HostResult,
            )
            run = run_manifest("unfenced", runtime=runtime)
            handle = await platform.start(run)
            before = await platform.wait_phase(handle, RunPhase.Ready)
            assert before.assignedHostUID == created.hostUid, "the pool's only host"

            with frozen(created.pid):
                # Lost (silent), not fenced: the Run leaves Ready at once.
                lost = await platform.wait_phase(handle, RunPhase.Running)
                # The HostWorkflow went round its unfenced loop again: the pool heard "not
                # fenced" a full retry ago.
                await eventually(lambda: provider.withheld >= 2, within=60, what="a second withheld fence")
                waiting = await platform.status(handle)
                record = await host.query(QUERY_HOST, result_type=HostRecord)
                pool = await platform.pool()
                others = [h for h in pool.hosts if h.hostUid != created.hostUid and h.address]
                elsewhere = [
                    h.hostId
                    for h in others
                    if run.metadata.uid in registrations(platform.pki, h.address or "")
                ]

                provider.release.set()
                after = await platform.wait_phase(handle, RunPhase.Ready, timeout=60)
                assert not alive(created.pid), "the fence that held killed the frozen host"

            assert ready(lost) == (ConditionStatus.FALSE, ConditionReason.HostLost), (
                "off Ready for its lost host, not registering elsewhere"
            )
            assert waiting.phase is RunPhase.Running
            assert ready(waiting) == (ConditionStatus.FALSE, ConditionReason.HostLost)
            assert waiting.assignedHostUID == created.hostUid, "not registered elsewhere while unfenced"
            assert (waiting.recoveries, waiting.attempt) == (before.recoveries, before.attempt)
            assert elsewhere == [], "no other host holds the Run's registration while unfenced"
            assert (record.state, record.fenced) == (HostState.Lost, False)
            assert after.assignedHostUID != created.hostUid and after.recoveries == 1

            ended = await asyncio.wait_for(host.result(), 60)
            assert ended.state is HostState.Lost and "fenced:" in ended.message
            history = await phase_times(handle)
            first_ready = [p for p, _ in history].index("Ready")
            assert [p for p, _ in history[first_ready:]] == [
                "Ready",
                "Running",
                "Pending",
                "Running",
                "Ready",
            ]
            [(_, pending_at)] = [(p, at) for p, at in history[first_ready:] if p == "Pending"]
            # The old host may be seen gone (killed) before its HostWorkflow records the fence:
            # the Run may move from then on, never before a fence could hold.
            assert provider.let_through_at is not None
            assert pending_at >= provider.let_through_at, "the Run registers elsewhere only after the fence"
