"""Admission: which host takes a Run, or whether it queues, scales out or is rejected.

Plain, deterministic functions over the pool's state; RuntimePoolWorkflow calls them and applies the
result. Admission decides *who* or *whether to scale out*; providers decide *how*.

Invariants the pool keeps by applying decisions only through ``reserve``/``release``:
no host holds more reservations than its capacity, and a run UID holds at most one reservation.

Errors::

    ValueError
     └── ReservationConflict   reserve() refused; .reason is a stable string
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from kruntimes.api.ids import HostId, HostUid, RuntimeName, RunUid
from kruntimes.decisions.scheduling.model import (
    COUNTED_STATES,
    PROVISIONING_STATES,
    AdmissionRequest,
    AssignToInstance,
    Decision,
    Host,
    HostState,
    QueueGlobally,
    Reject,
    RejectReason,
    RequestScaleOut,
    Reservation,
    ScaleOutReason,
    ScaleOutRequest,
    TenancyMode,
    TenantPolicy,
)

# Last step of provider resolution: hint -> runtime default -> this.
DEFAULT_PROVIDER = "process"

_HostKey = tuple[str, str]
# A host incarnation and a tenant (None: Runs without one): how many of its Runs the host holds.
_TenantKey = tuple[str, str, str | None]


class ReservationConflict(ValueError):
    """``reason`` is one of AlreadyReserved, HostNotReady, HostFull, HostNotVisible, RuntimeMismatch."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class Held(Mapping[RunUid, Reservation]):
    """The reservations by run uid, each kept as a tuple (host id, host uid, tenant, reserved at)
    with the host's and tenant's strings shared (interned): far less than the Reservation model
    takes (its __dict__, its fields-set, its own copies of the host's strings), for every Ready
    Run, in the pool's worker. Reading one builds its Reservation; ReservationIndex alone
    changes it (`put`, `take`)."""

    __slots__ = ("_by_run",)

    def __init__(self) -> None:
        self._by_run: dict[RunUid, tuple[HostId, HostUid, str | None, datetime]] = {}

    def put(self, r: Reservation) -> None:
        tenant = None if r.tenant is None else sys.intern(r.tenant)
        host_id, host_uid = HostId(sys.intern(r.hostId)), HostUid(sys.intern(r.hostUid))
        self._by_run[r.runUid] = (host_id, host_uid, tenant, r.reservedAt)

    def take(self, run_uid: RunUid) -> Reservation | None:
        held = self._by_run.pop(run_uid, None)
        return None if held is None else _reservation(run_uid, held)

    def __getitem__(self, run_uid: RunUid) -> Reservation:
        return _reservation(run_uid, self._by_run[run_uid])

    def __contains__(self, run_uid: object) -> bool:
        return run_uid in self._by_run

    def __iter__(self) -> Iterator[RunUid]:
        return iter(self._by_run)

    def __len__(self) -> int:
        return len(self._by_run)

    def of_hosts(self, host_uids: Collection[str] | None) -> Iterator[Reservation]:
        """The reservations on those host incarnations (None: every one), built one at a time as
        they are read: a query for some hosts builds only theirs."""
        for run_uid, held in self._by_run.items():
            if host_uids is None or held[1] in host_uids:
                yield _reservation(run_uid, held)

    def not_on(self, host_uids: Collection[str]) -> Iterator[Reservation]:
        """The reservations on every host incarnation but those, built one at a time."""
        for run_uid, held in self._by_run.items():
            if held[1] not in host_uids:
                yield _reservation(run_uid, held)

    def rows(self) -> Iterator[tuple[RunUid, HostId, HostUid, str | None, datetime]]:
        """Each reservation as (run uid, host id, host uid, tenant, reserved at), in the order
        they were added, without building its model."""
        for run_uid, (host_id, host_uid, tenant, at) in self._by_run.items():
            yield run_uid, host_id, host_uid, tenant, at


def _reservation(run_uid: RunUid, held: tuple[HostId, HostUid, str | None, datetime]) -> Reservation:
    host_id, host_uid, tenant, at = held
    # validated when it was added; built again from the same values
    return Reservation.model_construct(
        runUid=run_uid, hostId=host_id, hostUid=host_uid, tenant=tenant, reservedAt=at
    )


