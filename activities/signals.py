"""The pool's answers to Runs, sent in batches by one local activity, and the admission signal.

Sending them from the workflow (one SignalExternal command each) costs two history events and a
wake-up of the pool per Run; sent concurrently from one activity they cost nothing in the pool's
history.

A Run whose pool lives in the same worker process and that waits for the answer in its first
workflow task gets its assignment handed over in memory instead (kruntimes.activities.handoff). So does a
Run its starter admitted whose first task has not asked yet, when the Runs' tasks run in this
process too: the answer waits for that task in the mailbox, and is signalled only if the task
does not take it within a few seconds (`_unclaimed`). A burst of Runs then costs the server no
signal per Run, and the pool's task does not wait for those signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError, WorkflowQueryRejectedError
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

from kruntimes.activities.handoff import Mailbox
from kruntimes.api.ids import RuntimeName
from kruntimes.contracts.host import HostRecord
from kruntimes.contracts.names import (
    QUERY_HOST,
    QUERY_HOST_SLOTS_DIGEST,
    SIGNAL_ADMIT,
    SIGNAL_ASSIGNED,
    SIGNAL_HOST_COMMAND,
    SIGNAL_HOST_LOST,
    SIGNAL_HOST_SLOTS,
    SIGNAL_REJECTED,
    SIGNAL_RELEASE,
    UPDATE_HOST_SLOTS,
    pool_workflow_id,
)
from kruntimes.contracts.pool import AdmitSignal, ReleaseSignal
from kruntimes.contracts.run import (
    Assignment,
    HostSlots,
    HostSlotsInput,
    OutgoingSignal,
    SignalBatch,
    SignalResult,
    slots_digest,
)

CONCURRENCY = 32
DIGEST_TIMEOUT = timedelta(seconds=2)  # a query of a HostWorkflow's slots; else a signal or update
# A parked answer its Run did not take is signalled, tried this many times this far apart; one
# that still does not get there is asked for by the Run itself after its grace period.
UNCLAIMED_TRIES = 3
UNCLAIMED_BACKOFF_S = 1.0

log = logging.getLogger(__name__)


class SignalActivities:
    def __init__(self, client: Client, mailbox: Mailbox | None = None) -> None:
        self.client = client
        self.mailbox = mailbox or Mailbox()
        self._unclaimed_sends: set[asyncio.Task[None]] = set()

    def _unclaimed(self, workflow_id: str, runtime: str, assignment: Assignment) -> None:
        """A parked answer its Run did not take in time: signal it now (not in any pool task)."""
        task = asyncio.get_running_loop().create_task(
            self._send_unclaimed(workflow_id, RuntimeName(runtime), assignment)
        )
        self._unclaimed_sends.add(task)
        task.add_done_callback(self._unclaimed_sends.discard)

    async def _send_unclaimed(self, workflow_id: str, runtime: RuntimeName, assignment: Assignment) -> None:
        for attempt in range(UNCLAIMED_TRIES):
            try:
                await self.client.get_workflow_handle(workflow_id).signal(SIGNAL_ASSIGNED, assignment)
                return
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    break  # the Run is gone: its slot is free again, as the pool does for a signal
                if attempt + 1 == UNCLAIMED_TRIES:
                    log.warning(
                        "cannot signal a Run its assignment; it asks its pool again after its grace",
                        extra={"run_uid": assignment.runUid, "status": err.status.name},
                    )
                    return
            await asyncio.sleep(UNCLAIMED_BACKOFF_S)
        with contextlib.suppress(RPCError):  # a pool that is gone has nothing to release
            await self.client.get_workflow_handle(pool_workflow_id(runtime)).signal(
                SIGNAL_RELEASE, ReleaseSignal(runUid=assignment.runUid)
            )

    async def _send(self, out: OutgoingSignal, gate: asyncio.Semaphore) -> str | None:
        if out.assigned is not None:
            name, arg = SIGNAL_ASSIGNED, out.assigned
        elif out.rejected is not None:
            name, arg = SIGNAL_REJECTED, out.rejected  # type: ignore[assignment]
        elif out.hostLost is not None:
            name, arg = SIGNAL_HOST_LOST, out.hostLost  # type: ignore[assignment]
        elif out.command is not None:
            name, arg = SIGNAL_HOST_COMMAND, out.command  # type: ignore[assignment]
        elif out.slots is not None:
            name, arg = SIGNAL_HOST_SLOTS, out.slots  # type: ignore[assignment]
        else:
            return None
        async with gate:
            if out.slots is not None and await self._holds(out.workflowId, out.slots):
                return None  # it keeps these slots already: nothing to hand over
            try:
                await self.client.get_workflow_handle(out.workflowId).signal(name, arg)
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return out.workflowId  # the Run is gone
                raise
        return None

    async def _holds(self, workflow_id: str, slots: HostSlots) -> bool:
        """Whether that HostWorkflow runs and keeps exactly these slots (its digest of them), so
        the handover needs no signal: a host full since the last handover (most of them, in a
        big pool) costs a query, not its whole slots in its history and a task. Anything else (a
        closed or older workflow, an error, another incarnation's slots) is answered by the
        signal: a closed workflow's refusal keeps its slots in the pool's state."""
        try:
            held: str = await self.client.get_workflow_handle(workflow_id).query(
                QUERY_HOST_SLOTS_DIGEST,
                result_type=str,
                reject_condition=QueryRejectCondition.NOT_OPEN,
                rpc_timeout=DIGEST_TIMEOUT,
            )
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError):
            return False
        return held == slots_digest(slots.hostUid, slots.slots)

    @activity.defn(name="admit_run")
    async def admit_run(self, admit: AdmitSignal) -> bool:
        """A Run's admission request to its runtime's pool; False when no such pool runs."""
        try:
            await self.client.get_workflow_handle(pool_workflow_id(admit.request.runtime)).signal(
                SIGNAL_ADMIT, admit
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    @activity.defn(name="admit_run_early")
    async def admit_run_early(self, admit: AdmitSignal) -> bool:
        """An admission sent before its Run's workflow is started (a Function's replica): only
        while the pool's answer will wait for the Run's first task here (the pools' and the Runs'
        tasks both run only in this process: Mailbox.park), never to be signalled to a Run that
        does not exist yet. True when sent; False when not (the starter admits after the start)."""
        if not (admit.handoff and self.mailbox.pools_local and self.mailbox.runs_local):
            return False
        return await self.admit_run(admit)

    @activity.defn(name="host_slots")
    async def host_slots(self, ask: HostSlotsInput) -> HostSlots:
        """The slots a HostWorkflow keeps of its host (closed workflows answer too); none when
        the workflow is gone or supervises another incarnation."""
        handle = self.client.get_workflow_handle(ask.workflowId)
        if ask.digest and (kept := await self._kept(handle, ask)) is not None:
            return kept
        try:  # an update sees the handover signal applied; a query may not yet
            answer = await handle.execute_update(UPDATE_HOST_SLOTS, result_type=HostSlots)
        except RPCError as err:
            if err.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
        else:
            return HostSlots(hostUid=ask.hostUid, slots=answer.slots if answer.hostUid == ask.hostUid else [])
        try:  # closed (every signal it got is applied) or gone
            record = await handle.query(QUERY_HOST, result_type=HostRecord)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return HostSlots(hostUid=ask.hostUid)
            raise
        if record is None or record.host.hostUid != ask.hostUid:
            return HostSlots(hostUid=ask.hostUid)
        return HostSlots(hostUid=ask.hostUid, slots=record.slots)

    async def _kept(self, handle: WorkflowHandle[Any, Any], ask: HostSlotsInput) -> HostSlots | None:
        """The slots the HostWorkflow's record shows, if they are the very ones it was handed (its
        digest is `ask.digest`): read with a query, which leaves no task and no events in its
        history, as the update does. The query may be answered before a handover signal still in
        flight is applied, but then the record shows the slots from before it, whose digest is
        another (unless they are the same slots): None, and the update reads them."""
        try:
            record: HostRecord | None = await handle.query(
                QUERY_HOST, result_type=HostRecord, rpc_timeout=DIGEST_TIMEOUT
            )
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError):
            return None
        if record is None or record.host.hostUid != ask.hostUid:
            return None
        if slots_digest(ask.hostUid, record.slots) != ask.digest:
            return None
        return HostSlots(hostUid=ask.hostUid, slots=record.slots)

    def _handed_over(self, out: OutgoingSignal, runtime: str) -> bool:
        if out.assigned is None:
            return False
        if (
            out.park
            and runtime
            and self.mailbox.park(out.workflowId, runtime, out.assigned, unclaimed=self._unclaimed)
        ):
            return True
        return self.mailbox.deliver(out.workflowId, out.assigned)

    @activity.defn(name="signal_runs")
    async def signal_runs(self, batch: SignalBatch) -> SignalResult:
        if batch.runtime:
            self.mailbox.pool_answered(batch.runtime)
        # An assignment handed to its Run waiting in this process needs no signal: the Run records
        # it in the task it is in. Should that task be lost (the worker dies), the retried task
        # finds no answer, waits out its grace period and asks again, and the pool, which holds
        # the reservation, answers with the same assignment.
        signals = [out for out in batch.signals if not self._handed_over(out, batch.runtime)]
        if not signals:
            return SignalResult()
        gate = asyncio.Semaphore(CONCURRENCY)
        sends = [asyncio.ensure_future(self._send(out, gate)) for out in signals]
        # Within the budget: the pool's local activity holds its workflow task while it sends, and
        # what is left over goes out in an ordinary activity instead (a repeat is harmless).
        done, left = await asyncio.wait(sends, timeout=batch.budgetSeconds or None)
        for send in left:
            send.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        for send in done:
            failed = send.exception()
            if failed is not None:
                raise failed  # the activity is retried
        return SignalResult(
            unreachable=[g for s in sends if s in done and (g := s.result()) is not None],
            unsent=[out for out, s in zip(signals, sends, strict=True) if s in left],
        )
