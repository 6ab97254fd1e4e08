"""HostWorkflow (host/{runtime}/{host}): one host, from its creation until it is gone.

    Assigned ─▶ Ready ─▶ Draining ─▶ Terminating ─▶ gone
       │          │          │
       └──────────┴──────────┴──▶ Lost ─▶ fenced ─▶ gone

Started by the ScaleOutWorkflow that created the host. A long-running, heartbeating activity
(`watch_host`) holds the host's WatchHost stream: the host's first report that it serves makes it
Ready (the watch says so with `watch_ready` and goes on); a host dead, frozen, replaced or not
serving makes it Lost within seconds (the rules are kruntimes.decisions.hostlife.WatchRules). A host not
Ready after twice its assignment timeout is stuck: it is deleted, and the pool replaces it if it
is still needed.

A lost host is fenced before anything moves: `fence_host` makes that incarnation unable to serve
and proves it (process provider: the recorded process is gone, or is killed now and seen gone;
attach: another incarnation answers, or the host acknowledged unregistering everything). Only
then is the pool told (`host_lost`, fenced): it releases the host's slots and its Runs register
elsewhere. Until a fence holds, the pool hears that the host is lost but not fenced: its Runs
leave Ready and wait.

Drain and delete come from the pool (scale-in, a drained or one-shot host: the `command` signal)
or from an operator (the `drain` and `delete` Updates, acknowledged once the pool was told, and
recorded in this history). A host's provider may report it lost or not ready (`provider_report`,
e.g. from a pod watch): the host is then lost to the platform, fenced, and its Runs move.

Every decision is a function of kruntimes.decisions.hostlife; this module only sequences them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from kruntimes.contracts.host import (
        MAX_HOST_EVENTS,
        DeleteHostInput,
        FenceInput,
        FenceResult,
        HostActionInput,
        HostActionResult,
        HostEvent,
        HostInput,
        HostRecord,
        HostResult,
        ProviderReport,
        WatchInput,
        WatchReady,
        WatchResult,
    )
    from kruntimes.contracts.names import (
        QUERY_HOST,
        QUERY_HOST_SLOTS_DIGEST,
        SIGNAL_HOST_COMMAND,
        SIGNAL_HOST_LOST,
        SIGNAL_HOST_SLOTS,
        SIGNAL_HOST_STATE,
        SIGNAL_PROVIDER_REPORT,
        SIGNAL_WATCH_READY,
        UPDATE_DELETE_HOST,
        UPDATE_DRAIN_HOST,
        UPDATE_HOST_SLOTS,
    )
    from kruntimes.contracts.pool import HostStateSignal
    from kruntimes.contracts.run import HostCommand, HostLostSignal, HostSlots, SlotRows, slots_digest
    from kruntimes.decisions.hostlife import HostEnd, can_transition_host, stuck_at
    from kruntimes.decisions.scheduling.model import HostState
    from kruntimes.wire import summaries
    from kruntimes.workflows.common import failure_text

# The watch heartbeats every second: a dead worker's watch is retried elsewhere this soon.
WATCH_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
WATCH_MAX_S = 3600.0  # one watch activity at most; then the next (a few events per hour)
WATCH_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10))
FENCE_TIMEOUT = timedelta(seconds=30)
FENCE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5), maximum_attempts=5
)
# A fence that could not be proven (an unreachable attached host) is tried again this often.
UNFENCED_RETRY = timedelta(seconds=5)
DELETE_TIMEOUT = timedelta(seconds=30)
DELETE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(seconds=5), maximum_attempts=5
)
LIVE = (HostState.Assigned, HostState.Ready, HostState.Draining)


@dataclass
class _Ending:
    """How the host leaves: lost (fence it) or deleted (stop it, then fence it)."""

    end: HostEnd
    message: str


@workflow.defn(name="HostWorkflow")
class HostWorkflow:
    def __init__(self) -> None:
        self._commands: list[HostCommand] = []
        self._reports: list[ProviderReport] = []
        self._record: HostRecord | None = None
        self._done = False
        self._serving = False  # the watch saw it serve
        self._slots: HostSlots | None = None  # the pool's, arrived before the record was made
        # The slots the pool last handed over, kept compact; the record in memory holds none
        # (`_full` puts them back for whoever reads the record).
        self._slot_rows = SlotRows()

    # -- the API ---------------------------------------------------------------------------------

    @workflow.signal(name=SIGNAL_HOST_COMMAND)
    def command(self, command: HostCommand) -> None:
        self._commands.append(command)

    @workflow.signal(name=SIGNAL_WATCH_READY)
    def watch_ready(self, ready: WatchReady) -> None:
        """The watch saw the host's first report that it serves."""
        if self._record is not None and ready.hostUid == self._record.host.hostUid:
            self._serving = True

    @workflow.signal(name=SIGNAL_PROVIDER_REPORT)
    def provider_report(self, report: ProviderReport) -> None:
        """The host's provider says it is lost or not ready (a pod watch, say)."""
        if report.lost or not report.ready:
            self._reports.append(report)

    @workflow.signal(name=SIGNAL_HOST_SLOTS)
    def slots(self, slots: HostSlots) -> None:
        """The pool hands over every slot of this host before it continues as new."""
        if self._record is None:
            self._slots = slots
        elif slots.hostUid == self._record.host.hostUid:
            self._slot_rows.replace(slots.slots)

    @workflow.update(name=UPDATE_HOST_SLOTS)
    async def read_slots(self) -> HostSlots:
        """The slots as the pool handed them over. An update is applied after every signal the
        workflow received before it, so the handover is always in it (a query may be answered
        before a signal in flight is applied). It waits for the record: in the first activation
        of a run (this workflow continued as new) handlers run before `run` has set it from the
        input, and answering then would hand the pool no slots."""
        await workflow.wait_condition(lambda: self._record is not None)
        return HostSlots(hostUid=self._rec.host.hostUid, slots=self._slot_rows.slots())

    @workflow.query(name=QUERY_HOST)
    def host(self) -> HostRecord | None:
        return None if self._record is None else self._full()

    @workflow.query(name=QUERY_HOST_SLOTS_DIGEST)
    def slots_digest(self) -> str:
        """`slots_digest` of the slots kept ("" before the record is made: nothing is kept yet)."""
        if self._record is None:
            return ""
        return slots_digest(self._record.host.hostUid, self._slot_rows.slots())

    @workflow.update(name=UPDATE_DRAIN_HOST)
    async def drain(self, request: HostActionInput) -> HostActionResult:
        """Take no new Run and move the host's Runs off it; it is deleted once it holds none."""
        record = await self._started()
        if record.state in (HostState.Assigned, HostState.Ready):
            self._commands.append(HostCommand(action="drain", reason="Operator", message=request.message))
            await workflow.wait_condition(
                lambda: self._rec.state not in (HostState.Assigned, HostState.Ready)
            )
            return self._result(accepted=True, message="draining: the pool takes no new Run here")
        return self._result(accepted=False, message=f"the host is {record.state}")

    @workflow.update(name=UPDATE_DELETE_HOST)
    async def delete(self, request: HostActionInput) -> HostActionResult:
        """Stop the host now; its Runs move once it is proven gone."""
        record = await self._started()
        if record.state in LIVE:
            self._commands.append(HostCommand(action="delete", reason="Operator", message=request.message))
            await workflow.wait_condition(lambda: self._done or self._rec.fenced)
            return self._result(accepted=True, message=self._rec.message)
        return self._result(accepted=False, message=f"the host is {record.state}")

    async def _started(self) -> HostRecord:
        await workflow.wait_condition(lambda: self._record is not None)
        return self._rec

    @property
    def _rec(self) -> HostRecord:
        assert self._record is not None
        return self._record

    def _full(self) -> HostRecord:
        """The record with the slots kept (the one in memory holds none)."""
        return self._rec._replace(slots=self._slot_rows.slots())

    def _result(self, *, accepted: bool, message: str) -> HostActionResult:
        host = self._rec.host
        return HostActionResult(
            hostId=host.hostId,
            hostUid=host.hostUid,
            runtime=host.runtime,
            state=self._rec.state,
            accepted=accepted,
            message=message,
        )

    # -- the lifecycle -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: HostInput) -> HostResult:
        if input.record is not None:  # its slots are kept once, compact: not in the input too
            self._slot_rows.replace(input.record.slots)
            self._record = input.record._replace(slots=[])
            input = input._replace(record=None)
        self._input = input
        if self._record is None:
            self._record = HostRecord(
                host=input.host,
                created=input.created,
                state=HostState.Assigned,
                since=workflow.now(),
                reason="Created",
                message=f"created by the {input.created.provider} provider",
            )
            self._event(HostState.Assigned, "Created", self._rec.message)
        if self._slots is not None:
            self.slots(self._slots)
            self._slots = None
        self._pool = workflow.get_external_workflow_handle(input.poolWorkflowId)
        ending = await self._supervise()
        if ending is not None:
            await self._finish(ending)
        await workflow.wait_condition(workflow.all_handlers_finished)
        rec = self._rec
        return HostResult(
            hostId=rec.host.hostId,
            hostUid=rec.host.hostUid,
            state=rec.state,
            reason=rec.reason,
            message=rec.message,
        )

    async def _supervise(self) -> _Ending | None:
        """Watch the host until it ends (returned), continuing as new when the history is long."""
        while self._rec.state in LIVE:
            watch = workflow.start_activity(
                "watch_host",
                self._watch_input(),
                result_type=WatchResult,
                start_to_close_timeout=timedelta(seconds=WATCH_MAX_S + 60),
                heartbeat_timeout=WATCH_HEARTBEAT_TIMEOUT,
                retry_policy=WATCH_RETRY,
                cancellation_type=ActivityCancellationType.TRY_CANCEL,
                summary=summaries.summary(f"watch {self._rec.created.hostId}"),
            )
            ending = await self._while_watching(watch)
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(ActivityError, asyncio.CancelledError):
                    await watch
            if ending is not None:
                return ending
            if workflow.info().is_continue_as_new_suggested() and not self._commands and not self._reports:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._input._replace(record=self._full()))
        return None

    async def _while_watching(self, watch: workflow.ActivityHandle[WatchResult]) -> _Ending | None:
        """Act on what comes while one watch runs: its verdict, commands, provider reports, the
        stuck timer. None: the watch ended without an ending (start the next one)."""
        while True:
            timeout = None
            if self._rec.state is HostState.Assigned:
                due = stuck_at(
                    since=self._rec.since, assignment_timeout_s=self._input.assignmentTimeoutSeconds
                )
                timeout = max((due - workflow.now()).total_seconds(), 0.001)
            try:
                await workflow.wait_condition(
                    lambda: watch.done() or bool(self._commands) or bool(self._reports) or self._ready_now(),
                    timeout=timeout,
                )
            except TimeoutError:
                return _Ending(
                    HostEnd.Stuck,
                    f"not Ready within twice its assignment timeout "
                    f"({2 * self._input.assignmentTimeoutSeconds:g}s)",
                )
            if self._ready_now():
                self._transition(HostState.Ready, "Serving", "the host reported that it serves")
                continue
            if self._reports:
                report = self._reports.pop(0)
                if report.hostUid and report.hostUid != self._rec.host.hostUid:
                    continue  # about another incarnation of this host id: never fences this one
                return _Ending(HostEnd.Lost, f"{report.reason}: {report.message or 'the provider lost it'}")
            if self._commands:
                command = self._commands.pop(0)
                if command.action == "delete":
                    return _Ending(_end_of(command.reason), command.message or f"deleted: {command.reason}")
                if self._rec.state in (HostState.Assigned, HostState.Ready):
                    await self._tell_pool_state(HostState.Draining, command)
                continue
            return self._verdict(watch)

    def _ready_now(self) -> bool:
        return self._serving and self._rec.state is HostState.Assigned

    def _verdict(self, watch: workflow.ActivityHandle[WatchResult]) -> _Ending | None:
        try:
            result = watch.result()
        except ActivityError as err:  # its retry policy retries every failure; a bug shows here
            workflow.logger.warning("the host watch failed: %s", failure_text(err))
            return None
        if result.lostAfter is not None:
            self._record = self._rec._replace(lostAfter=result.lostAfter)
        if result.verdict == "Lost":
            return _Ending(HostEnd.Lost, f"{result.reason}: {result.message}")
        return None

    def _watch_input(self) -> WatchInput:
        host = self._rec.host
        assert host.address is not None
        return WatchInput(
            runtime=host.runtime,
            hostId=host.hostId,
            hostUid=host.hostUid,
            address=host.address,
            intervalSeconds=self._input.watchIntervalSeconds,
            tellReady=self._rec.state is HostState.Assigned,
            maxSeconds=WATCH_MAX_S,
            lostAfter=self._rec.lostAfter,
        )

    # -- endings -----------------------------------------------------------------------------------

    async def _finish(self, ending: _Ending) -> None:
        """Lost: fence, then tell the pool. Deleted: tell the pool to stop assigning, stop the
        host through its provider, fence (the proof), then tell the pool it is gone."""
        if ending.end is HostEnd.Lost:
            self._transition(HostState.Lost, "Lost", ending.message)
        else:
            self._transition(HostState.Terminating, str(ending.end), ending.message)
            await self._signal_pool(
                SIGNAL_HOST_STATE,
                HostStateSignal(
                    hostId=self._rec.host.hostId,
                    hostUid=self._rec.host.hostUid,
                    state=HostState.Terminating,
                    reason=str(ending.end),
                ),
            )
            await self._delete()
        told_unfenced = False
        while True:
            fence = await self._fence()
            if fence.fenced:
                break
            if not told_unfenced:
                told_unfenced = True
                await self._tell_pool_lost(ending, fenced=False, how=fence.how)
            self._note(f"not fenced yet: {fence.how}")
            await workflow.sleep(UNFENCED_RETRY, summary=summaries.summary("fence again"))
        self._record = self._rec._replace(fenced=True, message=f"{ending.message}; fenced: {fence.how}")
        self._event(self._rec.state, "Fenced", fence.how)
        await self._tell_pool_lost(ending, fenced=True, how=fence.how)
        self._record = self._rec._replace(reason=str(ending.end))
        self._done = True
        workflow.set_current_details(f"**{self._rec.state}** (gone) — {ending.end}: {self._rec.message}")

    async def _fence(self) -> FenceResult:
        try:
            result: FenceResult = await workflow.execute_local_activity(
                "fence_host",
                FenceInput(created=self._rec.created, stateDir=self._input.stateDir),
                result_type=FenceResult,
                start_to_close_timeout=FENCE_TIMEOUT,
                retry_policy=FENCE_RETRY,
                summary=summaries.summary(f"fence {self._rec.created.hostId}"),
            )
        except (ActivityError, ApplicationError) as err:  # a local activity's own error surfaces bare
            return FenceResult(fenced=False, how=failure_text(err))
        return result

    async def _delete(self) -> None:
        created = self._rec.created
        try:
            await workflow.execute_activity(
                "delete_host",
                DeleteHostInput(
                    provider=created.provider,
                    runtime=created.runtime,
                    hostId=created.hostId,
                    hostUid=created.hostUid,
                ),
                result_type=bool,
                start_to_close_timeout=DELETE_TIMEOUT,
                retry_policy=DELETE_RETRY,
            )
        except ActivityError as err:  # the fence that follows kills it all the same
            self._note(f"delete failed: {failure_text(err)}")

    async def _tell_pool_state(self, state: HostState, command: HostCommand) -> None:
        self._transition(state, command.reason, command.message or "takes no new Run; its Runs move")
        host = self._rec.host
        await self._signal_pool(
            SIGNAL_HOST_STATE,
            HostStateSignal(hostId=host.hostId, hostUid=host.hostUid, state=state, reason=command.reason),
        )

    async def _tell_pool_lost(self, ending: _Ending, *, fenced: bool, how: str) -> None:
        host = self._rec.host
        await self._signal_pool(
            SIGNAL_HOST_LOST,
            HostLostSignal(
                hostId=host.hostId,
                hostUid=host.hostUid,
                reason=f"{ending.end}: {ending.message}; {'fenced' if fenced else 'not fenced'}: {how}",
                fenced=fenced,
            ),
        )

    async def _signal_pool(self, name: str, message: HostLostSignal | HostStateSignal) -> None:
        try:
            await self._pool.signal(name, message)
        except FailureError as err:  # the pool is gone: nobody to tell
            self._note(f"cannot tell the pool: {failure_text(err)}")

    # -- the record --------------------------------------------------------------------------------

    def _transition(self, state: HostState, reason: str, message: str) -> None:
        if state == self._rec.state or not can_transition_host(self._rec.state, state):
            return
        self._record = self._rec._replace(state=state, since=workflow.now(), reason=reason, message=message)
        self._event(state, reason, message)

    def _event(self, state: HostState, reason: str, message: str) -> None:
        event = HostEvent(at=workflow.now(), state=state, reason=reason, message=message)
        self._record = self._rec._replace(events=[*self._rec.events, event][-MAX_HOST_EVENTS:])
        workflow.logger.info("host %s: %s (%s) %s", self._rec.host.hostId, state, reason, message)
        workflow.set_current_details(f"**{state}** — {reason}: {message}")

    def _note(self, message: str) -> None:
        workflow.logger.warning("host %s: %s", self._rec.host.hostId, message)


def _end_of(reason: str) -> HostEnd:
    try:
        return HostEnd(reason)
    except ValueError:
        return HostEnd.Deleted  # an operator's, or a caller that named no known reason
