"""RunWorkflow: the lifecycle of one Run (workflow id run/{namespace}/{name}).

    Pending ─▶ Scheduled ─▶ Running ─▶ Ready                      (function mode)
    Pending ─▶ Scheduled ─▶ Running ─▶ Succeeded | Failed | Timeout (task mode)
    any non-terminal ─▶ Cancelled | Failed | Timeout

Capacity comes from the runtime's pool workflow (admission by signal, the answer by signal).
Registration failures retry per spec.retryPolicy, each retry a new `attempt`; transport retries of
one RegisterFunction stay within the attempt. The idle clock lives in the Runtime Server: the
workflow reads FunctionStatus.lastActivity only when its idle timer fires, then re-arms or ends
the Run (kruntimes.decisions.runlife decides, as it decides the registration backoff).
Every terminal path runs the cleanup finalizer (CleanupWorkflow), which releases the slot.

Ready never lies. The moment the Run's host is lost (the pool's `host_lost`) it leaves Ready:

    Ready ─▶ Running (HostLost or HostDraining, Ready=False) ─▶ fenced ─▶ Pending (Recovering)
          ─▶ Scheduled ─▶ Running ─▶ Ready      the same URL, a new attempt on another host

and registers elsewhere only once the old assignment is fenced (the pool says so, or, moving
off a draining host, the old host acknowledged this Run's unregister). A move is a recovery, not
a registration failure: status.recoveries counts them, bounded by spec.recoveryLimit, and
retryPolicy is left alone. A registration its live host no longer holds (`registration_lost`)
is registered again, the same attempt (idempotent); one the host says can no longer serve is a
registration failure and takes a new attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.workflow import ActivityCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.api.ids import HostUid, RunUid
    from kruntimes.api.phases import RunPhase
    from kruntimes.api.status import (
        Condition,
        ConditionReason,
        Endpoint,
        EndpointProtocol,
        RunStatus,
    )
    from kruntimes.contracts.cleanup import CleanupInput, CleanupResult
    from kruntimes.contracts.function import SIGNAL_REPLICA_PHASE, ReplicaOf, ReplicaPhase
    from kruntimes.contracts.hostcalls import (
        FunctionState,
        Handoff,
        HostCall,
        RegisterInput,
        RegisterResult,
        StatusInput,
        TaskInput,
        TaskResult,
        UnregisterInput,
        register_input,
    )
    from kruntimes.contracts.names import (
        DEFAULT_RETENTION_SECONDS,
        QUERY_STATUS,
        SIGNAL_ASSIGNED,
        SIGNAL_CANCEL,
        SIGNAL_HOST_LOST,
        SIGNAL_REGISTRATION_LOST,
        SIGNAL_REJECTED,
        UPDATE_DELETE,
        cleanup_workflow_id,
        function_workflow_id,
        invoke_url,
        retention_workflow_id,
    )
    from kruntimes.contracts.pool import admit_signal, runtime_unknown
    from kruntimes.contracts.retention import RetentionInput
    from kruntimes.contracts.run import (
        STATUS_MEMO,
        Assignment,
        AwaitAssignmentInput,
        HostLostSignal,
        RegistrationLostSignal,
        Rejection,
        RunInput,
    )
    from kruntimes.decisions.runlife import (
        IdleExpired,
        RegistrationGone,
        failure_summary,
        idle_verdict,
        recovery_exhausted,
        registration_backoff,
        retries_exhausted,
    )
    from kruntimes.temporal.codec import PlainFailure
    from kruntimes.wire import reasons, search, search_typed, summaries
    from kruntimes.workflows.common import (
        HOST_CALL_RETRY,
        End,
        Recover,
        Reregister,
        failure_text,
        failure_type,
    )

REGISTER_TIMEOUT = timedelta(seconds=120)
ADMIT_TIMEOUT = timedelta(seconds=30)
# A Run whose starter sends its admission (RunInput.starterAdmits) asks the pool itself only when
# no answer came within this long: the starter failed between the start and the admission.
ADMIT_GRACE = timedelta(seconds=10)
# How long the first task waits for the pool's answer in-process (kruntimes.activities.signals.Mailbox)
# before it completes and leaves the answer to the signal.
HANDOFF_WAIT = timedelta(seconds=2)
# The whole handoff (the wait for the answer, attempt 1's registration) holds the Run's workflow
# task open: it ends within this, and within
# HANDOFF_TASK_SHARE of the task's own timeout (kruntimes.sdk.starting.RUN_TASK_TIMEOUT), so
# that the task completes before the SDK would have to extend it (at 80%) or the server time it
# out; a registration it could not finish is done in an ordinary activity.
HANDOFF_BOUND = timedelta(seconds=3)
HANDOFF_TASK_SHARE = 0.6
HANDOFF_RETRY = RetryPolicy(maximum_attempts=1)
# A registration in a local activity (within the workflow task) is tried once, for at most this
# long; one that did not succeed and was not refused is done again in an ordinary activity (with
# the transport retries), which holds no task open.
REGISTER_LOCAL_BOUND = timedelta(seconds=3)
REGISTER_LOCAL_RETRY = RetryPolicy(maximum_attempts=1)
# Admission must reach the pool: retried until it does (or the pool is proven absent).
ADMIT_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10)
)
STATUS_TIMEOUT = timedelta(seconds=30)
HEARTBEAT_TIMEOUT = timedelta(seconds=10)  # a dead worker's activity is retried this soon
NO_TASK_LIMIT_S = 7 * 24 * 3600.0
# Errors of the function itself: another attempt may help only through the retry policy.
REGISTRATION_ERRORS = reasons.registration_refusals()
# Of those, the ones every attempt of the same Run gets: the Run fails at the first.
FINAL_ERRORS = reasons.final_refusals()
# How soon an idle timer that found the host unreachable looks again.
UNREACHABLE_REARM_S = 30.0
UNREGISTER_TIMEOUT = timedelta(seconds=30)
# How a Run that says it is a Function's replica, not started by that Function, ends.
REPLICA_REFUSED = "NotStartedByFunction"


@workflow.defn(name="RunWorkflow")
class RunWorkflow:
    def __init__(self) -> None:
        self._status = RunStatus()
        self._cancel = False
        self._delete = False
        self._finalized = False
        self._assignment: Assignment | None = None
        self._rejection: Rejection | None = None
        self._registration: RegisterResult | None = None
        self._host_lost = False
        self._host_fenced = False  # the lost host's assignment is proven unable to serve
        self._moving = False  # the host drains: unregister there, then move
        self._registration_lost: RegistrationLostSignal | None = None
        self._serving = False  # Ready on its registration (a lost one matters only then)
        self._attempt = 0
        self._failures = 0  # registration failures: what spec.retryPolicy counts
        self._failure_cause = ""  # the reason of the last registration failure (its plain summary)
        self._failure_kind = ""  # the adapter's error class behind it, when the host named one
        self._indexed_host: str | None = None  # the KrtHost value last upserted
        self._status_memo = False  # RunInput.statusMemo
        self._register_slow = False  # the handoff gave attempt 1's registration up: an activity does it
        self._replica_of: ReplicaOf | None = None  # RunInput.replicaOf, once its parent is proven
        self._told: list[asyncio.Task[None]] = []  # a replica's phase signals to its Function

    # -- the API ---------------------------------------------------------------------------------

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> RunStatus:
        return self._status

    @workflow.signal(name=SIGNAL_CANCEL)
    def cancel(self) -> None:
        self._cancel = True  # false → true only; repeating it changes nothing

    @workflow.update(name=UPDATE_DELETE)
    async def delete(self) -> str:
        """Cancel if needed, run the cleanup finalizer, then end the workflow. The answer is one
        plain line (`temporal workflow update execute` prints it without the codec server); the
        final status is the workflow's result."""
        self._cancel = True
        self._delete = True
        await workflow.wait_condition(lambda: self._finalized)
        return summaries.summary(f"deleted {workflow.info().workflow_id}: {self._status.phase.value}")

    @workflow.signal(name=SIGNAL_ASSIGNED)
    def assigned(self, assignment: Assignment) -> None:
        if self._assignment is None and self._rejection is None:
            self._assignment = assignment

    @workflow.signal(name=SIGNAL_HOST_LOST)
    def host_lost(self, lost: HostLostSignal) -> None:
        if self._assignment is None or self._assignment.hostUid != lost.hostUid:
            return
        if lost.draining:
            self._moving = True
        else:
            self._host_lost = True
            self._host_fenced = self._host_fenced or lost.fenced

    @workflow.signal(name=SIGNAL_REGISTRATION_LOST)
    def registration_lost(self, lost: RegistrationLostSignal) -> None:
        """Its host no longer serves this Run's registration (only a Ready Run acts on it)."""
        a, reg = self._assignment, self._registration
        if not self._serving or a is None or reg is None or lost.runUid != self.uid:
            return
        if lost.hostUid == a.hostUid and lost.registrationId in ("", reg.registrationId):
            self._registration_lost = lost

    @workflow.signal(name=SIGNAL_REJECTED)
    def rejected(self, rejection: Rejection) -> None:
        if self._assignment is None and self._rejection is None:
            self._rejection = rejection

    # -- the lifecycle -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: RunInput) -> RunStatus:
        run = input.run
        if run.metadata.uid is None:
            raise ApplicationError(
                "metadata.uid must be set when a Run is started", type="InvalidRun", non_retryable=True
            )
        self._status_memo = input.statusMemo
        self.run_ = run
        self.uid: RunUid = run.metadata.uid
        wanted = search_typed.run_values(run)
        present = workflow.info().typed_search_attributes
        missing = [key.value_set(value) for key, value in wanted if present.get(key) != value]
        if missing:  # starters that set them at start save a visibility write here
            workflow.upsert_search_attributes(missing)
        self._phase(
            RunPhase.Pending, ConditionReason.Scheduled, "waiting for capacity", ready=False, index=False
        )
        end = self._replica_refused(input.replicaOf) if input.replicaOf is not None else None
        if end is None:
            end = await self._admit(starter_admits=input.starterAdmits)
        if end is None:
            end = await (self._task() if run.spec.mode.kind == "task" else self._function())
        end = await self._finalize(end)
        retention = run.spec.ttlSecondsAfterFinished
        seconds = retention if retention is not None else DEFAULT_RETENTION_SECONDS
        await self._retain(0 if self._delete else seconds, deleted=self._delete)
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._told:  # a replica's last phase reaches its Function before the Run closes
            await workflow.wait_condition(lambda: all(t.done() for t in self._told))
        if end.phase in (RunPhase.Failed, RunPhase.Timeout):
            # The message is stored unencrypted: the platform's words only (the status in the
            # details, encrypted, has the rest)
            why = failure_summary(
                end.reason,
                cause=self._failure_cause,
                kind=self._failure_kind,
                host=self._status.assignedHost or "",
                attempt=self._status.attempt,
                attempts_spent=end.reason == ConditionReason.RetriesExhausted,
            )
            raise PlainFailure(why, self._status, type=end.reason, non_retryable=True)
        return self._status

    def _replica_refused(self, replica_of: ReplicaOf) -> End | None:
        """A replica is started by its Function's own workflow and by nothing else (a Run that
        says it serves a Function would take that Function's traffic): None when the parent is
        that workflow, else how the Run ends."""
        parent = workflow.info().parent
        owner = function_workflow_id(self.run_.metadata.namespace, replica_of.functionName)
        if parent is None or parent.workflow_id != owner:
            return End(
                RunPhase.Failed,
                REPLICA_REFUSED,
                f"replicaOf: a Function's replica is started by its Function's workflow ({owner}), "
                f"not by {'a client' if parent is None else parent.workflow_id}",
            )
        self._replica_of = replica_of
        return None

    def _tell_function(self, reason: str, message: str) -> None:
        """A replica tells its Function each phase it indexes (Ready, leaving it, its end)."""
        replica, parent = self._replica_of, workflow.info().parent
        if replica is None or parent is None:
            return
        phase = ReplicaPhase(
            runUid=self.uid,
            name=self.run_.metadata.name,
            revision=replica.revision,
            phase=self._status.phase,
            reason=reason,
            message=message,
            seq=len(self._told) + 1,
            gatewayUrl=self._assignment.platform.gatewayUrl if self._assignment is not None else "",
            caBundle=self._assignment.platform.caBundle if self._assignment is not None else None,
            address=self._assignment.address if self._assignment is not None else "",
            registrationId=self._registration.registrationId if self._registration is not None else "",
        )
        self._told.append(asyncio.create_task(_signal_function(parent.workflow_id, phase)))

    async def _retain(self, seconds: float, *, deleted: bool) -> None:
        """Hand the closed execution to its RetentionWorkflow, which outlives this one and lists
        the finished Run meanwhile (with the Run's search attributes and final phase). A deleted
        Run says KrtPhase=Deleted on both first, so no listing shows it again."""
        info = workflow.info()
        phase = search.DELETED if deleted else self._status.phase.value
        if deleted:
            workflow.upsert_search_attributes(
                [search_typed.KRT_PHASE.value_set(search.DELETED), _phase_since()]
            )
        await workflow.start_child_workflow(
            "RetentionWorkflow",
            RetentionInput(workflowId=info.workflow_id, runId=info.run_id, seconds=seconds),
            id=retention_workflow_id(self.uid),
            task_queue=info.task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            search_attributes=search_typed.finished(
                self.run_, phase=phase, host=self._status.assignedHost or ""
            ),
            static_summary=summaries.summary(f"retention of {info.workflow_id}: {seconds:g} s"),
        )

    async def _admit(self, *, starter_admits: bool = False, leaving: HostUid | None = None) -> End | None:
        """Wait for the pool's answer; ask for it unless the starter already did. `leaving`: the
        host uid of the slot this Run gives up (moving off a draining host)."""
        cut_short = False
        if starter_admits and not self._answered():
            cut_short = await self._handoff()
        if cut_short and not self._answered():
            # The handoff ran out of its time: an answer handed to it may be lost, and the pool,
            # which holds the reservation, gives the same one again. Ask now, not after the grace.
            starter_admits = False
        if starter_admits:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    self._answered,
                    timeout=ADMIT_GRACE,
                    timeout_summary=summaries.summary(f"admission grace {ADMIT_GRACE.total_seconds():g} s"),
                )
        if not self._answered():
            end = await self._ask_pool(leaving=leaving)
            if end is not None:
                return end
            await workflow.wait_condition(self._answered)
        if self._assignment is not None and not self._cancel:
            return None
        if self._rejection is not None:
            return End(RunPhase.Failed, self._rejection.reason, self._rejection.message)
        return End(RunPhase.Cancelled, ConditionReason.Cancelled, "cancelled before a host was assigned")

    async def _handoff(self) -> bool:
        """The pool's answer, and attempt 1 registered on it, within this task when the pool
        decides in this worker process (kruntimes.activities.handoff; the pool then sends no signal). A
        pool elsewhere answers nothing at once and the signal brings the answer. True when the
        activity was cut short by its timeout (an answer handed to it is then lost)."""
        # (A local activity's timeouts are not part of its recorded marker: Runs that waited
        # longer replay the same.)
        task_timeout = workflow.info().task_timeout
        bound = min(HANDOFF_BOUND, task_timeout * HANDOFF_TASK_SHARE) if task_timeout else HANDOFF_BOUND
        wait = min(HANDOFF_WAIT, bound * (2 / 3))  # the rest is for attempt 1's registration
        try:
            handoff = await workflow.execute_local_activity(
                "await_assignment",
                AwaitAssignmentInput(
                    workflowId=workflow.info().workflow_id,
                    runUid=self.uid,
                    runtime=self.run_.spec.runtime,
                    timeoutSeconds=wait.total_seconds(),
                    run=self.run_ if self.run_.spec.mode.kind == "function" else None,
                    replicaOf=self._replica_of,
                ),
                result_type=Handoff,
                # Not schedule-to-close: the activity bounds itself from its own start, and one
                # cut short by a deadline it cannot see would lose an answer handed to it.
                start_to_close_timeout=bound,
                retry_policy=HANDOFF_RETRY,
                summary=summaries.summary(f"wait for pool/{self.run_.spec.runtime} in process"),
            )
        except (ActivityError, ApplicationError, ActivityTimeout) as err:
            return _timed_out(err)  # a shortcut only
        if handoff.assignment is None or handoff.assignment.runUid != self.uid:
            return False
        self.assigned(handoff.assignment)
        if self._assignment == handoff.assignment:  # (the signal may have brought the same one)
            # Attempt 1 is registered: recorded at once, so that whatever ends the Run next (a
            # cancel seen in this same task, say) has the cleanup unregister it.
            self._registration = handoff.registration
            self._register_slow = handoff.registration is None and self.run_.spec.mode.kind == "function"
        return False

    def _answered(self) -> bool:
        return self._assignment is not None or self._rejection is not None or self._cancel

    async def _ask_pool(self, *, leaving: HostUid | None = None) -> End | None:
        # From a local activity rather than a SignalExternal command: the command's completion
        # would wake this workflow for a task that does nothing, on the critical path to Ready.
        delivered = await workflow.execute_local_activity(
            "admit_run",
            admit_signal(
                self.run_, workflow_id=workflow.info().workflow_id, at=workflow.now(), leaving=leaving
            ),
            result_type=bool,
            start_to_close_timeout=ADMIT_TIMEOUT,
            retry_policy=ADMIT_RETRY,
            summary=summaries.summary(f"admit to pool/{self.run_.spec.runtime}"),
        )
        if delivered:
            return None
        unknown = runtime_unknown(self.run_)
        return End(RunPhase.Failed, unknown.reason, unknown.message)

    def _deadline(self, start: datetime) -> datetime | None:
        seconds = self.run_.spec.timeoutSeconds
        return start + timedelta(seconds=seconds) if seconds is not None else None

    def _register_input(self, attempt: int) -> RegisterInput:
        assert self._assignment is not None
        return register_input(
            self._assignment, self.run_, run_uid=self.uid, attempt=attempt, replica_of=self._replica_of
        )

    def _scheduled(self) -> None:
        """Record the assignment (Scheduled lasts only within this task: not indexed)."""
        assert self._assignment is not None
        a = self._assignment
        self._update(assignedHost=a.hostId, assignedHostUID=a.hostUid)
        self._phase(
            RunPhase.Scheduled,
            ConditionReason.Scheduled,
            f"assigned to host {a.hostId}",
            ready=False,
            index=False,
        )

    def _start_running(self, *, index: bool) -> datetime:
        self._scheduled()
        start = workflow.now()
        self._update(startTime=start)
        self._phase(RunPhase.Running, ConditionReason.Registering, "preparing", ready=False, index=index)
        return start

    async def _sleep_unless_cancelled(self, seconds: float, deadline: datetime | None) -> bool:
        """Sleep, waking early on cancel; False when the total timeout came first."""
        if deadline is not None:
            seconds = min(seconds, (deadline - workflow.now()).total_seconds())
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._cancel,
                    timeout=seconds,
                    timeout_summary=summaries.summary(f"backoff {seconds:g} s"),
                )
        return deadline is None or workflow.now() < deadline

    async def _function(self) -> End:
        """Register (retrying per policy), serve; after a host loss register elsewhere, after a
        lost registration register again."""
        # Registration runs in this same task (a local activity): Running would be indexed only to
        # be replaced by Ready or RegistrationFailed when the task completes.
        deadline = self._deadline(self._start_running(index=False))
        again = False  # register the same attempt again: the host lost the registration
        while True:
            end: End | Recover | Reregister | None = await self._register(deadline, again=again)
            again = False
            if end is None:
                end = await self._serve(deadline)
            if isinstance(end, Reregister):
                lost = await self._reregister(end, deadline)
                if isinstance(lost, End):
                    return lost
                again = lost
                continue
            if not isinstance(end, Recover):
                return end
            moved = await self._move(end, deadline)
            if moved is not None:
                return moved

    async def _move(self, end: Recover, deadline: datetime | None) -> End | None:
        """Leave Ready at once; once the old assignment is fenced, register elsewhere (a new
        attempt, the same URL). Moving off a draining host, this Run's acknowledged unregister
        there is the fence; a lost host's fence comes from the pool."""
        assert self._assignment is not None
        old = self._assignment
        draining = self._moving and not self._host_lost
        reason = ConditionReason.HostDraining if draining else ConditionReason.HostLost
        self._phase(RunPhase.Running, reason, end.message, ready=False)
        if draining and not self._host_fenced and await self._unregister_here():
            self._host_fenced = True
        if deadline is not None:
            seconds = max((deadline - workflow.now()).total_seconds(), 0.0)
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._host_fenced or self._cancel,
                    timeout=seconds,
                    timeout_summary=summaries.summary(f"total timeout in {seconds:g} s"),
                )
        else:
            await workflow.wait_condition(lambda: self._host_fenced or self._cancel)
        if self._cancel:
            return End(RunPhase.Cancelled, ConditionReason.Cancelled, f"cancelled while {reason}")
        if not self._host_fenced:
            return End(RunPhase.Timeout, ConditionReason.Timeout, f"total timeout while {reason}")
        recoveries = self._status.recoveries + 1
        self._update(recoveries=recoveries)
        if recovery_exhausted(limit=self.run_.spec.recoveryLimit, recoveries=recoveries):
            return End(
                RunPhase.Failed,
                ConditionReason.RecoveriesExhausted,
                f"{end.message}; recoveryLimit {self.run_.spec.recoveryLimit} reached",
            )
        self._assignment = self._registration = self._rejection = None
        self._host_lost = self._host_fenced = self._moving = False
        self._registration_lost = None
        self._update(assignedHost=None, assignedHostUID=None)
        self._phase(
            RunPhase.Pending, ConditionReason.Recovering, f"{end.message}; registering elsewhere", ready=False
        )
        admitted = await self._admit(leaving=old.hostUid if draining else None)
        if admitted is not None:
            return admitted
        self._scheduled()
        self._phase(RunPhase.Running, ConditionReason.Registering, "registering again", ready=False)
        return None

    async def _unregister_here(self) -> bool:
        """Unregister this Run on its (draining) host; True once the host acknowledged it."""
        a, reg = self._assignment, self._registration
        if a is None or reg is None:
            return True
        try:
            await workflow.execute_activity(
                "unregister_function",
                UnregisterInput(
                    address=a.address,
                    registrationId=reg.registrationId,
                    host=HostCall(
                        hostId=a.hostId,
                        hostUid=a.hostUid,
                        provider=a.provider,
                        runtime=self.run_.spec.runtime,
                    ),
                ),
                result_type=bool,
                start_to_close_timeout=UNREGISTER_TIMEOUT + timedelta(seconds=10),
                retry_policy=HOST_CALL_RETRY,
                summary=summaries.summary(f"unregister on {a.hostId} (draining)"),
            )
        except ActivityError as err:
            workflow.logger.warning("the draining host did not acknowledge: %s", failure_text(err))
            return False
        return True

    async def _reregister(self, end: Reregister, deadline: datetime | None) -> End | bool:
        """A registration its live host lost: register the same attempt again (True). One the
        host cannot serve any more is a registration failure: a new attempt after the backoff
        (False), or the end of the Run once the policy is spent."""
        self._phase(RunPhase.Running, ConditionReason.RegistrationLost, end.message, ready=False)
        self._registration_lost = None
        if end.same_attempt:
            self._registration = None  # the host no longer has it: register it anew
            return True
        self._failures += 1
        self._failure_cause = ConditionReason.RegistrationLost
        policy = self.run_.spec.retryPolicy
        if retries_exhausted(policy, failures=self._failures):
            return End(RunPhase.Failed, ConditionReason.RetriesExhausted, end.message)
        if not await self._sleep_unless_cancelled(
            registration_backoff(policy, attempt=self._failures), deadline
        ):
            return End(RunPhase.Timeout, ConditionReason.Timeout, "total timeout while registering")
        if self._cancel:
            return End(RunPhase.Cancelled, ConditionReason.Cancelled, "cancelled while registering")
        return False

    async def _register(self, deadline: datetime | None, *, again: bool = False) -> End | Recover | None:
        spec = self.run_.spec
        policy = spec.retryPolicy
        while True:
            if not again:
                self._attempt += 1
            again = False
            attempt = self._attempt
            self._update(attempt=attempt)
            if attempt == 1 and self._registration is not None:
                break  # registered by the handoff (kruntimes.activities.handoff)
            try:
                self._registration = await self._register_once(attempt)
                break
            except (ActivityError, ApplicationError) as err:  # a local activity's own error surfaces bare
                refusal = _refusal(err)
                self._failure_cause = refusal[0] if refusal else "RegistrationFailed"
                self._failure_kind = _error_class(err)
                said = f"{refusal[0]}: {refusal[1]}" if refusal else failure_text(err)
                message = f"attempt {attempt}: {said}"
                self._phase(RunPhase.Running, ConditionReason.RegistrationFailed, message, ready=False)
                if self._cancel:
                    return End(RunPhase.Cancelled, ConditionReason.Cancelled, "cancelled while registering")
                if refusal and refusal[0] in FINAL_ERRORS:  # every attempt would be refused the same
                    return End(RunPhase.Failed, refusal[0], refusal[1])
                if self._host_lost:
                    self._attempt -= 1  # the recovery spends the attempt
                    return Recover(message)
                self._failures += 1
                spent = self._failures
                if spent >= policy.limit:
                    return End(RunPhase.Failed, ConditionReason.RetriesExhausted, message)
                backoff = registration_backoff(policy, attempt=spent)
                if not await self._sleep_unless_cancelled(backoff, deadline):
                    return End(RunPhase.Timeout, ConditionReason.Timeout, "total timeout while registering")
                if self._cancel:
                    return End(RunPhase.Cancelled, ConditionReason.Cancelled, "cancelled while registering")
        self._failure_cause = self._failure_kind = ""
        assert self._assignment is not None
        platform = self._assignment.platform
        url = invoke_url(
            platform.gatewayUrl,
            namespace=self.run_.metadata.namespace,
            runtime=spec.runtime,
            run_uid=self.uid,
        )
        self._update(endpoint=Endpoint(protocol=EndpointProtocol.HTTPS, url=url, caBundle=platform.caBundle))
        self._phase(RunPhase.Ready, ConditionReason.FunctionRegistered, "function registered", ready=True)
        return None

    async def _register_once(self, attempt: int) -> RegisterResult:
        """Register `attempt` on the assigned host. A local activity first: registration is short
        and on the critical path to Ready. If the worker dies meanwhile, the task is retried
        elsewhere and re-registers the same attempt, which the host answers with the same
        registration. One that takes longer than REGISTER_LOCAL_BOUND (or that the handoff
        already gave up on) is done in an ordinary activity: the workflow task is never held
        open for it."""
        host = self._assignment.hostId if self._assignment else "?"
        retry = _no_retry_for(REGISTRATION_ERRORS)
        slow = self._register_slow and attempt == 1
        self._register_slow = False
        if not slow:
            try:
                registered: RegisterResult = await workflow.execute_local_activity(
                    "register_function",
                    self._register_input(attempt),
                    result_type=RegisterResult,
                    start_to_close_timeout=REGISTER_LOCAL_BOUND,
                    schedule_to_close_timeout=REGISTER_LOCAL_BOUND,
                    retry_policy=REGISTER_LOCAL_RETRY,
                    summary=summaries.summary(f"register on {host} (attempt {attempt})"),
                )
                return registered
            except (ActivityError, ApplicationError, ActivityTimeout) as err:
                if _refused(err):  # the function's own failure, not a slow registration
                    raise
        slowly: RegisterResult = await workflow.execute_activity(
            "register_function",
            self._register_input(attempt),
            result_type=RegisterResult,
            start_to_close_timeout=REGISTER_TIMEOUT,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=retry,
            summary=summaries.summary(f"register on {host} (attempt {attempt}, slow)"),
        )
        return slowly

    async def _serve(self, deadline: datetime | None) -> End | Recover | Reregister:
        """Ready: wait for cancel, a host loss or drain, a lost registration, the total timeout or
        the idle timeout."""
        self._serving = True
        try:
            return await self._serving_until(deadline)
        finally:
            self._serving = False

    async def _serving_until(self, deadline: datetime | None) -> End | Recover | Reregister:
        assert self._registration is not None and self._assignment is not None
        idle = self.run_.spec.mode.function.idleTimeoutSeconds if self.run_.spec.mode.function else None
        idle_at = workflow.now() + timedelta(seconds=idle) if idle is not None else None
        while True:
            wake = min((t for t in (deadline, idle_at) if t is not None), default=None)
            timeout = max((wake - workflow.now()).total_seconds(), 0.001) if wake is not None else None
            if wake is not None and wake == idle_at:
                what = f"idle timeout {idle} s"
            else:
                what = f"total timeout in {timeout:g} s" if timeout is not None else "no timer"
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: (
                        self._cancel or self._host_lost or self._moving or self._registration_lost is not None
                    ),
                    timeout=timeout,
                    timeout_summary=summaries.summary(what),
                )
            if self._cancel:
                return End(RunPhase.Cancelled, ConditionReason.Cancelled, "cancelled")
            if self._host_lost:
                return Recover(f"host {self._assignment.hostId} is lost")
            if self._moving:
                return Recover(f"host {self._assignment.hostId} is draining")
            lost = self._registration_lost
            if lost is not None:
                self._registration_lost = None
                return Reregister(
                    lost.message or f"registration {lost.reason}", same_attempt=lost.reason != "NotReady"
                )
            now = workflow.now()
            if deadline is not None and now >= deadline:
                return End(RunPhase.Timeout, ConditionReason.Timeout, "total timeout reached")
            if idle is None or idle_at is None or now < idle_at:
                continue
            try:
                state = await workflow.execute_activity(
                    "function_status",
                    StatusInput(
                        address=self._assignment.address, registrationId=self._registration.registrationId
                    ),
                    result_type=FunctionState,
                    start_to_close_timeout=STATUS_TIMEOUT,
                    retry_policy=HOST_CALL_RETRY,
                    summary=summaries.summary(f"idle check on {self._assignment.hostId}"),
                )
            except ActivityError:
                # The host's supervisor decides whether it is lost; look again a little later.
                idle_at = workflow.now() + timedelta(seconds=min(idle, UNREACHABLE_REARM_S))
                continue
            verdict = idle_verdict(idle_seconds=idle, now=now, state=state)
            if isinstance(verdict, RegistrationGone):
                return Reregister("the host no longer holds the registration", same_attempt=True)
            if isinstance(verdict, IdleExpired):
                return End(RunPhase.Timeout, ConditionReason.IdleTimeout, f"no invocation for {idle} s")
            idle_at = verdict.at

    async def _task(self) -> End:
        assert self._assignment is not None
        deadline = self._deadline(self._start_running(index=True))
        self._update(attempt=1)
        limit = (deadline - workflow.now()).total_seconds() if deadline is not None else NO_TASK_LIMIT_S
        task = TaskInput.of(self._assignment, self.run_, run_uid=self.uid, attempt=1, timeoutSeconds=limit)
        handle = workflow.start_activity(
            "execute_task",
            task,
            result_type=TaskResult,
            start_to_close_timeout=timedelta(seconds=limit + 60),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=HOST_CALL_RETRY,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=summaries.summary(f"task on {self._assignment.hostId}"),
        )
        await workflow.wait_condition(lambda: handle.done() or self._cancel or self._host_lost)
        if not handle.done() and self._host_lost:
            handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await handle
            return End(RunPhase.Failed, ConditionReason.HostLost, "the host running the task is gone")
        if not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await handle
            return End(RunPhase.Cancelled, ConditionReason.Cancelled, "cancelled while running")
        try:
            result = handle.result()
        except ActivityError as err:
            self._failure_cause = failure_type(err)
            return End(RunPhase.Failed, ConditionReason.TaskFailed, failure_text(err))
        # what the plain failure message names: an adapter's class only, never the process's own
        self._failure_cause = result.errorType if result.errorType in reasons.ADAPTER_ERRORS else ""
        if result.status == "Succeeded":
            return End(RunPhase.Succeeded, ConditionReason.TaskSucceeded, "", result.outputs)
        if result.status == "Timeout":
            return End(RunPhase.Timeout, ConditionReason.Timeout, result.message or "total timeout reached")
        if result.status == "Cancelled":
            return End(RunPhase.Cancelled, ConditionReason.Cancelled, "cancelled while running")
        message = result.message or f"exited with code {result.exitCode}"
        return End(RunPhase.Failed, ConditionReason.TaskFailed, message)

    async def _finalize(self, end: End) -> End:
        """The cleanup finalizer, then the terminal phase: a Run shows its terminal phase only
        once its cleanup has unregistered it from its host and released its slot (or tried to)."""
        a = self._assignment
        if self._register_slow and self._registration is None:
            # The handoff gave attempt 1's registration up, and the host may still have made it:
            # learn it (registering the same attempt again is idempotent) so the cleanup removes it.
            self._register_slow = False
            with contextlib.suppress(ActivityError, ActivityTimeout, ApplicationError):
                self._registration = await self._register_once(1)
        if end.phase is RunPhase.Cancelled or self._delete:
            self._phase(
                self._status.phase,
                ConditionReason.Deleting if self._delete else ConditionReason.Cancelled,
                "cleaning up",
                ready=False,
            )
        try:
            await workflow.execute_child_workflow(
                "CleanupWorkflow",
                CleanupInput(
                    runUid=self.uid,
                    attempt=self._status.attempt,
                    runtime=self.run_.spec.runtime,
                    address=a.address if a is not None else None,
                    registrationId=self._registration.registrationId
                    if self._registration is not None
                    else None,
                    task=self.run_.spec.mode.kind == "task",
                    hostGone=self._host_fenced,
                    hostId=a.hostId if a is not None else "",
                    hostUid=a.hostUid if a is not None else "",
                    provider=a.provider if a is not None else "",
                ),
                id=cleanup_workflow_id(self.uid),
                task_queue=workflow.info().task_queue,  # the Run's own queue: its workers run it
                result_type=CleanupResult,
                static_summary=summaries.summary(
                    f"cleanup {self.run_.metadata.namespace}/{self.run_.metadata.name}"
                    + (f" on {a.hostId}" if a is not None else "")
                ),
            )
        except ChildWorkflowError as err:
            end = End(
                end.phase, end.reason, f"{end.message}; cleanup failed: {failure_text(err)}".lstrip("; ")
            )
        self._update(endpoint=None, completionTime=workflow.now(), outputs=end.outputs)
        self._phase(end.phase, end.reason, end.message, ready=False)
        self._finalized = True
        return end

    # -- status ----------------------------------------------------------------------------------

    def _update(self, **changes: object) -> None:
        self._status = self._status._replace(**changes)

    def _phase(self, phase: RunPhase, reason: str, message: str, *, ready: bool, index: bool = True) -> None:
        condition = Condition.ready(ready, reason=reason, message=message, at=workflow.now())
        changed = phase != self._status.phase or not self._status.conditions
        self._status = self._status._replace(phase=phase, message=message).with_condition(condition)
        if changed and index:  # a phase that lasts only within this task is not indexed
            updates: list[SearchAttributeUpdate[Any]] = [
                search_typed.KRT_PHASE.value_set(phase.value),
                _phase_since(),
            ]
            host = self._status.assignedHost or ""
            if host != self._indexed_host:
                updates.append(search_typed.KRT_HOST.value_set(host))
                self._indexed_host = host
            if self._status_memo:  # first: `wait` takes it with the phase upsert that follows
                workflow.upsert_memo({STATUS_MEMO: self._status})
            workflow.upsert_search_attributes(updates)
            self._tell_function(reason, message)
        workflow.set_current_details(summaries.run_current(self._status, reason=reason))


