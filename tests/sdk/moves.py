"""Waiting, through the SDK, for a Run to move off a host (drained, lost or deleted)."""

from __future__ import annotations

import asyncio

from kruntimes.api.phases import RunPhase
from kruntimes.api.status import RunStatus
from kruntimes.sdk.client import Client


async def moved_off(krt: Client, name: str, host_uid: str, within: float = 60.0) -> RunStatus:
    """The Run's status once it is Ready on another host than `host_uid`."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        status = await krt.status(name)
        if status.phase is RunPhase.Ready and status.assignedHostUID != host_uid:
            return status
        assert asyncio.get_running_loop().time() < deadline, f"{name} did not move: {status}"
        await asyncio.sleep(0.05)
