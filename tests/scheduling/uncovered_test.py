"""Which queued Runs no capacity on its way covers any more (decided again after a host is Ready)."""

from __future__ import annotations

from kruntimes.contracts.pool import ready_host
from kruntimes.contracts.providers import CreatedHost
from kruntimes.decisions.scheduling.admission import ReservationIndex, next_from_queue, uncovered
from kruntimes.decisions.scheduling.model import HostState, ScaleOutStatus, TenancyMode, TenantPolicy

from .builders import RUNTIME, T0, host, request, reservation, scale_out

GROUP = TenantPolicy(mode=TenancyMode.Dedicated, group="grp")


def _uncovered(queue, hosts=(), pending=(), reservations=()):  # type: ignore[no-untyped-def]
    return uncovered(
        queue=queue,
        hosts=hosts,
        pending_scale_outs=pending,
        runtime=RUNTIME,
        index=ReservationIndex(reservations),
    )


def test_a_run_behind_a_pending_scale_out_it_can_see_is_covered():
    assert _uncovered([request("r1")], pending=[scale_out(slots=1)]) == ()


def test_runs_beyond_the_slots_on_their_way_are_uncovered_in_fifo_order():
    queue = [request("r1"), request("r2"), request("r3")]
    assert _uncovered(queue, pending=[scale_out(slots=1)]) == ("r2", "r3")


def test_a_run_with_nothing_on_its_way_is_uncovered():
    assert _uncovered([request("r1")]) == ("r1",)


def test_capacity_another_tenant_cannot_see_covers_nothing_of_its():
    mine = scale_out(tenant="tenant-a", policy=TenantPolicy(mode=TenancyMode.Dedicated))
    assert _uncovered([request("r1", tenant="tenant-c")], pending=[mine]) == ("r1",)


def test_a_scale_out_of_a_group_covers_every_tenant_of_the_group():
    theirs = scale_out(tenant="first", policy=GROUP, slots=2)
    queue = [request("r1", tenant="second", tenancy=GROUP)]
    assert _uncovered(queue, pending=[theirs]) == ()


def test_a_provisioning_host_covers_with_its_free_slots():
    coming = host("h1", state=HostState.Assigned, capacity=2)
    busy = reservation("held", coming)
    queue = [request("r1"), request("r2")]
    assert _uncovered(queue, hosts=[coming], reservations=[busy]) == ("r2",)


def test_a_fulfilled_scale_out_covers_nothing():
    done = scale_out(slots=2, status=ScaleOutStatus.Fulfilled, host_id="h9")
    assert _uncovered([request("r1")], pending=[done]) == ("r1",)


def test_a_queued_run_that_holds_a_slot_is_left_alone():
    ready = host("h1", capacity=1)
    assert _uncovered([request("r1")], hosts=[ready], reservations=[reservation("r1", ready)]) == ()


def test_a_host_made_for_one_tenant_of_a_group_takes_the_groups_other_tenants():
    """The scale-out's group goes onto the host it makes, so the group's queued Runs see it."""
    created = CreatedHost(
        hostId="h1",
        hostUid="h1-uid",
        runtime=RUNTIME,
        address="h1.local:7070",
        provider="process",
        createdAt=T0,
    )
    made = ready_host(created, capacity=2, at=T0, tenant="first", tenancy=GROUP.mode, tenant_group="grp")
    assert made.tenantGroup == "grp"
    placed = next_from_queue(
        queue=[request("r2", tenant="second", tenancy=GROUP)], hosts=[made], reservations=()
    )
    assert [p.assignment.hostId for p in placed] == ["h1"]


def test_without_an_index_nothing_is_held():
    assert uncovered(queue=[request("r1")], hosts=(), pending_scale_outs=(), runtime=RUNTIME) == ("r1",)


def test_a_provisioning_host_of_a_tenant_covers_that_tenants_runs():
    coming = host("h1", state=HostState.Assigned, tenant="tenant-a", capacity=1)
    assert _uncovered([request("r1", tenant="tenant-a")], hosts=[coming]) == ()


def test_a_provisioning_host_of_a_group_covers_every_tenant_of_the_group():
    coming = host("h1", state=HostState.Assigned, tenant="first", group="grp", capacity=1)
    assert _uncovered([request("r1", tenant="second", tenancy=GROUP)], hosts=[coming]) == ()


def test_a_provisioning_host_whose_slots_are_held_covers_nothing():
    coming = host("h1", state=HostState.Assigned, capacity=1)
    busy = reservation("held", coming)
    assert _uncovered([request("r1")], hosts=[coming], reservations=[busy]) == ("r1",)


def test_a_scale_out_of_a_tenant_covers_that_tenants_runs():
    mine = scale_out(tenant="tenant-a", policy=TenantPolicy(mode=TenancyMode.Dedicated), slots=1)
    assert _uncovered([request("r1", tenant="tenant-a")], pending=[mine]) == ()


def test_a_queued_run_that_holds_a_slot_does_not_stop_the_runs_after_it():
    ready = host("h1", capacity=1)
    queue = [request("r1"), request("r2")]
    assert _uncovered(queue, hosts=[ready], reservations=[reservation("r1", ready)]) == ("r2",)


def test_a_scale_out_covers_as_many_runs_as_it_has_slots():
    queue = [request("r1"), request("r2"), request("r3")]
    assert _uncovered(queue, pending=[scale_out(slots=2)]) == ("r3",)
