"""kruntimes.decisions.hostlife: the host state machine, what a watch concludes, registration losses, stuck
hosts, idle tracking and the scale-in choice (with properties over generated pools)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kruntimes.decisions.hostlife import (
    LossReason,
    LostBecause,
    Probe,
    Registered,
    WatchRules,
    can_transition_host,
    drained,
    next_scale_in,
    registration_losses,
    scale_in,
    stuck,
    stuck_at,
    track_idle,
)
from kruntimes.decisions.scheduling.model import Host, HostState, TenancyMode
from tests.scheduling.builders import T0, dedicated, fill, host, reservation

S = HostState

# --- states -----------------------------------------------------------------------------------

ALLOWED = {
    (S.Unassigned, S.Assigned),
    (S.Unassigned, S.Terminating),
    (S.Unassigned, S.Lost),
    (S.Assigned, S.Ready),
    (S.Assigned, S.Draining),
    (S.Assigned, S.Terminating),
    (S.Assigned, S.Lost),
    (S.Ready, S.Draining),
    (S.Ready, S.Terminating),
    (S.Ready, S.Lost),
    (S.Draining, S.Terminating),
    (S.Draining, S.Lost),
}


@pytest.mark.parametrize("src", list(HostState))
@pytest.mark.parametrize("dst", list(HostState))
def test_the_host_state_machine(src: HostState, dst: HostState) -> None:
    assert can_transition_host(src, dst) == ((src, dst) in ALLOWED)


def test_terminating_and_lost_are_final() -> None:
    assert not any(can_transition_host(S.Terminating, d) for d in HostState)
    assert not any(can_transition_host(S.Lost, d) for d in HostState)


# --- watching ---------------------------------------------------------------------------------


def test_a_frozen_host_is_noticed_within_three_intervals_of_its_last_report() -> None:
    rules = WatchRules(interval_s=2.0)
    assert rules.silence_s == 4.0 and rules.probe_timeout_s == 1.0
    assert rules.silence_s + rules.probe_timeout_s <= 3 * rules.interval_s
    assert rules.not_serving_s == 6.0


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_the_interval_is_positive(interval: float) -> None:
    with pytest.raises(ValueError, match=f"the watch interval is positive, not {interval}"):
        WatchRules(interval_s=interval)


@pytest.mark.parametrize(
    ("probe", "silent", "reported", "reconnects", "loss"),
    [
        (Probe.Refused, True, True, 0, LossReason.Unreachable),
        (Probe.Refused, False, False, 0, LossReason.Unreachable),
        (Probe.Other, False, True, 0, LossReason.Replaced),
        (Probe.Other, True, False, 0, LossReason.Replaced),
        (Probe.NoAnswer, True, True, 0, LossReason.Silent),
        # a broken stream and no answer: maybe dying; the reconnect decides
        (Probe.NoAnswer, False, True, 0, None),
        # never reported yet: still being assigned, left to the stuck timer
        (Probe.NoAnswer, True, False, 0, None),
        (Probe.Same, True, True, 0, None),
        (Probe.Same, False, True, 5, None),
        (Probe.Same, False, True, 6, LossReason.Unstable),
        (Probe.Same, False, False, 6, LossReason.Unstable),
    ],
)
def test_what_a_probe_proves(
    probe: Probe, silent: bool, reported: bool, reconnects: int, loss: LossReason | None
) -> None:
    rules = WatchRules(interval_s=1.0)
    assert rules.after_probe(probe, silent=silent, reported=reported, reconnects=reconnects) == loss


def test_not_serving_counts_only_beyond_its_window() -> None:
    rules = WatchRules(interval_s=1.0)
    assert not rules.not_serving_too_long(since=None, now=100.0)
    assert not rules.not_serving_too_long(since=97.0, now=100.0)
    assert rules.not_serving_too_long(since=96.9, now=100.0)


def reg(reg_id: str, *, ready: bool = True, run: str = "r") -> Registered:
    return Registered(registration_id=reg_id, run_uid=run, attempt=1, namespace="ns", name="n", ready=ready)


def test_a_registration_gone_or_no_longer_ready_is_a_loss_others_are_not() -> None:
    before = {"a": reg("a"), "b": reg("b"), "c": reg("c"), "d": reg("d", ready=False)}
    after = {"a": reg("a"), "c": reg("c", ready=False), "e": reg("e")}
    losses = registration_losses(before, after)
    assert [(x.registration.registration_id, x.because) for x in losses] == [
        ("b", LostBecause.Unregistered),
        ("c", LostBecause.NotReady),
    ]


def test_a_registration_never_ready_does_not_hide_the_losses_after_it() -> None:
    before = {"a": reg("a", ready=False), "b": reg("b"), "c": reg("c")}
    losses = registration_losses(before, {"c": reg("c")})
    assert [(x.registration.registration_id, x.because) for x in losses] == [("b", LostBecause.Unregistered)]


def test_no_change_and_new_registrations_are_no_loss() -> None:
    same = {"a": reg("a")}
    assert registration_losses(same, same) == []
    assert registration_losses({}, same) == []
    assert registration_losses({"x": reg("x", ready=False)}, {}) == []


# --- stuck ------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [S.Unassigned, S.Assigned])
def test_a_host_before_ready_is_stuck_after_twice_its_assignment_timeout(state: HostState) -> None:
    assert stuck_at(since=T0, assignment_timeout_s=30) == T0 + timedelta(seconds=60)
    assert not stuck(state=state, since=T0, now=T0 + timedelta(seconds=60), assignment_timeout_s=30)
    assert stuck(state=state, since=T0, now=T0 + timedelta(seconds=60.001), assignment_timeout_s=30)


@pytest.mark.parametrize("state", [S.Ready, S.Draining, S.Terminating, S.Lost])
def test_a_host_past_ready_is_never_stuck(state: HostState) -> None:
    assert not stuck(state=state, since=T0, now=T0 + timedelta(days=1), assignment_timeout_s=1)


def test_the_assignment_timeout_is_positive() -> None:
    with pytest.raises(ValueError, match="the assignment timeout is positive, not 0"):
        stuck_at(since=T0, assignment_timeout_s=0)


@pytest.mark.parametrize("timeout", [0.5, 1.0])
def test_an_assignment_timeout_of_a_second_or_less_is_taken(timeout: float) -> None:
    assert stuck_at(since=T0, assignment_timeout_s=timeout) == T0 + timedelta(seconds=2 * timeout)


# --- idle and scale-in --------------------------------------------------------------------------


def supervised(host_id: str, **kw: object) -> Host:
    return host(host_id, supervised=True, **kw)  # type: ignore[arg-type]


def test_idle_time_starts_when_the_last_reservation_goes_and_is_kept_while_idle() -> None:
    a, b, c = supervised("h-1"), supervised("h-2"), supervised("h-3")
    earlier = T0 - timedelta(minutes=5)
    idle = track_idle(
        hosts=[a, b, c],
        reservations=fill(b, 1),
        idle_since={a.hostUid: earlier, b.hostUid: earlier, "gone-uid": earlier},
        now=T0,
    )
    assert idle == {a.hostUid: earlier, c.hostUid: T0}


def ago(seconds: float) -> object:
    return T0 - timedelta(seconds=seconds)


def test_hosts_idle_beyond_the_delay_go_down_to_the_minimum_longest_idle_first() -> None:
    hosts = [supervised(f"h-{i}") for i in range(4)]
    idle = {hosts[0].hostUid: ago(400), hosts[1].hostUid: ago(900), hosts[2].hostUid: ago(301)}
    chosen = scale_in(
        hosts=hosts,
        reservations=fill(hosts[3], 1),
        idle_since=idle,  # type: ignore[arg-type]
        now=T0,
        min_hosts=2,
        delay_s=300,
    )
    assert [h.hostId for h in chosen] == ["h-1", "h-0"]


def test_a_host_idle_for_less_than_the_delay_stays() -> None:
    hosts = [supervised("h-0"), supervised("h-1")]
    idle = {hosts[0].hostUid: ago(299.9), hosts[1].hostUid: ago(300)}
    chosen = scale_in(
        hosts=hosts,
        reservations=[],
        idle_since=idle,
        now=T0,
        min_hosts=0,
        delay_s=300,  # type: ignore[arg-type]
    )
    assert [h.hostId for h in chosen] == ["h-1"]


def test_never_below_the_minimum_and_busy_hosts_count_toward_it() -> None:
    busy, idle_host = supervised("h-0"), supervised("h-1")
    idle = {idle_host.hostUid: ago(1000)}
    args = {"hosts": [busy, idle_host], "idle_since": idle, "now": T0, "delay_s": 60}
    assert scale_in(reservations=fill(busy, 1), min_hosts=1, **args) == (idle_host,)  # type: ignore[arg-type]
    assert scale_in(reservations=fill(busy, 1), min_hosts=2, **args) == ()  # type: ignore[arg-type]


def test_equally_idle_hosts_go_newest_first() -> None:
    hosts = [supervised("py-2"), supervised("py-10"), supervised("py-9")]
    idle = {h.hostUid: ago(500) for h in hosts}
    chosen = scale_in(hosts=hosts, reservations=[], idle_since=idle, now=T0, min_hosts=1, delay_s=60)  # type: ignore[arg-type]
    assert [h.hostId for h in chosen] == ["py-10", "py-9"]


def test_equally_idle_hosts_of_a_runtime_named_with_dashes_go_newest_first() -> None:
    """The host number is what follows the last dash: "web-api-12" is newer than "web-api-3"."""
    hosts = [supervised("web-api-3"), supervised("web-api-12"), supervised("web-api-4")]
    idle = {h.hostUid: ago(500) for h in hosts}
    chosen = scale_in(hosts=hosts, reservations=[], idle_since=idle, now=T0, min_hosts=1, delay_s=60)  # type: ignore[arg-type]
    assert [h.hostId for h in chosen] == ["web-api-12", "web-api-4"]


def test_the_pools_load_is_read_instead_of_the_reservations_when_given() -> None:
    """The pool passes its index's load (host uid → reservations) rather than every reservation."""
    busy, idle_host = supervised("h-0"), supervised("h-1")
    hosts = [busy, idle_host]
    load = {busy.hostUid: 2}
    idle = {h.hostUid: ago(1000) for h in hosts}
    assert track_idle(hosts=hosts, reservations=[], idle_since=idle, now=T0, load=load) == {
        idle_host.hostUid: ago(1000)
    }
    chosen = scale_in(
        hosts=hosts, reservations=[], idle_since=idle, now=T0, min_hosts=0, delay_s=60, load=load
    )  # type: ignore[arg-type]
    assert chosen == (idle_host,)
    recent = {busy.hostUid: ago(50), idle_host.hostUid: ago(30)}
    due = next_scale_in(hosts=hosts, reservations=[], idle_since=recent, delay_s=60, after=T0, load=load)  # type: ignore[arg-type]
    assert due == T0 + timedelta(seconds=30)


