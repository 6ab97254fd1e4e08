"""Tenancy through the real workflows: a pool, its ScaleOutWorkflows and real process hosts."""

from __future__ import annotations

from kruntimes.api.phases import RunPhase
from kruntimes.decisions.scheduling.model import TenancyMode
from tests.workflows.conftest import Platform, run_manifest

GROUP_OF_TWO = {
    "tenants": [
        {"name": "first", "mode": "Dedicated", "group": "grp"},
        {"name": "second", "mode": "Dedicated", "group": "grp"},
    ]
}


async def _scaling_out(platform: Platform) -> bool:
    pool = await platform.pool()
    return bool(pool.scaleOuts or pool.hosts)


async def test_a_host_scaled_out_for_one_tenant_of_a_group_takes_the_groups_other_tenant(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    """From zero hosts: the first tenant's Run asks for a host; the second tenant's Run, of the
    same group, waits for that host (admission counts it as the group's) and is placed on it."""
    async with platform_factory(config=GROUP_OF_TWO) as platform:
        first = await platform.start(run_manifest("first-fn", runtime=platform.runtime(), tenant="first"))
        await platform.eventually(lambda: _scaling_out(platform), what="the first tenant's scale-out")
        second = await platform.start(run_manifest("second-fn", runtime=platform.runtime(), tenant="second"))
        one = await platform.wait_phase(first, RunPhase.Ready)
        two = await platform.wait_phase(second, RunPhase.Ready, timeout=30)
        assert one.assignedHost is not None and two.assignedHost == one.assignedHost
        pool = await platform.pool()
        assert [(h.tenant, h.tenantGroup, h.tenancy) for h in pool.hosts] == [
            ("first", "grp", TenancyMode.Dedicated)
        ]
        assert not pool.queue and not pool.scaleOuts
