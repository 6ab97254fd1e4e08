"""Fair ordering of a runtime's queue across tenants: one tenant's backlog holds back another
tenant's next Run by at most its share, whatever the backlog's length."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kruntimes.decisions.scheduling.admission import admit, fair_order, next_from_queue, uncovered
from kruntimes.decisions.scheduling.model import QueueGlobally, RequestScaleOut, TenantPolicy

from .builders import RUNTIME, decide, host, request, reservation, scale_out

WEIGHTS = {"a": TenantPolicy(), "b": TenantPolicy(queueShare=0.5), "c": TenantPolicy(queueShare=0.25)}


def queued(spec: str):
    """'aab.' -> Runs a0, a1 of tenant a, b0 of b, s0 without a tenant, in that order."""
    counts: dict[str, int] = {}
    out = []
    for ch in spec:
        n = counts.get(ch, 0)
        counts[ch] = n + 1
        if ch == ".":
            out.append(request(f"s{n}"))
        else:
            out.append(request(f"{ch}{n}", tenant=ch, tenancy=WEIGHTS[ch]))
    return out


def uids(requests):
    return [r.runUid for r in requests]


def test_one_tenant_keeps_its_fifo_order():
    assert uids(fair_order(queued("aaaa"))) == ["a0", "a1", "a2", "a3"]


def test_equal_tenants_take_turns_the_oldest_first():
    assert uids(fair_order(queued("aaa.a."))) == ["a0", "s0", "a1", "s1", "a2", "a3"]


def test_a_tenant_holding_more_slots_waits_for_one_holding_fewer():
    assert uids(fair_order(queued("aaa."), {"a": 2})) == ["s0", "a0", "a1", "a2"]
    assert uids(fair_order(queued("aa.."), {"a": 1})) == ["s0", "a0", "s1", "a1"]


def test_a_tenant_with_half_the_share_gets_every_other_turn():
    assert uids(fair_order(queued("aaaaaabbb"))) == ["a0", "a1", "b0", "a2", "a3", "b1", "a4", "a5", "b2"]


def test_a_late_tenants_first_run_is_placed_at_the_next_free_slot_not_behind_the_backlog():
    queue = queued("a" * 50 + ".")
    placed = next_from_queue(queue=queue, hosts=[host("h1", capacity=2)], reservations=(), fair=True)
    assert uids(p.request for p in placed) == ["a0", "s0"]
    fifo = next_from_queue(queue=queue, hosts=[host("h1", capacity=2)], reservations=(), fair=False)
    assert uids(p.request for p in fifo) == ["a0", "a1"]


def test_the_one_slot_that_frees_goes_to_the_tenant_that_holds_none():
    h1 = host("h1", capacity=3)
    held = [reservation(f"run-a{i}", h1, tenant="a") for i in range(2)]
    queue = queued("aaaa.")
    placed = next_from_queue(queue=queue, hosts=[h1], reservations=held, fair=True)
    assert uids(p.request for p in placed) == ["s0"]


def test_capacity_on_its_way_covers_a_late_tenant_ahead_of_the_backlog():
    queue = queued("aaaa.")
    pending = [scale_out(slots=2)]
    fair = uncovered(queue=queue, hosts=[], pending_scale_outs=pending, runtime=RUNTIME, fair=True)
    assert fair == ("a1", "a2", "a3")
    assert uncovered(queue=queue, hosts=[], pending_scale_outs=pending, runtime=RUNTIME) == ("a2", "a3", "s0")


def test_a_new_run_of_another_tenant_waits_for_capacity_its_turn_covers():
    queue = queued("aaaa")
    pending = [scale_out(slots=2)]
    common = {
        "hosts": [],
        "reservations": (),
        "queue": queue,
        "pending_scale_outs": pending,
        "runtime": RUNTIME,
        "max_queue": 100,
        "max_hosts": 4,
    }
    late = request("s0")
    assert admit(request=late, fair=True, **common) == QueueGlobally(position=4)  # type: ignore[arg-type]
    # in FIFO order the four queued Runs take both slots first: it asks for a host of its own
    assert isinstance(admit(request=late, fair=False, **common), RequestScaleOut)  # type: ignore[arg-type]


tenant_runs = st.lists(st.sampled_from("abc."), max_size=60)


@settings(max_examples=300, deadline=None)
@given(tenant_runs)
def test_fair_order_keeps_every_run_once_and_each_tenants_own_order(spec):
    queue = queued("".join(spec))
    ordered = fair_order(queue)
    assert sorted(uids(ordered)) == sorted(uids(queue))
    for tenant in "abc.":
        mine = [r.runUid for r in queue if (r.tenant or ".") == tenant]
        assert [r.runUid for r in ordered if (r.tenant or ".") == tenant] == mine


def _weight(tenant: str) -> float:
    return 1.0 if tenant == "." else WEIGHTS[tenant].weight


running_counts = st.fixed_dictionaries({t: st.integers(0, 6) for t in "abc."})


@settings(max_examples=300, deadline=None)
@given(tenant_runs, st.sampled_from("abc."), running_counts)
def test_ahead_of_a_tenants_next_run_stand_only_runs_within_the_others_share(spec, late, running):
    """However long the backlog before it, a tenant arriving now with one Run has ahead of it at
    most w(other) × (own running + 1) / w(own) − other's running Runs of each other tenant."""
    queue = queued("".join(spec) + late)
    own = next(r.runUid for r in queue if (r.tenant or ".") == late)
    ordered = fair_order(queue, {None if t == "." else t: n for t, n in running.items()})
    ahead = ordered[: uids(ordered).index(own)]
    for other in set("abc.") - {late}:
        bound = _weight(other) * (running[late] + 1) / _weight(late) - running[other]
        assert sum(1 for r in ahead if (r.tenant or ".") == other) <= max(0, math.floor(bound + 1e-9))


