"""Applying decisions: reserve, release on every path, and host supervision decisions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kruntimes.decisions.scheduling.admission import (
    ReservationConflict,
    ReservationIndex,
    assignment_overdue,
    free_slots,
    hosts_to_warm,
    release,
    release_host,
    reserve,
    reserve_in,
    withdraw,
)
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderFailure, ProviderOperation
from kruntimes.decisions.scheduling.model import HostState, ScaleOutStatus, TenancyMode

from .builders import DEDICATED_A, T0, dedicated, fill, host, hybrid, request, reservation, scale_out


def test_reserving_takes_one_slot_and_records_the_tenant():
    h = host("h1", capacity=2)
    own = hybrid("b-1", "tenant-b")
    reservations = reserve(reservations=(), request=request("r1"), host=h, at=T0)
    reservations = reserve(
        reservations=reservations, request=request("r2", tenant="tenant-b"), host=own, at=T0
    )
    assert free_slots(host=h, reservations=reservations) == 1
    assert [(r.runUid, r.hostId, r.hostUid, r.tenant, r.reservedAt) for r in reservations] == [
        ("r1", "h1", "h1-uid", None, T0),
        ("r2", "b-1", "b-1-uid", "tenant-b", T0),
    ]


def test_reserving_the_slot_a_run_already_holds_changes_nothing():
    h = host("h1")
    held = (reservation("r1", h),)
    assert reserve(reservations=held, request=request("r1"), host=h, at=T0) == held


def test_a_run_cannot_hold_two_slots():
    h1, h2 = host("h1"), host("h2")
    with pytest.raises(ReservationConflict) as e:
        reserve(reservations=[reservation("r1", h1)], request=request("r1"), host=h2, at=T0)
    assert e.value.reason == "AlreadyReserved"


def test_a_full_host_refuses_another_reservation():
    h = host("h1", capacity=2)
    with pytest.raises(ReservationConflict) as e:
        reserve(reservations=fill(h), request=request("r1"), host=h, at=T0)
    assert e.value.reason == "HostFull"


@pytest.mark.parametrize("state", [s for s in HostState if s is not HostState.Ready])
def test_only_a_ready_host_can_be_reserved(state):
    with pytest.raises(ReservationConflict) as e:
        reserve(reservations=[], request=request("r1"), host=host("h1", state=state), at=T0)
    assert e.value.reason == "HostNotReady"


def test_a_host_the_tenant_cannot_see_refuses_the_reservation():
    with pytest.raises(ReservationConflict) as e:
        reserve(reservations=[], request=request("r1", tenant="tenant-a"), host=host("shared"), at=T0)
    assert e.value.reason == "HostNotVisible"
    with pytest.raises(ReservationConflict):
        reserve(reservations=[], request=request("r1"), host=dedicated("a-1", "tenant-a"), at=T0)


def test_a_host_of_another_runtime_refuses_the_reservation():
    with pytest.raises(ReservationConflict) as e:
        reserve(reservations=[], request=request("r1"), host=host("b", runtime="bash"), at=T0)
    assert e.value.reason == "RuntimeMismatch"


def test_a_reservation_conflict_is_a_value_error_naming_its_reason():
    h = host("h1", capacity=1)
    with pytest.raises(ValueError, match="^HostFull: "):
        reserve(reservations=fill(h), request=request("r1"), host=h, at=T0)


def test_releasing_a_run_frees_exactly_its_slot():
    h = host("h1", capacity=3)
    held = [reservation("r1", h), reservation("r2", h)]
    after = release(reservations=held, run_uid="r1")
    assert [r.runUid for r in after] == ["r2"]
    assert free_slots(host=h, reservations=after) == 2


def test_releasing_a_run_that_holds_nothing_changes_nothing():
    held = (reservation("r1", host("h1")),)
    assert release(reservations=held, run_uid="absent") == held
    assert release(reservations=(), run_uid="absent") == ()


def test_releasing_twice_is_the_same_as_releasing_once():
    held = [reservation("r1", host("h1")), reservation("r2", host("h1"))]
    once = release(reservations=held, run_uid="r1")
    assert release(reservations=once, run_uid="r1") == once


def test_a_released_run_can_be_admitted_again_elsewhere():
    h1, h2 = host("h1"), host("h2")
    held = reserve(reservations=(), request=request("r1"), host=h1, at=T0)
    held = release(reservations=held, run_uid="r1")
    held = reserve(reservations=held, request=request("r1"), host=h2, at=T0)
    assert [(r.runUid, r.hostId) for r in held] == [("r1", "h2")]


def test_every_way_a_run_leaves_the_pool_gives_its_place_back():
    h = host("h1", capacity=1)
    # Assigned then cancelled, finished, timed out or deleted: release.
    held = reserve(reservations=(), request=request("r1"), host=h, at=T0)
    assert free_slots(host=h, reservations=release(reservations=held, run_uid="r1")) == 1
    # Still queued when cancelled: withdraw.
    assert withdraw(queue=[request("r2")], run_uid="r2") == ()
    # On a host that is lost or deleted: release_host.
    kept, released = release_host(reservations=held, host_id="h1")
    assert (kept, released) == ((), ("r1",))


def test_removing_a_host_releases_its_runs_and_keeps_everyone_elses():
    h1, h2 = host("h1", capacity=3), host("h2", capacity=3)
    held = [reservation("r1", h1), reservation("r2", h2), reservation("r3", h1)]
    kept, released = release_host(reservations=held, host_id="h1")
    assert [r.runUid for r in kept] == ["r2"]
    assert released == ("r1", "r3")


def test_a_recreated_host_with_the_same_id_starts_empty():
    old, new = host("h1", uid="old"), host("h1", uid="new")
    kept, _ = release_host(reservations=fill(old), host_id="h1")
    assert free_slots(host=new, reservations=kept) == new.capacity


# --- host supervision ----------------------------------------------------------------------------


def test_the_warm_minimum_asks_for_the_missing_shared_hosts():
    assert (
        hosts_to_warm(hosts=[host("h1")], pending_scale_outs=[], runtime="python", min_hosts=3, max_hosts=10)
        == 2
    )


def test_the_warm_minimum_counts_pending_shared_scale_outs_and_provisioning_hosts():
    hosts = [host("h1", state=HostState.Assigned)]
    pending = [scale_out("so-1")]
    assert (
        hosts_to_warm(hosts=hosts, pending_scale_outs=pending, runtime="python", min_hosts=3, max_hosts=10)
        == 1
    )


def test_the_warm_minimum_ignores_tenant_hosts_and_hosts_on_their_way_out():
    hosts = [
        dedicated("a-1", "tenant-a"),
        host("d", state=HostState.Draining),
        host("t", state=HostState.Terminating),
        host("l", state=HostState.Lost),
        host("bash", runtime="bash"),
    ]
    pending = [scale_out("so-a", tenant="tenant-a", policy=DEDICATED_A)]
    assert (
        hosts_to_warm(hosts=hosts, pending_scale_outs=pending, runtime="python", min_hosts=2, max_hosts=10)
        == 2
    )


def test_the_warm_minimum_never_exceeds_max_hosts():
    hosts = [dedicated(f"a-{i}", "tenant-a") for i in range(3)]
    assert hosts_to_warm(hosts=hosts, pending_scale_outs=[], runtime="python", min_hosts=2, max_hosts=4) == 1
    assert hosts_to_warm(hosts=hosts, pending_scale_outs=[], runtime="python", min_hosts=2, max_hosts=3) == 0


def test_a_satisfied_warm_minimum_asks_for_nothing():
    hosts = [host("h1"), host("h2")]
    done = scale_out("so-1", status=ScaleOutStatus.Fulfilled, host_id="h2")
    assert (
        hosts_to_warm(hosts=hosts, pending_scale_outs=[done], runtime="python", min_hosts=1, max_hosts=4) == 0
    )


def test_an_assigned_host_is_overdue_after_twice_the_assignment_timeout():
    h = host("h1", state=HostState.Assigned)
    assert h.assignedAt is not None
    limit = h.assignedAt + timedelta(seconds=120)
    assert not assignment_overdue(host=h, now=limit, assignment_timeout_seconds=60)
    assert assignment_overdue(host=h, now=limit + timedelta(microseconds=1), assignment_timeout_seconds=60)


@pytest.mark.parametrize("state", [s for s in HostState if s is not HostState.Assigned])
def test_only_assigned_hosts_can_be_overdue(state):
    h = host("h1", state=state, tenancy=TenancyMode.Shared)
    assert not assignment_overdue(host=h, now=T0 + timedelta(days=1), assignment_timeout_seconds=1)


def _reserve_in(*, reservations, request, host, at):
    """`reserve` through a ReservationIndex of the same reservations (what the pool calls)."""
    return reserve_in(index=ReservationIndex(reservations), request=request, host=host, at=at)


@pytest.mark.parametrize("apply", [reserve, _reserve_in], ids=["scanned", "indexed"])
@pytest.mark.parametrize(
    ("held", "run", "on", "says"),
    [
        (
            [reservation("r1", host("h1"))],
            request("r1"),
            host("h2"),
            "AlreadyReserved: run r1 already holds a slot on h1",
        ),
        ([], request("r1"), host("b", runtime="bash"), "RuntimeMismatch: host b runs 'bash', not 'python'"),
        ([], request("r1"), host("h1", state=HostState.Draining), "HostNotReady: host h1 is Draining"),
        ([], request("r1"), host("h1", spent=True), "HostNotReady: one-shot host h1 already took its Run"),
        (
            [],
            request("r1", tenant="tenant-a"),
            host("shared"),
            "HostNotVisible: host shared is not visible to 'tenant-a'",
        ),
        (fill(host("h1")), request("r1"), host("h1"), "HostFull: host h1 has no free slot of 2"),
    ],
    ids=["already-reserved", "runtime", "not-ready", "spent", "not-visible", "full"],
)
def test_a_refused_reservation_says_why_and_names_the_host(apply, held, run, on, says):
    """The pool's workflow fails its task with this message: it says which host and why."""
    with pytest.raises(ReservationConflict) as e:
        apply(reservations=held, request=run, host=on, at=T0)
    assert (e.value.reason, str(e.value)) == (says.split(":")[0], says)


def test_reserving_in_the_index_records_the_tenant():
    own = hybrid("b-1", "tenant-b")
    index = ReservationIndex()
    taken = reserve_in(index=index, request=request("r2", tenant="tenant-b"), host=own, at=T0)
    assert taken.tenant == index.held["r2"].tenant == "tenant-b"


def test_pending_scale_outs_take_their_room_under_max_hosts():
    pending = [scale_out("so-1")]
    assert (
        hosts_to_warm(
            hosts=[host("h1")], pending_scale_outs=pending, runtime="python", min_hosts=5, max_hosts=2
        )
        == 0
    )


def test_a_failed_scale_out_is_no_warm_capacity():
    failure = ProviderFailure.of(
        FailureReason.OperationTimeout, provider="process", operation=ProviderOperation.Create
    )
    failed = scale_out("so-1", status=ScaleOutStatus.Failed, failure=failure)
    assert (
        hosts_to_warm(
            hosts=[host("h1")], pending_scale_outs=[failed], runtime="python", min_hosts=2, max_hosts=4
        )
        == 1
    )
