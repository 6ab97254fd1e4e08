"""RuntimePoolWorkflow (pool/{runtime}): the only place capacity of a runtime is reserved.

Admission requests arrive as signals and are decided in batches, one batch per workflow task, by
the pure functions of kruntimes.scheduling; answers go back to the Runs as signals. Signals, not
updates: a burst of Runs updating one workflow was measured at 0.7-10/s with timeouts, while
signals are batched. State is carried across continue-as-new.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.hosts import host_sandbox
    from kruntimes.lifecycle import (
        QUERY_POOL,
        SIGNAL_ADMIT,
        SIGNAL_ADMIT_MANY,
        SIGNAL_ASSIGNED,
        SIGNAL_CONFIGURE,
        SIGNAL_HOST_LOST,
        SIGNAL_HOST_READY,
        SIGNAL_REJECTED,
        SIGNAL_RELEASE,
        SIGNAL_SCALE_OUT_FAILED,
        AdmitMany,
        AdmitSignal,
        Assignment,
        HostLostSignal,
        HostReadySignal,
        OutgoingSignal,
        PoolConfig,
        PoolInput,
        PoolState,
        ProbeInput,
        ProbeResult,
        Rejection,
        ReleaseSignal,
        ScaleOutFailedSignal,
        ScaleOutInput,
        SignalBatch,
        SignalResult,
        scale_out_workflow_id,
    )
    from kruntimes.scheduling import admission
    from kruntimes.scheduling.model import (
        SHARED_POLICY,
        AdmissionRequest,
        AssignToInstance,
        QueueGlobally,
        Reject,
        RequestScaleOut,
        ScaleOutReason,
        ScaleOutRequest,
        ScaleOutStatus,
        TenantPolicy,
    )

MAX_CONSECUTIVE_SCALE_OUT_FAILURES = 3
PROBE_TIMEOUT = timedelta(seconds=20)
SIGNAL_TIMEOUT = timedelta(seconds=60)
# Signalling retries until it succeeds: an answer that never arrives leaves a Run waiting forever.
SIGNAL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10)
)


@dataclass
class _Outbox:
    signals: list[tuple[str, str, Assignment | Rejection | HostLostSignal]]
    scale_outs: list[ScaleOutInput]


@workflow.defn(name="RuntimePoolWorkflow")
class RuntimePoolWorkflow:
    def __init__(self) -> None:
        self._inbox: list[object] = []

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

    @workflow.query(name=QUERY_POOL)
    def pool(self) -> PoolState:
        return self.state

    # -- the loop ----------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        self.config = input.config
        self.state = input.state or PoolState()
        outbox = _Outbox([], [])
        self._warm(outbox)
        await self._flush(outbox)
        while True:
            probe = False
            try:
                await workflow.wait_condition(
                    lambda: bool(self._inbox), timeout=self.config.probeIntervalSeconds
                )
            except TimeoutError:
                probe = True
            batch, self._inbox = self._inbox, []
            outbox = _Outbox([], [])
            for msg in batch:
                self._handle(msg, outbox)
                probe = probe or isinstance(msg, PoolConfig)  # a (re)started worker: look at every host
            if probe and self.state.hosts:
                await self._probe(outbox)
            self._place_queued(outbox)
            await self._flush(outbox)
            if workflow.info().is_continue_as_new_suggested() and not self._inbox:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(PoolInput(config=self.config, state=self.state))

    def _handle(self, msg: object, outbox: _Outbox) -> None:
        if isinstance(msg, AdmitSignal):
            self._admit(msg, outbox)
        elif isinstance(msg, ReleaseSignal):
            self._release(msg.runUid)
        elif isinstance(msg, HostReadySignal):
            self._host_ready(msg)
        elif isinstance(msg, ScaleOutFailedSignal):
            self._scale_out_failed(msg, outbox)
        elif isinstance(msg, PoolConfig):
            self.config = msg
            self._warm(outbox)

    def _policy(self, tenant: str | None) -> TenantPolicy | None:
        if tenant is None:
            return SHARED_POLICY
        return next((t.policy() for t in self.config.tenants if t.name == tenant), None)

    def _admit(self, msg: AdmitSignal, outbox: _Outbox) -> None:
        request = msg.request
        policy = self._policy(request.tenant)
        if policy is not None:
            request = request._replace(tenancy=policy)
            msg = AdmitSignal(request=request, workflowId=msg.workflowId)
        rt = self.config.runtime
        decision = admission.admit(
            request=request,
            hosts=self.state.hosts,
            reservations=self.state.reservations,
            queue=[q.request for q in self.state.queue],
            pending_scale_outs=self.state.scaleOuts,
            runtime=rt.name,
            max_queue=self.config.queueLimit,
            max_hosts=rt.maxHosts,
            default_provider=rt.provider,
            providers=self.config.providers,
        )
        if isinstance(decision, AssignToInstance):
            self._assign(msg, decision, outbox)
        elif isinstance(decision, QueueGlobally):
            if all(q.request.runUid != request.runUid for q in self.state.queue):
                self._update(queue=[*self.state.queue, msg])
        elif isinstance(decision, RequestScaleOut):
            self._update(queue=[*self.state.queue, msg])
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

    def _assign(self, msg: AdmitSignal, decision: AssignToInstance, outbox: _Outbox) -> None:
        host = next(h for h in self.state.hosts if h.hostId == decision.hostId)
        reservations = admission.reserve(
            reservations=self.state.reservations, request=msg.request, host=host, at=workflow.now()
        )
        self._update(
            reservations=list(reservations), owners={**self.state.owners, msg.request.runUid: msg.workflowId}
        )
        assert host.address is not None
        assignment = Assignment(
            runUid=msg.request.runUid,
            hostId=host.hostId,
            hostUid=host.hostUid,
            address=host.address,
            adapter=self.config.runtime.adapter,
            platform=self.config.platform,
        )
        outbox.signals.append((msg.workflowId, SIGNAL_ASSIGNED, assignment))

    def _place_queued(self, outbox: _Outbox) -> None:
        placements = admission.next_from_queue(
            queue=[q.request for q in self.state.queue],
            hosts=self.state.hosts,
            reservations=self.state.reservations,
        )
        if not placements:
            return
        by_uid = {q.request.runUid: q for q in self.state.queue}
        placed = set()
        for placement in placements:
            queued = by_uid[placement.request.runUid]
            self._assign(queued, placement.assignment, outbox)
            placed.add(placement.request.runUid)
        self._update(queue=[q for q in self.state.queue if q.request.runUid not in placed])

    def _release(self, run_uid: str) -> None:
        self._update(
            reservations=list(admission.release(reservations=self.state.reservations, run_uid=run_uid)),
            queue=[q for q in self.state.queue if q.request.runUid != run_uid],
            owners={k: v for k, v in self.state.owners.items() if k != run_uid},
        )

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
            slots=rt.runs,
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
                capacity=rt.runs,
                stateDir=self.config.platform.stateDir,
                poolWorkflowId=workflow.info().workflow_id,
                gateways=self.config.platform.gatewayHeartbeats,
                heartbeatIntervalSeconds=self.config.platform.heartbeatIntervalSeconds,
                sandbox=host_sandbox(rt, self.config.hostDefaults),
            )
        )

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
                rejection = Rejection(runUid=queued.request.runUid, reason="ScaleOutFailed", message=text)
                outbox.signals.append((queued.workflowId, SIGNAL_REJECTED, rejection))
            self._update(failedScaleOuts=0)
            return
        for queued in waiting:  # decide again: another scale-out, a wait, or a rejection
            self._admit(queued, outbox)
        self._warm(outbox)  # a failed warm-up host is requested again, within the same bound

    async def _probe(self, outbox: _Outbox) -> None:
        """Find hosts proven gone; their Runs recover elsewhere, their slots are free again."""
        try:
            result = await workflow.execute_local_activity(
                "probe_hosts",
                ProbeInput(hosts=self.state.hosts, stateDir=self.config.platform.stateDir),
                result_type=ProbeResult,
                start_to_close_timeout=PROBE_TIMEOUT,
            )
        except ActivityError:
            return  # no verdict is not a verdict of death: look again next time
        for host_uid in result.lost:
            host = next((h for h in self.state.hosts if h.hostUid == host_uid), None)
            if host is None:
                continue
            kept, released = admission.release_host(reservations=self.state.reservations, host_id=host.hostId)
            owners = dict(self.state.owners)
            for run_uid in released:
                workflow_id = owners.pop(run_uid, None)
                if workflow_id is not None:
                    outbox.signals.append(
                        (workflow_id, SIGNAL_HOST_LOST, HostLostSignal(hostId=host.hostId, hostUid=host_uid))
                    )
            self._update(
                hosts=[h for h in self.state.hosts if h.hostUid != host_uid],
                reservations=list(kept),
                owners=owners,
            )
            workflow.logger.warning(
                "host %s is gone; %d Run(s) recover elsewhere", host.hostId, len(released)
            )
        if result.lost:
            self._warm(outbox)

    # -- effects -----------------------------------------------------------------------------------

    async def _flush(self, outbox: _Outbox) -> None:
        starts = [
            workflow.start_child_workflow(
                "ScaleOutWorkflow",
                scale_out,
                id=scale_out_workflow_id(scale_out.request.runtime, scale_out.request.requestId),
                task_queue=self.config.runTaskQueue,
                parent_close_policy=ParentClosePolicy.ABANDON,
            )
            for scale_out in outbox.scale_outs
        ]
        await asyncio.gather(*starts)
        if outbox.signals:
            await self._send(outbox.signals)

    async def _send(self, signals: list[tuple[str, str, Assignment | Rejection | HostLostSignal]]) -> None:
        """All answers of one batch in one local activity; a Run that is gone frees what it held."""
        batch = SignalBatch(
            runtime=self.config.runtime.name,
            signals=[
                OutgoingSignal(
                    workflowId=workflow_id,
                    assigned=arg if isinstance(arg, Assignment) else None,
                    rejected=arg if isinstance(arg, Rejection) else None,
                    hostLost=arg if isinstance(arg, HostLostSignal) else None,
                )
                for workflow_id, _name, arg in signals
            ],
        )
        result = await workflow.execute_local_activity(
            "signal_runs",
            batch,
            result_type=SignalResult,
            start_to_close_timeout=SIGNAL_TIMEOUT,
            retry_policy=SIGNAL_RETRY,
        )
        gone = set(result.unreachable)
        for workflow_id, _name, arg in signals:
            if workflow_id in gone and isinstance(arg, Assignment | Rejection):
                self._release(arg.runUid)

    def _update(self, **changes: object) -> None:
        self.state = self.state._replace(**changes)
