"""RuntimePoolWorkflow (pool/{runtime}): the only place capacity of a runtime is reserved.

Admission requests arrive as signals and are decided in batches, one batch per workflow task, by
the pure functions of kruntimes.decisions.scheduling; answers go back to the Runs as signals. Signals, not
updates: a burst of Runs updating one workflow times out, while signals are batched. State is
carried across continue-as-new.

Hosts come from ScaleOutWorkflows (host_ready) and leave through their HostWorkflows: a host lost
is reported once fenced (host_lost: its slots are released and its Runs register elsewhere) or,
while not fenced yet, so that its Runs stop being Ready; a host draining or terminating takes no
new Run (host_state). The pool's own housekeeping, after every batch: a draining host that holds
no reservation any more, and a one-shot host whose Run ended, are deleted; hosts idle beyond the
runtime's scaleInDelaySeconds are drained and deleted down to minHosts (kruntimes.decisions.hostlife
decides); the HostWorkflow carries the deletion out (the `command` signal).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.api.ids import HostUid, RunUid
    from kruntimes.contracts.names import (
        POOL_READING_BACK,
        QUERY_POOL,
        SIGNAL_ADMIT,
        SIGNAL_ADMIT_MANY,
        SIGNAL_ASSIGNED,
        SIGNAL_CONFIGURE,
        SIGNAL_HOST_COMMAND,
        SIGNAL_HOST_LOST,
        SIGNAL_HOST_READY,
        SIGNAL_HOST_SLOTS,
        SIGNAL_HOST_STATE,
        SIGNAL_REJECTED,
        SIGNAL_RELEASE,
        SIGNAL_SCALE_OUT_FAILED,
        UPDATE_DRAIN_QUEUE,
        UPDATE_PAUSE_QUEUE,
        UPDATE_RESUME_QUEUE,
        host_workflow_id,
        scale_out_workflow_id,
    )
    from kruntimes.contracts.pool import (
        QUEUE_DRAINED,
        AdmissionControl,
        AdmitMany,
        AdmitSignal,
        HostReadySignal,
        HostStateSignal,
        PoolConfig,
        PoolInput,
        PoolMessage,
        PoolQuery,
        PoolState,
        QueueActionInput,
        QueueActionResult,
        QueuedRun,
        ReleaseSignal,
        ScaleOutFailedSignal,
        carried_state,
        pool_part,
    )
    from kruntimes.contracts.providers import host_sandbox
    from kruntimes.contracts.run import (
        Assignment,
        HostCommand,
        HostLostSignal,
        HostSlots,
        HostSlotsInput,
        OutgoingSignal,
        ProbeInput,
        ProbeResult,
        Rejection,
        SignalBatch,
        SignalResult,
        Slot,
        slots_digest,
    )
    from kruntimes.contracts.scaleout import ScaleOutInput
    from kruntimes.decisions.hostlife import HostEnd, drained, next_scale_in, scale_in, track_idle
    from kruntimes.decisions.scheduling import admission
    from kruntimes.decisions.scheduling.model import (
        PROVIDER_LABEL,
        SHARED_POLICY,
        AdmissionRequest,
        AssignToInstance,
        Host,
        HostState,
        QueueGlobally,
        Reject,
        RequestScaleOut,
        Reservation,
        ScaleOutReason,
        ScaleOutRequest,
        ScaleOutStatus,
        TenantPolicy,
    )
    from kruntimes.wire import summaries

MAX_CONSECUTIVE_SCALE_OUT_FAILURES = 3
PROBE_TIMEOUT = timedelta(seconds=20)
# A probe that fails is no verdict, and the next look comes at the next interval: retried in the
# local activity, its backoff would outgrow the SDK's local retry threshold and hold the pool's
# loop in a timer (no admission meanwhile) for a minute and more.
PROBE_RETRY = RetryPolicy(maximum_attempts=1)
SIGNAL_TIMEOUT = timedelta(seconds=60)
SLOTS_TIMEOUT = timedelta(seconds=30)
# The continue-as-new comes in a task after the handover's: the server refuses it from a task
# during which signals arrived, and the refused task replays the whole run.
HANDOVER_PAUSE = timedelta(milliseconds=1)
# The signalling local activity holds the pool's workflow task: what it leaves unsent after this
# goes out in an ordinary activity, so a slow server cannot hold the task into its timeout.
SIGNAL_BUDGET = timedelta(seconds=1.5)
# A run continues as new at this length even before the server suggests it: a task the worker
# must replay replays the whole run, which has to stay well within the task timeout.
MAX_RUN_EVENTS = 1_000
ALARM_SLACK = timedelta(milliseconds=1)
# Queued Runs are placed in admission.fair_order (tenants take turns by their queueShare), not
# FIFO: one tenant's backlog no longer holds back another tenant's next Run. A history recorded
# before it places its queue FIFO.
PATCH_FAIR_QUEUE = "pool-fair-queue"  # an alarm this much later than wanted is still kept
# Reading a host's slots back retries until it succeeds: the pool decides nothing without them.
SLOTS_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5))
# Signalling retries until it succeeds: an answer that never arrives leaves a Run waiting forever.
SIGNAL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10)
)


Message = Assignment | Rejection | HostLostSignal | HostCommand | HostSlots


@dataclass
class _Outbox:
    signals: list[tuple[str, str, Message]]
    scale_outs: list[ScaleOutInput]
    parkable: set[str] = field(default_factory=set)  # Runs whose starter admitted them: answers may wait
    # Runs admission would have placed at once, queued instead to be placed in fair order at the
    # batch's end (PATCH_FAIR_QUEUE); those of them whose starter admitted them
    behind: set[RunUid] = field(default_factory=set)
    handoffs: set[str] = field(default_factory=set)
    again: bool = False  # deciding those of them left unplaced again: none waits behind the queue


@workflow.defn(name="RuntimePoolWorkflow")
class RuntimePoolWorkflow:
    def __init__(self) -> None:
        self._inbox: list[object] = []
        self._probed_at: datetime | None = None
        self._alarm: asyncio.Task[None] | None = None  # the timer of the next look, and when it rings
        self._alarm_at: datetime | None = None
        self._index = admission.ReservationIndex()  # the reservations, by run uid and host
        self._owners: dict[str, str] = {}  # run uid → the Run's workflow id
        # host uid → the slots_digest of what its HostWorkflow keeps, for the hosts whose slots
        # the pool read back whole at the run's start (unchanged since unless in _index.changed)
        self._handed: dict[str, str] = {}
        self._wake = False  # an operator changed the admission control: the loop applies it
        self._started = False
        self._fair = False  # PATCH_FAIR_QUEUE, asked for in the run's first activation

    # -- signals are queued; the main loop decides in batches --------------------------------------

    @workflow.signal(name=SIGNAL_ADMIT)
    def admit(self, msg: AdmitSignal) -> None:
        self._inbox.append(msg)

    @workflow.signal(name=SIGNAL_ADMIT_MANY)
    def admit_many(self, msg: AdmitMany) -> None:
        self._inbox.extend(msg.admissions)

    @workflow.signal(name=SIGNAL_RELEASE)
    def release(self, msg: ReleaseSignal) -> None:
        self._inbox.append(msg)

    @workflow.signal(name=SIGNAL_HOST_READY)
    def host_ready(self, msg: HostReadySignal) -> None:
        self._inbox.append(msg)

    @workflow.signal(name=SIGNAL_SCALE_OUT_FAILED)
    def scale_out_failed(self, msg: ScaleOutFailedSignal) -> None:
        self._inbox.append(msg)

    @workflow.signal(name=SIGNAL_CONFIGURE)
    def configure(self, config: PoolConfig) -> None:
        self._inbox.append(config)

    @workflow.signal(name=SIGNAL_HOST_LOST)
    def host_lost(self, msg: HostLostSignal) -> None:
        self._inbox.append(msg)

    @workflow.signal(name=SIGNAL_HOST_STATE)
    def host_state(self, msg: HostStateSignal) -> None:
        self._inbox.append(msg)

    # -- an operator's admission control: applied at once, audited in the Update's input -----------

    async def _control(self, request: QueueActionInput, **changes: object) -> QueueActionResult:
        await workflow.wait_condition(lambda: self._started)
        control = self.state.admission.model_copy(update=changes)
        self._update(admission=control)
        self._wake = True
        queued = len(self.state.queue)
        workflow.logger.info(
            "admission of %s: %s by %r: %s",
            self.config.runtime.name,
            "drain" if "drain" in changes else ("paused" if control.paused else "resumed"),
            request.requestedBy,
            request.message,
        )
        workflow.set_current_details(self._details(control, queued))
        return QueueActionResult(
            runtime=self.config.runtime.name, paused=control.paused, queued=queued, message=request.message
        )

    @workflow.update(name=UPDATE_PAUSE_QUEUE)
    async def pause_queue(self, request: QueueActionInput) -> QueueActionResult:
        """New Runs queue and none is placed until resumed."""
        return await self._control(
            request, paused=True, by=request.requestedBy, message=request.message, since=workflow.now()
        )

    @workflow.update(name=UPDATE_RESUME_QUEUE)
    async def resume_queue(self, request: QueueActionInput) -> QueueActionResult:
        """Admission again: the queued Runs are decided again (placed, scaled out for, or rejected)."""
        return await self._control(
            request,
            paused=False,
            by=request.requestedBy,
            message=request.message,
            since=workflow.now(),
            decideAgain=True,
        )

    @workflow.update(name=UPDATE_DRAIN_QUEUE)
    async def drain_queue(self, request: QueueActionInput) -> QueueActionResult:
        """The Runs queued when the pool applies it end, rejected with QUEUE_DRAINED."""
        return await self._control(request, drain=request)

    @staticmethod
    def _details(control: AdmissionControl, queued: int) -> str:
        return summaries.queue_details(
            paused=control.paused, by=control.by, message=control.message, queued=queued
        )

    def _apply_admission(self, outbox: _Outbox) -> None:
        """What an operator asked since the last batch: a drain, a resume."""
        control = self.state.admission
        if control.drain is not None:
            who = f" by {control.drain.requestedBy}" if control.drain.requestedBy else ""
            text = f"the queue of {self.config.runtime.name} was drained{who}: {control.drain.message}"
            for queued in self.state.queue:
                rejection = Rejection(runUid=queued.runUid, reason=QUEUE_DRAINED, message=text)
                outbox.signals.append((queued.workflowId, SIGNAL_REJECTED, rejection))
            self._update(queue=[], admission=control.model_copy(update={"drain": None}))
            workflow.set_current_details(self._details(self.state.admission, 0))
        if self.state.admission.decideAgain:
            self._update(admission=self.state.admission.model_copy(update={"decideAgain": False}))
            self._readmit_queue(outbox)

    @workflow.query(name=QUERY_POOL)
    def pool(self, ask: PoolQuery | None = None) -> PoolState:
        """The state, or the part `ask` asks for (the whole of a big pool is past what the server
        takes as one answer: kruntimes.temporal.connect.query_pool reads it in parts)."""
        if self.state.slotsOnHosts:  # without its hosts' reservations it would show taken slots free
            raise ApplicationError(POOL_READING_BACK, type="PoolReadingBack", non_retryable=True)
        hosts = None if ask is None or ask.hosts is None else set(ask.hosts)
        return pool_part(self.state, self._index.held.of_hosts(hosts), self._owners, ask)

    def _by_host_uid(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for (_, host_uid), n in self._index.load.items():
            load[host_uid] = load.get(host_uid, 0) + n
        return load

    # -- the loop ----------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        self._fair = workflow.patched(PATCH_FAIR_QUEUE)
        self.config = input.config
        state = input.state or PoolState()
        self._index = admission.ReservationIndex(state.reservations)
        self._owners = dict(state.owners)
        self.state = state.model_copy(update={"reservations": [], "owners": {}})
        self._inbox = [*(m.message for m in input.pending), *self._inbox]
        if self.state.slotsOnHosts:
            await self._slots_back()
        self._started = True
        outbox = _Outbox([], [])
        if self.state.admission != AdmissionControl():
            self._apply_admission(outbox)
            if outbox.behind:  # a resume decided the queue again
                self._place_queued(outbox)
        self._warm(outbox)
        await self._flush(outbox)
        while True:
            probe = await self._until_message_or_alarm(self._wake_in()) and self._probe_due()
            batch, self._inbox = self._inbox, []
            outbox = _Outbox([], [])
            if self._wake:
                self._wake = False
                self._apply_admission(outbox)
            for msg in batch:
                self._handle(msg, outbox)
                probe = probe or isinstance(msg, PoolConfig)  # a (re)started worker: look at every host
            if probe and self.state.hosts:
                self._probed_at = workflow.now()
                await self._probe(outbox)
            self._place_queued(outbox)
            if any(isinstance(msg, HostReadySignal) for msg in batch):
                self._readmit_uncovered(outbox)
            self._keep_hosts(outbox)
            await self._flush(outbox)
            if self._run_is_full() and not self._inbox:
                await workflow.wait_condition(workflow.all_handlers_finished)
                carried = await self._carried()
                # A new, short task to continue from: what arrives meanwhile is carried.
                await workflow.sleep(
                    HANDOVER_PAUSE, summary=summaries.summary("continue as new in a task of its own")
                )
                await workflow.wait_condition(workflow.all_handlers_finished)
                # An operator's pause, resume or drain during the handover goes with it.
                carried = carried.model_copy(update={"admission": self.state.admission})
                pending = [PoolMessage.of(m) for m in self._inbox]
                workflow.continue_as_new(PoolInput(config=self.config, state=carried, pending=pending))

    # -- continue-as-new: the reservations of supervised hosts are kept by their HostWorkflows -----

    def _run_is_full(self) -> bool:
        """Whether this run should continue as new: the server suggests it, or it holds
        MAX_RUN_EVENTS events, so replaying it stays well within a task timeout."""
        info = workflow.info()
        if info.is_continue_as_new_suggested():
            return True
        return info.get_current_history_length() >= MAX_RUN_EVENTS

    async def _carried(self) -> PoolState:
        """The state to continue with: the reservations of every supervised host handed to its
        HostWorkflow first (a host whose workflow cannot be told keeps its own here). A host
        whose HostWorkflow keeps the very slots the pool holds for it (read back whole at the
        start, none changed since) is carried on its host as it is; only the others' slots are
        built and handed over. Messages that arrive meanwhile wait in the inbox and are carried."""
        supervised = [h for h in self.state.hosts if h.supervised]
        # A host on its way out goes through the handover: its HostWorkflow may have
        # closed, and one that cannot be told keeps the host's slots in the pool's state.
        kept = {
            h.hostUid
            for h in supervised
            if h.hostUid in self._handed
            and h.hostUid not in self._index.changed
            and h.state is not HostState.Terminating
        }
        on_hosts, digests = await self._hand_over([h for h in supervised if h.hostUid not in kept])
        on_hosts |= kept
        digests.update({uid: self._handed[uid] for uid in kept})
        state = pool_part(self.state, self._index.held.not_on(on_hosts), self._owners)
        return carried_state(state, on_hosts=on_hosts, digests=digests)

    async def _hand_over(self, hosts: list[Host]) -> tuple[set[HostUid], dict[HostUid, str]]:
        """Hand each of `hosts`' HostWorkflow its slots (one local activity, none for no host):
        the uids of the hosts whose workflow took them, and each host's slots_digest."""
        handed = self._slots_by_host(hosts)
        signals: list[tuple[str, str, Message]] = [
            (host_workflow_id(h.runtime, h.hostId), SIGNAL_HOST_SLOTS, slots)
            for h, slots in zip(hosts, handed, strict=True)
        ]
        gone = await self._send(signals) if signals else set()
        on_hosts = {h.hostUid for h in hosts if host_workflow_id(h.runtime, h.hostId) not in gone}
        return on_hosts, {slots.hostUid: slots_digest(slots.hostUid, slots.slots) for slots in handed}

    def _slots_by_host(self, hosts: list[Host]) -> list[HostSlots]:
        """The slots of each of `hosts`, in one pass over the reservations (as slots_of gives
        them one host at a time, which is a pass per host)."""
        wanted = {h.hostUid: HostSlots(hostUid=h.hostUid) for h in hosts}
        for run_uid, _, host_uid, tenant, at in self._index.held.rows():
            slots = wanted.get(host_uid)
            if slots is not None:
                owner = self._owners.get(run_uid, "")
                slots.slots.append(Slot(runUid=run_uid, workflowId=owner, tenant=tenant, reservedAt=at))
        return [wanted[h.hostUid] for h in hosts]

    async def _slots_back(self) -> None:
        """After continue-as-new: the reservations the HostWorkflows kept, back in the pool's
        state (each host's in one local activity, so each payload is bounded by its capacity)."""
        hosts = {h.hostUid: h for h in self.state.hosts}
        wanted = [hosts[uid] for uid in self.state.slotsOnHosts if uid in hosts]
        answers = await asyncio.gather(
            *(
                workflow.execute_local_activity(
                    "host_slots",
                    HostSlotsInput(
                        workflowId=host_workflow_id(h.runtime, h.hostId),
                        hostUid=h.hostUid,
                        digest=self.state.slotsDigests.get(h.hostUid, ""),
                    ),
                    result_type=HostSlots,
                    start_to_close_timeout=SLOTS_TIMEOUT,
                    retry_policy=SLOTS_RETRY,
                )
                for h in wanted
            )
        )
        changed_before = set(self._index.changed)  # the carried reservations' hosts
        for host, answer in zip(wanted, answers, strict=True):
            whole = True
            for slot in answer.slots:
                if slot.runUid in self._index.held:
                    whole = False
                    continue  # a Run holds one slot at most
                self._index.add(
                    Reservation(
                        runUid=slot.runUid,
                        hostId=host.hostId,
                        hostUid=host.hostUid,
                        tenant=slot.tenant,
                        reservedAt=slot.reservedAt,
                    )
                )
                if slot.workflowId:
                    self._owners[slot.runUid] = slot.workflowId
            if whole and host.hostUid not in changed_before:
                # its HostWorkflow keeps exactly what the pool now holds for it
                self._handed[host.hostUid] = slots_digest(host.hostUid, answer.slots)
                changed_before.discard(host.hostUid)
            else:
                changed_before.add(host.hostUid)
        self._index.changed = changed_before
        self._update(slotsOnHosts=[], slotsDigests={})

    def _handle(self, msg: object, outbox: _Outbox) -> None:
        if isinstance(msg, AdmitSignal):
            if msg.leaving is not None:
                self._leave(msg.request.runUid, msg.leaving)
            self._admit(msg, outbox)
        elif isinstance(msg, ReleaseSignal):
            self._release(msg.runUid)
        elif isinstance(msg, HostReadySignal):
            self._host_ready(msg)
        elif isinstance(msg, ScaleOutFailedSignal):
            self._scale_out_failed(msg, outbox)
        elif isinstance(msg, HostLostSignal):
            self._host_lost(msg, outbox)
        elif isinstance(msg, HostStateSignal):
            self._host_state(msg, outbox)
        elif isinstance(msg, PoolConfig):
            self.config = msg
            self._warm(outbox)

    # -- timing ------------------------------------------------------------------------------------

    def _probe_due(self) -> bool:
        interval, last = self.config.probeIntervalSeconds, self._probed_at
        return interval is not None and (
            last is None or (workflow.now() - last).total_seconds() >= interval * 0.999
        )

    async def _until_message_or_alarm(self, wake: float | None) -> bool:
        """Wait until a message arrives or the alarm rings; whether it rang. One timer for the
        next look, not one started and cancelled in every task of a burst.
        The alarm is set for `wake` seconds from now; one already set that rings no later is kept
        (ringing early costs one look at nothing), one that would ring later is cancelled."""
        if wake is not None:
            at = workflow.now() + timedelta(seconds=wake)
            if self._alarm is not None and self._alarm_at is not None and self._alarm_at > at + ALARM_SLACK:
                self._alarm.cancel()
                self._alarm = None
            if self._alarm is None:
                self._alarm_at = at
                self._alarm = asyncio.create_task(
                    workflow.sleep(wake, summary=summaries.summary(f"next look at the hosts in {wake:g} s"))
                )
        elif self._alarm is not None:  # nothing to look at without a message
            self._alarm.cancel()
            self._alarm = None
        alarm = self._alarm
        await workflow.wait_condition(
            lambda: bool(self._inbox) or self._wake or (alarm is not None and alarm.done())
        )
        if alarm is None or not alarm.done():
            return False
        self._alarm = self._alarm_at = None
        return True

    def _wake_in(self) -> float | None:
        """Seconds until the loop must look again without a signal: the next probe, or the next
        host due for scale-in, whichever comes first."""
        probe = self.config.probeIntervalSeconds
        last = self._probed_at
        if probe is not None and last is not None:
            probe = max(probe - (workflow.now() - last).total_seconds(), 0.001)
        due = next_scale_in(
            hosts=self.state.hosts,
            reservations=(),
            idle_since=self.state.idleSince,
            delay_s=self.config.runtime.scaleInDelaySeconds,
            after=workflow.now(),
            load=self._by_host_uid(),
        )
        if due is None:
            return probe
        until = max((due - workflow.now()).total_seconds(), 0.001)
        return until if probe is None else min(probe, until)

    def _policy(self, tenant: str | None) -> TenantPolicy | None:
        if tenant is None:
            return SHARED_POLICY
        return next((t.policy() for t in self.config.tenants if t.name == tenant), None)

    def _admit(self, msg: AdmitSignal, outbox: _Outbox) -> None:
        request = msg.request
        policy = self._policy(request.tenant)
        if policy is not None:
            request = request._replace(tenancy=policy)
            msg = AdmitSignal(request=request, workflowId=msg.workflowId, handoff=msg.handoff)
        rt = self.config.runtime
        decision = admission.admit(
            request=request,
            hosts=self.state.hosts,
            reservations=(),
            index=self._index,
            queue=self._queued_requests(),
            pending_scale_outs=self.state.scaleOuts,
            runtime=rt.name,
            max_queue=self.config.queueLimit,
            max_hosts=rt.maxHosts,
            default_provider=rt.provider,
            providers=self.config.providers,
            paused=self.state.admission.paused,
            fair=self._fair,
        )
        if isinstance(decision, AssignToInstance) and not outbox.again and self._behind_queue(request):
            # a slot freed in this batch goes to the queue's fair order at the batch's end, not
            # to whichever admission the batch happened to hold first
            self._update(queue=[*self.state.queue, QueuedRun.of(msg)])
            outbox.behind.add(request.runUid)
            if msg.handoff:
                outbox.handoffs.add(request.runUid)
        elif isinstance(decision, AssignToInstance):
            self._assign(msg, decision, outbox)
        elif isinstance(decision, QueueGlobally):
            if all(q.runUid != request.runUid for q in self.state.queue):
                self._update(queue=[*self.state.queue, QueuedRun.of(msg)])
        elif isinstance(decision, RequestScaleOut):
            self._update(queue=[*self.state.queue, QueuedRun.of(msg)])
            self._scale_out(
                decision.reason, decision.provider, decision.tenant, decision.policy, outbox, request
            )
        elif isinstance(decision, Reject):
            outbox.signals.append(
                (
                    msg.workflowId,
                    SIGNAL_REJECTED,
                    Rejection(runUid=request.runUid, reason=decision.reason, message=decision.message),
                )
            )

    def _behind_queue(self, request: AdmissionRequest) -> bool:
        """Whether a request admission would place at once waits in the queue instead, to be
        placed with it in fair order at the batch's end (PATCH_FAIR_QUEUE, Runs waiting). Past
        the queue's limits only until then: left unplaced, it is decided again, and refused
        QueueFull if its tenant's part or the queue is full."""
        return self._fair and bool(self.state.queue) and request.runUid not in self._index.held

    def _assign(self, msg: AdmitSignal, decision: AssignToInstance, outbox: _Outbox) -> None:
        host = next(h for h in self.state.hosts if h.hostId == decision.hostId)
        admission.reserve_in(index=self._index, request=msg.request, host=host, at=workflow.now())
        self._owners[msg.request.runUid] = msg.workflowId
        if self.config.runtime.oneshot:
            self._set_host(host._replace(spent=True))  # its one Run; deleted once that ends
        assert host.address is not None
        assignment = Assignment(
            runUid=msg.request.runUid,
            hostId=host.hostId,
            hostUid=host.hostUid,
            address=host.address,
            adapter=self.config.runtime.adapter,
            platform=self.config.platform,
            provider=host.labels.get(PROVIDER_LABEL, ""),
        )
        outbox.signals.append((msg.workflowId, SIGNAL_ASSIGNED, assignment))
        if msg.handoff:
            outbox.parkable.add(msg.workflowId)

    def _queued_requests(self) -> list[AdmissionRequest]:
        """The queue as admission requests, each with its tenant's policy of now."""
        name = self.config.runtime.name
        return [q.request(runtime=name, policy=self._policy(q.tenant)) for q in self.state.queue]

    def _place_queued(self, outbox: _Outbox) -> None:
        if not self.state.queue or self.state.admission.paused:
            return
        placements = admission.next_from_queue(
            queue=self._queued_requests(),
            hosts=self.state.hosts,
            reservations=(),
            index=self._index,
            fair=self._fair,
        )
        by_uid = {q.runUid: q for q in self.state.queue}
        placed = set()
        for placement in placements:
            queued = by_uid[placement.request.runUid]
            handoff = placement.request.runUid in outbox.handoffs
            msg = AdmitSignal(request=placement.request, workflowId=queued.workflowId, handoff=handoff)
            self._assign(msg, placement.assignment, outbox)
            placed.add(placement.request.runUid)
        left = outbox.behind - placed
        self._update(queue=[q for q in self.state.queue if q.runUid not in placed and q.runUid not in left])
        # queued behind the queue and not placed: the slot went to a Run ahead of it; decided
        # again as if it arrived now (capacity on its way, a scale-out, or a wait)
        outbox.behind, outbox.again = set(), True
        for run_uid in sorted(left):
            self._admit(by_uid[run_uid].admit(runtime=self.config.runtime.name), outbox)
        outbox.again = False

    def _readmit_uncovered(self, outbox: _Outbox) -> None:
        """After a host became Ready and took what it could: the queued Runs that no capacity on
        its way covers any more (the host went to others of their scope) are decided again."""
        if not self.state.queue:
            return
        again = set(
            admission.uncovered(
                queue=self._queued_requests(),
                hosts=self.state.hosts,
                pending_scale_outs=self.state.scaleOuts,
                runtime=self.config.runtime.name,
                index=self._index,
                fair=self._fair,
            )
        )
        if not again:
            return
        waiting = [q for q in self.state.queue if q.runUid in again]
        self._update(queue=[q for q in self.state.queue if q.runUid not in again])
        for queued in waiting:
            self._admit(queued.admit(runtime=self.config.runtime.name), outbox)

    def _release(self, run_uid: RunUid) -> None:
        self._index.remove(run_uid)
        self._owners.pop(run_uid, None)
        if any(q.runUid == run_uid for q in self.state.queue):
            self._update(queue=[q for q in self.state.queue if q.runUid != run_uid])

    def _leave(self, run_uid: RunUid, host_uid: HostUid) -> None:
        """A Run moving off a draining host gives its slot there back before it is admitted again."""
        held = self._index.held.get(run_uid)
        if held is not None and held.hostUid == host_uid:
            self._index.remove(run_uid)

    # -- hosts -------------------------------------------------------------------------------------

    def _warm(self, outbox: _Outbox) -> None:
        rt = self.config.runtime
        missing = admission.hosts_to_warm(
            hosts=self.state.hosts,
            pending_scale_outs=self.state.scaleOuts,
            runtime=rt.name,
            min_hosts=rt.minHosts,
            max_hosts=rt.maxHosts,
        )
        for _ in range(missing):
            self._scale_out(ScaleOutReason.BelowMinHosts, rt.provider, None, SHARED_POLICY, outbox, None)

    def _scale_out(
        self,
        reason: ScaleOutReason,
        provider: str,
        tenant: str | None,
        policy: TenantPolicy,
        outbox: _Outbox,
        request: AdmissionRequest | None,
    ) -> None:
        rt = self.config.runtime
        request_id = str(workflow.uuid4())
        host_id = f"{rt.name}-{self.state.nextHost}"
        scale_out = ScaleOutRequest(
            requestId=request_id,
            runtime=rt.name,
            provider=provider,
            reason=reason,
            slots=self._capacity(),
            runUid=request.runUid if request is not None else None,
            requestedAt=workflow.now(),
            tenant=tenant,
            policy=policy,
        )
        self._update(scaleOuts=[*self.state.scaleOuts, scale_out], nextHost=self.state.nextHost + 1)
        outbox.scale_outs.append(
            ScaleOutInput(
                request=scale_out,
                hostId=host_id,
                adapter=rt.adapter,
                capacity=self._capacity(),
                stateDir=self.config.platform.stateDir,
                poolWorkflowId=workflow.info().workflow_id,
                gateways=self.config.platform.gatewayHeartbeats,
                heartbeatIntervalSeconds=self.config.platform.heartbeatIntervalSeconds,
                sandbox=host_sandbox(rt, self.config.hostDefaults),
                assignmentTimeoutSeconds=rt.assignmentTimeoutSeconds,
            )
        )

    def _capacity(self) -> int:
        """Run slots of a new host: the runtime's `runs`; one on a one-shot runtime."""
        return 1 if self.config.runtime.oneshot else self.config.runtime.runs

    def _host_ready(self, msg: HostReadySignal) -> None:
        hosts = [h for h in self.state.hosts if h.hostId != msg.host.hostId] + [msg.host]
        scale_outs = [
            s._replace(status=ScaleOutStatus.Fulfilled, hostId=msg.host.hostId, hostUid=msg.host.hostUid)
            if s.requestId == msg.requestId
            else s
            for s in self.state.scaleOuts
        ]
        self._update(hosts=hosts, scaleOuts=[s for s in scale_outs if s.pending], failedScaleOuts=0)

    def _scale_out_failed(self, msg: ScaleOutFailedSignal, outbox: _Outbox) -> None:
        failures = self.state.failedScaleOuts + 1
        self._update(
            scaleOuts=[s for s in self.state.scaleOuts if s.requestId != msg.requestId],
            failedScaleOuts=failures,
        )
        waiting, self.state = self.state.queue, self.state._replace(queue=[])
        if failures >= MAX_CONSECUTIVE_SCALE_OUT_FAILURES:
            # Stop trying until a host appears or the config changes: report it to who waits.
            text = f"scale-out failed {failures} times: {msg.failure.reason}: {msg.failure.message}"
            for queued in waiting:
                rejection = Rejection(runUid=queued.runUid, reason="ScaleOutFailed", message=text)
                outbox.signals.append((queued.workflowId, SIGNAL_REJECTED, rejection))
            self._update(failedScaleOuts=0)
            return
        for queued in waiting:  # decide again: another scale-out, a wait, or a rejection
            self._admit(queued.admit(runtime=self.config.runtime.name), outbox)
        self._warm(outbox)  # a failed warm-up host is requested again, within the same bound

    async def _probe(self, outbox: _Outbox) -> None:
        """Find hosts proven gone; their Runs recover elsewhere, their slots are free again."""
        try:
            result = await workflow.execute_local_activity(
                "probe_hosts",
                ProbeInput(hosts=self.state.hosts, stateDir=self.config.platform.stateDir),
                result_type=ProbeResult,
                start_to_close_timeout=PROBE_TIMEOUT,
                retry_policy=PROBE_RETRY,
                summary=summaries.summary(f"probe {len(self.state.hosts)} hosts"),
            )
        except ActivityError:
            return  # no verdict is not a verdict of death: look again next time
        for host_uid in result.lost:
            host = next((h for h in self.state.hosts if h.hostUid == host_uid), None)
            if host is None:
                continue
            self._remove_host(host, HostLostSignal(hostId=host.hostId, hostUid=host_uid), outbox)
        if result.lost:
            self._warm(outbox)

    def _remove_host(self, host: Host, lost: HostLostSignal, outbox: _Outbox) -> None:
        """The host is gone (fenced): its slots are free, its Runs told to register elsewhere."""
        released = [uid for uid, host_id, *_ in self._index.held.rows() if host_id == host.hostId]
        for run_uid in released:
            self._index.remove(run_uid)
            workflow_id = self._owners.pop(run_uid, None)
            if workflow_id is not None:
                outbox.signals.append((workflow_id, SIGNAL_HOST_LOST, lost))
        self._update(
            hosts=[h for h in self.state.hosts if h.hostUid != host.hostUid],
            idleSince={k: v for k, v in self.state.idleSince.items() if k != host.hostUid},
        )
        workflow.logger.warning("host %s is gone; %d Run(s) recover elsewhere", host.hostId, len(released))

    def _runs_on(self, host: Host) -> list[str]:
        """The workflow ids of the Runs holding a slot on `host`."""
        return [
            self._owners[run_uid]
            for run_uid, _, host_uid, *_ in self._index.held.rows()
            if host_uid == host.hostUid and run_uid in self._owners
        ]

    def _host_lost(self, msg: HostLostSignal, outbox: _Outbox) -> None:
        """From the host's HostWorkflow: fenced, the host leaves; not yet, its Runs stop being Ready."""
        host = next((h for h in self.state.hosts if h.hostUid == msg.hostUid), None)
        if host is None:
            return
        if msg.fenced:
            self._remove_host(host, msg, outbox)
            self._warm(outbox)
            self._readmit_queue(outbox)
            return
        if host.state is not HostState.Lost:
            self._set_host(host._replace(state=HostState.Lost))
            for workflow_id in self._runs_on(host):
                outbox.signals.append((workflow_id, SIGNAL_HOST_LOST, msg))
            self._warm(outbox)

    def _host_state(self, msg: HostStateSignal, outbox: _Outbox) -> None:
        """From the host's HostWorkflow: Draining (its Runs move off) or Terminating (going)."""
        host = next((h for h in self.state.hosts if h.hostUid == msg.hostUid), None)
        if host is None or host.state in (msg.state, HostState.Lost):
            return
        if msg.state is HostState.Draining and host.state is HostState.Ready:
            self._set_host(host._replace(state=HostState.Draining))
            moving = HostLostSignal(
                hostId=host.hostId,
                hostUid=host.hostUid,
                reason=msg.reason or "draining",
                fenced=False,
                draining=True,
            )
            for workflow_id in self._runs_on(host):
                outbox.signals.append((workflow_id, SIGNAL_HOST_LOST, moving))
        elif msg.state is HostState.Terminating:
            self._set_host(host._replace(state=HostState.Terminating))
        self._warm(outbox)

    def _readmit_queue(self, outbox: _Outbox) -> None:
        """Decide again for the Runs that wait: the capacity they waited for may be gone."""
        waiting, self.state = self.state.queue, self.state._replace(queue=[])
        for queued in waiting:
            self._admit(queued.admit(runtime=self.config.runtime.name), outbox)

    def _set_host(self, host: Host) -> None:
        self._update(hosts=[host if h.hostUid == host.hostUid else h for h in self.state.hosts])

    def _keep_hosts(self, outbox: _Outbox) -> None:
        """After every batch: track idle hosts; delete drained and spent one-shot hosts; scale in."""
        state, rt, now = self.state, self.config.runtime, workflow.now()
        load = self._by_host_uid()
        self._update(
            idleSince=track_idle(
                hosts=state.hosts, reservations=(), idle_since=state.idleSince, now=now, load=load
            )
        )
        for host in self.state.hosts:
            if (
                host.supervised
                and host.state is not HostState.Terminating
                and load.get(host.hostUid, 0) == 0
                and drained(host=host, reservations=())
            ):
                end = HostEnd.Released if host.spent else HostEnd.Drained
                self._retire(host, end, outbox)
        for host in scale_in(
            hosts=self.state.hosts,
            reservations=(),
            load=load,
            idle_since=self.state.idleSince,
            now=now,
            min_hosts=rt.minHosts,
            delay_s=rt.scaleInDelaySeconds,
            queued=len(self.state.queue),
        ):
            self._retire(host, HostEnd.ScaledIn, outbox)

    def _retire(self, host: Host, end: HostEnd, outbox: _Outbox) -> None:
        """No new Run on it; its HostWorkflow deletes it and reports it gone."""
        self._set_host(host._replace(state=HostState.Terminating))
        workflow.logger.info("host %s: %s, deleting it", host.hostId, end)
        command = HostCommand(action="delete", reason=str(end), message=f"{end} by the pool")
        outbox.signals.append((host_workflow_id(host.runtime, host.hostId), SIGNAL_HOST_COMMAND, command))

    # -- effects -----------------------------------------------------------------------------------

    async def _flush(self, outbox: _Outbox) -> None:
        starts = [
            workflow.start_child_workflow(
                "ScaleOutWorkflow",
                scale_out,
                id=scale_out_workflow_id(scale_out.request.runtime, scale_out.request.requestId),
                task_queue=self.config.runTaskQueue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                static_summary=summaries.summary(
                    f"scale out {scale_out.request.runtime}: host {scale_out.hostId}"
                ),
            )
            for scale_out in outbox.scale_outs
        ]
        await asyncio.gather(*starts)
        if outbox.signals:
            await self._send(outbox.signals, parkable=outbox.parkable)

    async def _send(
        self, signals: list[tuple[str, str, Message]], *, parkable: set[str] | None = None
    ) -> set[str]:
        """All messages of one batch in one local activity; a Run that is gone frees what it held,
        a host whose HostWorkflow is gone is dropped (the reconciler deletes what is left of it)."""
        batch = SignalBatch(
            runtime=self.config.runtime.name,
            signals=[
                OutgoingSignal(
                    workflowId=workflow_id,
                    assigned=arg if isinstance(arg, Assignment) else None,
                    park=isinstance(arg, Assignment) and parkable is not None and workflow_id in parkable,
                    rejected=arg if isinstance(arg, Rejection) else None,
                    hostLost=arg if isinstance(arg, HostLostSignal) else None,
                    command=arg if isinstance(arg, HostCommand) else None,
                    slots=arg if isinstance(arg, HostSlots) else None,
                )
                for workflow_id, _name, arg in signals
            ],
            budgetSeconds=SIGNAL_BUDGET.total_seconds(),
        )
        result = await workflow.execute_local_activity(
            "signal_runs",
            batch,
            result_type=SignalResult,
            start_to_close_timeout=SIGNAL_TIMEOUT,
            retry_policy=SIGNAL_RETRY,
            summary=summaries.summary(f"{len(signals)} signals to Runs and hosts"),
        )
        gone = set(result.unreachable)
        if result.unsent:  # the rest without holding a workflow task open
            rest = await workflow.execute_activity(
                "signal_runs",
                SignalBatch(runtime=batch.runtime, signals=result.unsent),
                result_type=SignalResult,
                start_to_close_timeout=SIGNAL_TIMEOUT,
                retry_policy=SIGNAL_RETRY,
                summary=summaries.summary(f"{len(result.unsent)} signals left over"),
            )
            gone |= set(rest.unreachable)
        for workflow_id, _name, arg in signals:
            if workflow_id in gone and isinstance(arg, Assignment | Rejection):
                self._release(arg.runUid)
            elif workflow_id in gone and isinstance(arg, HostCommand) and arg.action == "delete":
                self._update(
                    hosts=[
                        h for h in self.state.hosts if host_workflow_id(h.runtime, h.hostId) != workflow_id
                    ]
                )
        return gone

    def _update(self, **changes: object) -> None:
        # Every value is a model (or list of models) made and validated already: copied, not
        # validated again (validating the whole state on every change cost time linear in it).
        self.state = self.state.model_copy(update=changes)
