"""Random sequences of admit / release / host add, change and removal never break the invariants:
no host holds more reservations than its capacity, a run holds at most one reservation, a run is
never both queued and placed, the queue stays bounded, and every placement is tenant-visible."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kruntimes.decisions.scheduling import model
from kruntimes.decisions.scheduling.admission import (
    candidates,
    next_from_queue,
    release,
    release_host,
    reserve,
    visible_hosts,
    withdraw,
)

from .builders import RUNTIME, T0, decide, host, request

MAX_QUEUE = 4
MAX_HOSTS = 4
HOST_IDS = [f"h{i}" for i in range(5)]
RUNS = [f"r{i}" for i in range(10)]
# A run's tenant is part of its identity; None is the anonymous shared tenant.
TENANT_OF = dict(
    zip(RUNS, [None, "tenant-a", "tenant-b", "tenant-c", "tenant-s", "tenant-unknown"] * 2, strict=False)
)
SCOPES = [
    (model.TenancyMode.Shared, None),
    (model.TenancyMode.Dedicated, "tenant-a"),
    (model.TenancyMode.Hybrid, "tenant-b"),
    (model.TenancyMode.Hybrid, "tenant-c"),
    (model.TenancyMode.Hybrid, None),  # unowned: never visible
    (model.TenancyMode.Dedicated, "tenant-x"),
]


class Pool(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, model.Host] = {}
        self.reservations: tuple[model.Reservation, ...] = ()
        self.queue: tuple[model.AdmissionRequest, ...] = ()
        self.scale_outs: list[model.ScaleOutRequest] = []
        self.serial = 0

    def _uid(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.serial}"

    def _hosts(self):
        return list(self.hosts.values())

    # --- host changes ----------------------------------------------------------------------------

    @rule(
        host_id=st.sampled_from(HOST_IDS),
        capacity=st.integers(1, 3),
        scope=st.sampled_from(SCOPES),
        state=st.sampled_from(list(model.HostState)),
    )
    def add_host(self, host_id, capacity, scope, state):
        if host_id in self.hosts:
            return
        tenancy, owner = scope
        self.hosts[host_id] = host(
            host_id, capacity=capacity, tenant=owner, tenancy=tenancy, state=state, uid=self._uid(host_id)
        )

    @precondition(lambda self: self.hosts)
    @rule(data=st.data(), state=st.sampled_from(list(model.HostState)))
    def change_host_state(self, data, state):
        host_id = data.draw(st.sampled_from(sorted(self.hosts)))
        old = self.hosts[host_id]
        ready = state in (model.HostState.Ready, model.HostState.Draining, model.HostState.Terminating)
        self.hosts[host_id] = old._replace(
            state=state,
            address=old.address or f"{host_id}.local:1",
            assignedAt=old.assignedAt or T0,
            readyAt=(old.readyAt or T0 + timedelta(seconds=1)) if ready else old.readyAt,
        )

    @precondition(lambda self: self.hosts)
    @rule(data=st.data())
    def remove_host(self, data):
        host_id = data.draw(st.sampled_from(sorted(self.hosts)))
        self.reservations, _released = release_host(reservations=self.reservations, host_id=host_id)
        del self.hosts[host_id]

    @precondition(lambda self: self.scale_outs)
    @rule(data=st.data())
    def fulfil_scale_out(self, data):
        so = data.draw(st.sampled_from(self.scale_outs))
        self.scale_outs.remove(so)
        free_ids = [h for h in HOST_IDS if h not in self.hosts]
        if free_ids:
            self.hosts[free_ids[0]] = host(
                free_ids[0],
                capacity=so.slots,
                tenant=so.tenant,
                group=so.tenantGroup,
                tenancy=so.tenancy,
                uid=self._uid(free_ids[0]),
            )
        self.drain()

    # --- runs ------------------------------------------------------------------------------------

    @rule(run=st.sampled_from(RUNS))
    def admit_run(self, run):
        req = request(run, tenant=TENANT_OF[run])
        decision = decide(
            req,
            hosts=self._hosts(),
            reservations=self.reservations,
            queue=self.queue,
            pending=self.scale_outs,
            max_queue=MAX_QUEUE,
            max_hosts=MAX_HOSTS,
        )
        queued = [q.runUid for q in self.queue]
        held = any(r.runUid == run for r in self.reservations)
        # A fresh request is only refused a slot when none fits; a queued one keeps its FIFO place.
        if not isinstance(decision, model.AssignToInstance) and not held and run not in queued:
            assert candidates(hosts=self._hosts(), reservations=self.reservations, request=req) == ()
        if isinstance(decision, model.AssignToInstance):
            target = self.hosts[decision.hostId]
            assert target.hostUid == decision.hostUid
            self.reservations = reserve(reservations=self.reservations, request=req, host=target, at=T0)
        elif isinstance(decision, model.QueueGlobally):
            if run in queued:
                assert decision.position == queued.index(run)
            else:
                assert decision.position == len(queued)
                self.queue = (*self.queue, req)
        elif isinstance(decision, model.RequestScaleOut):
            assert run not in queued
            assert decision.position == len(queued)
            existing = sum(1 for h in self.hosts.values() if h.state is not model.HostState.Lost)
            assert existing + len(self.scale_outs) < MAX_HOSTS
            self.queue = (*self.queue, req)
            self.scale_outs.append(
                model.ScaleOutRequest(
                    requestId=self._uid("so"),
                    runtime=RUNTIME,
                    provider=decision.provider,
                    reason=model.ScaleOutReason.NoVisibleCapacity,
                    slots=2,
                    tenant=decision.tenant,
                    policy=decision.policy,
                    runUid=run,
                    requestedAt=T0,
                )
            )
        else:
            assert isinstance(decision, model.Reject)
            assert run not in queued
            assert all(r.runUid != run for r in self.reservations)

    @rule(run=st.sampled_from(RUNS))
    def release_run(self, run):
        self.reservations = release(reservations=self.reservations, run_uid=run)
        self.queue = withdraw(queue=self.queue, run_uid=run)

    @rule()
    def drain(self):
        placements = next_from_queue(queue=self.queue, hosts=self._hosts(), reservations=self.reservations)
        for placement in placements:
            target = self.hosts[placement.assignment.hostId]
            self.reservations = reserve(
                reservations=self.reservations, request=placement.request, host=target, at=T0
            )
            self.queue = withdraw(queue=self.queue, run_uid=placement.request.runUid)
        # After a drain nothing queued could still be placed.
        assert next_from_queue(queue=self.queue, hosts=self._hosts(), reservations=self.reservations) == ()

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def no_host_is_over_capacity(self):
        load = Counter((r.hostId, r.hostUid) for r in self.reservations)
        for h in self.hosts.values():
            assert load[(h.hostId, h.hostUid)] <= h.capacity

    @invariant()
    def a_run_holds_at_most_one_reservation(self):
        runs = [r.runUid for r in self.reservations]
        assert len(runs) == len(set(runs))

    @invariant()
    def every_reservation_is_on_a_present_host_the_run_may_see(self):
        for r in self.reservations:
            h = self.hosts[r.hostId]
            assert h.hostUid == r.hostUid
            assert visible_hosts(hosts=[h], request=request(r.runUid, tenant=TENANT_OF[r.runUid])) == (h,)

    @invariant()
    def the_queue_is_bounded_unique_and_disjoint_from_placed_runs(self):
        queued = [q.runUid for q in self.queue]
        assert len(queued) <= MAX_QUEUE
        assert len(queued) == len(set(queued))
        assert not set(queued) & {r.runUid for r in self.reservations}


Pool.TestCase.settings = settings(database=None, max_examples=300, stateful_step_count=40, deadline=None)
test_random_pool_histories_keep_every_scheduling_invariant = Pool.TestCase
