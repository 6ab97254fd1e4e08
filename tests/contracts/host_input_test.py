"""The HostWorkflow's input is built in one place for both of its starters (a ScaleOutWorkflow and
the reconciler), and its payload is the one recorded histories hold: each starter's timers go
where they always went."""

from __future__ import annotations

from datetime import UTC, datetime

from kruntimes.contracts.host import HostInput, host_input
from kruntimes.contracts.pool import ready_host
from kruntimes.contracts.providers import CreatedHost
from kruntimes.contracts.reconcile import ReconcileInput
from kruntimes.contracts.scaleout import ScaleOutInput
from kruntimes.decisions.scheduling.model import ScaleOutReason, ScaleOutRequest
from kruntimes.temporal.connect import DATA_CONVERTER

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
CREATED = CreatedHost(
    provider="process",
    runtime="python",
    hostId="python-1",
    hostUid="0b5c0f4e-1f7a-4a54-9d8f-2c39d1f0a001",
    address="127.0.0.1:20001",
    createdAt=T0,
)
HOST = ready_host(CREATED, capacity=4, at=T0, supervised=True)
STATE_DIR = "/var/lib/krt"
POOL = "pool/python"


def _payload(value: HostInput) -> bytes:
    (payload,) = DATA_CONVERTER.payload_converter.to_payloads([value])
    return payload.SerializeToString()


def _as_recorded(*, watch_s: float, stuck_s: float) -> HostInput:
    """The input as each starter spelled it out before there was one builder."""
    return HostInput(
        host=HOST,
        created=CREATED,
        poolWorkflowId=POOL,
        stateDir=STATE_DIR,
        watchIntervalSeconds=watch_s,
        assignmentTimeoutSeconds=stuck_s,
    )


def _check_built_as_recorded(
    starter: ScaleOutInput | ReconcileInput, *, watch_s: float, stuck_s: float
) -> None:
    """The builder's input for `starter` is, byte for byte, the payload that starter recorded."""
    built = host_input(starter, host=HOST, created=CREATED)
    assert _payload(built) == _payload(_as_recorded(watch_s=watch_s, stuck_s=stuck_s))


def test_a_new_host_is_watched_at_its_heartbeat_interval() -> None:
    request = ScaleOutRequest(
        requestId="r1",
        runtime="python",
        provider="process",
        reason=ScaleOutReason.NoVisibleCapacity,
        slots=4,
        requestedAt=T0,
    )
    starter = ScaleOutInput(
        request=request,
        hostId=CREATED.hostId,
        adapter="python",
        capacity=4,
        stateDir=STATE_DIR,
        poolWorkflowId=POOL,
        heartbeatIntervalSeconds=0.5,
        assignmentTimeoutSeconds=7.0,
    )
    _check_built_as_recorded(starter, watch_s=0.5, stuck_s=7.0)


def test_a_reconciled_host_is_watched_at_the_reconcilers_interval() -> None:
    starter = ReconcileInput(
        runtime="python",
        poolWorkflowId=POOL,
        stateDir=STATE_DIR,
        watchIntervalSeconds=2.0,
        assignmentTimeoutSeconds=9.0,
    )
    _check_built_as_recorded(starter, watch_s=2.0, stuck_s=9.0)
