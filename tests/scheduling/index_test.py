"""The reservation index the pool decides with: the same decisions as scanning the reservations,
the same refusals, and one slot per Run."""

from __future__ import annotations

import pytest

from kruntimes.scheduling.admission import (
    ReservationConflict,
    ReservationIndex,
    admit,
    next_from_queue,
    reserve,
    reserve_in,
)

from .builders import T0, dedicated, fill, host, request


def test_reserving_in_the_index_keeps_one_slot_per_run_and_the_capacity() -> None:
    h, other = host("h1", capacity=2), host("h2", capacity=2)
    index = ReservationIndex()
    first = reserve_in(index=index, request=request("r1"), host=h, at=T0)
    assert reserve_in(index=index, request=request("r1"), host=h, at=T0) is first, "the slot it holds"
    with pytest.raises(ReservationConflict) as already:
        reserve_in(index=index, request=request("r1"), host=other, at=T0)
    assert already.value.reason == "AlreadyReserved"
    reserve_in(index=index, request=request("r2"), host=h, at=T0)
    with pytest.raises(ReservationConflict) as full:
        reserve_in(index=index, request=request("r3"), host=h, at=T0)
    assert full.value.reason == "HostFull"
    assert len(index) == 2 and index.used("h1-uid") == 2
    assert index.remove("r1") is first and index.remove("r1") is None
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
