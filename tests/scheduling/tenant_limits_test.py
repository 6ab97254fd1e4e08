"""A tenant's own limits in a runtime: its Runs per host, its part of the queue (queueLimit,
queueShare), and a QueueFull that names the tenant's limit; its index of Runs per host."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kruntimes.config.runtimes import PlatformConfigError, parse_config
from kruntimes.decisions.scheduling.admission import (
    ReservationIndex,
    admit,
    candidates,
    next_from_queue,
    uncovered,
)
from kruntimes.decisions.scheduling.model import (
    AssignToInstance,
    QueueGlobally,
    Reject,
    RejectReason,
    RequestScaleOut,
    TenancyMode,
    TenantPolicy,
)

from .builders import RUNTIME, decide, host, request, reservation, scale_out

CAPPED = TenantPolicy(maxRunsPerHost=2)
TWO_QUEUED = TenantPolicy(queueLimit=2)
QUARTER = TenantPolicy(queueShare=0.25)


def test_a_tenant_at_its_runs_per_host_goes_to_another_host_with_room():
    h1, h2 = host("h1", capacity=5), host("h2", capacity=5)
    held = [reservation(f"a{i}", h1, tenant="a") for i in range(2)]
    found = candidates(hosts=[h1, h2], reservations=held, request=request("r", tenant="a", tenancy=CAPPED))
    assert [h.hostId for h in found] == ["h2"]


def test_runs_per_host_counts_only_the_tenants_own_runs_on_the_host():
    h1 = host("h1", capacity=5)
    held = [reservation(f"b{i}", h1, tenant="b") for i in range(3)] + [reservation("a0", h1, tenant="a")]
    decision = decide(request("r", tenant="a", tenancy=CAPPED), hosts=[h1], reservations=held)
    assert decision == AssignToInstance(hostId="h1", hostUid="h1-uid")


def test_a_tenant_at_its_runs_per_host_everywhere_scales_out_though_slots_are_free():
    h1 = host("h1", capacity=5)
    held = [reservation(f"a{i}", h1, tenant="a") for i in range(2)]
    decision = decide(request("r", tenant="a", tenancy=CAPPED), hosts=[h1], reservations=held)
    assert isinstance(decision, RequestScaleOut)


def test_a_tenant_at_its_runs_per_host_and_at_max_hosts_waits_for_its_own_runs_to_end():
    h1 = host("h1", capacity=5)
    held = [reservation(f"a{i}", h1, tenant="a") for i in range(2)]
    decision = decide(request("r", tenant="a", tenancy=CAPPED), hosts=[h1], reservations=held, max_hosts=1)
    assert decision == QueueGlobally(position=0)


def test_the_queue_places_a_tenant_up_to_its_runs_per_host_and_others_beyond():
    h1 = host("h1", capacity=4)
    queue = [request(f"a{i}", tenant="a", tenancy=CAPPED) for i in range(3)] + [request("s0")]
    placed = [p.request.runUid for p in next_from_queue(queue=queue, hosts=[h1], reservations=())]
    assert placed == ["a0", "a1", "s0"]


def test_the_index_counts_several_runs_of_a_tenant_and_takes_them_off_one_at_a_time():
    h1 = host("h1", capacity=4)
    index = ReservationIndex([reservation(f"a{i}", h1, tenant="a") for i in range(3)])
    assert (index.tenant_load, index.by_tenant) == ({("h1", "h1-uid", "a"): 3}, {"a": 3})
    index.remove("a0")
    assert (index.tenant_load, index.by_tenant) == ({("h1", "h1-uid", "a"): 2}, {"a": 2})
    index.remove("a1")
    assert (index.tenant_load, index.by_tenant) == ({("h1", "h1-uid", "a"): 1}, {"a": 1})


def test_the_index_counts_each_tenants_runs_per_host_and_forgets_released_ones():
    h1 = host("h1")
    index = ReservationIndex([reservation("a0", h1, tenant="a"), reservation("s0", h1)])
    assert index.tenant_load == {("h1", "h1-uid", "a"): 1, ("h1", "h1-uid", None): 1}
    assert index.by_tenant == {"a": 1, None: 1}
    index.remove("a0")
    assert index.tenant_load == {("h1", "h1-uid", None): 1}
    assert index.by_tenant == {None: 1}


def test_capacity_on_its_way_covers_a_capped_tenant_only_up_to_its_runs_per_host():
    pending = [scale_out(slots=4)]
    queue = [request(f"a{i}", tenant="a", tenancy=CAPPED) for i in range(3)]
    left = uncovered(queue=queue, hosts=[], pending_scale_outs=pending, runtime=RUNTIME)
    assert left == ("a2",)
    # a fourth Run sees two of the host's four slots, both spoken for: it asks for another host
    assert isinstance(
        decide(request("a3", tenant="a", tenancy=CAPPED), queue=queue[:2], pending=pending), RequestScaleOut
    )


def test_a_tenant_at_its_queue_limit_is_refused_naming_its_own_limit():
    queue = [request(f"a{i}", tenant="a", tenancy=TWO_QUEUED) for i in range(2)]
    decision = decide(request("a2", tenant="a", tenancy=TWO_QUEUED), queue=queue, max_hosts=0)
    assert isinstance(decision, Reject) and decision.reason is RejectReason.QueueFull
    assert "tenant 'a' holds its queueLimit of 2 in the 'python' queue" in decision.message


def test_another_tenants_run_still_queues_while_one_tenant_is_at_its_limit():
    queue = [request(f"a{i}", tenant="a", tenancy=TWO_QUEUED) for i in range(2)]
    h1 = host("h1", capacity=1)
    held = [reservation("x", h1)]
    assert decide(request("s0"), hosts=[h1], reservations=held, queue=queue, max_hosts=1) == QueueGlobally(
        position=2
    )


def test_a_tenants_queue_share_is_its_part_of_the_runtimes_queue_rounded_up():
    assert QUARTER.queue_limit(runtime_limit=10) == (3, "queueShare 0.25 of 10 (3 Runs)")
    assert QUARTER.queue_limit(runtime_limit=8) == (2, "queueShare 0.25 of 8 (2 Runs)")
    both = TenantPolicy(queueShare=0.5, queueLimit=3)
    assert both.queue_limit(runtime_limit=100) == (3, "queueLimit of 3")
    assert TenantPolicy().queue_limit(runtime_limit=100) is None


def test_a_tenant_past_its_queue_share_is_refused_naming_the_share():
    queue = [request(f"a{i}", tenant="a", tenancy=QUARTER) for i in range(3)]
    decision = decide(request("a3", tenant="a", tenancy=QUARTER), queue=queue, max_queue=10, max_hosts=0)
    assert isinstance(decision, Reject) and decision.reason is RejectReason.QueueFull
    assert "queueShare 0.25 of 10 (3 Runs)" in decision.message


def test_a_paused_queue_refuses_a_tenant_past_its_limit_and_takes_the_others():
    queue = [request(f"a{i}", tenant="a", tenancy=TWO_QUEUED) for i in range(2)]
    common = {
        "hosts": [host("h1")],
        "reservations": (),
        "queue": queue,
        "pending_scale_outs": (),
        "runtime": RUNTIME,
        "max_queue": 10,
        "max_hosts": 4,
        "paused": True,
    }
    refused = admit(request=request("a2", tenant="a", tenancy=TWO_QUEUED), **common)  # type: ignore[arg-type]
    assert isinstance(refused, Reject) and "paused; tenant 'a' holds its queueLimit of 2" in refused.message
    assert admit(request=request("s0"), **common) == QueueGlobally(position=2)  # type: ignore[arg-type]


def test_a_free_slot_is_taken_whatever_the_tenants_queue_holds():
    queue = [request(f"a{i}", tenant="a", tenancy=TWO_QUEUED) for i in range(2)]
    decision = decide(request("a2", tenant="a", tenancy=TWO_QUEUED), hosts=[host("h1")], queue=queue)
    assert isinstance(decision, AssignToInstance)


def test_the_runtimes_file_takes_a_tenants_limits_into_its_policy():
    config = parse_config(
        {
            "tenants": [
                {"name": "a", "mode": "Dedicated", "maxRunsPerHost": 3, "queueLimit": 50, "queueShare": 0.5}
            ]
        }
    )
    policy = config.tenant_policy("a")
    assert policy is not None
    assert (policy.mode, policy.maxRunsPerHost, policy.queueLimit, policy.queueShare) == (
        TenancyMode.Dedicated,
        3,
        50,
        0.5,
    )


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ({"queueShare": 0}, "queueShare"),
        ({"queueShare": 1.5}, "queueShare"),
        ({"maxRunsPerHost": 0}, "maxRunsPerHost"),
        ({"queueLimit": -1}, "queueLimit"),
    ],
)
def test_the_runtimes_file_refuses_a_tenant_limit_out_of_its_range_by_name(setting, field):
    with pytest.raises(PlatformConfigError) as refused:
        parse_config({"tenants": [{"name": "a", **setting}]})
    assert any(p.startswith(f"tenants.0.{field}:") for p in refused.value.problems)


CAPS = {
    "a": TenantPolicy(maxRunsPerHost=1),
    "b": TenantPolicy(maxRunsPerHost=2, queueShare=0.5),
    "c": TenantPolicy(),
}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.sampled_from("abc")), max_size=8),
    st.lists(st.sampled_from("abc"), max_size=20),
    st.booleans(),
)
def test_placing_the_queue_never_puts_more_of_a_tenants_runs_on_a_host_than_it_may(held_spec, queued, fair):
    hosts = [host(f"h{i}", capacity=3) for i in range(3)]
    held = []
    for n, (i, tenant) in enumerate(held_spec):
        on = hosts[i]
        if sum(1 for r in held if r.hostId == on.hostId) < on.capacity:
            held.append(reservation(f"held-{n}", on, tenant=tenant))
    queue = [request(f"q{n}-{t}", tenant=t, tenancy=CAPS[t]) for n, t in enumerate(queued)]
    placements = next_from_queue(queue=queue, hosts=hosts, reservations=held, fair=fair)
    before = {(r.hostId, r.tenant) for r in held}
    count: dict[tuple[str, str | None], int] = {}
    for r in held:
        count[(r.hostId, r.tenant)] = count.get((r.hostId, r.tenant), 0) + 1
    per_host: dict[str, int] = {h.hostId: sum(1 for r in held if r.hostId == h.hostId) for h in hosts}
    for p in placements:
        key = (p.assignment.hostId, p.request.tenant)
        count[key] = count.get(key, 0) + 1
        per_host[p.assignment.hostId] += 1
        cap = CAPS[p.request.tenant or "c"].maxRunsPerHost
        assert cap is None or count[key] <= max(cap, 0), (key, before)
    assert all(n <= 3 for n in per_host.values())


def test_a_tenant_below_its_queue_limit_still_queues():
    queue = [request("a0", tenant="a", tenancy=TWO_QUEUED)]
    decision = decide(
        request("a1", tenant="a", tenancy=TWO_QUEUED),
        queue=queue,
        hosts=[host("h1")],
        reservations=[reservation("x", host("h1")), reservation("y", host("h1"))],
        max_hosts=1,
    )
    assert decision == QueueGlobally(position=1)


def test_the_smaller_of_a_tenants_queue_limit_and_share_is_the_one_named():
    assert TenantPolicy(queueShare=0.1, queueLimit=50).queue_limit(runtime_limit=100) == (
        10,
        "queueShare 0.1 of 100 (10 Runs)",
    )


def test_capacity_on_its_way_goes_first_to_the_tenant_holding_fewer_slots():
    h1 = host("h1", capacity=2)
    index = ReservationIndex([reservation(f"run-a{i}", h1, tenant="a") for i in range(2)])
    queue = [request("a0", tenant="a", tenancy=TenantPolicy()), request("s0")]
    pending = [scale_out(slots=1)]
    fair = uncovered(
        queue=queue, hosts=[h1], pending_scale_outs=pending, runtime=RUNTIME, index=index, fair=True
    )
    assert fair == ("a0",)
    fifo = uncovered(queue=queue, hosts=[h1], pending_scale_outs=pending, runtime=RUNTIME, index=index)
    assert fifo == ("s0",)


def test_a_queued_run_of_a_tenant_the_platform_does_not_know_is_covered_by_nothing():
    queue = [request("x0", tenant="x"), request("s0")]
    assert queue[0].policy is None
    left = uncovered(
        queue=queue, hosts=[], pending_scale_outs=[scale_out(slots=2)], runtime=RUNTIME, fair=True
    )
    assert left == ("x0",)