def test_tied_turns_go_to_the_tenant_waiting_longest_not_to_queue_order():
    # a1 and s1 both come second of their tenant: a, whose oldest Run is older, goes first
    assert uids(fair_order(queued("a..a"))) == ["a0", "s0", "a1", "s1"]


def test_a_tenant_the_platform_does_not_know_takes_turns_with_weight_one():
    unknown = [request(f"x{i}", tenant="x") for i in range(2)]
    assert all(r.policy is None for r in unknown)
    assert uids(fair_order([*unknown, request("s0")])) == ["x0", "s0", "x1"]


def test_admission_is_fifo_unless_asked_to_be_fair():
    # the pool asks for fair order behind its patch; a caller that does not gets FIFO
    late = decide(request("s0"), queue=queued("aaaa"), pending=[scale_out(slots=2)], max_queue=100)
    assert isinstance(late, RequestScaleOut)


def test_a_run_behind_its_own_tenants_backlog_asks_for_capacity_of_its_own():
    common = {
        "hosts": [],
        "reservations": (),
        "queue": queued("aaaa"),
        "pending_scale_outs": [scale_out(slots=1)],
        "runtime": RUNTIME,
        "max_queue": 100,
        "max_hosts": 4,
        "fair": True,
    }
    last = request("a4", tenant="a", tenancy=WEIGHTS["a"])
    assert isinstance(admit(request=last, **common), RequestScaleOut)  # type: ignore[arg-type]


def test_a_new_run_of_a_tenant_holding_fewer_slots_goes_ahead_for_capacity_on_its_way():
    h1 = host("h1", capacity=2)
    held = [reservation(f"run-a{i}", h1, tenant="a") for i in range(2)]
    common = {
        "hosts": [h1],
        "reservations": held,
        "queue": queued("a"),
        "pending_scale_outs": [scale_out(slots=1)],
        "runtime": RUNTIME,
        "max_queue": 100,
        "max_hosts": 4,
    }
    # a holds both slots of h1: s0 comes before a0 in fair order, and the slot on its way covers it
    assert admit(request=request("s0"), fair=True, **common) == QueueGlobally(position=1)  # type: ignore[arg-type]
    assert isinstance(admit(request=request("s0"), fair=False, **common), RequestScaleOut)  # type: ignore[arg-type]
