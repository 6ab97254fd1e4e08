"""Waiting on a condition, with a bound: a test never sleeps and then asserts."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    check: Callable[[], Any | Awaitable[Any]], *, within: float = 10.0, what: str = "", every: float = 0.02
) -> Any:
    """Poll `check()` (awaiting what it returns when that is awaitable) every `every` seconds
    until its value is truthy, for at most `within` seconds; that value. AssertionError naming
    `what` (else the check) once the time is up."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within:g} s: {what or check}")
        await asyncio.sleep(every)


def wait_until(check: Callable[[], object], *, within: float = 10.0, every: float = 0.02) -> bool:
    """Whether `check()` became truthy within `within` seconds, polled every `every` seconds
    (blocking: for tests without an event loop); the caller asserts it, saying what it waited for."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return bool(check())
