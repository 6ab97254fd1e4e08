"""A test platform's hosts as its workflows and the hosts themselves see them: the heartbeat the
host tests run with, a host's HostWorkflow and when it is Ready there, a host a test created told
to the pool and supervised as a scale-out would, the address the pool holds for a host, a Run
started and Ready on its host, the registrations a host holds, an invocation straight on a host,
and a Run Ready again on another host, and a Ready host's HostWorkflow input as it continued as new."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from temporalio.client import WorkflowHandle

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.contracts.host import HostInput, HostRecord, HostResult
from kruntimes.contracts.names import QUERY_HOST, SIGNAL_HOST_READY, host_workflow_id, pool_workflow_id
from kruntimes.contracts.pool import HostReadySignal, ready_host
from kruntimes.contracts.providers import CreatedHost
from kruntimes.contracts.run import Slot
from kruntimes.decisions.scheduling.model import Host, HostState
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from tests.support.pki import TestPKI
from tests.workflows.conftest import Platform, pool_host

BEAT_S = 0.5  # hosts report every half second here: a frozen one is lost within 1.5 s


def host_handle(platform: Platform, host_id: str, logical: str = "python") -> WorkflowHandle[Any, HostResult]:
    """The HostWorkflow of host `host_id` of the platform's runtime `logical`."""
    return platform.client.get_workflow_handle(
        host_workflow_id(platform.runtime(logical), host_id), result_type=HostResult
    )


async def host_serving(platform: Platform, host_id: str) -> None:
    async def ready() -> bool:
        record = await host_handle(platform, host_id).query(QUERY_HOST, result_type=HostRecord)
        return record is not None and record.state is HostState.Ready

    await platform.eventually(ready, timeout=30, what=f"host {host_id} Ready on its HostWorkflow")


async def tell_pool(
    platform: Platform,
    created: CreatedHost,
    *,
    logical: str = "python",
    supervised: bool = True,
    request_id: str = "injected",
) -> Host:
    """Tell the pool of runtime `logical` that a host the test created is ready, as its scale-out
    would; the pool's view of it."""
    host = pool_host(created, supervised=supervised)
    await platform.client.get_workflow_handle(pool_workflow_id(platform.runtime(logical))).signal(
        SIGNAL_HOST_READY, HostReadySignal(requestId=request_id, host=host)
    )
    return host


async def start_supervisor(
    platform: Platform, created: CreatedHost, host: Host, *, logical: str = "python", stuck_s: float = 1.0
) -> WorkflowHandle[Any, HostResult]:
    """Start the HostWorkflow of a host the test created, as its scale-out would: watched every
    BEAT_S, stuck if it has not reported after `stuck_s`."""
    runtime = platform.runtime(logical)
    return await platform.client.start_workflow(
        "HostWorkflow",
        HostInput(
            host=host,
            created=created,
            poolWorkflowId=pool_workflow_id(runtime),
            stateDir=str(platform.state_dir),
            watchIntervalSeconds=BEAT_S,
            assignmentTimeoutSeconds=stuck_s,
        ),
        id=host_workflow_id(runtime, created.hostId),
        task_queue=platform.settings.run_task_queue,
        result_type=HostResult,
    )


def registrations(pki: TestPKI, address: str) -> dict[str, str]:
    """run uid → registration id on the host at `address`."""
    with pki.channel(address, as_=pki.control_plane) as channel:
        info = pb_grpc.FunctionRuntimeStub(channel).HostInfo(pb.HostInfoRequest(), timeout=10)
    return {r.run_uid: r.registration_id for r in info.registrations}


def invoke_on_host(
    pki: TestPKI, address: str, run_uid: str, payload: bytes = b"{}"
) -> pb.InvokeFunctionResponse:
    """One invocation straight on the host at `address` (as a gateway), of the Run's registration
    there (found via HostInfo, as the control plane)."""
    registration_id = registrations(pki, address)[run_uid]
    with pki.channel(address, as_=pki.gateway) as channel:
        answer: pb.InvokeFunctionResponse = pb_grpc.FunctionRuntimeStub(channel).InvokeFunction(
            pb.InvokeFunctionRequest(registration_id=registration_id, payload=payload), timeout=10
        )
    return answer


async def address_of(platform: Platform, host_id: str) -> str:
    pool = await platform.pool()
    found = next(h.address for h in pool.hosts if h.hostId == host_id)
    assert found is not None
    return found


class OnHost(NamedTuple):
    """A Run started and Ready: its handle, its host and the address the pool holds for that host."""

    handle: WorkflowHandle[Any, Any]
    host: str
    address: str


async def ready_on_host(platform: Platform, run: Run) -> OnHost:
    """Start `run` (as plain Temporal does) and wait until it is Ready on a host."""
    handle = await platform.start(run)
    status = await platform.wait_phase(handle, RunPhase.Ready)
    assert status.assignedHost is not None
    return OnHost(handle, status.assignedHost, await address_of(platform, status.assignedHost))


async def ready_elsewhere(platform: Platform, handle: WorkflowHandle[Any, Any], old_uid: str) -> Any:
    """The Run's status once it is Ready on another host than `old_uid`."""

    async def moved() -> bool:
        status = await platform.status(handle)
        return status.phase is RunPhase.Ready and status.assignedHostUID != old_uid

    await platform.eventually(moved, timeout=60, what="the Run Ready on another host")
    return await platform.status(handle)


def carried_host(
    runtime: str, state_dir: Path, *, slots: list[Slot] | None = None, lost_after: int | None = None
) -> tuple[str, HostInput]:
    """The workflow id and input of a Ready host's HostWorkflow as it continued as new, carrying
    `slots` and the place `lost_after` its watch left the host's loss journal (the host, at
    127.0.0.1:9, runs nowhere)."""
    now = datetime.now(UTC)
    created = CreatedHost(
        provider="process",
        runtime=runtime,
        hostId=f"{runtime}-{uuid.uuid4().hex[:6]}",
        hostUid=str(uuid.uuid4()),
        address="127.0.0.1:9",
        createdAt=now,
    )
    host = ready_host(created, capacity=4, at=now, supervised=True)
    record = HostRecord(
        host=host, created=created, state=HostState.Ready, since=now, slots=slots or [], lostAfter=lost_after
    )
    return host_workflow_id(runtime, host.hostId), HostInput(
        host=host,
        created=created,
        poolWorkflowId=pool_workflow_id(runtime),
        stateDir=str(state_dir),
        record=record,
    )
