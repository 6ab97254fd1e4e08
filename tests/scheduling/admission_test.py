"""Each branch of admit(): assign, queue, scale out, reject (a scale-out never dispatches: the
queued run is re-admitted once the host is ready)."""

from __future__ import annotations

import pytest

from kruntimes.decisions.scheduling.admission import provider_name, select_provider
from kruntimes.decisions.scheduling.failures import FailureReason, ProviderFailure, ProviderOperation
from kruntimes.decisions.scheduling.model import (
    SHARED_POLICY,
    AssignToInstance,
    HostState,
    QueueGlobally,
    Reject,
    RejectReason,
    RequestScaleOut,
    ScaleOutReason,
    ScaleOutStatus,
    TenancyMode,
    TenantPolicy,
)

from .builders import DEDICATED_A, decide, dedicated, fill, host, hybrid, request, reservation, scale_out


def assigned(h):
    return AssignToInstance(hostId=h.hostId, hostUid=h.hostUid)


# --- refusals before anything else ---------------------------------------------------------------


def test_a_request_for_another_runtime_is_rejected_as_runtime_unknown():
    decision = decide(request(runtime="bash"), hosts=[host("bash-1", runtime="bash")])
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.RuntimeUnknown
    assert "'bash'" in decision.message


def test_a_named_tenant_without_a_policy_is_rejected_as_not_allowed():
    decision = decide(request(tenant="tenant-unknown"), hosts=[host("h1")])
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.TenantNotAllowed


def test_a_run_without_a_tenant_uses_the_shared_policy():
    h = host("h1")
    assert decide(request(), hosts=[h]) == assigned(h)


# --- assignment ----------------------------------------------------------------------------------


def test_a_free_visible_host_gets_the_run():
    h = host("h1")
    assert decide(request(), hosts=[h]) == assigned(h)


def test_the_best_candidate_gets_the_run():
    busy, quiet = host("busy", capacity=4), host("quiet", capacity=4)
    assert decide(request(), hosts=[busy, quiet], reservations=fill(busy, 1)) == assigned(quiet)


def test_a_run_that_already_holds_a_slot_gets_the_same_host_again():
    h1, h2 = host("h1"), host("h2", capacity=9)
    assert decide(request("r1"), hosts=[h1, h2], reservations=[reservation("r1", h1)]) == assigned(h1)


def test_a_run_already_in_the_queue_keeps_its_place():
    queue = [request("q0"), request("r1"), request("q2")]
    assert decide(request("r1"), hosts=[host("h1")], queue=queue) == QueueGlobally(position=1)


def test_a_dedicated_tenant_is_never_assigned_free_shared_capacity():
    decision = decide(request(tenant="tenant-a"), hosts=[host("shared", capacity=10)])
    assert isinstance(decision, RequestScaleOut)
    assert decision.tenant == "tenant-a"
    assert decision.tenancy is TenancyMode.Dedicated


def test_a_hybrid_tenant_falls_back_to_shared_capacity_when_its_own_is_full():
    own, shared = hybrid("own", "tenant-b"), host("shared")
    decision = decide(request(tenant="tenant-b"), hosts=[own, shared], reservations=fill(own))
    assert decision == assigned(shared)


def test_a_hybrid_tenant_uses_its_own_capacity_first():
    own, shared = hybrid("own", "tenant-b"), host("shared", capacity=9)
    assert decide(request(tenant="tenant-b"), hosts=[shared, own]) == assigned(own)


def test_a_hybrid_tenant_without_fallback_scales_out_rather_than_use_shared_capacity():
    own, shared = hybrid("own", "tenant-c"), host("shared")
    decision = decide(request(tenant="tenant-c"), hosts=[own, shared], reservations=fill(own))
    assert isinstance(decision, RequestScaleOut)
    assert (decision.tenant, decision.tenancy) == ("tenant-c", TenancyMode.Hybrid)


# --- the queue bound -----------------------------------------------------------------------------


def test_with_no_free_slot_and_a_full_queue_the_run_is_rejected_as_queue_full():
    full = host("h1")
    queue = [request(f"q{i}") for i in range(3)]
    decision = decide(request("r1"), hosts=[full], reservations=fill(full), queue=queue, max_queue=3)
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.QueueFull


