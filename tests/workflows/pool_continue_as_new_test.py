"""The pool continues as new when Temporal suggests it, and keeps every reservation and host: the
reservations of a supervised host travel through its HostWorkflow, not the pool's carried state."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.hosts.process import stop_all
from kruntimes.api.phases import RunPhase
from kruntimes.config import parse_config
from kruntimes.devserver import DevServer
from kruntimes.lifecycle import (
    QUERY_HOST,
    SIGNAL_CANCEL,
    HostRecord,
    PlatformInfo,
    PoolInput,
    host_workflow_id,
    pool_workflow_id,
)
from kruntimes.temporal import DATA_CONVERTER, TemporalSettings, connect
from tests.pki import TestPKI
from tests.workflows.conftest import Platform, run_manifest
from workers.worker import WorkerSettings, running_workers


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


async def test_the_pool_continues_as_new_and_keeps_its_state(
    small_history_server: Client, tmp_path: Path, pki: TestPKI
) -> None:
    client = small_history_server
    runtime = "py-can"
    settings = WorkerSettings(
        temporal=TemporalSettings(),
        config=parse_config(
            {"runtimes": [{"name": runtime, "adapter": "python", "runs": 20, "maxHosts": 1}]}
        ),
        platform=PlatformInfo(stateDir=str(tmp_path / "state")),
        trust=pki.worker_trust(),
    )
    platform = Platform(client, tmp_path / "state", {"python": runtime}, settings, pki)
    pool = client.get_workflow_handle(pool_workflow_id(runtime))
    try:
        async with running_workers(client, settings):
            first_run_id = (await pool.describe()).run_id
            handles = [await platform.start(run_manifest(f"can-{i}", runtime=runtime)) for i in range(12)]
            await asyncio.gather(*(platform.wait_phase(h, RunPhase.Ready) for h in handles))
            for h in handles[:6]:
                await h.signal(SIGNAL_CANCEL)
            await asyncio.gather(*(platform.wait_phase(h, RunPhase.Cancelled) for h in handles[:6]))

            async def continued() -> bool:
                return (await pool.describe()).run_id != first_run_id

            await platform.eventually(continued, what="the pool to continue as new")
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


async def _uid(handle) -> str:  # type: ignore[no-untyped-def]
    description = await handle.describe()
    return str(description.search_attributes["KrtRunUid"][0])
