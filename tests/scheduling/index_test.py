"""The reservation index the pool decides with: the same decisions as scanning the reservations,
the same refusals, and one slot per Run."""

from __future__ import annotations

import tracemalloc
import uuid
from datetime import timedelta

import pytest

from kruntimes.decisions.scheduling.admission import (
    ReservationConflict,
    ReservationIndex,
    admit,
    next_from_queue,
    reserve,
    reserve_in,
)
from kruntimes.decisions.scheduling.model import Reservation

from .builders import T0, dedicated, fill, host, request


def test_reserving_in_the_index_keeps_one_slot_per_run_and_the_capacity() -> None:
    h, other = host("h1", capacity=2), host("h2", capacity=2)
    index = ReservationIndex()
    first = reserve_in(index=index, request=request("r1"), host=h, at=T0)
    assert reserve_in(index=index, request=request("r1"), host=h, at=T0) == first, "the slot it holds"
    with pytest.raises(ReservationConflict) as already:
        reserve_in(index=index, request=request("r1"), host=other, at=T0)
    assert already.value.reason == "AlreadyReserved"
    reserve_in(index=index, request=request("r2"), host=h, at=T0)
    with pytest.raises(ReservationConflict) as full:
        reserve_in(index=index, request=request("r3"), host=h, at=T0)
    assert full.value.reason == "HostFull"
    assert len(index) == 2 and index.used("h1-uid") == 2
    assert index.remove("r1") == first and index.remove("r1") is None
    assert index.used("h1-uid") == 1
    reserve_in(index=index, request=request("r3"), host=h, at=T0)
    assert sorted(index.held) == ["r2", "r3"]


def test_the_index_refuses_what_reserve_refuses() -> None:
    owned = dedicated("a-1", "tenant-a")
    for args in (
        {"request": request("r1"), "host": owned},
        {"request": request("r1"), "host": host(runtime="go")},
    ):
        with pytest.raises(ReservationConflict) as scanned:
            reserve(reservations=(), at=T0, **args)  # type: ignore[arg-type]
        with pytest.raises(ReservationConflict) as indexed:
            reserve_in(index=ReservationIndex(), at=T0, **args)  # type: ignore[arg-type]
        assert scanned.value.reason == indexed.value.reason


def test_decisions_with_the_index_are_those_without() -> None:
    hosts = [host("h1", capacity=3), host("h2", capacity=3), dedicated("a-1", "tenant-a", capacity=2)]
    reservations = [*fill(hosts[0], 3), *fill(hosts[1], 1, prefix="b"), *fill(hosts[2], 2, prefix="a")]
    index = ReservationIndex(reservations)
    asks = [
        request("new"),
        request("busy-0"),
        request("t", tenant="tenant-a"),
        request("t2", tenant="tenant-c"),
    ]
    for ask in asks:
        common = {
            "request": ask,
            "hosts": hosts,
            "queue": [],
            "pending_scale_outs": [],
            "runtime": "python",
            "max_queue": 10,
            "max_hosts": 3,
        }
        assert admit(reservations=reservations, **common) == admit(  # type: ignore[arg-type]
            reservations=(),
            index=index,
            **common,  # type: ignore[arg-type]
        )
    queue = [request(f"q{i}") for i in range(4)] + [request("busy-1")]
    assert next_from_queue(queue=queue, hosts=hosts, reservations=reservations) == next_from_queue(
        queue=queue, hosts=hosts, reservations=(), index=index
    )
    assert len(index) == len(reservations), "deciding does not reserve"


def test_the_index_gives_back_each_reservation_as_it_was_added() -> None:
    hosts = [host(f"h{i}", capacity=10) for i in range(3)]
    added = [
        Reservation(
            runUid=f"r{i}",
            hostId=hosts[i % 3].hostId,
            hostUid=hosts[i % 3].hostUid,
            tenant=None if i % 2 else "tenant-a",
            reservedAt=T0 + timedelta(seconds=i),
        )
        for i in range(12)
    ]
    index = ReservationIndex(added)
    assert list(index.held.values()) == added, "every field, in the order they were added"
    assert index.held["r5"] == added[5] and index.held.get("nope") is None and "r5" in index.held
    assert [row[0] for row in index.held.rows() if row[2] == "h1-uid"] == ["r1", "r4", "r7", "r10"]
    assert list(index.held.of_hosts({"h1-uid", "h2-uid"})) == [r for r in added if r.hostUid != "h0-uid"]
    assert list(index.held.of_hosts(None)) == added and list(index.held.of_hosts(set())) == []
    assert index.remove("r4") == added[4]
    assert list(index.held) == [r.runUid for r in added if r.runUid != "r4"]
    assert index.used("h1-uid") == 3


