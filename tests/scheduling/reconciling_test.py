"""kruntimes.decisions.reconciling.plan: each kind of orphan found and repaired, and what is younger than
the grace period (being created right now) or still held left alone."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from kruntimes.contracts.providers import CreatedHost
from kruntimes.decisions.reconciling import (
    PACE,
    PACED_MAX_S,
    HostSeen,
    Lost,
    Queued,
    Registration,
    Snapshot,
    Unregister,
    Workspace,
    next_round_in,
    plan,
)
from tests.scheduling.builders import T0, host, reservation

NOW = T0 + timedelta(hours=1)
OLD = NOW - timedelta(minutes=10)
NEW = NOW - timedelta(seconds=5)
GRACE = 60.0

H1 = host("py-0", supervised=True)
H2 = host("py-1", supervised=True)


def reg(run: str, *, name: str | None = None, at: Any = OLD, attempt: int = 1) -> Registration:
    return Registration(
        registration_id=f"reg-{run}-{attempt}",
        run_uid=run,
        attempt=attempt,
        namespace="ns",
        name=name or run,
        last_activity=at,
    )


def wid(name: str) -> str:
    return f"run/ns/{name}"


def snapshot(**changes: Any) -> Snapshot:
    """Two hosts, Run a Ready on H1 with its slot and registration there: nothing to do."""
    base = Snapshot(
        now=NOW,
        grace_s=GRACE,
        ready={"a": wid("a")},
        hosts=[HostSeen(H1, (reg("a"),)), HostSeen(H2, ())],
        reservations=[reservation("a", H1)._replace(reservedAt=OLD)],
        owners={"a": wid("a")},
        queued=[],
        provisioning=frozenset(),
        running={wid("a"): "a"},
        records=[],
        live_uids=frozenset({H1.hostUid, H2.hostUid}),
        workspaces=[],
        supervisors=frozenset({"py-0", "py-1"}),
    )
    return replace(base, **changes)


def test_a_consistent_runtime_needs_nothing() -> None:
    assert plan(snapshot()).actions() == 0


def test_a_registration_whose_run_is_gone_is_unregistered() -> None:
    decided = plan(snapshot(running={}))
    assert [(u.registration_id, u.why) for u in decided.unregister] == [("reg-a-1", "RunClosed")]


def test_a_registration_of_a_run_whose_name_is_reused_by_another_run_is_unregistered() -> None:
    decided = plan(snapshot(running={wid("a"): "a2"}))
    assert [u.why for u in decided.unregister] == ["RunReplaced"]


def test_a_run_not_indexed_yet_is_taken_for_the_same_run() -> None:
    assert plan(snapshot(running={wid("a"): ""})).unregister == []


def test_a_stale_attempt_on_a_host_the_run_left_is_unregistered_once_older_than_the_grace() -> None:
    moved = [reservation("a", H2)._replace(reservedAt=OLD)]
    hosts = [HostSeen(H1, (reg("a"),)), HostSeen(H2, (reg("a", attempt=2),))]
    decided = plan(snapshot(hosts=hosts, reservations=moved))
    assert [(u.registration_id, u.why) for u in decided.unregister] == [("reg-a-1", "NotReserved")]
    young = [HostSeen(H1, (reg("a", at=NEW),)), HostSeen(H2, (reg("a", attempt=2),))]
    assert plan(snapshot(hosts=young, reservations=moved)).unregister == []


def test_each_orphaned_registration_of_a_host_is_unregistered_at_its_address() -> None:
    """The registrations before it, kept or not, do not end the host's turn."""
    hosts = [HostSeen(H1, (reg("a"), reg("b"))), HostSeen(H2, ())]
    assert plan(snapshot(hosts=hosts)).unregister == [
        Unregister(H1.address or "", "reg-b-1", "b", "RunClosed")
    ]


def test_a_host_that_does_not_answer_does_not_hide_the_hosts_after_it() -> None:
    hosts = [HostSeen(H1, None), HostSeen(H2, (reg("b"),))]
    assert plan(snapshot(hosts=hosts)).unregister == [
        Unregister(H2.address or "", "reg-b-1", "b", "RunClosed")
    ]


def test_a_host_that_does_not_answer_is_left_alone() -> None:
    decided = plan(snapshot(hosts=[HostSeen(H1, None), HostSeen(H2, ())], running={}))
    assert decided.unregister == [] and decided.registration_lost == []


def test_the_slot_of_a_run_terminated_out_of_band_is_released() -> None:
    decided = plan(snapshot(running={}))
    assert decided.release == ["a"]


def test_the_slot_of_a_run_replaced_under_its_workflow_id_is_released() -> None:
    assert plan(snapshot(running={wid("a"): "a2"})).release == ["a"]


def test_what_is_exactly_as_old_as_the_grace_is_still_left_alone() -> None:
    at_grace = [reservation("a", H1)._replace(reservedAt=NOW - timedelta(seconds=GRACE))]
    assert plan(snapshot(running={}, reservations=at_grace)).release == []
    past = [reservation("a", H1)._replace(reservedAt=NOW - timedelta(seconds=GRACE, microseconds=1))]
    assert plan(snapshot(running={}, reservations=past)).release == ["a"]


def test_a_slot_taken_within_the_grace_is_left_alone() -> None:
    fresh = [reservation("a", H1)._replace(reservedAt=NEW)]
    assert plan(snapshot(running={}, reservations=fresh)).release == []


