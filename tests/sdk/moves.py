"""Waiting, through the SDK, for a Run to move off a host (drained, lost or deleted)."""

from __future__ import annotations

from kruntimes.api.phases import RunPhase
from kruntimes.api.status import RunStatus
from kruntimes.sdk.client import Client
from tests.support.waiting import eventually


async def moved_off(krt: Client, name: str, host_uid: str, within: float = 60.0) -> RunStatus:
    """The Run's status once it is Ready on another host than `host_uid`."""
    status: RunStatus = await eventually(
        lambda: krt.status(name),
        until=lambda status: status.phase is RunPhase.Ready and status.assignedHostUID != host_uid,
        within=within,
        every=0.05,
        what=f"{name} to move",
    )
    return status