def test_a_host_due_exactly_now_does_not_wake_the_pool_again_now() -> None:
    """The pool decided on it this instant: a timer for `after` itself would wake it at once, again."""
    hosts = [supervised("h-0")]
    idle = {hosts[0].hostUid: ago(300)}
    assert next_scale_in(hosts=hosts, reservations=[], idle_since=idle, delay_s=300, after=T0) is None  # type: ignore[arg-type]


def test_unsupervised_or_not_ready_hosts_never_scale_in() -> None:
    legacy = host("h-0")  # no HostWorkflow: nothing could delete it
    draining = supervised("h-1", state=S.Draining)
    assigned = supervised("h-2", state=S.Assigned)
    hosts = [legacy, draining, assigned]
    idle = {h.hostUid: ago(10_000) for h in hosts}
    assert scale_in(hosts=hosts, reservations=[], idle_since=idle, now=T0, min_hosts=0, delay_s=1) == ()  # type: ignore[arg-type]


def test_tenant_hosts_are_not_part_of_the_warm_minimum() -> None:
    own = dedicated("t-0", "tenant-a", supervised=True)
    shared = supervised("s-0")
    idle = {own.hostUid: ago(1000), shared.hostUid: ago(1000)}
    chosen = scale_in(hosts=[own, shared], reservations=[], idle_since=idle, now=T0, min_hosts=1, delay_s=60)  # type: ignore[arg-type]
    assert chosen == (own,)
    assert own.tenancy is TenancyMode.Dedicated