def test_a_queue_limit_of_zero_rejects_every_run_that_cannot_be_placed_at_once():
    h = host("h1")
    assert decide(request("r1"), hosts=[h], max_queue=0) == assigned(h)
    decision = decide(request("r2"), hosts=[h], reservations=fill(h), max_queue=0)
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.QueueFull


def test_a_full_queue_is_rejected_even_when_a_scale_out_would_be_possible():
    queue = [request(f"q{i}") for i in range(2)]
    decision = decide(request("r1"), queue=queue, max_queue=2, max_hosts=10)
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.QueueFull


def test_the_last_queue_place_is_still_given():
    full = host("h1")
    queue = [request("q0")]
    decision = decide(
        request("r1"), hosts=[full], reservations=fill(full), queue=queue, max_queue=2, max_hosts=1
    )
    assert decision == QueueGlobally(position=1)


# --- scale-out -----------------------------------------------------------------------------------


def test_with_no_capacity_at_all_the_pool_scales_out_and_the_run_waits_at_the_back_of_the_queue():
    queue = [request("q0", tenant="tenant-a")]
    decision = decide(request("r1"), queue=queue)
    assert decision == RequestScaleOut(
        reason=ScaleOutReason.NoVisibleCapacity,
        provider="process",
        tenant=None,
        policy=SHARED_POLICY,
        position=1,
    )


def test_a_dedicated_tenants_scale_out_creates_a_host_it_owns_and_carries_its_settings():
    policy = TenantPolicy(mode=TenancyMode.Dedicated, group="enterprise", maxHosts=3)
    decision = decide(request(tenant="tenant-a", tenancy=policy))
    assert isinstance(decision, RequestScaleOut)
    assert (decision.tenant, decision.tenancy, decision.tenantGroup) == (
        "tenant-a",
        "Dedicated",
        "enterprise",
    )
    assert decision.policy == policy


def test_a_hybrid_tenants_scale_out_creates_a_hybrid_host_it_owns():
    decision = decide(request(tenant="tenant-b"))
    assert isinstance(decision, RequestScaleOut)
    assert (decision.tenant, decision.tenancy) == ("tenant-b", TenancyMode.Hybrid)


def test_a_shared_mode_tenants_scale_out_creates_an_unowned_shared_host():
    decision = decide(request(tenant="tenant-s"))
    assert isinstance(decision, RequestScaleOut)
    assert (decision.tenant, decision.tenancy, decision.tenantGroup) == (None, TenancyMode.Shared, None)


def test_a_full_host_of_another_tenant_does_not_stop_a_scale_out():
    other = dedicated("x-1", "tenant-x")
    assert isinstance(
        decide(request(tenant="tenant-a"), hosts=[other], reservations=fill(other)), RequestScaleOut
    )


def test_a_pending_scale_out_that_covers_the_run_makes_it_queue_instead_of_scaling_out_again():
    pending = [scale_out(slots=2)]
    assert decide(request("r1"), pending=pending) == QueueGlobally(position=0)


def test_a_pending_scale_out_covers_queued_runs_first_and_then_another_is_requested():
    pending = [scale_out(slots=2)]
    queue = [request("q0"), request("q1")]
    assert isinstance(decide(request("r1"), pending=pending, queue=queue), RequestScaleOut)
    assert decide(request("r1"), pending=pending, queue=queue[:1]) == QueueGlobally(position=1)


def test_queued_runs_that_cannot_see_the_pending_capacity_do_not_compete_for_it():
    pending = [scale_out(slots=1)]
    queue = [request("q0", tenant="tenant-a"), request("q1", tenant="tenant-c")]
    assert decide(request("r1"), pending=pending, queue=queue) == QueueGlobally(position=2)


def test_another_tenants_pending_scale_out_does_not_cover_the_run():
    pending = [scale_out(tenant="tenant-a", policy=DEDICATED_A, slots=10)]
    decision = decide(request("r1", tenant="tenant-b"), pending=pending)
    assert isinstance(decision, RequestScaleOut)
    assert decision.tenant == "tenant-b"


def test_a_pending_shared_scale_out_covers_a_hybrid_tenant_with_fallback():
    assert decide(request("r1", tenant="tenant-b"), pending=[scale_out(slots=1)]) == QueueGlobally(position=0)


