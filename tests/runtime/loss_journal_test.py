"""A host's journal of lost registrations (runtime/watch.py): what a stream that asks for losses
is told, and what a watcher that resumes after a broken stream is told, without keeping anything
per registration itself."""

from __future__ import annotations

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime.watch import Health, HostWatch, LossCursor

READY = pb.REGISTRATION_PHASE_READY
NOT_READY = pb.REGISTRATION_PHASE_NOT_READY


class Host:
    """A HostWatch over a list of registrations the test changes."""

    def __init__(self, *, journal: int = 16) -> None:
        self.registrations: dict[str, pb.RegistrationState] = {}
        self.watch = HostWatch(
            host_id="python-0",
            host_uid="uid-1",
            runtime="python",
            interval_s=1.0,
            registrations=lambda: list(self.registrations.values()),
            running_tasks=lambda: 0,
            isolation=dict,
            gateways=list,
            set_gateways=lambda _: None,
            health=Health(),
            journal=journal,
        )
        self.sequence = 0

    def set(self, name: str, phase: pb.RegistrationPhase.ValueType = READY) -> None:
        self.registrations[f"reg-{name}"] = pb.RegistrationState(
            run_uid=f"run-{name}",
            attempt=1,
            namespace="default",
            name=name,
            runtime="python",
            registration_id=f"reg-{name}",
            phase=phase,
            assignment=pb.SignedAssignment(assignment=b"signed", signature=b"sig"),
        )

    def remove(self, name: str) -> None:
        del self.registrations[f"reg-{name}"]

    def report(
        self, cursor: LossCursor | None, sent: dict[str, pb.RegistrationState] | None = None
    ) -> pb.HostReport:
        self.sequence += 1
        return self.watch.report(self.sequence, {} if sent is None else sent, cursor)


def told(report: pb.HostReport) -> list[tuple[int, str, bool]]:
    return [(loss.position, loss.registration.name, loss.gone) for loss in report.lost]


def test_a_stream_is_told_each_registration_that_stops_serving_once_and_from_its_first_report_on() -> None:
    host = Host()
    host.set("gone-before")
    host.watch.report(1)  # the host looked (another watcher): gone-before served
    host.remove("gone-before")
    host.set("a")
    host.set("b")
    host.set("never-ready", NOT_READY)
    cursor = LossCursor(None)
    first = host.report(cursor)
    assert first.reports_losses and not first.lost and not first.lost_truncated
    assert first.lost_position == 1, "the loss before the stream began is journalled, not told"

    host.remove("a")  # gone
    host.set("b", NOT_READY)  # there, not ready
    host.remove("never-ready")  # never served: no loss
    second = host.report(cursor)
    assert told(second) == [(2, "a", True), (3, "b", False)]
    assert second.lost_position == 3 == cursor.after
    [a, _] = second.lost
    assert a.registration.run_uid == "run-a" and a.registration.registration_id == "reg-a"
    assert not a.registration.HasField("assignment"), "a loss carries no assignment"

    host.remove("b")  # was not ready when the host last looked: told once, above
    assert not host.report(cursor).lost


def test_a_watcher_that_resumes_is_told_what_it_missed_and_no_more() -> None:
    host = Host()
    for name in "abc":
        host.set(name)
    cursor = LossCursor(None)
    host.report(cursor)
    host.remove("a")
    taken = host.report(cursor)
    assert told(taken) == [(1, "a", True)]

    # the stream breaks; meanwhile the host reports to another watcher and loses b and c
    host.remove("b")
    host.watch.report(1)
    host.set("c", NOT_READY)
    resumed = host.report(LossCursor(taken.lost_position))
    assert told(resumed) == [(2, "b", True), (3, "c", False)] and not resumed.lost_truncated
    fresh = host.report(LossCursor(None))
    assert not fresh.lost and fresh.lost_position == 3, "a new watcher starts from now"


def test_a_watcher_away_for_longer_than_the_journal_is_told_so() -> None:
    host = Host(journal=4)
    for i in range(6):
        host.set(f"r{i}")
    cursor = LossCursor(None)
    host.report(cursor)
    before = cursor.after
    for i in range(6):
        host.remove(f"r{i}")
    resumed = host.report(LossCursor(before))
    assert resumed.lost_truncated
    assert [loss.position for loss in resumed.lost] == [3, 4, 5, 6], "what it still holds"

    assert host.report(LossCursor(6)).lost_truncated is False
    made_up = host.report(LossCursor(99))
    assert made_up.lost_truncated and not made_up.lost and made_up.lost_position == 6


def test_a_stream_that_does_not_ask_for_losses_gets_none() -> None:
    host = Host()
    host.set("a")
    sent: dict[str, pb.RegistrationState] = {}
    host.report(None, sent)
    host.remove("a")
    report = host.report(None, sent)
    assert not report.reports_losses and not report.lost and report.removed == ["reg-a"]
