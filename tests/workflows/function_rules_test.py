"""kruntimes.decisions.functionlife: what a Function's workflow starts and deletes, the backoff
after replicas that never got Ready, and the Function's phase."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from kruntimes.api.function import FunctionPhase
from kruntimes.api.ids import RunUid
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.function import Replica
from kruntimes.decisions.functionlife import MAX_BACKOFF_S, phase_of, plan, start_backoff

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def replica(revision: int, phase: RunPhase = RunPhase.Ready, *, deleting: bool = False) -> Replica:
    uid = RunUid(str(uuid.uuid4()))
    return Replica(
        runUid=uid,
        name=f"f-r{revision}-{uid[:5]}",
        revision=revision,
        phase=phase,
        startedAt=T0,
        deleting=deleting,
    )


def test_missing_replicas_of_the_current_revision_are_started() -> None:
    decided = plan(revision=1, wanted=3, replicas=[replica(1)], now=T0, retry_at=None)
    assert (decided.start, decided.delete, decided.rolled_out) == (2, (), False)


def test_no_start_before_the_backoff_is_over_and_one_after() -> None:
    later = T0 + timedelta(seconds=2)
    assert plan(revision=1, wanted=1, replicas=[], now=T0, retry_at=later).start == 0
    assert plan(revision=1, wanted=1, replicas=[], now=later, retry_at=later).start == 1


def test_the_old_revision_goes_only_once_the_new_one_is_ready() -> None:
    old = [replica(1), replica(1)]
    coming = [replica(2), replica(2, RunPhase.Running)]
    decided = plan(revision=2, wanted=2, replicas=[*old, *coming], now=T0, retry_at=None)
    assert (decided.start, decided.delete, decided.rolled_out) == (0, (), False)
    ready = [replica(2), replica(2)]
    decided = plan(revision=2, wanted=2, replicas=[*old, *ready], now=T0, retry_at=None)
    assert decided.rolled_out and set(decided.delete) == {r.runUid for r in old}


def test_a_surplus_goes_not_ready_first_then_the_newest() -> None:
    oldest, newer, pending = replica(1), replica(1), replica(1, RunPhase.Pending)
    decided = plan(revision=1, wanted=1, replicas=[oldest, newer, pending], now=T0, retry_at=None)
    assert set(decided.delete) == {pending.runUid, newer.runUid}


def test_replicas_being_deleted_or_ended_count_for_nothing() -> None:
    gone = [replica(1, deleting=True), replica(1, RunPhase.Failed), replica(1, RunPhase.Cancelled)]
    assert plan(revision=1, wanted=1, replicas=gone, now=T0, retry_at=None).start == 1
    with pytest.raises(ValueError):
        plan(revision=1, wanted=-1, replicas=[], now=T0, retry_at=None)


def test_the_backoff_doubles_and_is_bounded() -> None:
    assert [start_backoff(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert start_backoff(10_000) == MAX_BACKOFF_S
    with pytest.raises(ValueError):
        start_backoff(0)


@pytest.mark.parametrize(
    ("replicas", "ever_ready", "deleting", "phase"),
    [
        ([], False, False, FunctionPhase.Pending),
        ([replica(1, RunPhase.Running)], False, False, FunctionPhase.Pending),
        ([replica(1)], False, False, FunctionPhase.Pending),
        ([replica(1)], True, False, FunctionPhase.Degraded),
        ([replica(1), replica(2)], True, False, FunctionPhase.Ready),
        ([replica(1), replica(1, deleting=True)], True, False, FunctionPhase.Degraded),
        ([], True, False, FunctionPhase.Degraded),
        ([replica(1), replica(1)], True, True, FunctionPhase.Deleting),
    ],
)
def test_the_phase(replicas: list[Replica], ever_ready: bool, deleting: bool, phase: FunctionPhase) -> None:
    assert phase_of(wanted=2, replicas=replicas, deleting=deleting, ever_ready=ever_ready) is phase