async def _signal_function(workflow_id: str, phase: ReplicaPhase) -> None:
    # A Function deleted (or gone) before its replica ended has no one to tell: not the Run's failure.
    with contextlib.suppress(FailureError):
        await workflow.get_external_workflow_handle(workflow_id).signal(SIGNAL_REPLICA_PHASE, phase)


def _phase_since() -> SearchAttributeUpdate[Any]:
    """KrtPhaseSince at this task's time, upserted with the phase (what the gateway's known-Runs
    view asks for). Not a patch: replay matches an upsert by its command, not by the attributes it
    sets, so the histories recorded before it replay (every recorded Run history shows it), and a
    patch would cost each Run a marker and an upsert of TemporalChangeVersion."""
    return search_typed.KRT_PHASE_SINCE.value_set(workflow.now())


def _timed_out(err: BaseException | None) -> bool:
    """Whether an activity failure is (or was caused by) its timeout."""
    while isinstance(err, FailureError):
        if isinstance(err, ActivityTimeout):
            return True
        err = err.cause
    return False


def _refusal(err: BaseException | None) -> tuple[str, str] | None:
    """The host's reason and its own words, when a registration failure is (or was caused by) the
    host refusing it. The activity's message is `runtime host ADDRESS: ` and the host's details,
    which begin with the reason (`HandlerLoadFailed: cannot import ...`): the words are what
    follows the reason."""
    while isinstance(err, FailureError):
        if isinstance(err, ApplicationError) and err.type in REGISTRATION_ERRORS:
            _, said, words = err.message.partition(f"{err.type}: ")
            return err.type, words if said else err.message
        err = err.cause
    return None


def _error_class(err: BaseException | None) -> str:
    """The adapter's error class a host named with its refusal (the failure's one detail), if the
    catalogue knows it: nothing the function process made up reaches the plain message."""
    while isinstance(err, FailureError):
        if isinstance(err, ApplicationError) and err.type in REGISTRATION_ERRORS:
            details = err.details
            return details[0] if len(details) == 1 and details[0] in reasons.ADAPTER_ERRORS else ""
        err = err.cause
    return ""


def _refused(err: BaseException | None) -> bool:
    """Whether an activity failure is (or was caused by) the host refusing the registration."""
    while isinstance(err, FailureError):
        if isinstance(err, ApplicationError) and err.type in REGISTRATION_ERRORS:
            return True
        err = err.cause
    return False


def _no_retry_for(errors: list[str]) -> RetryPolicy:
    """HOST_CALL_RETRY, but never retrying `errors`."""
    return dataclasses.replace(HOST_CALL_RETRY, non_retryable_error_types=errors)