class ReservationIndex:
    """The reservations by run uid and the load of each host: what admission reads of them, kept
    up to date by a caller that applies one reservation at a time (the pool), so that a decision
    costs the same with 10 Ready Runs as with 10,000. ``add``/``remove`` keep both in step; `held`
    keeps each reservation compact (`Held`); `changed` gathers the host incarnations whose
    reservations they changed (the caller clears what it has dealt with)."""

    __slots__ = ("by_tenant", "changed", "held", "load", "tenant_load")

    def __init__(self, reservations: Iterable[Reservation] = ()) -> None:
        self.held = Held()
        self.load: Counter[_HostKey] = Counter()
        self.tenant_load: Counter[_TenantKey] = Counter()
        self.by_tenant: Counter[str | None] = Counter()  # each tenant's Runs holding a slot
        self.changed: set[str] = set()
        for r in reservations:
            self.add(r)

    def add(self, reservation: Reservation) -> None:
        if reservation.runUid in self.held:
            raise ReservationConflict("AlreadyReserved", f"run {reservation.runUid} already holds a slot")
        self.held.put(reservation)
        self.load[(reservation.hostId, reservation.hostUid)] += 1
        self.tenant_load[(reservation.hostId, reservation.hostUid, reservation.tenant)] += 1
        self.by_tenant[reservation.tenant] += 1
        self.changed.add(reservation.hostUid)

    def remove(self, run_uid: RunUid) -> Reservation | None:
        reservation = self.held.take(run_uid)
        if reservation is not None:
            self.changed.add(reservation.hostUid)
            key = (reservation.hostId, reservation.hostUid)
            self.load[key] -= 1
            if self.load[key] <= 0:
                del self.load[key]
            whose = (*key, reservation.tenant)
            self.tenant_load[whose] -= 1
            if self.tenant_load[whose] <= 0:
                del self.tenant_load[whose]
            self.by_tenant[reservation.tenant] -= 1
            if self.by_tenant[reservation.tenant] <= 0:
                del self.by_tenant[reservation.tenant]
        return reservation

    def used(self, host_uid: HostUid) -> int:
        """Reservations on the host incarnation `host_uid`."""
        return sum(n for (_, uid), n in self.load.items() if uid == host_uid)

    def __len__(self) -> int:
        return len(self.held)


class Placement(NamedTuple):
    """A queued request that can take a slot now."""

    request: AdmissionRequest
    assignment: AssignToInstance


# --- visibility -------------------------------------------------------------------------------


def _owns(*, owner: str | None, owner_group: str | None, tenant: str | None, policy: TenantPolicy) -> bool:
    return (owner is not None and owner == tenant) or (
        owner_group is not None and owner_group == policy.group
    )


def is_visible(
    *,
    tenancy: TenancyMode,
    owner: str | None,
    owner_group: str | None,
    tenant: str | None,
    policy: TenantPolicy,
) -> bool:
    """May ``tenant`` (with ``policy``) see capacity of this scope?

    - Shared host: visible to Shared tenants; visible to Hybrid/Dedicated tenants only if the
      tenant's settings allow shared fallback. TenantPolicy forbids fallback for Dedicated, so a
      Dedicated tenant never sees shared capacity.
    - Dedicated host: visible only if its owning tenant or tenant group matches.
    - Hybrid host: visible only if its owning tenant or tenant group matches; allowSharedFallback
      does not make an unowned Hybrid host visible.

    The rules look at the host's mode and owner, not the tenant's mode: a tenant sees hosts it
    owns whatever its own mode. Identity is the strong tenant/group fields, never labels (labels
    are free-form metadata anyone may set, not a tenant boundary).
    """
    if tenancy is TenancyMode.Shared:
        return policy.mode is TenancyMode.Shared or policy.allowSharedFallback
    return _owns(owner=owner, owner_group=owner_group, tenant=tenant, policy=policy)


def _host_visible(host: Host, request: AdmissionRequest, policy: TenantPolicy) -> bool:
    return is_visible(
        tenancy=host.tenancy,
        owner=host.tenant,
        owner_group=host.tenantGroup,
        tenant=request.tenant,
        policy=policy,
    )


def visible_hosts(*, hosts: Iterable[Host], request: AdmissionRequest) -> tuple[Host, ...]:
    """The hosts ``request``'s tenant may see, in input order; none when it has no policy."""
    policy = request.policy
    if policy is None:
        return ()
    return tuple(h for h in hosts if _host_visible(h, request, policy))


# --- capacity ---------------------------------------------------------------------------------


