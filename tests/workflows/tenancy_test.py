"""Tenancy through the real workflows: a pool, its ScaleOutWorkflows and real process hosts."""

from __future__ import annotations

from kruntimes.api.phases import RunPhase
from kruntimes.contracts.names import SIGNAL_CANCEL
from kruntimes.contracts.providers import HostSpec
from kruntimes.decisions.scheduling.model import TenancyMode
from tests.support.waiting import eventually
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
        specs = await eventually(
            lambda: _created_specs(platform),
            until=lambda found: len(found) == 1,
            every=0.2,
            what="the create_host input",
        )
        # the provider is told the group too (a Kubernetes host pod is labelled with it)
        assert [(s.tenant, s.tenantGroup) for s in specs] == [("first", "grp")]


async def _created_specs(platform: Platform) -> list[HostSpec]:
    """What each ScaleOutWorkflow of the platform asked its provider to create."""
    specs: list[HostSpec] = []
    query = f"WorkflowType='ScaleOutWorkflow' AND TaskQueue='{platform.settings.run_task_queue}'"
    async for execution in platform.client.list_workflows(query):
        async for event in platform.client.get_workflow_handle(execution.id).fetch_history_events():
            scheduled = event.activity_task_scheduled_event_attributes
            if event.HasField("activity_task_scheduled_event_attributes") and (
                scheduled.activity_type.name == "create_host"
            ):
                [spec] = await platform.client.data_converter.decode(scheduled.input.payloads, [HostSpec])
                specs.append(spec)
    return specs


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


# --- each mode, scale-out from zero: where each tenant's Runs are placed -------------------------
# Hosts of two slots, at most two hosts unless said; the pool's query says whose each host is
# and whose Runs hold its slots.


async def _placements(platform: Platform) -> dict[str, tuple[TenancyMode, str | None, list[str]]]:
    """Each host: its mode, its owner, and the tenants of the Runs holding its slots."""
    pool = await platform.pool()
    return {
        h.hostId: (
            h.tenancy,
            h.tenant,
            sorted(r.tenant or "" for r in pool.reservations if r.hostUid == h.hostUid),
        )
        for h in pool.hosts
    }


async def _holding(platform: Platform, n: int) -> bool:
    return len((await platform.pool()).reservations) == n


def _tenancy(**overrides: object) -> dict[str, object]:
    return {"python": {"runs": 2, "maxHosts": 2, **overrides}}


async def test_shared_tenants_share_the_host_one_of_them_scaled_out(platform_factory) -> None:  # type: ignore[no-untyped-def]
    """From zero: one Shared tenant's Run scales out a shared host; another Shared tenant's Run
    waits for that host rather than asking for its own, and both run on it."""
    config = {"tenants": [{"name": "alpha"}, {"name": "beta", "mode": "Shared"}]}
    async with platform_factory(config=config, **_tenancy()) as platform:
        rt = platform.runtime()
        alpha = await platform.start(run_manifest("alpha-0", runtime=rt, tenant="alpha"))
        await platform.eventually(lambda: _scaling_out(platform), what="the shared scale-out")
        beta = await platform.start(run_manifest("beta-0", runtime=rt, tenant="beta"))
        one = await platform.wait_phase(alpha, RunPhase.Ready)
        two = await platform.wait_phase(beta, RunPhase.Ready)
        assert one.assignedHost is not None and two.assignedHost == one.assignedHost
        assert await _placements(platform) == {
            one.assignedHost: (TenancyMode.Shared, None, ["alpha", "beta"])
        }
        assert not (await platform.pool()).scaleOuts


async def test_a_dedicated_tenant_never_shares_a_host_and_waits_for_its_own(platform_factory) -> None:  # type: ignore[no-untyped-def]
    """From zero: two Dedicated tenants each get a host of their own. The first tenant's third
    Run finds its host full and maxHosts reached: it waits, though the other tenant's host has a
    free slot, and takes its own host's slot once one of its Runs ends."""
    config = {"tenants": [{"name": "alpha", "mode": "Dedicated"}, {"name": "beta", "mode": "Dedicated"}]}
    async with platform_factory(config=config, **_tenancy()) as platform:
        rt = platform.runtime()
        a0 = await platform.start(run_manifest("alpha-0", runtime=rt, tenant="alpha"))
        await platform.eventually(lambda: _scaling_out(platform), what="alpha's scale-out")
        b0 = await platform.start(run_manifest("beta-0", runtime=rt, tenant="beta"))
        mine = (await platform.wait_phase(a0, RunPhase.Ready)).assignedHost
        theirs = (await platform.wait_phase(b0, RunPhase.Ready)).assignedHost
        assert mine is not None and theirs is not None and mine != theirs
        a1 = await platform.start(run_manifest("alpha-1", runtime=rt, tenant="alpha"))
        assert (await platform.wait_phase(a1, RunPhase.Ready)).assignedHost == mine
        a2 = await platform.start(run_manifest("alpha-2", runtime=rt, tenant="alpha"))
        await platform.eventually(lambda: _queued(platform, 1), what="alpha's third Run queued")
        assert (await platform.status(a2)).phase is RunPhase.Pending
        assert await _placements(platform) == {
            mine: (TenancyMode.Dedicated, "alpha", ["alpha", "alpha"]),
            theirs: (TenancyMode.Dedicated, "beta", ["beta"]),
        }
        await a0.signal(SIGNAL_CANCEL)
        assert (await platform.wait_phase(a2, RunPhase.Ready, timeout=30)).assignedHost == mine
        assert (await _placements(platform))[theirs] == (TenancyMode.Dedicated, "beta", ["beta"])


