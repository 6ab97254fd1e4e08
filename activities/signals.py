"""The pool's answers to Runs, sent in batches by one local activity, and the admission signal.

Sending them from the workflow (one SignalExternal command each) costs two history events and a
wake-up of the pool per Run, and managed 11-13 signals/s on SQLite; sent concurrently from one
activity they cost nothing in the pool's history (measured 3-4x faster for a burst).

A Run whose pool lives in the same worker process and that waits for the answer in its first
workflow task gets its assignment handed over in memory instead (activities.handoff).
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.handoff import Mailbox
from kruntimes.lifecycle import (
    QUERY_HOST,
    SIGNAL_ADMIT,
    SIGNAL_ASSIGNED,
    SIGNAL_HOST_COMMAND,
    SIGNAL_HOST_LOST,
    SIGNAL_HOST_SLOTS,
    SIGNAL_REJECTED,
    UPDATE_HOST_SLOTS,
    AdmitSignal,
    HostRecord,
    HostSlots,
    HostSlotsInput,
    OutgoingSignal,
    SignalBatch,
    SignalResult,
    pool_workflow_id,
)

CONCURRENCY = 32


class SignalActivities:
    def __init__(self, client: Client, mailbox: Mailbox | None = None) -> None:
        self.client = client
        self.mailbox = mailbox or Mailbox()

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
            try:
                await self.client.get_workflow_handle(out.workflowId).signal(name, arg)
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return out.workflowId  # the Run is gone
                raise
        return None

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

    @activity.defn(name="host_slots")
    async def host_slots(self, ask: HostSlotsInput) -> HostSlots:
        """The slots a HostWorkflow keeps of its host (closed workflows answer too); none when
        the workflow is gone or supervises another incarnation."""
        handle = self.client.get_workflow_handle(ask.workflowId)
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

    @activity.defn(name="signal_runs")
    async def signal_runs(self, batch: SignalBatch) -> SignalResult:
        if batch.runtime:
            self.mailbox.pool_answered(batch.runtime)
        # An assignment handed to its Run waiting in this process needs no signal: the Run records
        # it in the task it is in. Should that task be lost (the worker dies), the retried task
        # finds no answer, waits out its grace period and asks again, and the pool, which holds
        # the reservation, answers with the same assignment.
        signals = [
            out
            for out in batch.signals
            if out.assigned is None or not self.mailbox.deliver(out.workflowId, out.assigned)
        ]
        gate = asyncio.Semaphore(CONCURRENCY)
        gone = await asyncio.gather(*(self._send(out, gate) for out in signals))
        return SignalResult(unreachable=[g for g in gone if g is not None])