def _key(host: Host) -> _HostKey:
    return (host.hostId, host.hostUid)


def _load(reservations: Iterable[Reservation]) -> Counter[_HostKey]:
    return Counter((r.hostId, r.hostUid) for r in reservations)


def _tenant_load(reservations: Iterable[Reservation]) -> Counter[_TenantKey]:
    return Counter((r.hostId, r.hostUid, r.tenant) for r in reservations)


def free_slots(*, host: Host, reservations: Iterable[Reservation]) -> int:
    """Slots of ``host`` not reserved. Reservations of an older host with the same id do not count."""
    return max(0, host.capacity - _load(reservations)[_key(host)])


def _candidates(
    hosts: Iterable[Host],
    load: Counter[_HostKey],
    request: AdmissionRequest,
    policy: TenantPolicy,
    tenant_load: Counter[_TenantKey],
) -> list[Host]:
    # Eligible: the same runtime; state Ready (not draining, not stale: a stale host is Lost);
    # not a one-shot host that already took its Run; visible to the tenant; at least one free
    # slot (one function process per slot here); fewer of the tenant's Runs than its
    # maxRunsPerHost.
    cap = policy.maxRunsPerHost
    eligible = [
        h
        for h in hosts
        if h.runtime == request.runtime
        and h.state is HostState.Ready
        and not h.spent
        and h.capacity - load[_key(h)] > 0
        and (cap is None or tenant_load[(h.hostId, h.hostUid, request.tenant)] < cap)
        and _host_visible(h, request, policy)
    ]

    # Ordering: most free slots first, then fewest running runs, then host id (a stable tie
    # break). Before all of them, preferDedicatedCapacity puts the tenant's own hosts ahead of
    # shared ones.
    def order(h: Host) -> tuple[bool, int, int, str, str]:
        shared_first_penalty = policy.preferDedicatedCapacity and h.tenancy is TenancyMode.Shared
        used = load[_key(h)]
        return (shared_first_penalty, -(h.capacity - used), used, h.hostId, h.hostUid)

    return sorted(eligible, key=order)


def candidates(
    *, hosts: Iterable[Host], reservations: Iterable[Reservation], request: AdmissionRequest
) -> tuple[Host, ...]:
    """Hosts that could take ``request`` now, best first."""
    policy = request.policy
    if policy is None:
        return ()
    held = list(reservations)
    return tuple(_candidates(hosts, _load(held), request, policy, _tenant_load(held)))


# --- providers --------------------------------------------------------------------------------


def provider_name(*, hint: str | None, runtime_default: str | None) -> str:
    """The request's hint, then the runtime's provider, then the default."""
    return hint or runtime_default or DEFAULT_PROVIDER


def select_provider(
    *, hint: str | None, runtime_default: str | None, known: Collection[str] | None
) -> str | None:
    """The provider to scale out with, or None when it is not one of ``known`` (None: any name).

    An unknown hint is an error, not a reason to fall back: the caller reports the missing
    provider rather than create a host somewhere else."""
    name = provider_name(hint=hint, runtime_default=runtime_default)
    return name if known is None or name in known else None


# --- admission --------------------------------------------------------------------------------


def _scope_owner(request: AdmissionRequest, policy: TenantPolicy) -> str | None:
    # The host a scale-out creates for this tenant: shared for Shared tenants, owned by the tenant
    # for Dedicated and Hybrid ones.
    return None if policy.mode is TenancyMode.Shared else request.tenant


def _in_scope(tenancy: TenancyMode, owner: str | None, *, scope_owner: str | None) -> bool:
    # A tenant scope's maxHosts counts the hosts of that scope, not every host of the runtime.
    # By owner, the strong field, rather than by id prefix.
    if scope_owner is None:
        return tenancy is TenancyMode.Shared
    return tenancy is not TenancyMode.Shared and owner == scope_owner


class _Source(NamedTuple):
    """Capacity on its way: a provisioning host or a scale-out without a host yet."""

    tenancy: TenancyMode
    owner: str | None
    owner_group: str | None
    slots: int

    def visible_to(self, request: AdmissionRequest) -> bool:
        policy = request.policy
        return policy is not None and is_visible(
            tenancy=self.tenancy,
            owner=self.owner,
            owner_group=self.owner_group,
            tenant=request.tenant,
            policy=policy,
        )


