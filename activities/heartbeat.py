"""Heartbeat while awaiting something slow, so a dead worker's activity is retried within seconds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")
HEARTBEAT_S = 2.0


async def heartbeating(call: Awaitable[T], *, every_s: float = HEARTBEAT_S) -> T:
    task = asyncio.ensure_future(call)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            activity.heartbeat()
    finally:
        task.cancel()
