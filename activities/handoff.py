"""The pool's answer handed to a Run waiting for it in the same worker process.

With the embedded platform the pool and the Runs are served by one worker process. A Run started
by the SDK (its starter sent the admission) waits, in a local activity of its first workflow
task, up to a fraction of a second for the pool's answer; the pool's signal_runs activity hands
the answer over in memory before it sends the signal. The same activity then registers attempt 1
on the assigned host, so the Run is Ready at the end of its first task instead of after a second
task woken by the signal: one workflow task and one local activity fewer on the path to Ready.

A Run that got its answer this way gets no signal (the pool's activity skips it): the Run records
the answer in the task it is in. If that task is lost (the worker dies before completing it),
the retried task finds nothing here, waits out the Run's grace period (ADMIT_GRACE) and asks the
pool again; the pool still holds the reservation and answers with the same assignment. A Run
whose pool answers from another process gets nothing at once, and so does a Run beyond the few
allowed to wait at a time; a Run the pool answers too late gets the signal as before. A
registration that failed here is done again by the Run the usual way, where failures count
against its retry policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from kruntimes.lifecycle import Assignment, AwaitAssignmentInput, Handoff, RegisterInput, RegisterResult

Register = Callable[[RegisterInput], Awaitable[RegisterResult]]

# A Run waits in the mailbox only while its pool answered from this process this recently...
POOL_RECENT_S = 60.0
# ... and only this many Runs wait at once: each holds a workflow task slot while it waits, and
# in a burst the pool's answers are in the Runs' histories before their first task anyway.
MAX_WAITERS = 4
# An answer that found no Run waiting is kept this long for one that is about to ask (the pool
# can answer before the Run's first task gets to ask), at most KEPT of them.
KEEP_S = 2.0
KEPT = 256


class Mailbox:
    """Pool answers handed to Runs that wait for them in this process (one event loop)."""

    def __init__(self, *, max_waiters: int = MAX_WAITERS, pool_recent_s: float = POOL_RECENT_S) -> None:
        self.max_waiters = max_waiters
        self.pool_recent_s = pool_recent_s
        self._pools: dict[str, float] = {}  # runtime → when its pool last answered from here
        self._waiters: dict[tuple[str, str], asyncio.Future[Assignment]] = {}
        self._kept: dict[tuple[str, str], tuple[float, Assignment]] = {}  # insertion = age order

    def pool_answered(self, runtime: str) -> None:
        self._pools[runtime] = time.monotonic()

    def _pool_here(self, runtime: str) -> bool:
        seen = self._pools.get(runtime)
        return seen is not None and time.monotonic() - seen < self.pool_recent_s

    def deliver(self, workflow_id: str, assignment: Assignment) -> bool:
        """Hand the assignment to its Run if it waits here; True when it was handed over."""
        key = (workflow_id, assignment.runUid)
        waiter = self._waiters.get(key)
        if waiter is None or waiter.done():
            self._keep(key, assignment)
            return False
        waiter.set_result(assignment)
        return True

    def _keep(self, key: tuple[str, str], assignment: Assignment) -> None:
        now = time.monotonic()
        while self._kept:
            oldest, (at, _) = next(iter(self._kept.items()))
            if now - at < KEEP_S and len(self._kept) < KEPT:
                break
            del self._kept[oldest]
        self._kept[key] = (now, assignment)

    async def wait(self, request: AwaitAssignmentInput) -> Assignment | None:
        """The assignment, if the Run's pool answers from this process within the timeout."""
        key = (request.workflowId, request.runUid)
        kept = self._kept.pop(key, None)
        if kept is not None and time.monotonic() - kept[0] < KEEP_S:
            return kept[1]
        if (
            not self._pool_here(request.runtime)
            or len(self._waiters) >= self.max_waiters
            or key in self._waiters
        ):
            return None
        waiter: asyncio.Future[Assignment] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        try:
            await asyncio.wait({waiter}, timeout=request.timeoutSeconds)
        finally:
            del self._waiters[key]  # no await between this and the check below: nothing slips in
        return waiter.result() if waiter.done() and not waiter.cancelled() else None


class HandoffActivities:
    def __init__(self, mailbox: Mailbox, register: Register) -> None:
        self.mailbox = mailbox
        self.register = register  # RuntimeHostActivities.register_function

    @activity.defn(name="await_assignment")
    async def await_assignment(self, request: AwaitAssignmentInput) -> Handoff:
        assignment = await self.mailbox.wait(request)
        if assignment is None or request.run is None:
            return Handoff(assignment=assignment)
        run = request.run
        try:
            registration = await self.register(
                RegisterInput(
                    address=assignment.address,
                    runUid=request.runUid,
                    attempt=1,
                    namespace=run.metadata.namespace,
                    name=run.metadata.name,
                    runtime=run.spec.runtime,
                    adapter=assignment.adapter,
                    run=run,
                )
            )
        except ApplicationError as err:
            return Handoff(assignment=assignment, registerError=f"{err.type}: {err.message}")
        return Handoff(assignment=assignment, registration=registration)
