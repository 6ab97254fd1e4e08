"""Tenancy through the real workflows: a pool, its ScaleOutWorkflows and real process hosts."""

from __future__ import annotations

from kruntimes.api.phases import RunPhase
from kruntimes.contracts.names import SIGNAL_CANCEL
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


BURST_AND_STEADY = {
    "python": {"runs": 2, "maxHosts": 1},
    "config": {"tenants": [{"name": "burst", "queueLimit": 4}, {"name": "steady"}]},
}


async def _queued(platform: Platform, n: int) -> bool:
    return len((await platform.pool()).queue) == n


async def test_one_tenants_backlog_does_not_hold_back_another_tenants_run_past_its_turn(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    """One host of two slots. A tenant fills both and queues four more, up to its queueLimit (its
    fifth is refused, naming that limit); another tenant's Run, queued after them, takes the next
    slot that frees, ahead of the whole backlog."""
    async with platform_factory(**BURST_AND_STEADY) as platform:
        rt = platform.runtime()
        burst = [
            await platform.start(run_manifest(f"burst-{i}", runtime=rt, tenant="burst")) for i in range(2)
        ]
        for handle in burst:
            await platform.wait_phase(handle, RunPhase.Ready)
        backlog = [
            await platform.start(run_manifest(f"burst-{i}", runtime=rt, tenant="burst")) for i in range(2, 6)
        ]
        await platform.eventually(lambda: _queued(platform, 4), what="the burst's backlog queued")
        over = await platform.start(run_manifest("burst-6", runtime=rt, tenant="burst"))
        refused = (await platform.wait_phase(over, RunPhase.Failed)).condition("Ready")
        assert refused is not None and refused.reason == "QueueFull"
        assert "tenant 'burst' holds its queueLimit of 4" in refused.message

        steady = await platform.start(run_manifest("steady-0", runtime=rt, tenant="steady"))
        await platform.eventually(lambda: _queued(platform, 5), what="the steady tenant's Run queued")
        await burst[0].signal(SIGNAL_CANCEL)
        placed = await platform.wait_phase(steady, RunPhase.Ready, timeout=30)
        assert placed.assignedHost is not None
        pool = await platform.pool()
        assert sorted(q.tenant or "" for q in pool.queue) == ["burst"] * 4
        for handle in backlog:
            assert (await platform.status(handle)).phase is RunPhase.Pending