def test_nothing_scales_in_while_runs_wait_in_the_queue() -> None:
    hosts = [supervised("h-0"), supervised("h-1")]
    idle = {h.hostUid: ago(1000) for h in hosts}
    args = {"hosts": hosts, "reservations": [], "idle_since": idle, "now": T0, "min_hosts": 0, "delay_s": 60}
    assert scale_in(queued=1, **args) == ()  # type: ignore[arg-type]
    assert len(scale_in(queued=0, **args)) == 2  # type: ignore[arg-type]


def test_a_spent_one_shot_host_is_not_warm_capacity() -> None:
    spent, fresh = supervised("h-0", spent=True), supervised("h-1")
    idle = {spent.hostUid: ago(1000), fresh.hostUid: ago(1000)}
    chosen = scale_in(hosts=[spent, fresh], reservations=[], idle_since=idle, now=T0, min_hosts=1, delay_s=60)  # type: ignore[arg-type]
    assert chosen == (spent,)


def test_the_pool_wakes_when_the_first_idle_host_becomes_due() -> None:
    hosts = [supervised("h-0"), supervised("h-1"), host("legacy")]
    idle = {hosts[0].hostUid: ago(100), hosts[1].hostUid: ago(50), hosts[2].hostUid: ago(1000)}
    due = next_scale_in(hosts=hosts, reservations=[], idle_since=idle, delay_s=300, after=T0)  # type: ignore[arg-type]
    assert due == T0 + timedelta(seconds=200)
    busy = fill(hosts[0], 1) + fill(hosts[1], 1)
    assert next_scale_in(hosts=hosts, reservations=busy, idle_since={}, delay_s=1, after=T0) is None


