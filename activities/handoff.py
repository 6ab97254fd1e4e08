"""The pool's answer handed to a Run waiting for it in the same worker process.

With the embedded platform the pool and the Runs are served by one worker process. A Run started
by the SDK or a Function's replica (its starter, or its Function's workflow, sent the admission)
waits, in a local activity of its first workflow task, up to a fraction of a second for the pool's
answer; the pool's signal_runs activity hands the answer over in memory before it sends the
signal. The same activity then registers attempt 1 on the assigned host (a replica's naming its
Function, as its own registration would), so the Run is Ready at the end of its first task
instead of after a second task woken by the signal: one workflow task and one local activity
fewer on the path to Ready.

The activity holds the Run's workflow task open, so it ends before its own start-to-close
timeout, whatever the pool or the host do: the wait for the answer is bounded by the request,
and the registration by what is left of the timeout (less a margin). A registration that does
not finish in time is given up (`REGISTER_SLOW`) and done by the Run in an ordinary activity;
registering the same attempt again is idempotent on the host.

A Run that got its answer this way gets no signal (the pool's activity skips it): the Run records
the answer in the task it is in. If that task is lost (the worker dies before completing it),
the retried task finds nothing here, waits out the Run's grace period (ADMIT_GRACE) and asks the
pool again; the pool still holds the reservation and answers with the same assignment. A Run
whose pool answers from another process gets nothing at once, and so does a Run beyond the few
allowed to wait at a time; a Run the pool answers too late gets the signal. A
registration that failed here is done again by the Run the usual way, where failures count
against its retry policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from kruntimes.contracts.hostcalls import Handoff, RegisterInput, RegisterResult, register_input
from kruntimes.contracts.names import POOL_TASK_QUEUE
from kruntimes.contracts.run import Assignment, AwaitAssignmentInput

Register = Callable[[RegisterInput], Awaitable[RegisterResult]]

# A Run waits in the mailbox only while its pool's tasks run in this process: this process is the
# only one polling the pools' task queue (watch_pool_pollers), or its pool answered from here
# this recently...
POOL_RECENT_S = 60.0
POLLERS_EVERY_S = 30.0
# ... and only this many Runs wait at once, each holding one of the worker's 100 workflow task
# slots (the rest stay free for other Runs, scale-outs and cleanups).
MAX_WAITERS = 64
# An answer that found no Run waiting is kept this long for one that is about to ask (the pool
# can answer before the Run's first task gets to ask), at most KEPT of them.
KEEP_S = 2.0
KEPT = 256
# An answer to a Run its starter admitted, ready before the Run's first task asks for it, waits
# here for the Run this long (at most PARKED of them) instead of being signalled, while the Runs'
# and the pools' tasks both run only in this process: the Run then needs no signal, and the pool's
# task does not wait for one. One still here after PARK_S is signalled then (`Unclaimed`).
PARK_S = 30.0
PARKED = 4096
# A Run that asked and left without an answer waits for the signal: its answer is never parked.
# Remembered this long, at most MISSED of them.
MISSED_S = 60.0
MISSED = 4096
# The activity returns this long before its start-to-close timeout at the latest.
MARGIN_S = 0.5
# The registerError of a registration given up because it took too long.
REGISTER_SLOW = "RegisterSlow"


# Called with (workflow id, runtime, assignment) for a parked answer its Run did not take in time.
Unclaimed = Callable[[str, str, Assignment], None]


class Mailbox:
    """Pool answers handed to Runs that wait for them in this process (one event loop)."""

    def __init__(
        self,
        *,
        max_waiters: int = MAX_WAITERS,
        pool_recent_s: float = POOL_RECENT_S,
        park_s: float = PARK_S,
        max_parked: int = PARKED,
    ) -> None:
        self.max_waiters = max_waiters
        self.pool_recent_s = pool_recent_s
        self.park_s = park_s
        self.max_parked = max_parked
        self._pools: dict[str, float] = {}  # runtime → when its pool last answered from here
        self._waiters: dict[tuple[str, str], asyncio.Future[Assignment]] = {}
        self._kept: dict[tuple[str, str], tuple[float, Assignment]] = {}  # insertion = age order
        self._parked: dict[tuple[str, str], tuple[Assignment, asyncio.TimerHandle]] = {}
        self._missed: dict[tuple[str, str], float] = {}  # insertion = age order
        self.pools_local = False  # every pool's tasks run in this process (watch_pool_pollers)
        self.runs_local = False  # every Run's tasks run in this process (watch_pool_pollers)

    def pool_answered(self, runtime: str) -> None:
        self._pools[runtime] = time.monotonic()

    def _pool_here(self, runtime: str) -> bool:
        if self.pools_local:
            return True
        seen = self._pools.get(runtime)
        return seen is not None and time.monotonic() - seen < self.pool_recent_s

    def waiting(self, workflow_id: str, run_uid: str) -> bool:
        """Whether that Run waits here for its answer now."""
        waiter = self._waiters.get((workflow_id, run_uid))
        return waiter is not None and not waiter.done()

    def deliver(self, workflow_id: str, assignment: Assignment) -> bool:
        """Hand the assignment to its Run if it waits here; True when it was handed over."""
        key = (workflow_id, assignment.runUid)
        waiter = self._waiters.get(key)
        if waiter is None or waiter.done():
            self._keep(key, assignment)
            return False
        waiter.set_result(assignment)
        return True

    def park(self, workflow_id: str, runtime: str, assignment: Assignment, *, unclaimed: Unclaimed) -> bool:
        """Hand the assignment to its Run waiting here, or keep it here for the Run's first task
        (which will look here: its starter admitted it) when that task runs in this process and
        has not asked yet; True when no signal is needed now. An answer not taken within park_s
        goes to `unclaimed`, which signals it."""
        key = (workflow_id, assignment.runUid)
        waiter = self._waiters.get(key)
        if waiter is not None and not waiter.done():
            waiter.set_result(assignment)
            return True
        if not (self.pools_local and self.runs_local) or len(self._parked) >= self.max_parked:
            return False
        if self._left_empty_handed(key) or key in self._parked:
            return False
        handle = asyncio.get_running_loop().call_later(
            self.park_s, self._unpark, key, runtime, assignment, unclaimed
        )
        self._parked[key] = (assignment, handle)
        return True

    def parked(self) -> int:
        return len(self._parked)

    def _unpark(
        self, key: tuple[str, str], runtime: str, assignment: Assignment, unclaimed: Unclaimed
    ) -> None:
        parked = self._parked.get(key)
        if parked is None or parked[0] is not assignment:
            return
        del self._parked[key]
        unclaimed(key[0], runtime, assignment)

    def _left_empty_handed(self, key: tuple[str, str]) -> bool:
        self._forget_missed(time.monotonic())
        return key in self._missed

    def _missed_answer(self, key: tuple[str, str]) -> None:
        now = time.monotonic()
        self._missed.pop(key, None)
        self._missed[key] = now
        self._forget_missed(now)

    def _forget_missed(self, now: float) -> None:
        while self._missed:
            oldest, at = next(iter(self._missed.items()))
            if now - at < MISSED_S and len(self._missed) <= MISSED:
                break
            del self._missed[oldest]

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
        parked = self._parked.pop(key, None)
        if parked is not None:
            parked[1].cancel()
            return parked[0]
        kept = self._kept.pop(key, None)
        if kept is not None and time.monotonic() - kept[0] < KEEP_S:
            return kept[1]
        if (
            not self._pool_here(request.runtime)
            or len(self._waiters) >= self.max_waiters
            or key in self._waiters
        ):
            self._missed_answer(key)
            return None
        waiter: asyncio.Future[Assignment] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        try:
            await asyncio.wait({waiter}, timeout=request.timeoutSeconds)
        finally:
            del self._waiters[key]  # no await between this and the check below: nothing slips in
        if waiter.done() and not waiter.cancelled():
            return waiter.result()
        self._missed_answer(key)  # its answer comes by signal from now on
        return None


async def pools_polled_only_by(client: Client, identity: str, task_queue: str = POOL_TASK_QUEUE) -> bool:
    """Whether the pools' task queue has pollers and all of them are `identity` (this process).
    The server lists a poller for some minutes after it stopped: a restarted worker process
    waits for the old one to drop out before Runs wait for in-process answers again."""
    answer = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return bool(answer.pollers) and all(p.identity == identity for p in answer.pollers)


async def watch_pool_pollers(
    client: Client,
    mailbox: Mailbox,
    identity: str,
    *,
    task_queue: str = POOL_TASK_QUEUE,
    run_task_queue: str | None = None,
) -> None:
    """Keep Mailbox.pools_local current (a worker serving the pools' queue runs this), and with
    `run_task_queue` (a worker serving the Runs' queue too) Mailbox.runs_local."""
    delay = 0.5  # the first look once the pool worker has polled
    while True:
        await asyncio.sleep(delay)
        delay = POLLERS_EVERY_S
        try:
            mailbox.pools_local = await pools_polled_only_by(client, identity, task_queue)
        except RPCError:
            mailbox.pools_local = False
        if run_task_queue is None:
            continue
        try:
            mailbox.runs_local = await pools_polled_only_by(client, identity, run_task_queue)
        except RPCError:
            mailbox.runs_local = False


class HandoffActivities:
    def __init__(self, mailbox: Mailbox, register: Register) -> None:
        self.mailbox = mailbox
        self.register = register  # RuntimeHostActivities.register_function

    @activity.defn(name="await_assignment")
    async def await_assignment(self, request: AwaitAssignmentInput) -> Handoff:
        began = time.monotonic()
        limit = activity.info().start_to_close_timeout
        assignment = await self.mailbox.wait(request)
        if assignment is None or request.run is None:
            return Handoff(assignment=assignment)
        run = request.run
        left = limit.total_seconds() - MARGIN_S - (time.monotonic() - began) if limit is not None else None
        if left is not None and left <= 0:
            return Handoff(assignment=assignment, registerError=f"{REGISTER_SLOW}: no time left to register")
        try:
            registration = await asyncio.wait_for(
                self.register(
                    register_input(
                        assignment, run, run_uid=request.runUid, attempt=1, replica_of=request.replicaOf
                    )
                ),
                timeout=left,
            )
        except TimeoutError:
            return Handoff(
                assignment=assignment, registerError=f"{REGISTER_SLOW}: not registered within {left:.2f} s"
            )
        except ApplicationError as err:
            return Handoff(assignment=assignment, registerError=f"{err.type}: {err.message}")
        return Handoff(assignment=assignment, registration=registration)