def test_a_pending_shared_scale_out_does_not_cover_a_dedicated_tenant():
    decision = decide(request("r1", tenant="tenant-a"), pending=[scale_out(slots=5)])
    assert isinstance(decision, RequestScaleOut)


def test_a_visible_host_still_being_assigned_covers_the_run():
    coming = host("h1", state=HostState.Assigned, capacity=1)
    assert decide(request("r1"), hosts=[coming]) == QueueGlobally(position=0)


def test_a_host_still_being_assigned_that_the_run_cannot_see_does_not_cover_it():
    coming = dedicated("a-1", "tenant-a", state=HostState.Assigned)
    assert isinstance(decide(request("r1"), hosts=[coming]), RequestScaleOut)


@pytest.mark.parametrize("status", [ScaleOutStatus.Fulfilled, ScaleOutStatus.Failed])
def test_finished_scale_outs_neither_cover_runs_nor_count_towards_max_hosts(status):
    failure = ProviderFailure.of(
        FailureReason.OperationTimeout, provider="process", operation=ProviderOperation.Create
    )
    finished = scale_out(
        status=status,
        host_id="gone" if status is ScaleOutStatus.Fulfilled else None,
        failure=failure if status is ScaleOutStatus.Failed else None,
    )
    assert isinstance(decide(request("r1"), pending=[finished], max_hosts=1), RequestScaleOut)


def test_scale_outs_of_another_runtime_are_ignored():
    other = scale_out(runtime="bash", slots=5)
    assert isinstance(decide(request("r1"), pending=[other], max_hosts=1), RequestScaleOut)


# --- max hosts -----------------------------------------------------------------------------------


def test_at_max_hosts_a_run_queues_when_a_visible_host_will_free_a_slot():
    full = host("h1")
    assert decide(request("r1"), hosts=[full], reservations=fill(full), max_hosts=1) == QueueGlobally(
        position=0
    )


def test_at_max_hosts_a_run_queues_behind_a_pending_scale_out_it_can_see_even_if_not_fully_covered():
    queue = [request("q0"), request("q1")]
    pending = [scale_out(slots=1)]
    assert decide(request("r1"), queue=queue, pending=pending, max_hosts=1) == QueueGlobally(position=2)


def test_at_max_hosts_a_run_no_host_will_ever_serve_is_rejected():
    others = [dedicated(f"x-{i}", "tenant-x") for i in range(2)]
    decision = decide(request("r1", tenant="tenant-a"), hosts=others, max_hosts=2)
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.MaxHostsReached
    assert "maxHosts=2" in decision.message


def test_a_draining_visible_host_gives_no_hope_of_a_slot():
    draining = host("h1", state=HostState.Draining)
    decision = decide(request("r1"), hosts=[draining], max_hosts=1)
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.MaxHostsReached


@pytest.mark.parametrize(
    ("state", "counts"),
    [
        (HostState.Unassigned, True),
        (HostState.Assigned, True),
        (HostState.Ready, True),
        (HostState.Draining, True),
        (HostState.Terminating, True),
        (HostState.Lost, False),
    ],
)
def test_every_host_that_still_exists_counts_towards_max_hosts(state, counts):
    other = dedicated("x-1", "tenant-x", state=state)
    decision = decide(request("r1"), hosts=[other], max_hosts=1)
    if counts:
        assert isinstance(decision, Reject)
        assert decision.reason is RejectReason.MaxHostsReached
    else:
        assert isinstance(decision, RequestScaleOut)


def test_a_pending_scale_out_counts_towards_max_hosts():
    pending = [scale_out(tenant="tenant-x", policy=DEDICATED_A, slots=1)]
    decision = decide(request("r1"), pending=pending, max_hosts=1)
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.MaxHostsReached


def test_a_scale_out_whose_host_is_already_in_the_pool_is_counted_once():
    new = dedicated("x-1", "tenant-x", state=HostState.Assigned)
    provisioning = scale_out(
        tenant="tenant-x", policy=DEDICATED_A, status=ScaleOutStatus.Provisioning, host_id="x-1"
    )
    assert isinstance(
        decide(request("r1"), hosts=[new], pending=[provisioning], max_hosts=2), RequestScaleOut
    )


