"""Candidate filter (same runtime, Ready, visible, a free slot) and ordering (own hosts first when
preferred, most free slots, fewest runs, host id)."""

from __future__ import annotations

import pytest

from kruntimes.decisions.scheduling.admission import candidates, free_slots
from kruntimes.decisions.scheduling.model import HostState, TenancyMode, TenantPolicy

from .builders import dedicated, fill, host, hybrid, request, reservation


def ids(hosts):
    return [h.hostId for h in hosts]


def pick(hosts, reservations=(), req=None):
    return ids(candidates(hosts=hosts, reservations=reservations, request=req or request()))


@pytest.mark.parametrize("state", [s for s in HostState if s is not HostState.Ready])
def test_only_ready_hosts_are_candidates(state):
    assert pick([host("h1", state=state), host("h2")]) == ["h2"]


def test_a_full_host_is_not_a_candidate():
    full = host("full", capacity=2)
    assert pick([full, host("free")], fill(full)) == ["free"]


def test_a_host_of_another_runtime_is_not_a_candidate():
    assert pick([host("bash-1", runtime="bash"), host("py-1")]) == ["py-1"]


def test_an_invisible_host_is_not_a_candidate():
    assert pick([dedicated("a-1", "tenant-a"), host("s-1")]) == ["s-1"]


def test_a_tenant_without_a_policy_has_no_candidates():
    assert pick([host("s-1")], req=request(tenant="tenant-unknown")) == []


def test_the_host_with_the_most_free_slots_comes_first():
    busy, quiet = host("busy", capacity=4), host("quiet", capacity=4)
    assert pick([busy, quiet], fill(busy, 3)) == ["quiet", "busy"]


def test_equal_free_slots_go_to_the_host_running_fewer_runs():
    big, small = host("big", capacity=4), host("small", capacity=2)
    # Both have 2 free slots; big runs 2, small runs none.
    assert pick([big, small], fill(big, 2)) == ["small", "big"]


def test_full_ties_are_broken_by_host_id_in_ordinal_order():
    assert pick([host("h9"), host("h10"), host("B"), host("a")]) == ["B", "a", "h10", "h9"]


def test_the_order_does_not_depend_on_the_input_order():
    hosts = [host("c"), host("a", capacity=3), host("b")]
    assert pick(hosts) == pick(list(reversed(hosts))) == ["a", "b", "c"]


def test_a_hybrid_tenant_tries_its_own_hosts_before_shared_ones_even_when_shared_ones_are_emptier():
    own, shared = hybrid("own", "tenant-b", capacity=4), host("shared", capacity=8)
    assert pick([shared, own], fill(own, 3), request(tenant="tenant-b")) == ["own", "shared"]


def test_without_prefer_dedicated_capacity_own_and_shared_hosts_are_ordered_by_load_alone():
    policy = TenantPolicy(mode=TenancyMode.Hybrid, allowSharedFallback=True, preferDedicatedCapacity=False)
    own, shared = hybrid("own", "tenant-b", capacity=4), host("shared", capacity=8)
    assert pick([own, shared], fill(own, 3), request(tenant="tenant-b", tenancy=policy)) == ["shared", "own"]


def test_a_dedicated_tenant_orders_its_own_hosts_by_load():
    a1, a2 = dedicated("a-1", "tenant-a", capacity=4), dedicated("a-2", "tenant-a", capacity=4)
    assert pick([a1, a2], fill(a1, 1), request(tenant="tenant-a")) == ["a-2", "a-1"]


def test_free_slots_counts_only_reservations_of_that_host():
    h1, h2 = host("h1", capacity=3), host("h2", capacity=3)
    reservations = [reservation("r1", h1), reservation("r2", h1), reservation("r3", h2)]
    assert free_slots(host=h1, reservations=reservations) == 1
    assert free_slots(host=h2, reservations=reservations) == 2


def test_reservations_of_an_earlier_host_with_the_same_id_do_not_count():
    old = host("h1", capacity=2, uid="old-uid")
    new = host("h1", capacity=2, uid="new-uid")
    assert free_slots(host=new, reservations=fill(old)) == 2
    assert pick([new], fill(old)) == ["h1"]


def test_free_slots_never_goes_negative():
    h = host("h1", capacity=1)
    assert free_slots(host=h, reservations=fill(h, 3)) == 0