def _unmaterialized(pending: Iterable[ScaleOutRequest], hosts: Sequence[Host]) -> list[ScaleOutRequest]:
    # A scale-out whose host is already in the pool is counted as that host (whatever its state).
    known = {h.hostId for h in hosts}
    return [s for s in pending if s.hostId is None or s.hostId not in known]


# --- the queue across tenants -----------------------------------------------------------------


def fair_order(
    queue: Sequence[AdmissionRequest], running: Mapping[str | None, int] | None = None
) -> list[AdmissionRequest]:
    """The queue in the order its Runs are placed: each tenant's Runs (those without a tenant
    are one more sub-queue) in their own FIFO order, the tenants taking turns in proportion to
    their weight (TenantPolicy.queueShare; 1 without one), counting the Runs each already holds
    a slot with (``running``, by tenant).

    Weighted fair queueing over the queue as it is now: a tenant's k-th queued Run (from 1)
    comes at (its running Runs + k) / weight, and Runs go in order of that, ties to the tenant
    whose oldest queued Run is oldest, then to queue order. So however long one tenant's
    backlog, ahead of another tenant's next Run stand only the Runs that keep the first tenant
    within its share of the slots: at most weight(other) × (own running + 1) / weight(own) −
    other's running of them. With one tenant it is the FIFO order.
    """
    rank: dict[str | None, int] = {}
    taken: dict[str | None, int] = {}
    keyed: list[tuple[float, int, int]] = []
    for position, request in enumerate(queue):
        tenant = request.tenant
        order = rank.setdefault(tenant, len(rank))
        k = taken.get(tenant, (running or {}).get(tenant, 0)) + 1
        taken[tenant] = k
        policy = request.policy
        weight = 1.0 if policy is None else policy.weight
        keyed.append((k / weight, order, position))
    keyed.sort()
    return [queue[position] for _, _, position in keyed]


def _tenant_queue_full(
    request: AdmissionRequest, policy: TenantPolicy, queue: Sequence[AdmissionRequest], *, max_queue: int
) -> str | None:
    """Why the tenant's own part of the queue is full (its queueLimit or queueShare), or None."""
    limit = policy.queue_limit(runtime_limit=max_queue)
    if limit is None:
        return None
    most, which = limit
    mine = sum(1 for q in queue if q.tenant == request.tenant)
    if mine < most:
        return None
    return f"tenant {request.tenant!r} holds its {which} in the {request.runtime!r} queue"


