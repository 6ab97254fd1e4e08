"""The decisions of a host's lifecycle, as pure functions (HostWorkflow, the pool and the host
watch call them; nothing here reads a clock or does I/O).

    Unassigned ─▶ Assigned ─▶ Ready ─▶ Draining ─▶ Terminating;  any but Terminating ─▶ Lost
    (Assigned ─▶ Draining too: the pool may have given it Runs before its first report)

- when a watched host counts as silent, and what a probe of it then proves (`WatchRules`);
- which registrations a host dropped or can no longer serve since its last report
  (`registration_losses`);
- whether a host is stuck before Ready (`stuck`);
- how long each host has held no reservation (`track_idle`) and which idle hosts scale in
  (`scale_in`, `next_scale_in`), never going below the runtime's warm minimum;
- whether a draining or one-shot host may be deleted (`drained`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from kruntimes.api.ids import Namespace, RunUid
from kruntimes.decisions.scheduling.model import Host, HostState, Reservation, TenancyMode

# --- states -----------------------------------------------------------------------------------

_HOST_TRANSITIONS: dict[HostState, frozenset[HostState]] = {
    HostState.Unassigned: frozenset({HostState.Assigned, HostState.Terminating, HostState.Lost}),
    # The pool may already give an Assigned host Runs (the provider proved it serves): it drains.
    HostState.Assigned: frozenset(
        {HostState.Ready, HostState.Draining, HostState.Terminating, HostState.Lost}
    ),
    HostState.Ready: frozenset({HostState.Draining, HostState.Terminating, HostState.Lost}),
    HostState.Draining: frozenset({HostState.Terminating, HostState.Lost}),
    HostState.Terminating: frozenset(),
    HostState.Lost: frozenset(),
}


def can_transition_host(src: HostState, dst: HostState) -> bool:
    """Whether a host may go from `src` to `dst` (a state to itself is not a transition)."""
    return dst in _HOST_TRANSITIONS[src]


# Hosts that take no new Run: the pool assigns only to Ready ones.
RETIRING_STATES: frozenset[HostState] = frozenset({HostState.Draining, HostState.Terminating})


class HostEnd(StrEnum):
    """Why a host left the pool (HostWorkflow's result, the pool's log, `krt hosts` history)."""

    Lost = "Lost"  # died or stopped answering; fenced before its Runs moved
    Stuck = "Stuck"  # never became Ready within twice its assignment timeout
    Deleted = "Deleted"  # an operator deleted it
    Drained = "Drained"  # drained by an operator, then deleted once it held no Run
    ScaledIn = "ScaledIn"  # idle beyond the scale-in delay, above the warm minimum
    Released = "Released"  # a one-shot host whose one Run ended


# --- watching ---------------------------------------------------------------------------------


class Probe(StrEnum):
    """What asking a silent host who it is (HostInfo) found."""

    Same = "Same"  # the same incarnation answered: alive, its stream is what failed
    Other = "Other"  # another incarnation, or a server that is not the host, answers at its address
    Refused = "Refused"  # nothing listens at its address: its process is gone or going
    NoAnswer = "NoAnswer"  # the probe timed out: frozen, or the network is cut


class LossReason(StrEnum):
    Silent = "Silent"  # reported before, then nothing for the silence window and no probe answer
    Unreachable = "Unreachable"  # nothing listens at its address
    Replaced = "Replaced"  # another incarnation, or a server that is not the host, answers at its address
    NotServing = "NotServing"  # reports that it does not serve, for longer than the window
    Unstable = "Unstable"  # answers probes but its stream keeps failing
    ProviderLost = "ProviderLost"  # its provider reported it lost or not ready


@dataclass(frozen=True)
class WatchRules:
    """How a host watch (reports every `interval_s`) decides that the host is lost.

    A report that does not come within `silence_s` (two intervals) starts a probe bounded by
    `probe_timeout_s` (half an interval): a frozen host is noticed at most 2.5 intervals after
    its last report, so within three intervals of freezing. A broken stream is probed at once:
    a killed host is noticed as soon as its connections close.
    """

    interval_s: float
    silent_intervals: float = 2.0
    probe_intervals: float = 0.5
    not_serving_intervals: float = 3.0
    # Stream failures answered by the same host before it counts as Unstable.
    max_reconnects: int = 5

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"the watch interval is positive, not {self.interval_s}")

    @property
    def silence_s(self) -> float:
        return self.silent_intervals * self.interval_s

    @property
    def probe_timeout_s(self) -> float:
        return self.probe_intervals * self.interval_s

    @property
    def not_serving_s(self) -> float:
        return self.not_serving_intervals * self.interval_s

    def after_probe(
        self, probe: Probe, *, silent: bool, reported: bool, reconnects: int
    ) -> LossReason | None:
        """The loss a probe proves, or None to keep watching (reconnect the stream).

        `silent`: the stream went quiet (rather than broke). No answer to the probe of a silent
        host means frozen; after a broken stream it may be a process halfway through dying (its
        listening socket not closed yet), and the reconnect decides. Before its first report a
        host is still being assigned: only a probe that proves it gone counts (a frozen one is
        left to the stuck timer). Reconnects counts the failures the same host answered since it
        last reported that it serves.
        """
        if probe is Probe.Refused:
            return LossReason.Unreachable
        if probe is Probe.Other:
            return LossReason.Replaced
        if probe is Probe.NoAnswer:
            return LossReason.Silent if silent and reported else None
        return LossReason.Unstable if reconnects > self.max_reconnects else None

    def not_serving_too_long(self, *, since: float | None, now: float) -> bool:
        return since is not None and now - since > self.not_serving_s


@dataclass(frozen=True, slots=True)
class Registered:
    """One registration as a host reported it."""

    registration_id: str
    run_uid: RunUid
    attempt: int
    namespace: Namespace
    name: str
    ready: bool


class LostBecause(StrEnum):
    Unregistered = "Unregistered"  # gone from the host without the platform asking (or asked)
    NotReady = "NotReady"  # still there, but can no longer serve (a fatal error)


@dataclass(frozen=True)
class RegistrationLoss:
    registration: Registered
    because: LostBecause


def registration_losses(
    previous: Mapping[str, Registered], current: Mapping[str, Registered]
) -> list[RegistrationLoss]:
    """Registrations (by id) that served in the previous report and do not in this one: gone, or
    there but not ready. Whether that matters is the Run's to decide (its own cleanup also makes
    its registration disappear); registrations never seen ready are not reported."""
    losses = []
    for reg_id, before in previous.items():
        if not before.ready:
            continue
        now = current.get(reg_id)
        if now is None:
            losses.append(RegistrationLoss(before, LostBecause.Unregistered))
        elif not now.ready:
            losses.append(RegistrationLoss(now, LostBecause.NotReady))
    return sorted(losses, key=lambda loss: loss.registration.registration_id)


# --- stuck ------------------------------------------------------------------------------------


def stuck_at(*, since: datetime, assignment_timeout_s: float) -> datetime:
    """When a host that is not Ready by then counts as stuck: twice its assignment timeout."""
    if assignment_timeout_s <= 0:
        raise ValueError(f"the assignment timeout is positive, not {assignment_timeout_s}")
    return since + timedelta(seconds=2 * assignment_timeout_s)


def stuck(*, state: HostState, since: datetime, now: datetime, assignment_timeout_s: float) -> bool:
    """A host still before Ready (Unassigned or Assigned) past twice its assignment timeout."""
    if state not in (HostState.Unassigned, HostState.Assigned):
        return False
    return now > stuck_at(since=since, assignment_timeout_s=assignment_timeout_s)


# --- scale-in -----------------------------------------------------------------------------------


def _load(reservations: Iterable[Reservation]) -> Counter[str]:
    return Counter(r.hostUid for r in reservations)


def track_idle(
    *,
    hosts: Sequence[Host],
    reservations: Sequence[Reservation],
    idle_since: Mapping[str, datetime],
    now: datetime,
    load: Mapping[str, int] | None = None,
) -> dict[str, datetime]:
    """Host uid → since when it has held no reservation, for the pool's hosts that hold none
    (kept from `idle_since` while it stays idle, `now` when it has just become idle). `load`
    (host uid → reservations), when given, is read instead of counting `reservations`."""
    load = _load(reservations) if load is None else load
    return {h.hostUid: idle_since.get(h.hostUid, now) for h in hosts if load.get(h.hostUid, 0) == 0}


def _warm_count(hosts: Iterable[Host]) -> int:
    # The warm minimum counts shared Ready hosts that can still take a Run (as hosts_to_warm does).
    return sum(
        1 for h in hosts if h.state is HostState.Ready and h.tenancy is TenancyMode.Shared and not h.spent
    )


def _idle_candidates(
    hosts: Sequence[Host],
    reservations: Sequence[Reservation],
    idle_since: Mapping[str, datetime],
    load: Mapping[str, int] | None = None,
) -> list[Host]:
    load = _load(reservations) if load is None else load
    found = [
        h
        for h in hosts
        if h.state is HostState.Ready
        and h.supervised
        and load.get(h.hostUid, 0) == 0
        and h.hostUid in idle_since
    ]
    # The longest idle goes first; among equals the newest host (highest id), so the oldest stay.
    return sorted(found, key=lambda h: (idle_since[h.hostUid], _id_order(h.hostId)))


def _id_order(host_id: str) -> tuple[int, str]:
    # "python-12" after "python-3": by the number after the last dash, descending, then the name.
    _, _, tail = host_id.rpartition("-")
    return (-int(tail) if tail.isdigit() else 0, host_id)


def scale_in(
    *,
    hosts: Sequence[Host],
    reservations: Sequence[Reservation],
    idle_since: Mapping[str, datetime],
    now: datetime,
    min_hosts: int,
    delay_s: float,
    queued: int = 0,
    load: Mapping[str, int] | None = None,
) -> tuple[Host, ...]:
    """The hosts to drain and delete now: Ready, supervised (a HostWorkflow deletes them), holding
    no reservation for at least `delay_s`, longest idle first, while the shared Ready hosts left
    stay at or above `min_hosts`. Hosts owned by a tenant are not part of the warm minimum. Nothing
    scales in while Runs wait in the queue (they are about to need capacity)."""
    if queued > 0:
        return ()
    due = now - timedelta(seconds=delay_s)
    warm = _warm_count(hosts)
    out: list[Host] = []
    for host in _idle_candidates(hosts, reservations, idle_since, load):
        if idle_since[host.hostUid] > due:
            continue
        if host.tenancy is TenancyMode.Shared and not host.spent:
            if warm - 1 < min_hosts:
                continue
            warm -= 1
        out.append(host)
    return tuple(out)


def next_scale_in(
    *,
    hosts: Sequence[Host],
    reservations: Sequence[Reservation],
    idle_since: Mapping[str, datetime],
    delay_s: float,
    after: datetime,
    load: Mapping[str, int] | None = None,
) -> datetime | None:
    """The earliest time after `after` at which an idle host becomes due for scale-in (the pool
    wakes up then), or None. Hosts already due were decided on (kept for the warm minimum): only
    a change, which wakes the pool anyway, can make them go."""
    times = [
        idle_since[h.hostUid] + timedelta(seconds=delay_s)
        for h in _idle_candidates(hosts, reservations, idle_since, load)
    ]
    return min((t for t in times if t > after), default=None)


def drained(*, host: Host, reservations: Iterable[Reservation]) -> bool:
    """A draining host, or a one-shot host that took its Run, that holds no reservation any more."""
    if host.state is not HostState.Draining and not host.spent:
        return False
    return all(r.hostUid != host.hostUid for r in reservations)
