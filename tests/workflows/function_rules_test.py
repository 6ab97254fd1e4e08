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
from kruntimes.decisions.functionlife import MAX_BACKOFF_S, phase_of, plan, split_wanted, start_backoff

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


def test_a_function_at_zero_whose_last_replicas_failed_is_not_ready() -> None:
    """At zero replicas wanted a Function is Ready (its next invocation wakes one), unless the
    replicas it started last ended before Ready: then the wake would fail as they did."""
    assert phase_of(wanted=0, replicas=[], deleting=False, ever_ready=False) is FunctionPhase.Ready
    failing = {"wanted": 0, "replicas": [], "deleting": False, "failing": True}
    assert phase_of(**failing, ever_ready=False) is FunctionPhase.Pending
    assert phase_of(**failing, ever_ready=True) is FunctionPhase.Degraded
    # a Ready replica serves whatever failed before it
    assert phase_of(wanted=1, replicas=[replica(1)], deleting=False, ever_ready=True, failing=True) is (
        FunctionPhase.Ready
    )


@pytest.mark.parametrize(
    ("wanted", "split", "maximum", "shares"),
    [
        (10, {4: 10, 3: 90}, 10, {4: 1, 3: 9}),  # the canary takes its percent, no more replicas
        (4, {4: 10, 3: 90}, 10, {4: 1, 3: 3}),  # 0.4 rounds down, but a revision with traffic keeps one
        (2, {4: 90, 3: 10}, 10, {4: 1, 3: 1}),
        (3, {4: 50, 3: 50}, 10, {4: 2, 3: 1}),  # a tie of remainders: the newer revision
        (7, {4: 70, 3: 30}, 7, {4: 5, 3: 2}),  # 4.9 and 2.1: the largest remainder rounds up
        (1, {4: 10, 3: 90}, 5, {4: 1, 3: 1}),  # one each, however few are wanted: a split needs both
        (0, {4: 10, 3: 90}, 5, {4: 0, 3: 0}),  # scaled to zero: none
        (5, {4: 0, 3: 100}, 5, {4: 0, 3: 5}),  # a revision given 0 % keeps none
        (5, {}, 5, {}),
    ],
)
def test_a_split_divides_the_replicas_wanted(
    wanted: int, split: dict[int, int], maximum: int, shares: dict[int, int]
) -> None:
    assert split_wanted(wanted, split, maximum=maximum) == shares


def test_a_split_adds_up_to_wanted_for_every_count_and_percent() -> None:
    for maximum in (2, 7, 100):
        for wanted in range(maximum + 1):
            for percent in range(101):
                split = {2: percent, 1: 100 - percent}
                shares = split_wanted(wanted, split, maximum=maximum)
                floor = sum(1 for p in split.values() if p > 0) if wanted else 0
                assert sum(shares.values()) == max(wanted, floor) <= max(maximum, floor), (wanted, split)
                assert all(shares[r] >= 1 for r, p in split.items() if p > 0 and wanted), (wanted, split)
                assert all(
                    abs(shares[r] - wanted * p / 100) < 1
                    for r, p in split.items()
                    if 0 < p < 100 and wanted >= 2
                ), (wanted, split)


def test_a_negative_wanted_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        split_wanted(-1, {1: 100}, maximum=3)
