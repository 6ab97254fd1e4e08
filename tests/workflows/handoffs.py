"""Helpers of the in-process handoff tests (kruntimes.activities.handoff): a pool's answer, and waiting until
a Run waits for it in a Mailbox."""

from __future__ import annotations

import asyncio
import time

from kruntimes.activities.handoff import Mailbox
from kruntimes.contracts.platform import PlatformInfo
from kruntimes.contracts.run import Assignment

WAIT_BOUND_S = 10.0


def assignment(run_uid: str = "uid-1") -> Assignment:
    return Assignment(
        runUid=run_uid,
        hostId="h-0",
        hostUid="host-uid",
        address="127.0.0.1:1",
        adapter="python",
        platform=PlatformInfo(),
    )


async def until_waiting(mailbox: Mailbox, workflow_id: str, run_uid: str = "uid-1") -> None:
    """Return once that Run waits in the mailbox (its answer would be handed over, not kept)."""
    deadline = time.monotonic() + WAIT_BOUND_S
    while not mailbox.waiting(workflow_id, run_uid):
        if time.monotonic() > deadline:
            raise AssertionError(f"{workflow_id} ({run_uid}) never waited in the mailbox")
        await asyncio.sleep(0.001)
