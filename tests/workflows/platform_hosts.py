"""A test platform's hosts as its workflows and the hosts themselves see them: the heartbeat the
host tests run with, a host's HostWorkflow and when it is Ready there, the address the pool holds
for a host, the registrations a host holds, and a Run Ready again on another host."""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowHandle

from kruntimes.api.phases import RunPhase
from kruntimes.lifecycle import QUERY_HOST, HostRecord, HostResult, host_workflow_id
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.scheduling.model import HostState
from tests.pki import TestPKI
from tests.workflows.conftest import Platform

BEAT_S = 0.5  # hosts report every half second here: a frozen one is lost within 1.5 s


def host_handle(platform: Platform, host_id: str) -> WorkflowHandle[Any, HostResult]:
    return platform.client.get_workflow_handle(
        host_workflow_id(platform.runtime(), host_id), result_type=HostResult
    )


async def host_serving(platform: Platform, host_id: str) -> None:
    async def ready() -> bool:
        record = await host_handle(platform, host_id).query(QUERY_HOST, result_type=HostRecord)
        return record is not None and record.state is HostState.Ready

    await platform.eventually(ready, timeout=30, what=f"host {host_id} Ready on its HostWorkflow")


def registrations(pki: TestPKI, address: str) -> dict[str, str]:
    """run uid → registration id on the host at `address`."""
    with pki.channel(address, as_=pki.control_plane) as channel:
        info = pb_grpc.FunctionRuntimeStub(channel).HostInfo(pb.HostInfoRequest(), timeout=10)
    return {r.run_uid: r.registration_id for r in info.registrations}


async def address_of(platform: Platform, host_id: str) -> str:
    pool = await platform.pool()
    found = next(h.address for h in pool.hosts if h.hostId == host_id)
    assert found is not None
    return found


async def ready_elsewhere(platform: Platform, handle: WorkflowHandle[Any, Any], old_uid: str) -> Any:
    """The Run's status once it is Ready on another host than `old_uid`."""

    async def moved() -> bool:
        status = await platform.status(handle)
        return status.phase is RunPhase.Ready and status.assignedHostUID != old_uid

    await platform.eventually(moved, timeout=60, what="the Run Ready on another host")
    return await platform.status(handle)
