"""The reconciler's decisions: from one snapshot of a runtime (its pool, its hosts' registrations,
the Runs that run, the provider's records, the workspaces on disk), what is orphaned and what to
do about it. Pure: the reconcile activity gathers the snapshot and carries the plan out.

The snapshot is read in an order that makes a stale view safe: which Runs run and which are
Ready first (the reconciler's known-Runs view, kruntimes.temporal.known_runs, refreshed by what changed
since its last round), then every host's registrations, then the pool; last, every Run the hosts
and the pool mention that the view does not show running under that very run uid is asked for
itself (started or replaced since the view was read, or not shown by visibility yet). So a
registration or reservation is judged against its own Run as it is now, unless the view shows
that Run running: one that ended since is left for a later round (the view learns of its end at
its next refresh, or its next full listing). Whatever is younger than the grace period (twice the
runtime's assignment timeout) is being created right now and is left alone:

- a registration whose Run is closed, unknown or another Run of that name: unregistered; one its
  Run holds no slot for on that host (a stale attempt): unregistered once older than the grace;
- a reservation or queue entry whose Run's workflow is gone (terminated out of band): released;
- a Run Ready on a host that answers but holds no registration of it (its slot older than the
  grace): told (registration_lost);
- a host the provider records and the pool does not know: deleted;
- a workspace of a host incarnation that no longer runs, or of a registration its (live) host
  no longer holds: removed;
- a pool host marked supervised whose HostWorkflow is not running: supervised again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kruntimes.api.ids import HostUid, Namespace, RunUid
from kruntimes.contracts.providers import CreatedHost
from kruntimes.decisions.scheduling.model import Host, Reservation


@dataclass(frozen=True)
class Registration:
    registration_id: str
    run_uid: RunUid
    attempt: int
    namespace: Namespace
    name: str
    last_activity: datetime


@dataclass(frozen=True)
class HostSeen:
    """A pool host and what it answered (None: it did not answer: nothing is decided about it)."""

    host: Host
    registrations: tuple[Registration, ...] | None


@dataclass(frozen=True)
class Queued:
    run_uid: RunUid
    workflow_id: str
    requested_at: datetime


@dataclass(frozen=True)
class Workspace:
    """One directory under the state dir's work/: a host incarnation's (`entry` None) or one of
    its registrations' or tasks' (`entry`: its name, `{run uid}.{attempt}` or `task-...`)."""

    host_uid: HostUid
    entry: str | None
    modified: datetime


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    grace_s: float
    ready: Mapping[RunUid, str]  # Ready Runs listed first: run uid → workflow id
    hosts: Sequence[HostSeen]
    reservations: Sequence[Reservation]
    owners: Mapping[str, str]  # run uid → workflow id (the pool's)
    queued: Sequence[Queued]
    provisioning: frozenset[str]  # host ids of scale-outs still under way
    # Workflow id → run uid ("" when not indexed yet) of the Runs that run: every workflow id the
    # hosts and the pool mention is in it if that Run runs (and, but for one that ended since the
    # view was read, only then).
    running: Mapping[str, str]
    records: Sequence[CreatedHost]  # the provider's hosts of this runtime
    live_uids: frozenset[str]  # host uids whose process runs (every runtime of the state dir)
    workspaces: Sequence[Workspace] = ()
    supervisors: frozenset[str] = frozenset()  # host ids whose HostWorkflow runs


@dataclass(frozen=True)
class Unregister:
    address: str
    registration_id: str
    run_uid: RunUid
    why: str


@dataclass(frozen=True)
class Lost:
    workflow_id: str
    run_uid: RunUid
    host_uid: HostUid


@dataclass
class Plan:
    unregister: list[Unregister] = field(default_factory=list)
    release: list[str] = field(default_factory=list)  # run uids
    registration_lost: list[Lost] = field(default_factory=list)
    delete: list[CreatedHost] = field(default_factory=list)
    remove: list[Workspace] = field(default_factory=list)
    supervise: list[Host] = field(default_factory=list)

    def actions(self) -> int:
        return sum(
            len(x)
            for x in (
                self.unregister,
                self.release,
                self.registration_lost,
                self.delete,
                self.remove,
                self.supervise,
            )
        )


@dataclass(frozen=True)
class HeldEntries:
    """Which registration workspaces (a host's `{run uid}.{attempt}` entries) the hosts that
    answered still hold: `plan` removes an entry only of a host that answered and neither held
    nor a task's; the reconcile activity reads no other entry from disk."""

    answered: frozenset[str]  # host uids
    live: frozenset[tuple[str, str]]  # (host uid, entry)

    @classmethod
    def of(cls, hosts: Sequence[HostSeen]) -> HeldEntries:
        seen = [h for h in hosts if h.registrations is not None]
        return cls(
            answered=frozenset(h.host.hostUid for h in seen),
            live=frozenset(
                (h.host.hostUid, f"{reg.run_uid}.{reg.attempt}")
                for h in seen
                for reg in h.registrations or ()
            ),
        )

    def removable(self, host_uid: HostUid, entry: str) -> bool:
        return (
            host_uid in self.answered and not entry.startswith("task-") and (host_uid, entry) not in self.live
        )


def _old(at: datetime, snapshot: Snapshot) -> bool:
    return snapshot.now - at > timedelta(seconds=snapshot.grace_s)


def _run_of(namespace: Namespace, name: str) -> str:
    return f"run/{namespace}/{name}"


def _same_run(indexed: str, run_uid: RunUid) -> bool:
    return not indexed or indexed == run_uid  # a Run not indexed yet is taken for the same one


def _runs(snapshot: Snapshot, workflow_id: str | None, run_uid: RunUid) -> bool:
    indexed = snapshot.running.get(workflow_id) if workflow_id is not None else None
    return indexed is not None and _same_run(indexed, run_uid)


def plan(snapshot: Snapshot) -> Plan:
    out = Plan()
    reserved = {(r.runUid, r.hostUid) for r in snapshot.reservations}
    for seen in snapshot.hosts:
        if seen.registrations is None or seen.host.address is None:
            continue
        for reg in seen.registrations:
            run_uid = snapshot.running.get(_run_of(reg.namespace, reg.name))
            if run_uid is None:
                why = "RunClosed"  # closed or never was: nothing holds it
            elif not _same_run(run_uid, reg.run_uid):
                why = "RunReplaced"  # another Run of that name runs now
            elif (reg.run_uid, seen.host.hostUid) not in reserved and _old(reg.last_activity, snapshot):
                why = "NotReserved"  # a stale attempt on a host the Run left
            else:
                continue
            out.unregister.append(Unregister(seen.host.address, reg.registration_id, reg.run_uid, why))
    for reservation in snapshot.reservations:
        owner = snapshot.owners.get(reservation.runUid)
        if _old(reservation.reservedAt, snapshot) and not _runs(snapshot, owner, reservation.runUid):
            out.release.append(reservation.runUid)
    for queued in snapshot.queued:
        if _old(queued.requested_at, snapshot) and not _runs(snapshot, queued.workflow_id, queued.run_uid):
            out.release.append(queued.run_uid)
    # Indexed once: each Ready Run looks up its own slots and each host's registrations, so a
    # round costs the Runs once, not Ready Runs times reservations (10,000 Ready Runs: seconds).
    slots_of: dict[RunUid, list[Reservation]] = {}
    for reservation in snapshot.reservations:
        slots_of.setdefault(reservation.runUid, []).append(reservation)
    registered = {
        seen.host.hostUid: {reg.run_uid for reg in seen.registrations}
        for seen in snapshot.hosts
        if seen.registrations is not None
    }
    for run_uid, workflow_id in snapshot.ready.items():
        if not _runs(snapshot, workflow_id, run_uid):
            continue
        for reservation in slots_of.get(run_uid, ()):
            if not _old(reservation.reservedAt, snapshot):
                continue
            holding = registered.get(reservation.hostUid)
            if holding is not None and run_uid not in holding:
                out.registration_lost.append(Lost(workflow_id, run_uid, reservation.hostUid))
    pool_uids = {seen.host.hostUid for seen in snapshot.hosts}
    for record in snapshot.records:
        if (
            record.hostUid not in pool_uids
            and record.hostId not in snapshot.provisioning
            and _old(record.createdAt, snapshot)
        ):
            out.delete.append(record)
    held = HeldEntries.of(snapshot.hosts)
    for space in snapshot.workspaces:
        if not _old(space.modified, snapshot):
            continue
        if space.entry is None:
            if space.host_uid not in snapshot.live_uids:
                out.remove.append(space)
        elif held.removable(space.host_uid, space.entry):
            out.remove.append(space)
    for seen in snapshot.hosts:
        host = seen.host
        if (
            host.supervised
            and host.hostId not in snapshot.supervisors
            and _old(host.readyAt or host.createdAt, snapshot)
        ):
            out.supervise.append(host)
    out.release = list(dict.fromkeys(out.release))
    return out


# A periodic round reads every Run of its runtime (the whole pool, every host's registrations;
# and from visibility what changed since the last round, every Run at a full listing), so it
# costs in proportion to the Runs. Paced, the reconciler waits at least PACE times as long as its
# last round took before the next, so it takes at most 1/PACE of the time however many Runs there
# are. PACED_MAX_S bounds the wait after a round that took long because it failed and was
# retried, not because it had much to read.
PACE = 20.0
PACED_MAX_S = 900.0


def next_round_in(interval_s: float | None, last_round_s: float) -> float | None:
    """Seconds from the end of a round to the next periodic one: the configured interval, or
    PACE times the last round's duration if longer (within PACED_MAX_S, never below the interval);
    None: no periodic rounds (only those asked for)."""
    if interval_s is None:
        return None
    paced = min(PACE * max(last_round_s, 0.0), PACED_MAX_S)
    return max(interval_s, paced)
