"""Helpers of the in-process handoff tests (kruntimes.activities.handoff): a pool's answer, and waiting until
a Run waits for it in a Mailbox."""

from __future__ import annotations

from kruntimes.activities.handoff import Mailbox
from kruntimes.contracts.platform_info import PlatformInfo
from kruntimes.contracts.run import Assignment
from tests.support.waiting import eventually

WAIT_BOUND_S = 30.0


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
    await eventually(
        lambda: mailbox.waiting(workflow_id, run_uid),
        within=WAIT_BOUND_S,
        every=0.001,
        what=f"{workflow_id} ({run_uid}) to wait in the mailbox",
    )