def test_hosts_already_due_do_not_wake_the_pool_again() -> None:
    """Kept for the warm minimum when they were due: only a change (which wakes it) frees them."""
    hosts = [supervised("h-0"), supervised("h-1")]
    idle = {hosts[0].hostUid: ago(1000), hosts[1].hostUid: ago(100)}
    due = next_scale_in(hosts=hosts, reservations=[], idle_since=idle, delay_s=300, after=T0)  # type: ignore[arg-type]
    assert due == T0 + timedelta(seconds=200)
    assert next_scale_in(hosts=hosts[:1], reservations=[], idle_since=idle, delay_s=300, after=T0) is None  # type: ignore[arg-type]


def test_a_draining_or_spent_host_is_drained_once_it_holds_no_reservation() -> None:
    draining = supervised("h-0", state=S.Draining)
    spent = supervised("h-1", spent=True)
    ready = supervised("h-2")
    assert drained(host=draining, reservations=[])
    assert drained(host=spent, reservations=fill(ready, 1))
    assert not drained(host=draining, reservations=[reservation("r", draining)])
    assert not drained(host=ready, reservations=[])


# --- properties ---------------------------------------------------------------------------------

idle_seconds = st.one_of(st.none(), st.floats(min_value=0, max_value=3600))


@st.composite
def pools(draw: st.DrawFn) -> tuple[list[Host], list[object], dict[str, object]]:
    n = draw(st.integers(min_value=0, max_value=8))
    hosts, reservations, idle = [], [], {}
    for i in range(n):
        h = host(
            f"h-{i}",
            state=draw(st.sampled_from([S.Ready, S.Ready, S.Draining, S.Assigned])),
            supervised=draw(st.booleans()),
        )
        hosts.append(h)
        if draw(st.booleans()):
            reservations.extend(fill(h, 1))
        seconds = draw(idle_seconds)
        if seconds is not None:
            idle[h.hostUid] = T0 - timedelta(seconds=seconds)
    return hosts, reservations, idle


@settings(max_examples=300, deadline=None)
@given(
    pool=pools(),
    min_hosts=st.integers(min_value=0, max_value=8),
    delay=st.floats(min_value=0, max_value=3600),
)
def test_scale_in_keeps_the_minimum_and_takes_only_idle_due_supervised_ready_hosts(
    pool: tuple[list[Host], list[object], dict[str, object]], min_hosts: int, delay: float
) -> None:
    hosts, reservations, idle = pool
    chosen = scale_in(
        hosts=hosts,
        reservations=reservations,
        idle_since=idle,
        now=T0,
        min_hosts=min_hosts,
        delay_s=delay,  # type: ignore[arg-type]
    )
    busy = {r.hostUid for r in reservations}  # type: ignore[attr-defined]
    for h in chosen:
        assert h.state is S.Ready and h.supervised and h.hostUid not in busy
        assert idle[h.hostUid] <= T0 - timedelta(seconds=delay)  # type: ignore[operator]
    warm_before = sum(1 for h in hosts if h.state is S.Ready)
    warm_after = warm_before - len(chosen)
    assert warm_after >= min(min_hosts, warm_before)
    assert len({h.hostUid for h in chosen}) == len(chosen)