async def test_a_hybrid_tenant_with_fallback_prefers_its_own_host_then_takes_a_shared_slot(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    """From zero: a Shared tenant's two Runs fill a shared host; a Hybrid tenant with
    allowSharedFallback then scales out a host of its own. With a slot free on each host, its
    next Run takes its own host's (though the shared host is the older, first by id); its next,
    its own host full, the shared host's."""
    config = {
        "tenants": [
            {"name": "common"},
            {"name": "hybrid", "mode": "Hybrid", "allowSharedFallback": True},
        ]
    }
    async with platform_factory(config=config, **_tenancy(maxHosts=3)) as platform:
        rt = platform.runtime()
        c0 = await platform.start(run_manifest("common-0", runtime=rt, tenant="common"))
        await platform.eventually(lambda: _scaling_out(platform), what="the shared scale-out")
        c1 = await platform.start(run_manifest("common-1", runtime=rt, tenant="common"))
        shared = (await platform.wait_phase(c0, RunPhase.Ready)).assignedHost
        assert (await platform.wait_phase(c1, RunPhase.Ready)).assignedHost == shared
        h0 = await platform.start(run_manifest("hybrid-0", runtime=rt, tenant="hybrid"))
        own = (await platform.wait_phase(h0, RunPhase.Ready)).assignedHost
        assert own is not None and shared is not None and own != shared
        await c0.signal(SIGNAL_CANCEL)
        await platform.eventually(lambda: _holding(platform, 2), what="common-0's slot freed")
        h1 = await platform.start(run_manifest("hybrid-1", runtime=rt, tenant="hybrid"))
        assert (await platform.wait_phase(h1, RunPhase.Ready)).assignedHost == own
        h2 = await platform.start(run_manifest("hybrid-2", runtime=rt, tenant="hybrid"))
        assert (await platform.wait_phase(h2, RunPhase.Ready)).assignedHost == shared
        assert await _placements(platform) == {
            shared: (TenancyMode.Shared, None, ["common", "hybrid"]),
            own: (TenancyMode.Hybrid, "hybrid", ["hybrid", "hybrid"]),
        }


async def test_a_hybrid_tenant_without_fallback_scales_out_and_waits_for_its_own_host(
    platform_factory,
) -> None:  # type: ignore[no-untyped-def]
    """From zero: a Shared tenant's Run scales out a shared host. A Hybrid tenant without
    allowSharedFallback scales out its own though the shared host has a free slot; its third
    Run, its host full and maxHosts reached, waits (the shared slot still free) and takes its own
    host's slot once one of its Runs ends."""
    config = {"tenants": [{"name": "common"}, {"name": "hybrid", "mode": "Hybrid"}]}
    async with platform_factory(config=config, **_tenancy()) as platform:
        rt = platform.runtime()
        c0 = await platform.start(run_manifest("common-0", runtime=rt, tenant="common"))
        shared = (await platform.wait_phase(c0, RunPhase.Ready)).assignedHost
        h0 = await platform.start(run_manifest("hybrid-0", runtime=rt, tenant="hybrid"))
        h1 = await platform.start(run_manifest("hybrid-1", runtime=rt, tenant="hybrid"))
        own = (await platform.wait_phase(h0, RunPhase.Ready)).assignedHost
        assert own is not None and shared is not None and own != shared
        assert (await platform.wait_phase(h1, RunPhase.Ready)).assignedHost == own
        h2 = await platform.start(run_manifest("hybrid-2", runtime=rt, tenant="hybrid"))
        await platform.eventually(lambda: _queued(platform, 1), what="hybrid's third Run queued")
        assert (await platform.status(h2)).phase is RunPhase.Pending
        assert await _placements(platform) == {
            shared: (TenancyMode.Shared, None, ["common"]),
            own: (TenancyMode.Hybrid, "hybrid", ["hybrid", "hybrid"]),
        }
        await h0.signal(SIGNAL_CANCEL)
        assert (await platform.wait_phase(h2, RunPhase.Ready, timeout=30)).assignedHost == own
        assert (await _placements(platform))[shared] == (TenancyMode.Shared, None, ["common"])