def test_a_held_slot_costs_a_fraction_of_its_model() -> None:
    """The pool's worker keeps one entry per Ready Run: ~0.24 KB (its run uid and time included)
    with its host's strings shared, where keeping the Reservation model took ~0.74 KB (10,000
    Ready Runs: ~5 MB less)."""
    h = host("h1", capacity=5000)

    def arriving(n: int) -> list[Reservation]:  # as the pool decodes them: each string its own
        def copy(s: str) -> str:
            return s[:1] + s[1:]

        return [
            Reservation.model_validate(
                {
                    "runUid": str(uuid.uuid4()),
                    "hostId": copy(h.hostId),
                    "hostUid": copy(h.hostUid),
                    "reservedAt": T0.isoformat(),
                }
            )
            for _ in range(n)
        ]

    def retained(keep: type[dict[str, Reservation]] | type[ReservationIndex]) -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            batch = arriving(5000)
            kept: object = {r.runUid: r for r in batch} if keep is dict else ReservationIndex(batch)
            del batch
            return (tracemalloc.get_traced_memory()[0] - before) / 5000 if kept else 0.0
        finally:
            tracemalloc.stop()

    per_slot, per_model = retained(ReservationIndex), retained(dict)
    assert per_slot < 400, f"{per_slot:.0f} B per held slot"  # measured: ~235
    assert per_slot * 2.5 < per_model, f"{per_slot:.0f} B per held slot, {per_model:.0f} B per kept model"


def test_the_index_gathers_the_hosts_whose_reservations_changed() -> None:
    """The pool hands over at continue-as-new only what changed since: every add and remove counts."""
    h1, h2 = host("h1"), host("h2")
    index = ReservationIndex()
    reserve_in(index=index, request=request("r1"), host=h1, at=T0)
    reserve_in(index=index, request=request("r2"), host=h2, at=T0)
    assert index.changed == {"h1-uid", "h2-uid"}
    index.changed.clear()
    index.remove("r1")
    assert index.changed == {"h1-uid"}


def test_the_index_refuses_a_second_slot_for_a_run() -> None:
    h = host("h1")
    index = ReservationIndex([Reservation(runUid="r1", hostId="h1", hostUid="h1-uid", reservedAt=T0)])
    with pytest.raises(ReservationConflict) as already:
        index.add(Reservation(runUid="r1", hostId=h.hostId, hostUid=h.hostUid, reservedAt=T0))
    assert (already.value.reason, str(already.value)) == (
        "AlreadyReserved",
        "AlreadyReserved: run r1 already holds a slot",
    )
    assert len(index) == 1 and index.used("h1-uid") == 1


def test_the_load_forgets_a_host_once_its_last_reservation_goes() -> None:
    """Kept per host that holds reservations, so it does not grow with every host the pool had."""
    index = ReservationIndex(fill(host("h1"), 2))
    for run_uid in list(index.held):
        index.remove(run_uid)
    assert dict(index.load) == {}


def test_the_reservations_not_on_some_hosts_are_all_the_others_in_order() -> None:
    hosts = [host(f"h{i}", capacity=10) for i in range(3)]
    added = [
        Reservation(runUid=f"r{i}", hostId=hosts[i % 3].hostId, hostUid=hosts[i % 3].hostUid, reservedAt=T0)
        for i in range(7)
    ]
    index = ReservationIndex(added)
    assert list(index.held.not_on({"h1-uid"})) == [r for r in added if r.hostUid != "h1-uid"]
    assert list(index.held.not_on(set())) == added
    assert list(index.held.not_on({"h0-uid", "h1-uid", "h2-uid"})) == []
