"""kruntimes.system.futures.fail: how the side doing the work ends a waiter's future with an error."""

from __future__ import annotations

import asyncio

import pytest

from kruntimes.system.futures import fail


async def test_an_error_becomes_the_futures_exception() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    fail(future, ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        future.result()


async def test_a_cancellation_cancels_the_future() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    fail(future, asyncio.CancelledError())
    assert future.cancelled()


async def test_a_future_already_done_keeps_its_result() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    future.set_result(1)
    fail(future, ValueError("late"))
    assert future.result() == 1
