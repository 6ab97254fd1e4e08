"""Tenant visibility: which hosts a tenant may see (and a Dedicated tenant never falls back to
shared capacity)."""

from __future__ import annotations

import pytest

from kruntimes.decisions.scheduling.admission import is_visible, visible_hosts
from kruntimes.decisions.scheduling.model import HostState, TenancyMode, TenantPolicy

from .builders import dedicated, host, hybrid, request

SHARED = host("shared-1")
OWN_A = dedicated("a-1", "tenant-a")
OWN_B_HYBRID = hybrid("b-1", "tenant-b")
OTHER_DEDICATED = dedicated("x-1", "tenant-x")
OTHER_HYBRID = hybrid("x-2", "tenant-x")
UNOWNED_HYBRID = hybrid("orphan-1", None)
UNOWNED_DEDICATED = dedicated("orphan-2", None)
ALL = [SHARED, OWN_A, OWN_B_HYBRID, OTHER_DEDICATED, OTHER_HYBRID, UNOWNED_HYBRID, UNOWNED_DEDICATED]


def ids(hosts):
    return [h.hostId for h in hosts]


@pytest.mark.parametrize(
    ("tenant", "expected"),
    [
        (None, ["shared-1"]),
        ("tenant-s", ["shared-1"]),
        ("tenant-a", ["a-1"]),
        ("tenant-b", ["shared-1", "b-1"]),
        ("tenant-c", []),
        ("tenant-unknown", []),
    ],
)
def test_each_tenant_sees_exactly_the_hosts_its_policy_allows(tenant, expected):
    assert ids(visible_hosts(hosts=ALL, request=request(tenant=tenant))) == expected


def test_a_dedicated_tenant_sees_only_hosts_it_owns():
    visible = visible_hosts(hosts=ALL, request=request(tenant="tenant-a"))
    assert visible == (OWN_A,)


def test_a_dedicated_tenant_never_sees_shared_hosts():
    assert visible_hosts(hosts=[SHARED], request=request(tenant="tenant-a")) == ()


def test_a_dedicated_tenant_also_sees_a_hybrid_host_it_owns():
    own_hybrid = hybrid("a-2", "tenant-a")
    assert visible_hosts(hosts=[own_hybrid], request=request(tenant="tenant-a")) == (own_hybrid,)


def test_a_run_without_a_tenant_sees_only_the_shared_pool():
    assert visible_hosts(hosts=ALL, request=request()) == (SHARED,)


def test_a_shared_mode_tenant_sees_shared_hosts_and_no_other_tenants_hosts():
    assert visible_hosts(hosts=ALL, request=request(tenant="tenant-s")) == (SHARED,)


def test_a_shared_mode_tenant_sees_a_dedicated_host_it_owns_because_ownership_decides():
    # A Dedicated host is visible to its owning tenant, whatever the tenant's own mode.
    owned = dedicated("s-1", "tenant-s")
    assert visible_hosts(hosts=[owned, SHARED], request=request(tenant="tenant-s")) == (owned, SHARED)


def test_a_hybrid_tenant_sees_shared_hosts_only_when_fallback_is_allowed():
    with_fallback = request(tenant="tenant-b")
    without = request(tenant="tenant-b", tenancy=TenantPolicy(mode=TenancyMode.Hybrid))
    assert visible_hosts(hosts=[SHARED], request=with_fallback) == (SHARED,)
    assert visible_hosts(hosts=[SHARED], request=without) == ()


def test_a_hybrid_tenant_sees_its_own_hosts_with_or_without_fallback():
    without = request(tenant="tenant-b", tenancy=TenantPolicy(mode=TenancyMode.Hybrid))
    assert visible_hosts(hosts=[OWN_B_HYBRID], request=without) == (OWN_B_HYBRID,)


def test_an_unowned_hybrid_host_is_never_visible_even_with_shared_fallback():
    for tenant in (None, "tenant-s", "tenant-a", "tenant-b", "tenant-c"):
        assert visible_hosts(hosts=[UNOWNED_HYBRID], request=request(tenant=tenant)) == ()


def test_an_unowned_dedicated_host_is_never_visible():
    for tenant in (None, "tenant-s", "tenant-a", "tenant-b", "tenant-c"):
        assert visible_hosts(hosts=[UNOWNED_DEDICATED], request=request(tenant=tenant)) == ()


def test_another_tenants_hybrid_host_stays_invisible_to_a_hybrid_tenant_with_fallback():
    # Fallback is to Shared capacity, never to every Hybrid host.
    assert visible_hosts(hosts=[OTHER_HYBRID], request=request(tenant="tenant-b")) == ()


def test_a_host_owned_by_a_tenant_group_is_visible_to_every_tenant_of_that_group():
    group_host = dedicated("g-1", None, group="enterprise")
    member = TenantPolicy(mode=TenancyMode.Dedicated, group="enterprise")
    outsider = TenantPolicy(mode=TenancyMode.Dedicated, group="other")
    assert visible_hosts(hosts=[group_host], request=request(tenant="tenant-m", tenancy=member)) == (
        group_host,
    )
    assert visible_hosts(hosts=[group_host], request=request(tenant="tenant-o", tenancy=outsider)) == ()
    assert visible_hosts(hosts=[group_host], request=request(tenant="tenant-a")) == ()


def test_a_group_less_tenant_does_not_match_a_group_less_host_by_absence():
    orphan = hybrid("orphan-3", None)
    assert visible_hosts(hosts=[orphan], request=request(tenant="tenant-b")) == ()


def test_tenant_labels_never_make_a_host_visible():
    # Labels are metadata anyone may set, not the tenant boundary.
    labelled = hybrid("orphan-4", None, labels={"tenant.id": "tenant-b", "isolation.mode": "Hybrid"})
    assert visible_hosts(hosts=[labelled], request=request(tenant="tenant-b")) == ()


def test_a_named_tenant_without_a_policy_sees_nothing_not_even_the_shared_pool():
    assert visible_hosts(hosts=[SHARED], request=request(tenant="tenant-unknown")) == ()


def test_visible_hosts_keeps_the_input_order():
    hosts = [host("z"), host("a"), host("m")]
    assert ids(visible_hosts(hosts=hosts, request=request())) == ["z", "a", "m"]


def test_visibility_does_not_depend_on_host_state():
    for state_host in (host("s", state=HostState.Draining), host("t", state=HostState.Lost)):
        assert visible_hosts(hosts=[state_host], request=request()) == (state_host,)


@pytest.mark.parametrize("mode", list(TenancyMode))
def test_the_visibility_rule_for_a_shared_scope_depends_only_on_the_tenants_mode_and_fallback(mode):
    fallback = mode is TenancyMode.Hybrid
    policy = TenantPolicy(mode=mode, allowSharedFallback=fallback)
    assert is_visible(
        tenancy=TenancyMode.Shared, owner=None, owner_group=None, tenant="tenant-q", policy=policy
    ) == (mode is not TenancyMode.Dedicated)
