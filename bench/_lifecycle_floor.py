"""The Temporal floor of bench/lifecycle.py: a plain workflow running 3 trivial local activities.

In its own module so the workflow sandbox imports something small, never the bench script.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

FLOOR_TASK_QUEUE = "bench-floor"


@activity.defn(name="floor_step")
async def floor_step(n: int) -> int:
    return n + 1


@workflow.defn(name="Floor3LA")
class Floor3LA:
    @workflow.run
    async def run(self, n: int) -> int:
        for _ in range(3):
            n = await workflow.execute_local_activity(
                floor_step, n, start_to_close_timeout=timedelta(seconds=10)
            )
        return n
