"""FunctionWorkflow: one Function (workflow id function/{namespace}/{name}), for as long as it
exists. It is the Function's status, and it keeps the Function's replicas:

    apply ─▶ revision 1 ─▶ `wanted` replica Runs (child RunWorkflows, RunInput.replicaOf)
          ─▶ Ready once `wanted` are Ready
    a replica that ends ─▶ another is started (after a backoff when replicas end before Ready)
    apply (another template) | rollback ─▶ revision n+1 ─▶ its replicas ─▶ Ready ─▶ the older
          revision's replicas are deleted (their RunWorkflows' delete update)
    delete ─▶ every replica deleted ─▶ the workflow ends (Deleted)
    autoscaling (scale.max > scale.min): the `autoscale_function` activity samples the load and
          returns a decision ─▶ `wanted` changes as the `scale` update would (status.lastScale)
    wake (a gateway holds an invocation, no replica) ─▶ one replica at once, from zero
    spec.traffic naming the previous revision (a canary) ─▶ its replicas are kept (its share of
          `wanted`, at least one) instead of deleted, and the split is indexed (KrtTraffic) for
          the gateways

Replicas are children with parent close policy ABANDON (a continue-as-new must not end them);
each tells this workflow its phase by signal (`replica_phase`), which is how the workflow knows
them after a continue-as-new too. What to start and delete is decided by
kruntimes.decisions.functionlife; the only side effect besides child starts is the replicas'
delete, in an activity (a workflow cannot send another workflow an update).

The invocation path never touches this workflow: the gateway routes a Function's invocations to
the replicas its hosts report (their signed assignments name the Function and the revision). The
one exception is scale from zero: a gateway holding an invocation of a Function with no Ready
replica signals `wake`.

The autoscaler's decisions are taken in its activity (activities/function_load.py), never here:
the workflow starts one per set of load targets (its Ready replicas' hosts and registrations) and
`wanted`, cancels it when either changes (waiting for the cancellation, whose answer is the
autoscaler's memory, carried into the next), and applies the decision it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ActivityCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from kruntimes.api.function import (
        Function,
        FunctionConditionType,
        FunctionPhase,
        FunctionSpec,
        FunctionStatus,
        ReplicaCounts,
        ScaleEvent,
        ScaleSpec,
        TrafficTarget,
    )
    from kruntimes.api.ids import RunUid
    from kruntimes.api.phases import TERMINAL_PHASES, RunPhase
    from kruntimes.api.run import API_VERSION, KIND, Run
    from kruntimes.api.spec import Metadata
    from kruntimes.api.status import Condition, ConditionStatus, Endpoint, EndpointProtocol, RunStatus
    from kruntimes.contracts.function import (
        FUNCTION_CONFLICT_HINT,
        FUNCTION_LABEL,
        FUNCTION_STATUS_MEMO,
        MAX_REVISIONS_KEPT,
        QUERY_FUNCTION,
        REVISION_LABEL,
        SIGNAL_REPLICA_PHASE,
        ApplyResult,
        AutoscaleInput,
        AutoscaleResult,
        DeleteReplicaInput,
        DeleteReplicaResult,
        FunctionInput,
        FunctionState,
        LoadTarget,
        Replica,
        ReplicaOf,
        ReplicaPhase,
        ReplicaView,
        Revision,
        ScaleInput,
        ScaleResult,
        ScaleWindow,
        replica_name,
    )
    from kruntimes.contracts.names import (
        FUNCTION_CONFLICT,
        QUERY_REPLICAS,
        QUERY_STATUS,
        SIGNAL_FUNCTION_WAKE,
        SIGNAL_REJECTED,
        SIGNAL_RELEASE,
        UPDATE_APPLY,
        UPDATE_DELETE,
        UPDATE_ROLLBACK,
        UPDATE_SCALE,
        function_invoke_url,
        pool_workflow_id,
        run_workflow_id,
    )
    from kruntimes.contracts.pool import ReleaseSignal, admit_signal, runtime_unknown
    from kruntimes.contracts.run import RunInput
    from kruntimes.decisions.autoscale import MAX_CARRIED_WANTED
    from kruntimes.decisions.functionlife import (
        older_replicas,
        phase_of,
        plan,
        split_wanted,
        start_backoff,
    )
    from kruntimes.wire import function_summaries, search, search_typed, summaries

# How long a rollout waits for the new revision's replicas to be Ready before its Progressing
# condition says it is stuck (the old replicas keep serving meanwhile: none is deleted).
ROLLOUT_BOUND = timedelta(minutes=10)
# How long `delete` waits for the replicas to end before the workflow ends anyway, saying so.
DELETE_BOUND = timedelta(minutes=10)
# How soon a replica's delete that could not be sent is tried again.
DELETE_RESEND = timedelta(seconds=30)
DELETE_REPLICA_TIMEOUT = timedelta(seconds=30)
DELETE_REPLICA_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=5
)
# A run continues as new past this many events (or when the server suggests it), so replaying it
# stays well within a task timeout.
MAX_RUN_EVENTS = 2_000
# Autoscaling (the autoscale_function activity and the wake signal): histories recorded before it
# schedule no such activity.
PATCH_AUTOSCALE = "function-autoscale"
# The autoscaling activity's life: it returns after this with nothing changed, and the next one
# starts with the replicas as they are then.
AUTOSCALE_LIFE_S = 300.0
AUTOSCALE_TIMEOUT = timedelta(seconds=AUTOSCALE_LIFE_S + 60)
# Its heartbeat: how soon a lost worker's activity is retried, and a cancellation reaches it.
AUTOSCALE_HEARTBEAT = timedelta(seconds=2)
AUTOSCALE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
# After an autoscaling activity failed for good (its retries are unlimited: a cancelled or timed
# out one), the next starts after this, so a broken one never loops hot.
AUTOSCALE_PAUSE = timedelta(seconds=10)
WOKEN = "woken: an invocation waits at a gateway"
# The Function admits each replica it starts to the replica's pool itself, right after the start
# (RunInput.starterAdmits, as the SDK does for a Run): the pool decides while the replica's first
# task runs and hands it the answer in-process, one signal and task fewer on the way to Ready
# (scale from zero waits for it). Histories recorded before it let each replica ask the pool.
PATCH_REPLICA_ADMITS = "function-replica-admits"
REPLICA_ADMIT_TIMEOUT = timedelta(seconds=30)
REPLICA_ADMIT_RETRY = RetryPolicy(maximum_attempts=3)
# The admission goes before the replica's start, in the task that decides the start, when the
# worker says the pool's answer will wait in its mailbox for the replica's first task
# (`admit_run_early`): the pool decides while the replica starts, instead of after a task woken by
# the start's confirmation. Elsewhere it says so and the admission follows the start, as before.
PATCH_ADMIT_EARLY = "function-admit-early"
REPLICA_ADMIT_EARLY_RETRY = RetryPolicy(maximum_attempts=1)
# Traffic splits (spec.traffic): an older revision the split names keeps replicas, and the split
# is indexed (KrtTraffic, KrtTrafficSince). Histories recorded before it know no split.
PATCH_TRAFFIC = "function-traffic"
# A split divides the replicas wanted between its revisions (functionlife.split_wanted): a canary
# takes its percent of them instead of adding them to the current revision's `wanted`, and
# `replicas.ready` counts the Ready replicas of every revision the split serves. Histories
# recorded before it keep `wanted` of the current revision beside the older one's share.
PATCH_SPLIT_WANTED = "function-split-wanted"
# A Function with no Ready replica whose last replicas ended before Ready is not Ready even at
# zero replicas wanted (functionlife.phase_of `failing`). Histories recorded before it called such
# a Function Ready once it scaled to zero.
PATCH_ZERO_FAILING = "function-zero-failing-phase"


def _clamp(wanted: int, scale: ScaleSpec) -> int:
    return min(max(wanted, scale.min), scale.max)


def _initial_wanted(scale: ScaleSpec) -> int:
    # At least one replica at first, even with min 0: the Function is shown Ready with its
    # endpoint, and the autoscaler takes it to zero once idle.
    return min(max(scale.min, 1), scale.max)


def _autoscaled(scale: ScaleSpec) -> bool:
    return scale.max > scale.min


@workflow.defn(name="FunctionWorkflow")
class FunctionWorkflow:
    @workflow.init
    def __init__(self, input: FunctionInput) -> None:
        self._fn = input.function
        self._uid = input.function.metadata.uid or ""
        state = input.state
        if state is None:
            spec = input.function.spec
            now = workflow.now()
            state = FunctionState(
                revisions=[Revision(revision=1, spec=spec, createdAt=now)],
                wanted=_initial_wanted(spec.scale),
                rolloutSince=now,
            )
        self._revisions = list(state.revisions)
        self._wanted = state.wanted
        self._replicas = list(state.replicas)
        self._observed = state.observedRevision
        self._failures = state.failures
        self._retry_at = state.retryAt
        self._last_failure = state.lastFailure
        self._deleting = state.deleting
        self._started = state.started
        self._rollout_since = state.rolloutSince
        self._ever_ready = state.everReady
        self._endpoint = state.endpoint
        self._window: ScaleWindow | None = state.scaleWindow
        self._last_scale: ScaleEvent | None = state.lastScale
        self._autoscale = False  # PATCH_AUTOSCALE taken
        self._admits = False  # PATCH_REPLICA_ADMITS taken
        self._admits_early = False  # PATCH_ADMIT_EARLY taken
        self._splits = False  # PATCH_TRAFFIC taken
        self._split_wanted = False  # PATCH_SPLIT_WANTED taken
        self._indexed_traffic = ""
        self._scaler: asyncio.Task[None] | None = None
        self._held: tuple[float, int] | None = None  # a manual scale the autoscaler has not seen
        self._wakes = 0  # wakes taken by this run: an autoscaler started before one forgets its window
        self._status = FunctionStatus(revision=self._revisions[-1].revision)
        self._changed = False  # something to act on since the loop last looked
        self._ended = False  # every replica deleted: the workflow ends
        self._memo: FunctionStatus | None = None  # the status last written to the memo
        self._indexed_phase = ""
        self._watches: list[asyncio.Task[None]] = []  # each replica started by this run, until it closes

    # -- the API ---------------------------------------------------------------------------------

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> FunctionStatus:
        return self._status

    @workflow.query(name=QUERY_FUNCTION)
    def function(self) -> Function:
        """The Function as `krt function get -o yaml` shows it: the manifest last applied, with
        the current revision's spec (a rollback's), and its status."""
        return self._fn._replace(spec=self._revisions[-1].spec, status=self._status)

    @workflow.query(name=QUERY_REPLICAS)
    def replicas(self) -> list[ReplicaView]:
        return [r.view() for r in self._replicas]

    @workflow.signal(name=SIGNAL_REPLICA_PHASE)
    def replica_phase(self, told: ReplicaPhase) -> None:
        for i, replica in enumerate(self._replicas):
            if replica.runUid != told.runUid:
                continue
            if told.seq and told.seq <= replica.seq:
                return  # an older phase arriving late
            ready = told.phase is RunPhase.Ready
            if ready and not replica.wasReady:
                self._failures, self._retry_at = 0, None
            self._replicas[i] = replica._replace(
                phase=told.phase,
                reason=told.reason,
                message=told.message,
                seq=max(told.seq, replica.seq),
                wasReady=replica.wasReady or ready,
                address=told.address,
                registrationId=told.registrationId,
            )
            if told.gatewayUrl and self._endpoint is None:
                self._endpoint = _endpoint(self._fn, told)
            self._changed = True
            return

    @workflow.signal(name=SIGNAL_FUNCTION_WAKE)
    def wake(self) -> None:
        """A gateway holds an invocation and no replica serves: one replica at once, without
        waiting for the autoscaler's window. Idempotent: with a replica wanted already, nothing."""
        if not self._autoscale or self._deleting or self._wanted > 0:
            return
        wanted = _clamp(1, self._revisions[-1].spec.scale)
        self._last_scale = ScaleEvent(
            previous=self._wanted,
            wanted=wanted,
            reason=WOKEN,
            message=f"0 -> {wanted} replicas: {WOKEN}",
            at=workflow.now(),
        )
        self._wanted = wanted
        self._wakes += 1
        self._window = None  # its quiet window is over: no scale to zero for a window from now
        self._changed = True

    @workflow.update(name=UPDATE_APPLY)
    def apply(self, fn: Function) -> ApplyResult:
        """A new manifest of this Function: a new revision when its template changed (its
        replicas roll out), else only its scale and metadata are taken."""
        if fn.metadata.uid is None:
            fn = fn._replace(metadata=fn.metadata._replace(uid=self._uid))
        current = self._revisions[-1]
        self._fn = fn
        if fn.spec.same_template(current.spec):
            self._revisions[-1] = current._replace(spec=fn.spec)
            self._wanted = _clamp(self._wanted, fn.spec.scale)
            self._changed = True
            return ApplyResult(revision=current.revision, changed=False, message="the template is unchanged")
        revision = self._new_revision(fn.spec)
        return ApplyResult(revision=revision, changed=True, message=f"revision {revision} rolls out")

    @apply.validator
    def _apply_allowed(self, fn: Function) -> None:
        self._traffic_allowed(fn.spec)
        meta = fn.metadata
        if (meta.namespace, meta.name) != (self._fn.metadata.namespace, self._fn.metadata.name):
            raise ApplicationError(
                f"apply: the manifest names {meta.namespace}/{meta.name}, not "
                f"{self._fn.metadata.namespace}/{self._fn.metadata.name}",
                type="InvalidFunction",
                non_retryable=True,
            )
        if meta.uid is not None and meta.uid != self._uid:
            raise ApplicationError(
                f"Function {meta.namespace}/{meta.name} exists with uid {self._uid}; the manifest "
                f"names uid {meta.uid} ({FUNCTION_CONFLICT_HINT})",
                type=FUNCTION_CONFLICT,
                non_retryable=True,
            )
        self._not_deleting("apply")

    @workflow.update(name=UPDATE_SCALE)
    def scale(self, input: ScaleInput) -> ScaleResult:
        previous, self._wanted = self._wanted, input.replicas
        # the autoscaler keeps it as one of its own decisions: held for scaleDownDelaySeconds
        self._held = (workflow.now().timestamp(), input.replicas)
        self._changed = True
        return ScaleResult(previous=previous, wanted=self._wanted)

    @scale.validator
    def _scale_allowed(self, input: ScaleInput) -> None:
        self._not_deleting("scale")
        scale = self._revisions[-1].spec.scale
        if not scale.min <= input.replicas <= scale.max:
            raise ApplicationError(
                f"scale: {input.replicas} replicas is outside the Function's scale {scale.min}..{scale.max}",
                type="ScaleOutOfRange",
                non_retryable=True,
            )

    @workflow.update(name=UPDATE_ROLLBACK)
    def rollback(self) -> ApplyResult:
        """The previous revision's template again, as a new revision (rolled out like any)."""
        previous, current = self._revisions[-2], self._revisions[-1]
        spec = previous.spec._replace(scale=current.spec.scale, traffic=None)  # all to it
        self._fn = self._fn._replace(spec=spec)
        revision = self._new_revision(spec)
        return ApplyResult(
            revision=revision,
            changed=True,
            message=f"revision {revision} is revision {previous.revision}'s template",
        )

    @rollback.validator
    def _rollback_allowed(self) -> None:
        self._not_deleting("rollback")
        if len(self._revisions) < 2:
            raise ApplicationError(
                "rollback: the Function has no previous revision",
                type="NoPreviousRevision",
                non_retryable=True,
            )

    @workflow.update(name=UPDATE_DELETE)
    async def delete(self) -> str:
        """Delete every replica, then end the workflow. The answer is one plain line; the final
        status is the workflow's result."""
        self._deleting = True
        self._changed = True
        await workflow.wait_condition(lambda: self._ended)
        return summaries.summary(f"deleted {workflow.info().workflow_id}: {self._status.message}")

    def _traffic_allowed(self, spec: FunctionSpec) -> None:
        """A split may name only the revisions the Function keeps after this apply: the current
        (0, `latest`) and the previous one."""
        if spec.traffic is None:
            return
        if not self._splits:
            raise ApplicationError(
                "apply: this Function's workflow predates traffic splits; apply it without "
                "spec.traffic, or delete and create it again",
                type="InvalidFunction",
                non_retryable=True,
            )
        current = self._revisions[-1]
        if spec.same_template(current.spec):
            kept = [r.revision for r in self._revisions]
        else:
            kept = [current.revision, current.revision + 1]
        named = sorted({t.revision for t in spec.traffic if t.revision} - set(kept))
        if named:
            raise ApplicationError(
                f"apply: spec.traffic names revision {', '.join(map(str, named))}; a split may name "
                f"only the revisions the Function keeps: {' and '.join(map(str, kept))} (0: the latest)",
                type="InvalidFunction",
                non_retryable=True,
            )

    def _not_deleting(self, what: str) -> None:
        if self._deleting:
            raise ApplicationError(
                f"{what}: the Function is being deleted", type="FunctionDeleting", non_retryable=True
            )

    # -- the lifecycle -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: FunctionInput) -> FunctionStatus:
        if not self._uid:
            raise ApplicationError(
                "metadata.uid must be set when a Function is started",
                type="InvalidFunction",
                non_retryable=True,
            )
        wanted = search_typed.function_values(self._fn)
        present = workflow.info().typed_search_attributes
        missing = [key.value_set(value) for key, value in wanted if present.get(key) != value]
        if missing and input.state is None:  # a run after continue-as-new inherits them
            workflow.upsert_search_attributes(missing)
        self._indexed_phase = FunctionPhase.Pending.value
        self._autoscale = workflow.patched(PATCH_AUTOSCALE)
        self._admits = workflow.patched(PATCH_REPLICA_ADMITS)
        self._admits_early = self._admits and workflow.patched(PATCH_ADMIT_EARLY)
        self._splits = workflow.patched(PATCH_TRAFFIC)
        self._split_wanted = self._splits and workflow.patched(PATCH_SPLIT_WANTED)
        if self._autoscale:
            self._scaler = asyncio.create_task(self._autoscale_loop())
        while not self._deleting:
            self._changed = False
            self._take_ended()
            await self._converge()
            self._refresh()
            if self._continue_as_new_due():
                workflow.continue_as_new(FunctionInput(function=self._fn, state=self._carried()))
            if self._changed:
                continue
            timeout = self._next_wake()
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._changed or self._deleting,
                    timeout=timeout,
                    timeout_summary=summaries.summary(f"next look in {timeout:g} s")
                    if timeout is not None
                    else None,
                )
        await self._delete_all()
        if self._scaler is not None:
            await self._scaler  # its activity's cancellation, answered within a heartbeat
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._status

    # -- autoscaling -------------------------------------------------------------------------------

    def _load_targets(self) -> list[LoadTarget]:
        return [
            LoadTarget(runUid=r.runUid, address=r.address, registrationId=r.registrationId)
            for r in self._replicas
            if not r.deleting and r.phase is RunPhase.Ready and r.address and r.registrationId
        ]

    def _autoscale_key(self) -> tuple[object, ...]:
        """What an autoscaling activity was started with: when it changes, it is started again."""
        spec = self._revisions[-1].spec
        targets = tuple(
            (r.runUid, r.address, r.registrationId)
            for r in self._replicas
            if not r.deleting and r.phase is RunPhase.Ready and r.address and r.registrationId
        )
        return (targets, self._wanted, spec.scale, spec.target_concurrency)

    async def _autoscale_loop(self) -> None:
        """While the Function may scale (max > min): one autoscaling activity after another, each
        decision that changes `wanted` applied as the `scale` update would be."""
        while not self._deleting:
            spec = self._revisions[-1].spec
            if not _autoscaled(spec.scale):
                await workflow.wait_condition(
                    lambda: self._deleting or _autoscaled(self._revisions[-1].spec.scale)
                )
                continue
            self._take_held()
            key, wakes = self._autoscale_key(), self._wakes
            scale = spec.scale
            handle = workflow.start_activity(
                "autoscale_function",
                AutoscaleInput(
                    functionUid=self._uid,
                    namespace=self._fn.metadata.namespace,
                    name=self._fn.metadata.name,
                    min=scale.min,
                    max=scale.max,
                    target=spec.target_concurrency,
                    scaleDownDelaySeconds=scale.scaleDownDelaySeconds,
                    stableWindowSeconds=scale.stableWindowSeconds,
                    current=self._wanted,
                    replicas=self._load_targets(),
                    window=self._window,
                    maxSeconds=AUTOSCALE_LIFE_S,
                ),
                result_type=AutoscaleResult,
                start_to_close_timeout=AUTOSCALE_TIMEOUT,
                heartbeat_timeout=AUTOSCALE_HEARTBEAT,
                retry_policy=AUTOSCALE_RETRY,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=summaries.summary(f"autoscale from {self._wanted} replicas"),
            )
            await workflow.wait_condition(
                lambda handle=handle, key=key: handle.done() or self._deleting or self._autoscale_key() != key  # type: ignore[misc]
            )
            if not handle.done():
                handle.cancel()
            try:
                result = await handle
            except ActivityError as err:
                if not isinstance(err.cause, CancelledError):
                    workflow.logger.warning(
                        "the autoscaler of %s failed: %s", workflow.info().workflow_id, err
                    )
                    await workflow.sleep(AUTOSCALE_PAUSE)
                continue
            if wakes != self._wakes:
                continue  # woken meanwhile: its memory (a quiet window) and decision are stale
            self._window = result.window
            self._take_decision(result)

    def _take_held(self) -> None:
        if self._held is None:
            return
        window = self._window or ScaleWindow()
        wanted = [*window.wanted, self._held][-MAX_CARRIED_WANTED:]
        self._window, self._held = window._replace(wanted=wanted), None

    def _take_decision(self, result: AutoscaleResult) -> None:
        """The autoscaler's decision, if it still applies (`wanted` is what it decided from)."""
        if not result.changed or self._deleting or result.previous != self._wanted:
            return
        wanted = _clamp(result.wanted, self._revisions[-1].spec.scale)
        if wanted == self._wanted:
            return
        self._last_scale = ScaleEvent(
            previous=self._wanted,
            wanted=wanted,
            reason=result.reason,
            message=result.message,
            at=workflow.now(),
        )
        self._wanted = wanted
        self._changed = True

    def _new_revision(self, spec: FunctionSpec) -> int:
        revision = self._revisions[-1].revision + 1
        now = workflow.now()
        self._revisions = [*self._revisions, Revision(revision=revision, spec=spec, createdAt=now)][
            -MAX_REVISIONS_KEPT:
        ]
        self._wanted = _clamp(self._wanted, spec.scale)
        self._failures, self._retry_at, self._last_failure = 0, None, ""
        self._rollout_since = now
        self._changed = True
        return revision

    def _take_ended(self) -> None:
        """Forget the replicas that ended; one that ended before it was ever Ready (and was not
        asked to go) is a failure: the next start waits a backoff that grows with them."""
        now = workflow.now()
        kept = []
        for replica in self._replicas:
            if replica.phase not in TERMINAL_PHASES:
                kept.append(replica)
                continue
            if replica.deleting or replica.wasReady or self._deleting:
                continue
            self._failures += 1
            self._retry_at = now + timedelta(seconds=start_backoff(self._failures))
            said = f"{replica.reason}: {replica.message}" if replica.message else replica.reason
            self._last_failure = f"replica {replica.name} ended {replica.phase.value} before Ready ({said})"
        self._replicas = kept

    def _split(self) -> dict[int, int]:
        """The traffic split in force (revision → percent) over the revisions kept; {}: none."""
        if not self._splits:
            return {}
        current = self._revisions[-1]
        split = current.spec.split(current.revision)
        kept = {r.revision for r in self._revisions}
        return split if set(split) <= kept else {}

    def _shares(self) -> dict[int, int]:
        """Replicas wanted of each revision: the current one's and those a split keeps."""
        current = self._revisions[-1]
        split = self._split()
        if not split:
            return {current.revision: self._wanted}
        if self._split_wanted:
            shares = split_wanted(self._wanted, split, maximum=current.spec.scale.max)
            return {current.revision: 0, **shares}
        older = {r: older_replicas(self._wanted, p) for r, p in split.items() if r != current.revision}
        return {**older, current.revision: self._wanted}

    async def _converge(self) -> None:
        """Start and delete replicas as functionlife.plan says."""
        current = self._revisions[-1]
        shares = self._shares()
        older = {revision: n for revision, n in shares.items() if revision != current.revision}
        decided = plan(
            revision=current.revision,
            wanted=shares[current.revision],
            replicas=self._replicas,
            now=workflow.now(),
            retry_at=self._retry_at,
            older=older,
        )
        if decided.rolled_out:
            self._observed = current.revision
            self._rollout_since = None
        doomed = set(decided.delete)
        self._replicas = [r._replace(deleting=True) if r.runUid in doomed else r for r in self._replicas]
        starts = [current] * decided.start
        for number, count in decided.start_older:
            starts += [r for r in self._revisions if r.revision == number] * count
        if starts:
            await asyncio.gather(*(self._start_replica(revision) for revision in starts))
        await self._send_deletes()

    async def _start_replica(self, revision: Revision) -> None:
        fn, info = self._fn, workflow.info()
        uid = RunUid(str(workflow.uuid4()))
        name = replica_name(fn.metadata.name, revision.revision, uid)
        labels = {
            **fn.metadata.labels,
            FUNCTION_LABEL: fn.metadata.name,
            REVISION_LABEL: str(revision.revision),
        }
        run = Run(
            apiVersion=API_VERSION,
            kind=KIND,
            metadata=Metadata(
                name=name,
                namespace=fn.metadata.namespace,
                uid=uid,
                labels=labels,
                creator=fn.metadata.creator,
            ),
            spec=revision.spec.template(),
        )
        self._replicas.append(
            Replica(runUid=uid, name=name, revision=revision.revision, startedAt=workflow.now())
        )
        self._started += 1
        replica_of = ReplicaOf(
            functionUid=self._uid, functionName=fn.metadata.name, revision=revision.revision
        )
        workflow_id = run_workflow_id(fn.metadata.namespace, name)
        early = self._admits_early and await self._admit_early(run, workflow_id)
        try:
            handle = await workflow.start_child_workflow(
                "RunWorkflow",
                RunInput(run=run, statusMemo=True, replicaOf=replica_of, starterAdmits=self._admits),
                id=workflow_id,
                task_queue=info.task_queue,
                result_type=RunStatus,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=search_typed.replica_at_start(run, function_uid=self._uid),
                static_summary=summaries.summary(
                    f"replica of Function {fn.metadata.namespace}/{fn.metadata.name}, "
                    f"revision {revision.revision}"
                ),
                static_details=summaries.run_details(run),
            )
        except WorkflowAlreadyStartedError:  # its name taken: it counts as a failure
            self._set(uid, phase=RunPhase.Failed, reason="StartFailed", message=f"{name} exists already")
            if early:  # the pool holds a slot for a replica that never ran: free it
                with contextlib.suppress(FailureError):
                    await workflow.get_external_workflow_handle(pool_workflow_id(run.spec.runtime)).signal(
                        SIGNAL_RELEASE, ReleaseSignal(runUid=uid)
                    )
            return
        self._set(uid, runId=handle.first_execution_run_id or "")
        self._watches.append(asyncio.create_task(self._watch(handle, uid)))
        if self._admits and not early:
            await self._admit(run, handle.id, handle.first_execution_run_id)

    async def _admit_early(self, run: Run, workflow_id: str) -> bool:
        """The replica's admission sent before its start, if the worker says the pool's answer
        will wait for the replica's first task in its mailbox (kruntimes.activities.handoff);
        False when it was not sent: it follows the start then."""
        try:
            sent: bool = await workflow.execute_local_activity(
                "admit_run_early",
                admit_signal(run, workflow_id=workflow_id, at=workflow.now(), handoff=True),
                result_type=bool,
                start_to_close_timeout=REPLICA_ADMIT_TIMEOUT,
                retry_policy=REPLICA_ADMIT_EARLY_RETRY,
                summary=summaries.summary(f"admit {run.metadata.name} to pool/{run.spec.runtime} first"),
            )
        except ActivityError as err:
            workflow.logger.warning("the early admission of %s was not sent: %s", workflow_id, err)
            return False
        return sent

    async def _admit(self, run: Run, workflow_id: str, run_id: str | None) -> None:
        """The replica's admission to its pool, as the SDK sends a Run's (kruntimes.sdk.starting):
        a runtime without a pool rejects it at once. Not sent: the replica asks the pool itself
        once its admission grace is over."""
        try:
            delivered = await workflow.execute_local_activity(
                "admit_run",
                admit_signal(run, workflow_id=workflow_id, at=workflow.now(), handoff=True),
                result_type=bool,
                start_to_close_timeout=REPLICA_ADMIT_TIMEOUT,
                retry_policy=REPLICA_ADMIT_RETRY,
                summary=summaries.summary(f"admit {run.metadata.name} to pool/{run.spec.runtime}"),
            )
        except ActivityError as err:
            workflow.logger.warning("the admission of %s was not sent: %s", workflow_id, err)
            return
        if not delivered:
            with contextlib.suppress(FailureError):  # it finds out itself after its grace
                await workflow.get_external_workflow_handle(workflow_id, run_id=run_id).signal(
                    SIGNAL_REJECTED, runtime_unknown(run)
                )

    async def _watch(self, handle: Any, uid: str) -> None:
        """A replica whose workflow closed without telling its end (terminated) ends here too."""
        with contextlib.suppress(ChildWorkflowError):
            await handle
        for replica in self._replicas:
            if replica.runUid == uid and replica.phase not in TERMINAL_PHASES:
                self._set(uid, phase=RunPhase.Failed, reason="WorkflowClosed", message="its workflow closed")
                self._changed = True

    def _set(self, uid: str, **changes: object) -> None:
        self._replicas = [r._replace(**changes) if r.runUid == uid else r for r in self._replicas]

    async def _send_deletes(self) -> None:
        pending = [
            r for r in self._replicas if r.deleting and not r.deleteSent and r.phase not in TERMINAL_PHASES
        ]
        if pending:
            await asyncio.gather(*(self._send_delete(r) for r in pending))

    async def _send_delete(self, replica: Replica) -> None:
        if not replica.runId:  # never started
            self._set(replica.runUid, phase=RunPhase.Cancelled, reason="NotStarted", deleteSent=True)
            return
        try:
            result = await workflow.execute_activity(
                "delete_replica",
                DeleteReplicaInput(
                    workflowId=run_workflow_id(self._fn.metadata.namespace, replica.name),
                    runId=replica.runId,
                    runUid=replica.runUid,
                ),
                result_type=DeleteReplicaResult,
                start_to_close_timeout=DELETE_REPLICA_TIMEOUT,
                retry_policy=DELETE_REPLICA_RETRY,
                summary=summaries.summary(f"delete replica {replica.name}"),
            )
        except ActivityError as err:
            workflow.logger.warning("the delete of replica %s was not sent: %s", replica.name, err)
            return  # tried again at the next look (DELETE_RESEND)
        if result.accepted:
            self._set(replica.runUid, deleteSent=True)
        else:  # its workflow had closed: nothing to wait for
            self._set(replica.runUid, phase=RunPhase.Cancelled, reason="Gone", deleteSent=True)

    async def _delete_all(self) -> None:
        """Delete every replica and wait (within DELETE_BOUND) for each to end."""
        deadline = workflow.now() + DELETE_BOUND
        self._replicas = [r._replace(deleting=True) for r in self._replicas]
        while True:
            self._changed = False
            self._take_ended()
            self._refresh()
            if not self._replicas or workflow.now() >= deadline:
                break
            await self._send_deletes()
            left = (deadline - workflow.now()).total_seconds()
            wait = min(left, DELETE_RESEND.total_seconds())
            if wait <= 0:
                continue
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._changed,
                    timeout=wait,
                    timeout_summary=summaries.summary(f"{len(self._replicas)} replicas to end"),
                )
        left_over = len(self._replicas)
        message = (
            "every replica deleted"
            if not left_over
            else f"{left_over} replicas had not ended within {DELETE_BOUND.total_seconds():g} s"
        )
        self._refresh(final=FunctionPhase.Deleted, message=message)
        self._ended = True

    def _continue_as_new_due(self) -> bool:
        info = workflow.info()
        due = info.is_continue_as_new_suggested() or info.get_current_history_length() >= MAX_RUN_EVENTS
        return due and workflow.all_handlers_finished() and not self._deleting

    def _carried(self) -> FunctionState:
        return FunctionState(
            revisions=self._revisions,
            wanted=self._wanted,
            replicas=self._replicas,
            observedRevision=self._observed,
            failures=self._failures,
            retryAt=self._retry_at,
            lastFailure=self._last_failure,
            deleting=self._deleting,
            started=self._started,
            rolloutSince=self._rollout_since,
            everReady=self._ever_ready,
            endpoint=self._endpoint,
            scaleWindow=self._window,
            lastScale=self._last_scale,
        )

    def _next_wake(self) -> float | None:
        """Seconds until something is due without a message: a start after its backoff, the
        rollout's bound, a delete to send again."""
        now = workflow.now()
        due: list[datetime] = []
        if self._retry_at is not None and self._retry_at > now:
            due.append(self._retry_at)
        if self._rollout_since is not None and self._rollout_since + ROLLOUT_BOUND > now:
            due.append(self._rollout_since + ROLLOUT_BOUND)
        if any(r.deleting and not r.deleteSent for r in self._replicas):
            due.append(now + DELETE_RESEND)
        if not due:
            return None
        return max((min(due) - now).total_seconds(), 0.001)

    # -- status ----------------------------------------------------------------------------------

    def _refresh(self, *, final: FunctionPhase | None = None, message: str = "") -> None:
        now = workflow.now()
        current = self._revisions[-1].revision
        failing_at_zero = self._failures > 0 and workflow.patched(PATCH_ZERO_FAILING)
        phase = final or phase_of(
            wanted=self._wanted,
            replicas=self._replicas,
            deleting=self._deleting,
            ever_ready=self._ever_ready,
            failing=failing_at_zero,
        )
        self._ever_ready = self._ever_ready or phase is FunctionPhase.Ready
        live = [r for r in self._replicas if not r.deleting]
        # with a divided split, every revision it serves counts: the current one has only its share
        serving = (set(self._split()) if self._split_wanted else set()) or {current}
        ready = sum(1 for r in live if r.revision in serving and r.phase is RunPhase.Ready)
        if not message:
            message = self._message(phase, ready)
        status = FunctionStatus(
            phase=phase,
            revision=current,
            observedRevision=self._observed,
            replicas=ReplicaCounts(wanted=self._wanted, ready=ready, total=len(self._replicas)),
            endpoint=self._endpoint if phase is not FunctionPhase.Deleted else None,
            conditions=self._status.conditions,
            message=message,
            lastScale=self._last_scale,
            traffic=[TrafficTarget(revision=r, percent=p) for r, p in sorted(self._split().items())],
        )
        status = status.with_condition(
            _condition(FunctionConditionType.Ready, phase is FunctionPhase.Ready, phase.value, message, now)
        )
        status = status.with_condition(self._progressing(now, ready))
        failing = self._failures > 0
        status = status.with_condition(
            _condition(
                FunctionConditionType.ReplicaFailure,
                failing,
                "ReplicasEndBeforeReady" if failing else "NoFailure",
                self._failure_message(now) if failing else "",
                now,
            )
        )
        self._status = status
        if status != self._memo:
            workflow.upsert_memo({FUNCTION_STATUS_MEMO: status})
            self._memo = status
        indexed = search.DELETED if phase is FunctionPhase.Deleted else phase.value
        if indexed != self._indexed_phase:
            workflow.upsert_search_attributes([search_typed.KRT_PHASE.value_set(indexed)])
            self._indexed_phase = indexed
        if self._splits:
            self._index_traffic()
        workflow.set_current_details(function_summaries.function_current(status))

    def _index_traffic(self) -> None:
        """KrtTraffic (the split the gateways honour) and KrtTrafficSince, when the split changed."""
        split = {} if self._deleting else self._split()
        value = search.traffic_value(split)
        if value == self._indexed_traffic:
            return
        key = search_typed.KRT_TRAFFIC
        workflow.upsert_search_attributes(
            [
                key.value_set(value) if value else key.value_unset(),
                search_typed.KRT_TRAFFIC_SINCE.value_set(workflow.now()),
            ]
        )
        self._indexed_traffic = value

    def _message(self, phase: FunctionPhase, ready: int) -> str:
        if phase is FunctionPhase.Deleting:
            return f"deleting {len(self._replicas)} replicas"
        said = f"{ready} of {self._wanted} replicas of {self._serving()} Ready"
        if self._rollout_since is not None and self._observed:
            said += f"; revision {self._observed} serves until then"
        if self._failures:
            said += f"; {self._last_failure}"
        return said

    def _progressing(self, now: datetime, ready: int) -> Condition:
        current = self._revisions[-1].revision
        since = self._rollout_since
        if since is None:
            return _condition(
                FunctionConditionType.Progressing, False, "RolledOut", f"revision {current} serves", now
            )
        if now >= since + ROLLOUT_BOUND:
            return _condition(
                FunctionConditionType.Progressing,
                False,
                "ProgressDeadlineExceeded",
                f"{self._serving()}: {ready} of {self._wanted} replicas Ready after "
                f"{ROLLOUT_BOUND.total_seconds():g} s; the older replicas keep serving",
                now,
            )
        return _condition(
            FunctionConditionType.Progressing,
            True,
            "RollingOut",
            f"{self._serving()}: {ready} of {self._wanted} replicas Ready",
            now,
        )

    def _serving(self) -> str:
        """The revisions `replicas.ready` counts, as the status messages name them."""
        split = sorted(self._split()) if self._split_wanted else []
        if len(split) < 2:
            return f"revision {self._revisions[-1].revision}"
        return f"revisions {' and '.join(map(str, split))}"

    def _failure_message(self, now: datetime) -> str:
        said = f"{self._failures} replicas in a row ended before Ready; the last: {self._last_failure}"
        if self._retry_at is not None and self._retry_at > now:
            said += f"; the next starts in {(self._retry_at - now).total_seconds():g} s"
        return said


def _condition(type_: str, true: bool, reason: str, message: str, at: datetime) -> Condition:
    return Condition(
        type=type_,
        status=ConditionStatus.TRUE if true else ConditionStatus.FALSE,
        reason=reason,
        message=message,
        lastTransitionTime=at,
    )


def _endpoint(fn: Function, told: ReplicaPhase) -> Endpoint | None:
    url = function_invoke_url(
        told.gatewayUrl, namespace=fn.metadata.namespace, function_uid=fn.metadata.uid or ""
    )
    try:
        return Endpoint(protocol=EndpointProtocol.HTTPS, url=url, caBundle=told.caBundle)
    except ValueError:
        return None