def test_a_queued_run_that_is_gone_leaves_the_queue() -> None:
    queued = [
        Queued("q", wid("q"), OLD),
        Queued("young", wid("young"), NEW),
        Queued("alive", wid("alive"), OLD),
    ]
    decided = plan(snapshot(queued=queued, running={wid("a"): "a", wid("alive"): "alive"}))
    assert decided.release == ["q"]


def test_a_ready_run_whose_host_holds_no_registration_of_it_is_told() -> None:
    decided = plan(snapshot(hosts=[HostSeen(H1, ()), HostSeen(H2, ())]))
    assert [(x.workflow_id, x.run_uid, x.host_uid) for x in decided.registration_lost] == [
        (wid("a"), "a", H1.hostUid)
    ]


def test_each_ready_run_is_judged_on_its_own() -> None:
    """A Ready Run that no longer runs, or holds no slot, does not stop the check of the others."""
    ready = {"gone": wid("gone"), "slotless": wid("slotless"), "a": wid("a")}
    running = {wid("a"): "a", wid("slotless"): "slotless"}
    decided = plan(snapshot(ready=ready, running=running, hosts=[HostSeen(H1, ()), HostSeen(H2, ())]))
    assert decided.registration_lost == [Lost(wid("a"), "a", H1.hostUid)]


def test_each_old_slot_of_a_ready_run_is_checked_past_a_young_one() -> None:
    slots = [
        reservation("a", H2)._replace(reservedAt=NEW),
        reservation("a", H1)._replace(reservedAt=OLD),
    ]
    hosts = [HostSeen(H1, ()), HostSeen(H2, (reg("a"),))]
    decided = plan(snapshot(hosts=hosts, reservations=slots))
    assert decided.registration_lost == [Lost(wid("a"), "a", H1.hostUid)]


def test_a_run_that_just_took_its_slot_or_ended_is_not_told() -> None:
    empty = [HostSeen(H1, ()), HostSeen(H2, ())]
    fresh = [reservation("a", H1)._replace(reservedAt=NEW)]
    assert plan(snapshot(hosts=empty, reservations=fresh)).registration_lost == []
    assert plan(snapshot(hosts=empty, running={})).registration_lost == []


def record(host_id: str, *, uid: str, at: Any = OLD) -> CreatedHost:
    return CreatedHost(
        provider="process",
        runtime="python",
        hostId=host_id,
        hostUid=uid,
        address="127.0.0.1:7",
        pid=123,
        createdAt=at,
    )


def test_a_host_the_pool_does_not_know_is_deleted_unless_young_or_being_provisioned() -> None:
    records = [
        record("py-0", uid=H1.hostUid),
        record("py-7", uid="stray"),
        record("py-8", uid="young", at=NEW),
        record("py-9", uid="provisioning"),
    ]
    decided = plan(snapshot(records=records, provisioning=frozenset({"py-9"})))
    assert [r.hostId for r in decided.delete] == ["py-7"]


def test_workspaces_of_dead_hosts_and_of_registrations_no_longer_held_are_removed() -> None:
    spaces = [
        Workspace("dead-uid", None, OLD),
        Workspace("young-dead-uid", None, NEW),
        Workspace(H1.hostUid, None, OLD),
        Workspace(H1.hostUid, "a.1", OLD),  # held
        Workspace(H1.hostUid, "gone.1", OLD),
        Workspace(H1.hostUid, "young.1", NEW),
        Workspace(H1.hostUid, "task-t.1", OLD),  # a task's: its host removes it
        Workspace("silent-uid", "x.1", OLD),  # a host that did not answer: unknown
    ]
    seen = [HostSeen(H1, (reg("a"),)), HostSeen(H2, ()), HostSeen(host("py-2", uid="silent-uid"), None)]
    live = frozenset({H1.hostUid, H2.hostUid, "silent-uid"})
    decided = plan(snapshot(workspaces=spaces, hosts=seen, live_uids=live))
    assert [(s.host_uid, s.entry) for s in decided.remove] == [("dead-uid", None), (H1.hostUid, "gone.1")]


def test_a_supervised_host_whose_supervisor_is_gone_is_supervised_again() -> None:
    unsupervised = host("py-5", supervised=False)
    young = host("py-6", supervised=True, readyAt=NEW)
    seen = [HostSeen(H1, (reg("a"),)), HostSeen(H2, ()), HostSeen(unsupervised, ()), HostSeen(young, ())]
    decided = plan(snapshot(hosts=seen, supervisors=frozenset({"py-0"})))
    assert [h.hostId for h in decided.supervise] == ["py-1"]


def test_a_quick_round_waits_the_interval() -> None:
    assert next_round_in(60.0, 0.2) == 60.0
    assert next_round_in(60.0, 0.0) == 60.0


def test_a_long_round_waits_pace_times_as_long() -> None:
    """The reconciler spends at most 1/PACE of the time on rounds, however many Runs they read."""
    assert next_round_in(60.0, 10.0) == PACE * 10.0
    assert next_round_in(1.0, 0.5) == PACE * 0.5


def test_the_paced_wait_is_bounded_but_never_below_the_interval() -> None:
    assert next_round_in(60.0, 3600.0) == PACED_MAX_S
    assert next_round_in(2 * PACED_MAX_S, 3600.0) == 2 * PACED_MAX_S


def test_no_interval_means_no_periodic_round() -> None:
    assert next_round_in(None, 10.0) is None


def test_a_negative_duration_counts_as_none() -> None:
    assert next_round_in(5.0, -1.0) == 5.0
