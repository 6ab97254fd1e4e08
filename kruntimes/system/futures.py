"""Ending a waiter's asyncio future from the side that does the work."""

from __future__ import annotations

import asyncio
from typing import Any


def fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    """End `future` with `exc`: cancelled when `exc` is a cancellation, else with `exc` as its
    exception; a future already done (its waiter stopped waiting) is left as it is."""
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
