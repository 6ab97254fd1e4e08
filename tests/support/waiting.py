"""Waiting on a condition, with a bound: the one way a test waits, so that no test sleeps and then
asserts. `eventually` in a test on an event loop, `eventually_blocking` (or `wait_until`, which
answers whether) in one without; each polls a check until what it returns is settled."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

# A bound is for a hang, not a timing assertion: `make test` runs two test processes on two CPUs,
# and a condition that takes a second alone can take several there.
DEFAULT_WITHIN_S = 30.0


class NotInTime(AssertionError):
    """A condition a test waited for did not hold within its bound."""


async def eventually(
    check: Callable[[], Any | Awaitable[Any]],
    *,
    within: float = DEFAULT_WITHIN_S,
    what: str = "",
    every: float = 0.02,
    until: Callable[[Any], object] = bool,
    ignoring: tuple[type[BaseException], ...] = (),
    pause: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> Any:
    """Poll `check()` (awaiting what it returns when that is awaitable) every `every` seconds
    until `until(value)` holds (by default: the value is truthy), for at most `within` seconds;
    that value. An exception of a type in `ignoring` counts as not yet. `pause` waits between
    checks (a time-skipping environment's `sleep` moves its clock instead). AssertionError naming
    `what` (else the check) and the last value or exception once the time is up."""
    deadline = time.monotonic() + within
    while True:
        value: Any = None
        error: BaseException | None = None
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as e:
            error = e
        else:
            if until(value):
                return value
        if time.monotonic() > deadline:
            raise _ran_out(within, what or check, value, error) from error
        await pause(every)


def eventually_blocking(
    check: Callable[[], Any],
    *,
    within: float = DEFAULT_WITHIN_S,
    what: str = "",
    every: float = 0.02,
    until: Callable[[Any], object] = bool,
    ignoring: tuple[type[BaseException], ...] = (),
) -> Any:
    """`eventually` for a test without an event loop (or one that must not let the loop run
    between the checks): the same polling, blocking the thread between them."""
    deadline = time.monotonic() + within
    while True:
        value: Any = None
        error: BaseException | None = None
        try:
            value = check()
        except ignoring as e:
            error = e
        else:
            if until(value):
                return value
        if time.monotonic() > deadline:
            raise _ran_out(within, what or check, value, error) from error
        time.sleep(every)


def wait_until(check: Callable[[], object], *, within: float = DEFAULT_WITHIN_S, every: float = 0.02) -> bool:
    """Whether `check()` became truthy within `within` seconds, polled every `every` seconds
    (blocking: for tests without an event loop); the caller asserts it, saying what it waited for."""
    try:
        eventually_blocking(check, within=within, every=every)
    except NotInTime:
        return False
    return True


def _ran_out(within: float, what: object, value: Any, error: BaseException | None) -> NotInTime:
    """What a test that waited in vain says: what it waited for and what it saw last."""
    if error is not None:
        last = f"; last: {type(error).__name__}: {error}"
    elif value is None or isinstance(value, bool):
        last = ""
    else:
        last = f"; last: {value!r}"
    return NotInTime(f"not true within {within:g} s: {what}{last}")