def admit(
    *,
    request: AdmissionRequest,
    hosts: Sequence[Host],
    reservations: Sequence[Reservation],
    queue: Sequence[AdmissionRequest],
    pending_scale_outs: Sequence[ScaleOutRequest],
    runtime: RuntimeName,
    max_queue: int,
    max_hosts: int,
    default_provider: str | None = None,
    providers: Collection[str] | None = None,
    index: ReservationIndex | None = None,
    paused: bool = False,
    fair: bool = False,
) -> Decision:
    """Decide for one request: AssignToInstance, QueueGlobally, RequestScaleOut or Reject.

    1. Not this pool's runtime: Reject(RuntimeUnknown). A named tenant without a policy:
       Reject(TenantNotAllowed).
    2. Idempotent: a run that holds a reservation gets that host again; a queued run keeps its place.
    3. A candidate host: AssignToInstance(best candidate).
    4. Otherwise the run must wait in the bounded FIFO; no room: Reject(QueueFull).
    5. Capacity already on its way that this run can see (provisioning hosts, pending scale-outs)
       covers it and the queued runs that compete for it: QueueGlobally.
    6. Room under the runtime's and the tenant scope's maxHosts: RequestScaleOut for the tenant's
       scope, the run queued behind it; an unknown provider: Reject(NoProvider).
    7. A visible host will free a slot or become ready: QueueGlobally. Nothing ever will:
       Reject(MaxHostsReached).

    ``paused`` (an operator paused the runtime's admission): after steps 1 and 2, the run waits
    in the FIFO (QueueGlobally) or, no room, Reject(QueueFull); nothing is placed or scaled out.

    The tenant's own part of the queue (TenantPolicy.queueLimit, queueShare) is room as the
    runtime's is: its Runs beyond it are Reject(QueueFull) naming the tenant's limit. ``fair``:
    the queue is placed in ``fair_order``, so the Runs that compete with this one for capacity
    on its way (step 5) are those ahead of it in that order, not every earlier one.

    ``index``, when given, is ``reservations`` indexed (ReservationIndex): it is read instead of
    scanning them.
    """
    if request.runtime != runtime:
        return Reject(
            reason=RejectReason.RuntimeUnknown,
            message=f"runtime {request.runtime!r} is not served by the {runtime!r} pool",
        )
    policy = request.policy
    if policy is None:
        return Reject(
            reason=RejectReason.TenantNotAllowed,
            message=f"tenant {request.tenant!r} is not configured on this platform",
        )

    if index is None:
        index = ReservationIndex(reservations)
    held = index.held.get(request.runUid)
    if held is not None:
        return AssignToInstance(hostId=held.hostId, hostUid=held.hostUid)
    for position, queued in enumerate(queue):
        if queued.runUid == request.runUid:
            return QueueGlobally(position=position)

    tenant_full = _tenant_queue_full(request, policy, queue, max_queue=max_queue)
    if paused:
        if tenant_full is not None:
            return Reject(
                reason=RejectReason.QueueFull, message=f"admission to {runtime!r} is paused; {tenant_full}"
            )
        if len(queue) >= max_queue:
            return Reject(
                reason=RejectReason.QueueFull,
                message=f"admission to {runtime!r} is paused; its queue holds its limit of {max_queue}",
            )
        return QueueGlobally(position=len(queue))

    pool = [h for h in hosts if h.runtime == runtime]
    load = index.load
    found = _candidates(pool, load, request, policy, index.tenant_load)
    if found:
        return AssignToInstance(hostId=found[0].hostId, hostUid=found[0].hostUid)

    if tenant_full is not None:
        return Reject(reason=RejectReason.QueueFull, message=f"no free slot and {tenant_full}")
    if len(queue) >= max_queue:
        return Reject(
            reason=RejectReason.QueueFull,
            message=f"no free slot and the {runtime!r} queue holds its limit of {max_queue} runs",
        )
    position = len(queue)

    pending = _unmaterialized((s for s in pending_scale_outs if s.pending and s.runtime == runtime), pool)
    sources = [
        _Source(h.tenancy, h.tenant, h.tenantGroup, max(0, h.capacity - load[_key(h)]))
        for h in pool
        if h.state in PROVISIONING_STATES
    ] + [_Source(s.tenancy, s.tenant, s.tenantGroup, s.slots) for s in pending]
    mine = [s for s in sources if s.visible_to(request)]
    cap = policy.maxRunsPerHost
    supply = sum(s.slots if cap is None else min(s.slots, cap) for s in mine)
    if supply > 0:
        ahead: Sequence[AdmissionRequest] = queue
        if fair:
            ordered = fair_order([*queue, request], index.by_tenant)
            ahead = ordered[: next(i for i, q in enumerate(ordered) if q is request)]
        competing = sum(1 for q in ahead if q.runtime == runtime and any(s.visible_to(q) for s in mine))
        if competing + 1 <= supply:
            return QueueGlobally(position=position)

    scope_owner = _scope_owner(request, policy)
    counted = [h for h in pool if h.state in COUNTED_STATES]
    blocker: str | None = None
    if len(counted) + len(pending) >= max_hosts:
        blocker = f"runtime {runtime!r} has reached maxHosts={max_hosts}"
    elif policy.maxHosts is not None:
        in_scope = sum(1 for h in counted if _in_scope(h.tenancy, h.tenant, scope_owner=scope_owner))
        in_scope += sum(1 for s in pending if _in_scope(s.tenancy, s.tenant, scope_owner=scope_owner))
        if in_scope >= policy.maxHosts:
            scope = "the shared pool" if scope_owner is None else f"tenant {scope_owner!r}"
            blocker = f"{scope} has reached its maxHosts={policy.maxHosts} on runtime {runtime!r}"

    if blocker is None:
        provider = select_provider(
            hint=request.providerHint, runtime_default=default_provider, known=providers
        )
        if provider is None:
            name = provider_name(hint=request.providerHint, runtime_default=default_provider)
            return Reject(reason=RejectReason.NoProvider, message=f"no host provider named {name!r}")
        return RequestScaleOut(
            reason=ScaleOutReason.NoVisibleCapacity,
            provider=provider,
            tenant=scope_owner,
            policy=policy,
            position=position,
        )

    will_free = any(h.state is HostState.Ready and _host_visible(h, request, policy) for h in pool)
    if mine or will_free:
        return QueueGlobally(position=position)
    return Reject(reason=RejectReason.MaxHostsReached, message=f"no capacity can appear: {blocker}")


