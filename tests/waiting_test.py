"""The one waiting helper (tests/support/waiting.py): what it returns, what it says when the time
is up, and which exceptions count as not yet."""

from __future__ import annotations

import itertools

import pytest

from tests.support.waiting import NotInTime, eventually, eventually_blocking, wait_until


async def test_eventually_returns_the_first_settled_value() -> None:
    counter = itertools.count()
    assert await eventually(lambda: next(counter), until=lambda n: n >= 3, every=0) == 3


async def test_eventually_awaits_what_the_check_returns() -> None:
    async def check() -> str:
        return "ready"

    assert await eventually(check) == "ready"


async def test_the_time_up_names_what_was_awaited_and_the_last_value_seen() -> None:
    with pytest.raises(AssertionError, match=r"not true within 0\.05 s: the phase; last: 'Pending'$"):
        await eventually(lambda: "Pending", until=lambda p: p == "Ready", within=0.05, what="the phase")


async def test_an_ignored_exception_counts_as_not_yet_and_is_chained_when_the_time_is_up() -> None:
    calls = itertools.count()

    def refused_twice() -> bool:
        if next(calls) < 2:
            raise ConnectionError("refused")
        return True

    def refused() -> bool:
        raise ConnectionError("refused")

    assert await eventually(refused_twice, ignoring=(OSError,), every=0) is True
    with pytest.raises(NotInTime, match="last: ConnectionError: refused$") as raised:
        await eventually(refused, within=0, ignoring=(OSError,))
    assert isinstance(raised.value.__cause__, ConnectionError)


async def test_an_exception_not_ignored_ends_the_wait_at_once() -> None:
    def check() -> bool:
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        await eventually(check, ignoring=(ConnectionError,))


async def test_the_pause_between_checks_is_the_callers() -> None:
    paused: list[float] = []

    async def pause(seconds: float) -> None:
        paused.append(seconds)

    assert await eventually(lambda: len(paused) == 2, every=1, pause=pause)
    assert paused == [1, 1]


def test_the_blocking_variant_polls_and_says_the_same() -> None:
    counter = itertools.count()
    assert eventually_blocking(lambda: next(counter), until=lambda n: n >= 2, every=0) == 2
    with pytest.raises(NotInTime, match="not true within 0 s: nothing"):
        eventually_blocking(lambda: None, within=0, what="nothing")
    assert wait_until(lambda: True) and not wait_until(lambda: False, within=0)
