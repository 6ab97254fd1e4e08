"""The pool's continue-as-new payload is bounded by its hosts and its queue, not by its Runs.

The state is built directly (10,000 Ready Runs on 20 supervised hosts of 500, 1,000 queued) and
encoded by the platform's own data converter, as Temporal would receive it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from kruntimes.config.runtimes import parse_config
from kruntimes.contracts.names import run_workflow_id
from kruntimes.contracts.pool import (
    POOL_QUERY_SLOTS,
    AdmitSignal,
    PoolConfig,
    PoolInput,
    PoolMessage,
    PoolQuery,
    PoolState,
    QueuedRun,
    ReleaseSignal,
    carried_state,
    pool_part,
    pool_query_parts,
    slots_of,
)
from kruntimes.contracts.run import HostSlots
from kruntimes.decisions.scheduling.model import AdmissionRequest, Host, HostState, Reservation
from kruntimes.temporal.connect import DATA_CONVERTER

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
WARN_BYTES = 256 * 1024  # Temporal warns about a payload above this
HOSTS, CAPACITY, QUEUED = 20, 500, 1000


def _host(i: int) -> Host:
    return Host(
        hostId=f"bash-{i}",
        hostUid=str(uuid.UUID(int=i)),
        runtime="bash",
        address=f"127.0.0.1:{20000 + i}",
        state=HostState.Ready,
        capacity=CAPACITY,
        createdAt=T0,
        assignedAt=T0,
        readyAt=T0,
        labels={"kruntimes.io/provider": "process"},
        supervised=True,
    )


def _full_state() -> PoolState:
    hosts = [_host(i) for i in range(HOSTS)]
    reservations, owners = [], {}
    for n in range(HOSTS * CAPACITY):
        uid = str(uuid.uuid4())
        h = hosts[n % HOSTS]
        reservations.append(
            Reservation(runUid=uid, hostId=h.hostId, hostUid=h.hostUid, reservedAt=T0 + timedelta(seconds=n))
        )
        owners[uid] = run_workflow_id("default", f"fn-{n:05d}")
    queue = [
        QueuedRun.of(
            AdmitSignal(
                request=AdmissionRequest(
                    runUid=str(uuid.uuid4()),
                    namespace="default",
                    name=f"queued-{n:04d}",
                    runtime="bash",
                    requestedAt=T0,
                ),
                workflowId=run_workflow_id("default", f"queued-{n:04d}"),
            )
        )
        for n in range(QUEUED)
    ]
    return PoolState(hosts=hosts, reservations=reservations, owners=owners, queue=queue)


def _config() -> PoolConfig:
    runtime = parse_config({"runtimes": [{"name": "bash", "adapter": "bash", "runs": CAPACITY}]}).runtimes[0]
    return PoolConfig(runtime=runtime)


def _size(value: object) -> int:
    return len(DATA_CONVERTER.payload_converter.to_payloads([value])[0].SerializeToString())


def test_the_carried_state_of_10000_ready_and_1000_queued_runs_stays_under_256_kb() -> None:
    full = _full_state()
    assert _size(PoolInput(config=_config(), state=full)) > 4 * WARN_BYTES  # what every Run cost before
    carried = carried_state(full, on_hosts={h.hostUid for h in full.hosts})
    assert carried.reservations == [] and carried.owners == {}
    assert len(carried.queue) == QUEUED
    size = _size(PoolInput(config=_config(), state=carried))
    assert size < WARN_BYTES, f"{size} bytes"
    assert _size(carried.queue) < 170 * QUEUED, "a queued Run costs a reference, not its spec"


def test_each_host_gets_its_own_slots_and_they_come_back_whole() -> None:
    full = _full_state()
    handed = [slots_of(full, host_uid=h.hostUid) for h in full.hosts]
    for slots in handed:
        assert len(slots.slots) == CAPACITY
        assert _size(slots) < WARN_BYTES
        assert all(s.workflowId for s in slots.slots)
    back = {s.runUid: (h.hostUid, s.workflowId) for h in handed for s in h.slots}
    assert back == {r.runUid: (r.hostUid, full.owners[r.runUid]) for r in full.reservations}


def test_a_host_not_handed_its_slots_keeps_them_in_the_carried_state() -> None:
    full = _full_state()
    kept_host = full.hosts[3].hostUid
    carried = carried_state(full, on_hosts={h.hostUid for h in full.hosts} - {kept_host})
    assert {r.hostUid for r in carried.reservations} == {kept_host}
    assert set(carried.owners) == {r.runUid for r in carried.reservations}
    assert kept_host not in carried.slotsOnHosts and len(carried.slotsOnHosts) == HOSTS - 1


def test_a_queue_carried_by_earlier_pools_reads_as_references() -> None:
    admit = AdmitSignal(
        request=AdmissionRequest(
            runUid="u-1", namespace="default", name="old", runtime="bash", tenant=None, requestedAt=T0
        ),
        workflowId="run/default/old",
    )
    legacy = {"queue": [admit.model_dump(mode="json")]}
    state = PoolState.model_validate(legacy)
    assert state.queue == [QueuedRun.of(admit)]
    assert state.queue[0].admit(runtime="bash") == admit


def test_messages_not_yet_decided_travel_with_the_pool_in_order() -> None:
    messages = [ReleaseSignal(runUid="a"), HostSlots(hostUid="x")]
    carried = [PoolMessage.of(messages[0])]
    assert [
        m.message for m in PoolInput.model_validate({"config": _config(), "pending": carried}).pending
    ] == [messages[0]]


def test_the_pool_query_of_10000_ready_runs_is_read_in_parts_each_under_the_warning_size() -> None:
    """The whole state (~2.4 MB) is past the server's 2 MB limit for one answer: its parts (the
    state without reservations, then POOL_QUERY_SLOTS slots' worth of hosts each) are each under
    the warning size, and put together they are the whole state."""
    full = _full_state()
    kept = full.model_copy(update={"reservations": [], "owners": {}})
    assert _size(pool_part(kept, full.reservations, full.owners)) > 2 * 1024 * 1024
    summary = pool_part(kept, full.reservations, full.owners, PoolQuery(reservations=False))
    assert summary.reservations == [] and summary.owners == {} and summary.hosts == full.hosts
    assert _size(summary) < WARN_BYTES
    parts = [
        pool_part(kept, full.reservations, full.owners, PoolQuery(hosts=hosts))
        for hosts in pool_query_parts(summary.hosts)
    ]
    assert len(parts) == HOSTS * CAPACITY // POOL_QUERY_SLOTS
    assert all(_size(part) < 2 * WARN_BYTES for part in parts)
    assert sorted(r.runUid for p in parts for r in p.reservations) == sorted(
        r.runUid for r in full.reservations
    )
    assert {k: v for p in parts for k, v in p.owners.items()} == full.owners


def test_a_host_bigger_than_a_part_is_a_part_of_its_own() -> None:
    big, small = _host(0).model_copy(update={"capacity": POOL_QUERY_SLOTS + 1}), _host(1)
    assert pool_query_parts([small, big, small]) == [[small.hostUid], [big.hostUid], [small.hostUid]]
    assert pool_query_parts([]) == []