def next_from_queue(
    *,
    queue: Sequence[AdmissionRequest],
    hosts: Sequence[Host],
    reservations: Sequence[Reservation],
    index: ReservationIndex | None = None,
    fair: bool = False,
) -> tuple[Placement, ...]:
    """The queued requests that can take a slot now, in FIFO order (``fair``: in ``fair_order``),
    each with its host.

    Slots are handed out in that order, so an earlier request always wins a slot a later one
    could also use. A request that cannot be placed does not block later ones (no head-of-line
    blocking): tenants' capacity is disjoint, so each queued request is decided on its own. A run
    that already holds a reservation, or repeats an earlier entry, is skipped.
    """
    if index is None:
        index = ReservationIndex(reservations)
    load = Counter(index.load)
    tenant_load = Counter(index.tenant_load)
    held = index.held
    placed: set[str] = set()
    out: list[Placement] = []
    for request in fair_order(queue, index.by_tenant) if fair else queue:
        policy = request.policy
        if policy is None or request.runUid in placed or request.runUid in held:
            continue
        found = _candidates(hosts, load, request, policy, tenant_load)
        if not found:
            continue
        host = found[0]
        load[_key(host)] += 1
        tenant_load[(host.hostId, host.hostUid, request.tenant)] += 1
        placed.add(request.runUid)
        out.append(Placement(request, AssignToInstance(hostId=host.hostId, hostUid=host.hostUid)))
    return tuple(out)


def uncovered(
    *,
    queue: Sequence[AdmissionRequest],
    hosts: Sequence[Host],
    pending_scale_outs: Sequence[ScaleOutRequest],
    runtime: RuntimeName,
    index: ReservationIndex | None = None,
    fair: bool = False,
) -> tuple[RunUid, ...]:
    """The queued requests that no capacity on its way covers any more, in FIFO order
    (``fair``: in ``fair_order``, the order they would be placed in).

    A request queued behind capacity on its way (a provisioning host, a pending scale-out) it can
    see. Once that capacity arrives and the requests it could take are placed (next_from_queue),
    the rest may wait for nothing: the host went to other requests of its scope. Each queued
    request takes, in FIFO order, one slot of the first source on its way that it can see; those
    left without one are decided again (admit: another scale-out, a wait for a Ready host, or a
    rejection).
    """
    if index is None:
        index = ReservationIndex()
    load = index.load
    pool = [h for h in hosts if h.runtime == runtime]
    pending = _unmaterialized((s for s in pending_scale_outs if s.pending and s.runtime == runtime), pool)
    sources = [
        _Source(h.tenancy, h.tenant, h.tenantGroup, max(0, h.capacity - load[_key(h)]))
        for h in pool
        if h.state in PROVISIONING_STATES
    ] + [_Source(s.tenancy, s.tenant, s.tenantGroup, s.slots) for s in pending]
    left = [s.slots for s in sources]
    # a source's slots one tenant may take: its maxRunsPerHost of them at most
    mine: Counter[tuple[int, str | None]] = Counter()
    out: list[RunUid] = []
    for request in fair_order(queue, index.by_tenant) if fair else queue:
        if request.runUid in index.held:
            continue
        cap = None if request.policy is None else request.policy.maxRunsPerHost
        taken = next(
            (
                i
                for i, s in enumerate(sources)
                if left[i] > 0 and (cap is None or mine[(i, request.tenant)] < cap) and s.visible_to(request)
            ),
            None,
        )
        if taken is None:
            out.append(request.runUid)
        else:
            left[taken] -= 1
            mine[(taken, request.tenant)] += 1
    return tuple(out)


# --- applying decisions -----------------------------------------------------------------------


def reserve(
    *, reservations: Sequence[Reservation], request: AdmissionRequest, host: Host, at: datetime
) -> tuple[Reservation, ...]:
    """Take one slot of ``host`` for ``request`` (admission selects the host, then reserves).

    Reserving the slot the run already holds is a no-op; every other way of breaking an invariant
    or the tenant boundary (a run never goes to a host its tenant may not see) raises.
    """
    for held in reservations:
        if held.runUid == request.runUid:
            if (held.hostId, held.hostUid) == _key(host):
                return tuple(reservations)
            raise ReservationConflict(
                "AlreadyReserved", f"run {request.runUid} already holds a slot on {held.hostId}"
            )
    _check_host(request, host)
    if free_slots(host=host, reservations=reservations) <= 0:
        raise ReservationConflict("HostFull", f"host {host.hostId} has no free slot of {host.capacity}")
    reservation = Reservation(
        runUid=request.runUid, hostId=host.hostId, hostUid=host.hostUid, tenant=request.tenant, reservedAt=at
    )
    return (*reservations, reservation)


