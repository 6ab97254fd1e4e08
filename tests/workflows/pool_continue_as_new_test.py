"""The pool continues as new when Temporal suggests it, and keeps every reservation and host: the
reservations of a supervised host travel through its HostWorkflow, not the pool's carried state."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError
from temporalio.worker import Worker

from kruntimes.activities.hosts.process import stop_all
from kruntimes.api.phases import RunPhase
from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.host import HostRecord
from kruntimes.contracts.names import (
    POOL_READING_BACK,
    POOL_TASK_QUEUE,
    QUERY_HOST,
    QUERY_HOST_SLOTS_DIGEST,
    QUERY_POOL,
    SIGNAL_CANCEL,
    SIGNAL_CONFIGURE,
    SIGNAL_HOST_SLOTS,
    UPDATE_HOST_SLOTS,
    host_workflow_id,
    pool_workflow_id,
)
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.pool import PoolConfig, PoolInput, PoolState, pool_query_parts
from kruntimes.contracts.run import HostSlots, Slot, slots_digest
from kruntimes.decisions.scheduling.model import Host, HostState
from kruntimes.temporal.connect import DATA_CONVERTER, TemporalSettings, connect, query_pool
from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.assembly import running_workers
from kruntimes.workers.pools import pool_configs
from kruntimes.workers.settings import WorkerSettings
from kruntimes.workflows.host import HostWorkflow
from tests.support.pki import TestPKI
from tests.support.waiting import eventually
from tests.workflows.conftest import Platform, run_manifest
from tests.workflows.platform_hosts import carried_host


@pytest.fixture
async def small_history_server(tmp_path: Path) -> AsyncIterator[Client]:
    server = DevServer(
        state_dir=tmp_path / "temporal",
        persistent=False,
        extra_dynamic_config=("limit.historyCount.suggestContinueAsNew=40",),
    )
    server.start()
    try:
        yield await connect(server.address, "default")
    finally:
        server.stop()


def _one_host_platform(
    client: Client, runtime: str, tmp_path: Path, pki: TestPKI
) -> tuple[WorkerSettings, Platform]:
    """A python runtime of one host of 20 runs, on the given (small-history) server."""
    settings = WorkerSettings(
        temporal=TemporalSettings(),
        config=parse_config(
            {"runtimes": [{"name": runtime, "adapter": "python", "runs": 20, "maxHosts": 1}]}
        ),
        platform=PlatformInfo(stateDir=str(tmp_path / "state")),
        trust=pki.worker_trust(),
    )
    return settings, Platform(client, tmp_path / "state", {"python": runtime}, settings, pki)


async def test_the_pool_continues_as_new_and_keeps_its_state(
    small_history_server: Client, tmp_path: Path, pki: TestPKI
) -> None:
    client = small_history_server
    runtime = "py-can"
    settings, platform = _one_host_platform(client, runtime, tmp_path, pki)
    pool = client.get_workflow_handle(pool_workflow_id(runtime))
    try:
        async with running_workers(client, settings):
            first_run_id = (await pool.describe()).run_id
            handles = [await platform.start(run_manifest(f"can-{i}", runtime=runtime)) for i in range(12)]
            await asyncio.gather(*(platform.wait_phase(h, RunPhase.Ready) for h in handles))
            for h in handles[:6]:
                await h.signal(SIGNAL_CANCEL)
            await asyncio.gather(*(platform.wait_phase(h, RunPhase.Cancelled) for h in handles[:6]))

            # The Runs settled: make the pool continue as new from here, however many times it
            # did before (each configure is an event; the server soon suggests continuing).
            settled_run_id = (await pool.describe()).run_id
            config = pool_configs(settings, providers=["process"])[runtime]
            await _continue_as_new(platform, pool, config, since=(first_run_id, settled_run_id))
            state = await platform.pool()
            assert len(state.hosts) == 1
            kept = {r.runUid for r in state.reservations}
            assert kept == {h_run for h_run in [await _uid(h) for h in handles[6:]]}
            # What the pool carried holds no reservation of its (supervised) host; the host's
            # workflow was handed them.
            started = None
            async for event in pool.fetch_history_events():
                if event.HasField("workflow_execution_started_event_attributes"):
                    started = event.workflow_execution_started_event_attributes
                    break
            assert started is not None
            carried = DATA_CONVERTER.payload_converter.from_payloads(started.input.payloads, [PoolInput])[0]
            assert carried.state is not None and carried.state.reservations == []
            # The run before continued as new from a task of its own: the task that completed
            # with the continue-as-new ran no local activity (the handover's went out before it,
            # so no signal arriving during them made the server refuse the continue-as-new).
            before = client.get_workflow_handle(pool.id, run_id=started.continued_execution_run_id)
            events = [e async for e in before.fetch_history_events()]
            [ended] = [
                e for e in events if e.HasField("workflow_execution_continued_as_new_event_attributes")
            ]
            task = ended.workflow_execution_continued_as_new_event_attributes.workflow_task_completed_event_id
            last_task = [e for e in events if task < e.event_id < ended.event_id]
            assert not [
                e
                for e in last_task
                if e.HasField("marker_recorded_event_attributes")
                and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
            ]
            host = state.hosts[0]
            assert carried.state.slotsOnHosts == [host.hostUid]
            record = await client.get_workflow_handle(host_workflow_id(runtime, host.hostId)).query(
                QUERY_HOST, result_type=HostRecord
            )
            # The host holds the slots as they were handed over (a Run cancelled since is released
            # in the pool only): the Ready Runs are among them, so the pool read them back.
            every = {await _uid(h) for h in handles}
            assert kept <= {s.runUid for s in record.slots} <= every
            late = await platform.start(run_manifest("can-late", runtime=runtime))
            status = await platform.wait_phase(late, RunPhase.Ready)
            assert status.assignedHost == state.hosts[0].hostId
    finally:
        for h in platform.started:
            with contextlib.suppress(Exception):
                await h.terminate("test finished")
        await stop_all(tmp_path / "state")


async def _continue_as_new(
    platform: Platform, pool: WorkflowHandle[Any, Any], config: PoolConfig, *, since: tuple[str, ...]
) -> str:
    """Make the pool continue as new (each configure is an event; the server soon suggests it):
    the id of a run that is none of `since`."""

    async def continued() -> bool:
        if (await pool.describe()).run_id not in since:
            return True
        await pool.signal(SIGNAL_CONFIGURE, config)
        return False

    await platform.eventually(continued, what="the pool to continue as new")
    return (await pool.describe()).run_id


async def _handovers(client: Client, workflow_id: str) -> tuple[int, int]:
    """What a HostWorkflow's history holds of the pool's handovers, over every run of it: its
    `slots` signals and its `read_slots` updates."""
    signals = updates = 0
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        run = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        async for event in run.fetch_history_events():
            signaled = event.workflow_execution_signaled_event_attributes
            signals += event.HasField("workflow_execution_signaled_event_attributes") and (
                signaled.signal_name == SIGNAL_HOST_SLOTS
            )
            accepted = event.workflow_execution_update_accepted_event_attributes
            updates += event.HasField("workflow_execution_update_accepted_event_attributes") and (
                accepted.accepted_request.input.name == UPDATE_HOST_SLOTS
            )
    return signals, updates


async def _local_activities(client: Client, workflow_id: str, run_id: str) -> list[str]:
    """The types of the local activities one run of a workflow ran, in order (its markers)."""
    found = []
    async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events():
        marker = event.marker_recorded_event_attributes
        if event.HasField("marker_recorded_event_attributes") and marker.marker_name == "core_local_activity":
            found.append(json.loads(marker.details["data"].payloads[0].data)["activity_type"])
    return found


async def test_a_handover_signals_only_the_hosts_whose_slots_changed(
    small_history_server: Client, tmp_path: Path, pki: TestPKI
) -> None:
    """A HostWorkflow that keeps the slots the pool would hand it (its digest answers for them)
    gets no signal; one whose slots changed gets them, and the pool reads every slot back. A run
    that changed no host's reservations continues handing nothing over, not even a look at the
    digests (at 10,000 Ready Runs every handover built and sent every host's slots, to signal the
    few that had new Runs)."""
    client = small_history_server
    runtime = "py-same"
    settings, platform = _one_host_platform(client, runtime, tmp_path, pki)
    pool = client.get_workflow_handle(pool_workflow_id(runtime))
    config = pool_configs(settings, providers=["process"])[runtime]
    try:
        async with running_workers(client, settings):
            handles = [await platform.start(run_manifest(f"same-{i}", runtime=runtime)) for i in range(3)]
            await asyncio.gather(*(platform.wait_phase(h, RunPhase.Ready) for h in handles))
            uids = {await _uid(h) for h in handles}
            [host] = (await platform.pool()).hosts
            host_wf = client.get_workflow_handle(host_workflow_id(runtime, host.hostId))
            first = (await pool.describe()).run_id
            run_id = await _continue_as_new(platform, pool, config, since=(first,))
            assert "signal_runs" in await _local_activities(client, pool.id, first)
            handed, _ = await _handovers(client, host_wf.id)
            assert handed >= 1
            digest = await host_wf.query(QUERY_HOST_SLOTS_DIGEST, result_type=str)
            record = await host_wf.query(QUERY_HOST, result_type=HostRecord)
            assert {s.runUid for s in record.slots} == uids
            assert digest == slots_digest(host.hostUid, record.slots)

            # Nothing changed: the next handovers send nothing, the read backs are queries (the
            # record shows what the pool handed over: its digest), and every slot comes back.
            unchanged = [run_id]
            run_id = await _continue_as_new(platform, pool, config, since=(run_id,))
            _, updates = await _handovers(client, host_wf.id)
            unchanged.append(run_id)
            run_id = await _continue_as_new(platform, pool, config, since=(run_id,))
            assert await _handovers(client, host_wf.id) == (handed, updates)
            for unchanged_run in unchanged:
                assert "signal_runs" not in await _local_activities(client, pool.id, unchanged_run)
            assert {r.runUid for r in (await platform.pool()).reservations} == uids

            # One more Run on the host: the next handover hands the host its slots again.
            late = await platform.start(run_manifest("same-late", runtime=runtime))
            await platform.wait_phase(late, RunPhase.Ready)
            uids.add(await _uid(late))
            await _continue_as_new(platform, pool, config, since=(run_id,))
            assert "signal_runs" in await _local_activities(client, pool.id, run_id)
            assert (await _handovers(client, host_wf.id))[0] == handed + 1
            record = await host_wf.query(QUERY_HOST, result_type=HostRecord)
            assert {s.runUid for s in record.slots} == uids
            assert {r.runUid for r in (await platform.pool()).reservations} == uids
    finally:
        for h in platform.started:
            with contextlib.suppress(Exception):
                await h.terminate("test finished")
        await stop_all(tmp_path / "state")


async def test_query_pool_reads_a_pool_in_parts_that_make_the_whole(tmp_path: Path, pki: TestPKI) -> None:
    """Two hosts of 1,500 slots are two parts (POOL_QUERY_SLOTS each at most): the state read in
    parts is the state read whole (which a pool of ~9,000 Ready Runs could not answer)."""
    server = DevServer(state_dir=tmp_path / "temporal", persistent=False)
    server.start()
    try:
        client = await connect(server.address, "default")
        runtime = "py-parts"
        settings = WorkerSettings(
            temporal=TemporalSettings(),
            config=parse_config(
                {
                    "runtimes": [
                        {"name": runtime, "adapter": "python", "runs": 1500, "minHosts": 2, "maxHosts": 2}
                    ]
                }
            ),
            platform=PlatformInfo(stateDir=str(tmp_path / "state")),
            trust=pki.worker_trust(),
        )
        platform = Platform(client, tmp_path / "state", {"python": runtime}, settings, pki)
        pool = client.get_workflow_handle(pool_workflow_id(runtime))
        try:
            async with running_workers(client, settings):
                handles = [await platform.start(run_manifest(f"part-{i}", runtime=runtime)) for i in range(4)]
                await asyncio.gather(*(platform.wait_phase(h, RunPhase.Ready) for h in handles))

                async def two_hosts() -> bool:
                    return len((await query_pool(client, pool.id)).hosts) == 2

                await platform.eventually(two_hosts, what="both warm hosts")
                whole = await pool.query(QUERY_POOL, result_type=PoolState)
                parts = await query_pool(client, pool.id)
                assert len(pool_query_parts(parts.hosts)) == 2
                assert sorted(parts.reservations, key=lambda r: r.runUid) == sorted(
                    whole.reservations, key=lambda r: r.runUid
                )
                assert parts.owners == whole.owners and len(parts.owners) == 4
                assert parts.model_copy(update={"reservations": whole.reservations}) == whole
        finally:
            for h in platform.started:
                with contextlib.suppress(Exception):
                    await h.terminate("test finished")
            await stop_all(tmp_path / "state")
    finally:
        server.stop()


async def _uid(handle) -> str:  # type: ignore[no-untyped-def]
    description = await handle.describe()
    return str(description.search_attributes["KrtRunUid"][0])


@workflow.defn(name="HostWorkflow", sandboxed=False)
class _HeldHost:
    """Stands in for a HostWorkflow that holds slots and answers `read_slots` only once a worker
    polls its task queue: the pool's read-back stays open for as long as the test wants."""

    @workflow.init
    def __init__(self, slots: HostSlots) -> None:
        self._slots = slots

    @workflow.run
    async def run(self, slots: HostSlots) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update(name=UPDATE_HOST_SLOTS)
    def read_slots(self) -> HostSlots:
        return self._slots