def test_a_tenant_at_its_own_max_hosts_queues_for_its_busy_hosts():
    policy = TenantPolicy(mode=TenancyMode.Dedicated, maxHosts=1)
    own = dedicated("a-1", "tenant-a")
    decision = decide(request("r1", tenant="tenant-a", tenancy=policy), hosts=[own], reservations=fill(own))
    assert decision == QueueGlobally(position=0)


def test_a_tenant_allowed_no_hosts_of_its_own_is_rejected_as_max_hosts_reached():
    policy = TenantPolicy(mode=TenancyMode.Dedicated, maxHosts=0)
    decision = decide(request("r1", tenant="tenant-a", tenancy=policy))
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.MaxHostsReached
    assert "tenant 'tenant-a'" in decision.message


def test_a_tenants_max_hosts_counts_only_hosts_of_its_own_scope():
    # A shared host (or another tenant's) must not be counted as tenant-a's capacity.
    policy = TenantPolicy(mode=TenancyMode.Dedicated, maxHosts=1)
    shared, other = host("shared"), dedicated("x-1", "tenant-x")
    decision = decide(request("r1", tenant="tenant-a", tenancy=policy), hosts=[shared, other], max_hosts=10)
    assert isinstance(decision, RequestScaleOut)
    assert decision.tenant == "tenant-a"


def test_a_tenants_pending_scale_outs_count_towards_its_max_hosts():
    policy = TenantPolicy(mode=TenancyMode.Hybrid, maxHosts=1)
    pending = [scale_out(tenant="tenant-b", policy=policy, slots=1)]
    queue = [request("q0", tenant="tenant-b", tenancy=policy)]
    decision = decide(request("r1", tenant="tenant-b", tenancy=policy), pending=pending, queue=queue)
    assert decision == QueueGlobally(position=1)


def test_a_shared_tenants_max_hosts_counts_the_shared_pool():
    policy = TenantPolicy(maxHosts=1)
    shared = host("shared")
    decision = decide(
        request("r1", tenant="tenant-s", tenancy=policy), hosts=[shared], reservations=fill(shared)
    )
    assert decision == QueueGlobally(position=0)


# --- providers -----------------------------------------------------------------------------------


def test_the_scale_out_provider_is_the_requests_hint_first():
    decision = decide(request(hint="kubernetes"), default_provider="attach")
    assert isinstance(decision, RequestScaleOut)
    assert decision.provider == "kubernetes"


def test_the_scale_out_provider_is_the_runtime_default_without_a_hint():
    decision = decide(request(), default_provider="attach")
    assert isinstance(decision, RequestScaleOut)
    assert decision.provider == "attach"


def test_the_scale_out_provider_is_process_without_hint_or_default():
    decision = decide(request())
    assert isinstance(decision, RequestScaleOut)
    assert decision.provider == "process"


def test_an_unknown_provider_rejects_the_run_as_no_provider():
    decision = decide(request(hint="kubernetes"), providers={"process", "attach"})
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.NoProvider
    assert "'kubernetes'" in decision.message


def test_an_unknown_provider_does_not_matter_when_a_host_is_free():
    h = host("h1")
    assert decide(request(hint="kubernetes"), hosts=[h], providers={"process"}) == assigned(h)


def test_provider_selection_never_falls_back_past_an_unknown_hint():
    assert select_provider(hint="nope", runtime_default="process", known={"process"}) is None
    assert select_provider(hint=None, runtime_default=None, known={"process"}) == "process"
    assert select_provider(hint=None, runtime_default="attach", known=None) == "attach"
    assert provider_name(hint="", runtime_default="") == "process"


def test_the_decision_is_the_same_for_the_same_inputs():
    hosts = [host(f"h{i}", capacity=3) for i in range(5)]
    reservations = [reservation("x", hosts[2]), reservation("y", hosts[4])]
    first = decide(request("r1", tenant="tenant-b"), hosts=hosts, reservations=reservations)
    again = decide(request("r1", tenant="tenant-b"), hosts=list(reversed(hosts)), reservations=reservations)
    assert first == again == assigned(hosts[0])


# --- what a rejected Run is told, and capacity on its way -------------------------------------