def reserve_in(
    *, index: ReservationIndex, request: AdmissionRequest, host: Host, at: datetime
) -> Reservation:
    """``reserve`` for a caller that keeps a ReservationIndex: the same checks, read from the
    index, and the new reservation added to it (the one the run holds already, if it is on
    ``host``)."""
    held = index.held.get(request.runUid)
    if held is not None:
        if (held.hostId, held.hostUid) == _key(host):
            return held
        raise ReservationConflict(
            "AlreadyReserved", f"run {request.runUid} already holds a slot on {held.hostId}"
        )
    _check_host(request, host)
    if host.capacity - index.load[_key(host)] <= 0:
        raise ReservationConflict("HostFull", f"host {host.hostId} has no free slot of {host.capacity}")
    reservation = Reservation(
        runUid=request.runUid, hostId=host.hostId, hostUid=host.hostUid, tenant=request.tenant, reservedAt=at
    )
    index.add(reservation)
    return reservation


def _check_host(request: AdmissionRequest, host: Host) -> None:
    if host.runtime != request.runtime:
        raise ReservationConflict(
            "RuntimeMismatch", f"host {host.hostId} runs {host.runtime!r}, not {request.runtime!r}"
        )
    if host.state is not HostState.Ready:
        raise ReservationConflict("HostNotReady", f"host {host.hostId} is {host.state}")
    if host.spent:
        raise ReservationConflict("HostNotReady", f"one-shot host {host.hostId} already took its Run")
    policy = request.policy
    if policy is None or not _host_visible(host, request, policy):
        raise ReservationConflict(
            "HostNotVisible", f"host {host.hostId} is not visible to {request.tenant!r}"
        )


def release(*, reservations: Sequence[Reservation], run_uid: RunUid) -> tuple[Reservation, ...]:
    """Give back the run's slot; releasing a run that holds none is a no-op."""
    return tuple(r for r in reservations if r.runUid != run_uid)


def release_host(
    *, reservations: Sequence[Reservation], host_id: HostId
) -> tuple[tuple[Reservation, ...], tuple[str, ...]]:
    """Drop every reservation on a host leaving the pool; returns (kept, run UIDs released)."""
    kept = tuple(r for r in reservations if r.hostId != host_id)
    released = tuple(r.runUid for r in reservations if r.hostId == host_id)
    return kept, released


def withdraw(*, queue: Sequence[AdmissionRequest], run_uid: RunUid) -> tuple[AdmissionRequest, ...]:
    """Take a run out of the queue (cancelled, deleted, timed out); absent is a no-op."""
    return tuple(q for q in queue if q.runUid != run_uid)


# --- host supervision -------------------------------------------------------------------------


def hosts_to_warm(
    *,
    hosts: Sequence[Host],
    pending_scale_outs: Sequence[ScaleOutRequest],
    runtime: RuntimeName,
    min_hosts: int,
    max_hosts: int,
) -> int:
    """Shared hosts to request so the runtime keeps its warm minimum, within maxHosts.

    Warm hosts are shared capacity, so only shared hosts that are or will be Ready count (a
    one-shot host that took its Run does not).
    """
    pool = [h for h in hosts if h.runtime == runtime]
    pending = _unmaterialized((s for s in pending_scale_outs if s.pending and s.runtime == runtime), pool)
    warm_states = PROVISIONING_STATES | {HostState.Ready}
    warm = sum(1 for h in pool if h.state in warm_states and h.tenancy is TenancyMode.Shared and not h.spent)
    warm += sum(1 for s in pending if s.tenancy is TenancyMode.Shared)
    room = max_hosts - sum(1 for h in pool if h.state in COUNTED_STATES) - len(pending)
    return max(0, min(min_hosts - warm, room))


def assignment_overdue(*, host: Host, now: datetime, assignment_timeout_seconds: float) -> bool:
    """An Assigned host that has not become Ready within twice the assignment timeout."""
    if host.state is not HostState.Assigned or host.assignedAt is None:
        return False
    return now - host.assignedAt > timedelta(seconds=2 * assignment_timeout_seconds)