async def test_the_pool_refuses_its_query_until_it_has_read_its_hosts_slots_back(
    small_history_server: Client, tmp_path: Path, pki: TestPKI
) -> None:
    """A pool run that continued as new knows its hosts but not yet their reservations: it must
    not answer a state that shows those slots free (the reconciler and `krt hosts` act on it)."""
    client = small_history_server
    runtime = "py-rb"
    settings = WorkerSettings(
        temporal=TemporalSettings(),
        config=parse_config({"runtimes": [{"name": runtime, "adapter": "python", "runs": 4, "maxHosts": 1}]}),
        platform=PlatformInfo(stateDir=str(tmp_path / "state")),
        trust=pki.worker_trust(),
    )
    now = datetime.now(UTC)
    host = Host(
        hostId=f"{runtime}-0",
        hostUid=str(uuid.uuid4()),
        runtime=runtime,
        address="127.0.0.1:9",
        state=HostState.Ready,
        capacity=4,
        createdAt=now,
        assignedAt=now,
        readyAt=now,
        supervised=True,
    )
    run_uid = str(uuid.uuid4())
    held = HostSlots(
        hostUid=host.hostUid,
        slots=[Slot(runUid=run_uid, workflowId="run/default/held", reservedAt=now)],
    )
    queue = f"held-hosts-{uuid.uuid4().hex[:8]}"
    host_handle = await client.start_workflow(
        _HeldHost.run, held, id=host_workflow_id(runtime, host.hostId), task_queue=queue
    )
    pool_id = pool_workflow_id(runtime)
    carried = PoolState(hosts=[host], slotsOnHosts=[host.hostUid])
    config = pool_configs(settings, providers=["process"])[runtime]
    pool = await client.start_workflow(
        "RuntimePoolWorkflow", PoolInput(config=config, state=carried), id=pool_id, task_queue=POOL_TASK_QUEUE
    )
    try:
        async with running_workers(client, settings):

            async def refusal() -> str:
                try:
                    state = await pool.query(
                        QUERY_POOL, result_type=PoolState, rpc_timeout=timedelta(seconds=5)
                    )
                except WorkflowQueryFailedError as err:
                    return str(err)
                pytest.fail(f"the pool answered without its host's slots: {state.reservations}")

            # RPCError: its first task is not done yet
            refused = await eventually(
                refusal, ignoring=(RPCError,), within=30, every=0.05, what="the pool to answer its query"
            )
            assert POOL_READING_BACK in refused
            async with Worker(client, task_queue=queue, workflows=[_HeldHost]):
                state = await query_pool(client, pool_id)
            assert state.slotsOnHosts == []
            # What the pool read back is the host's slot, recorded in its history.
            markers = [
                e.marker_recorded_event_attributes
                async for e in pool.fetch_history_events()
                if e.HasField("marker_recorded_event_attributes")
            ]
            read = [
                DATA_CONVERTER.payload_converter.from_payloads(m.details["result"].payloads, [HostSlots])[0]
                for m in markers
                if m.marker_name == "core_local_activity"
                and "result" in m.details
                and b"host_slots" in m.details["data"].SerializeToString()
            ]
            assert [[s.runUid for s in r.slots] for r in read] == [[run_uid]]
    finally:
        for handle in (pool, host_handle):
            with contextlib.suppress(Exception):
                await handle.terminate("test finished")
        await stop_all(tmp_path / "state")