def test_a_rejected_run_is_told_why_in_its_message():
    not_allowed = decide(request(tenant="tenant-unknown"), hosts=[host("h1")])
    assert not_allowed == Reject(
        reason=RejectReason.TenantNotAllowed,
        message="tenant 'tenant-unknown' is not configured on this platform",
    )
    full = host("h1")
    queue_full = decide(request("r1"), hosts=[full], reservations=fill(full), max_queue=0)
    assert queue_full == Reject(
        reason=RejectReason.QueueFull, message="no free slot and the 'python' queue holds its limit of 0 runs"
    )


def test_a_shared_tenant_allowed_no_hosts_is_told_the_shared_pool_is_at_its_max_hosts():
    decision = decide(request("r1", tenant="tenant-s", tenancy=TenantPolicy(maxHosts=0)))
    assert decision == Reject(
        reason=RejectReason.MaxHostsReached,
        message="no capacity can appear: the shared pool has reached its maxHosts=0 on runtime 'python'",
    )


def test_an_unknown_runtime_provider_is_named_in_the_rejection():
    decision = decide(request(), default_provider="kubernetes", providers={"process"})
    assert decision == Reject(reason=RejectReason.NoProvider, message="no host provider named 'kubernetes'")


def test_a_scale_out_whose_host_is_being_provisioned_still_covers_the_run():
    provisioning = scale_out(status=ScaleOutStatus.Provisioning, host_id="h9", slots=2)
    assert decide(request("r1"), pending=[provisioning]) == QueueGlobally(position=0)


def test_the_tenants_own_host_still_being_assigned_covers_its_run():
    coming = dedicated("a-1", "tenant-a", state=HostState.Assigned, capacity=1)
    assert decide(request("r1", tenant="tenant-a"), hosts=[coming]) == QueueGlobally(position=0)


GROUP_G = TenantPolicy(mode=TenancyMode.Dedicated, group="grp")


def test_a_host_of_the_tenants_group_still_being_assigned_covers_its_run():
    coming = host("g-1", group="grp", state=HostState.Assigned, capacity=1)
    assert decide(request("r1", tenant="tenant-g", tenancy=GROUP_G), hosts=[coming]) == QueueGlobally(
        position=0
    )


def test_a_pending_scale_out_for_the_tenants_group_covers_its_run():
    pending = [scale_out(tenant="tenant-h", policy=GROUP_G, slots=1)]
    assert decide(request("r1", tenant="tenant-g", tenancy=GROUP_G), pending=pending) == QueueGlobally(
        position=0
    )


def test_the_reserved_slots_of_a_host_being_assigned_are_not_capacity_on_its_way():
    full = host("h1", state=HostState.Assigned, capacity=1)
    assert isinstance(decide(request("r1"), hosts=[full], reservations=fill(full)), RequestScaleOut)
    half = host("h1", state=HostState.Assigned, capacity=2)
    decision = decide(request("r1"), hosts=[half], reservations=fill(half, 1), queue=[request("q0")])
    assert isinstance(decision, RequestScaleOut), "one free slot, and a queued run ahead for it"


def test_a_tenant_below_its_max_hosts_scales_out_again():
    policy = TenantPolicy(mode=TenancyMode.Dedicated, maxHosts=2)
    own = dedicated("a-1", "tenant-a")
    decision = decide(request("r1", tenant="tenant-a", tenancy=policy), hosts=[own], reservations=fill(own))
    assert isinstance(decision, RequestScaleOut)
    pending = [scale_out(tenant="tenant-a", policy=policy, slots=1)]
    queue = [request("q0", tenant="tenant-a", tenancy=policy)]
    decision = decide(request("r1", tenant="tenant-a", tenancy=policy), pending=pending, queue=queue)
    assert isinstance(decision, RequestScaleOut), "one pending scale-out of two allowed"


def test_a_shared_tenants_max_hosts_counts_pending_shared_scale_outs():
    policy = TenantPolicy(maxHosts=1)
    queue = [request("q0", tenant="tenant-s", tenancy=policy)]
    decision = decide(
        request("r1", tenant="tenant-s", tenancy=policy), pending=[scale_out(slots=1)], queue=queue
    )
    assert decision == QueueGlobally(position=1)