async def test_a_host_workflow_that_just_continued_as_new_answers_read_slots_with_its_slots(
    small_history_server: Client, tmp_path: Path
) -> None:
    """The pool's read-back can reach a HostWorkflow in the first task of a run it continued as
    new with, where handlers run before `run` has set the carried record: it must answer the
    carried slots, not none."""
    client = small_history_server
    slot = Slot(runUid=str(uuid.uuid4()), workflowId="run/default/held", reservedAt=datetime.now(UTC))
    workflow_id, input = carried_host("py-hw", tmp_path / "state", slots=[slot])
    assert input.record is not None
    host = input.record.host
    queue = f"hosts-{uuid.uuid4().hex[:8]}"
    start = WithStartWorkflowOperation(
        HostWorkflow.run,
        input,
        id=workflow_id,
        task_queue=queue,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
    )
    try:
        async with Worker(client, task_queue=queue, workflows=[HostWorkflow]):
            # Started together with the update: the update is in the run's first task.
            answer = await asyncio.wait_for(
                client.execute_update_with_start_workflow(
                    UPDATE_HOST_SLOTS, start_workflow_operation=start, result_type=HostSlots
                ),
                timeout=30,
            )
            handle = await start.workflow_handle()
        assert answer == HostSlots(hostUid=host.hostUid, slots=[slot])
        first_task = [
            e.event_id
            async for e in handle.fetch_history_events()
            if e.HasField("workflow_task_completed_event_attributes")
        ][0]
        accepted = [
            e.event_id
            async for e in handle.fetch_history_events()
            if e.HasField("workflow_execution_update_accepted_event_attributes")
        ]
        assert accepted == [first_task + 1], "the update was not in the run's first task"
    finally:
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(workflow_id).terminate("test finished")
