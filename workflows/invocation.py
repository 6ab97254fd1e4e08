"""InvocationWorkflow (invocation/{namespace}/{target uid}/{invocation id}): one async invocation
(issue #44; docs/async-invocations.md), from Queued to Succeeded, Failed or Unknown, then kept for
the target's retention.

Each round reads the target (`invocation_target`, a local activity: its policy, whether it exists
and is Ready): a target that is gone fails the invocation (TargetGone), one not Ready yet is waited
for without an attempt. An attempt is one `attempt_invocation` activity with the activity's retries off: the
workflow alone decides what follows (kruntimes.decisions.invocations), so an attempt that may
have run is never repeated behind its back. The status is upserted to the memo INVOCATION_STATUS_MEMO
at each change (a fresh run's Queued excepted: the gateway reads a run without the memo as Queued)
and answered by QUERY_INVOCATION; KrtPhase indexes the state.

Once ended, the status is POSTed to the callback URL (the request's, else the target's) by
`deliver_callback`, each delivery one activity, at most MAX_CALLBACK_DELIVERIES with backoff; the
last failures stay on the status. Then the workflow stays open until expiresAt (endedAt + the
retention: a durable timer), so the id is remembered and its status read, and completes with it.

History: a Run's attempts are at most retry.maxAttempts (<= 100), but a Function keeps an
invocation that did not run while it exists, and a Run not Ready yet is waited for: a long wait
continues as new with the status carried (InvocationInput.carried) once the history is long.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from kruntimes.api.limits import DEFAULT_INVOKE_TIMEOUT_SECONDS
    from kruntimes.contracts.invocation import (
        ACTIVITY_ATTEMPT,
        ACTIVITY_CALLBACK,
        ACTIVITY_TARGET,
        ATTEMPT_SENT,
        INVOCATION_DIGEST_MEMO,
        INVOCATION_STATUS_MEMO,
        INVOCATION_WORKFLOW,
        MAX_ATTEMPTS_KEPT,
        MAX_CALLBACK_FAILURES_KEPT,
        QUERY_INVOCATION,
        Attempt,
        AttemptOutcome,
        AttemptRequest,
        CallbackOutcome,
        CallbackRequest,
        CallbackState,
        InvocationError,
        InvocationInput,
        InvocationPolicy,
        InvocationState,
        InvocationStatus,
        Target,
    )
    from kruntimes.decisions.invocations import (
        ATTEMPT_NOT_STARTED,
        Next,
        backoff_seconds,
        callback_origin,
        decide,
        next_without_attempt,
        waits_its_turn,
    )
    from kruntimes.wire import search_typed, summaries
    from kruntimes.wire.invocation_summaries import target_text
    from kruntimes.workflows.common import failure_text, failure_type

# Reading the target is a read: retried by Temporal a few times, then counted by the workflow.
TARGET_TIMEOUT = timedelta(seconds=30)
TARGET_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=5
)
MAX_TARGET_READ_FAILURES = 20  # rounds in a row without an answer: Failed TargetUnreadable
# An attempt is never retried by Temporal: its outcome is the workflow's to judge.
NO_RETRY = RetryPolicy(maximum_attempts=1)
# Beyond the invocation's own timeout: the gateway's hold for a replica counts within that
# timeout, so the margin covers the gateway's dispatch and the answer's way back.
ATTEMPT_MARGIN = timedelta(seconds=60)
ATTEMPT_HEARTBEAT = timedelta(seconds=30)  # the activity beats while it waits: a lost worker is seen
ATTEMPT_LOST = "AttemptLost"  # the attempt's activity failed or timed out: it may have run
# The attempt's activity records that it sends before it does (AttemptRequest.marksDispatch), so an
# activity that timed out without that record never ran: a task the server started for a poll
# whose answer was lost (temporalio/temporal#11733) is tried again instead of ending Unknown.
PATCH_ATTEMPT_NOT_SENT = "invocation-attempt-not-sent"
CALLBACK_TIMEOUT = timedelta(seconds=60)
MAX_CALLBACK_DELIVERIES = 10
TARGET_UNREADABLE = "TargetUnreadable"
# A target not found by its uid this soon after the accept is waited for (visibility lags a target
# just created); past it, not found is gone.
UNLISTED_GRACE_S = 30.0
# A run this long continues as new while it waits for an attempt (well under Temporal's limits: a
# body of up to a MiB rides in every attempt's input). The callback's deliveries are bounded
# (MAX_CALLBACK_DELIVERIES, each its status with the result) and never continue as new.
CONTINUE_AFTER_EVENTS = 2_000
CONTINUE_AFTER_BYTES = 8 * 1024 * 1024


def _keep(attempts: list[Attempt]) -> list[Attempt]:
    """The first half and the last half of MAX_ATTEMPTS_KEPT attempts."""
    if len(attempts) <= MAX_ATTEMPTS_KEPT:
        return attempts
    half = MAX_ATTEMPTS_KEPT // 2
    return [*attempts[:half], *attempts[-(MAX_ATTEMPTS_KEPT - half) :]]


def _never_sent(err: ActivityError) -> bool:
    """An attempt's activity that timed out without recording ATTEMPT_SENT in its heartbeat: it
    marks before it sends, so it never sent (a failure of its own may have come after sending)."""
    cause = err.cause
    return isinstance(cause, ActivityTimeout) and ATTEMPT_SENT not in list(cause.last_heartbeat_details)


def _current(status: InvocationStatus) -> str:
    """The Temporal UI's current details: state, attempts, target, why retried, the error."""
    target = status.target
    attempts = status.attemptCount
    lines = [
        f"**{status.state.value}** · {attempts} attempt{'s' if attempts != 1 else ''} · "
        + target_text(kind=target.kind.value, namespace=target.namespace, name=target.name, uid=target.uid)
    ]
    if status.retried:
        lines.append(f"last retried: {status.retried}")
    if status.error is not None:
        lines.append(f"{status.error.reason}: {status.error.message}")
    if status.callback is not None:
        delivered = "delivered" if status.callback.delivered else "not delivered"
        lines.append(f"callback {delivered} after {status.callback.attempts} deliveries")
    if status.expiresAt is not None:
        lines.append(f"kept until {status.expiresAt.isoformat()}")
    return summaries.details("\n\n".join(lines))


@workflow.defn(name=INVOCATION_WORKFLOW)
class InvocationWorkflow:
    @workflow.init
    def __init__(self, input: InvocationInput) -> None:
        self._input = input
        self._status = input.carried or InvocationStatus(
            invocationId=input.invocationId,
            target=input.target,
            state=InvocationState.Queued,
            acceptedAt=input.acceptedAt,
        )
        self._memo: InvocationStatus | None = None
        self._indexed = ""
        self._ran = input.carriedRan
        self._turns = input.carriedTurns
        self._not_started = 0  # this run's attempts that never started (bounded, so never carried)
        self._marks = False

    @workflow.query(name=QUERY_INVOCATION)
    def invocation(self) -> InvocationStatus:
        return self._status

    @workflow.run
    async def run(self, input: InvocationInput) -> InvocationStatus:
        self._marks = workflow.patched(PATCH_ATTEMPT_NOT_SENT)
        self._index_target()
        if input.carried is not None:
            self._take_result_back()
            self._publish(self._status)
        else:  # Queued is what the gateway reads without a memo: the first write is Running's
            workflow.set_current_details(_current(self._status))
        policy, ended = await self._attempts(input)
        ended = await self._deliver(input, policy, ended)
        if ended.expiresAt is not None:
            left = (ended.expiresAt - workflow.now()).total_seconds()
            if left > 0:
                await workflow.sleep(
                    left, summary=summaries.summary(f"retention {policy.retentionSeconds} s")
                )
        return ended

    def _carried_memo(self) -> dict[str, Any]:
        """The memo the next run starts with, named in full (a server copies the start's memo, not
        always what was upserted since): the status, and the body's digest the gateway set."""
        memo: dict[str, Any] = {INVOCATION_STATUS_MEMO: self._status}
        if INVOCATION_DIGEST_MEMO in workflow.info().raw_memo:
            try:
                memo[INVOCATION_DIGEST_MEMO] = workflow.memo_value(INVOCATION_DIGEST_MEMO, type_hint=str)
            except Exception:  # not the gateway's digest: nothing to keep comparing bodies with
                workflow.logger.warning("the digest memo is unreadable; not carried")
        return memo

    def _take_result_back(self) -> None:
        """After a continue-as-new: the result the input left out, from the memo the run inherited."""
        try:
            kept = workflow.memo_value(INVOCATION_STATUS_MEMO, None, type_hint=InvocationStatus)
        except Exception:  # a memo this code cannot read: the next answer sets a result again
            return
        if isinstance(kept, InvocationStatus) and kept.result is not None:
            self._status = self._status._replace(result=kept.result)
            if kept == self._status:
                self._memo = kept  # what the memo holds already

    # -- attempts --------------------------------------------------------------------------------

    async def _attempts(self, input: InvocationInput) -> tuple[InvocationPolicy, InvocationStatus]:
        """Read, attempt, decide, until the invocation ends: the last policy read, the final status."""
        target = input.target
        waited = 0
        unread = 0
        while True:
            policy = await self._read_target(target)
            if policy is None:
                unread += 1
                if unread >= MAX_TARGET_READ_FAILURES:
                    error = InvocationError(
                        reason=TARGET_UNREADABLE,
                        message=f"the {target.kind.value} could not be read {unread} times",
                    )
                    return InvocationPolicy(exists=False), self._end(
                        InvocationState.Failed, error, policy=None
                    )
                await self._wait(backoff_seconds(unread), why="read the target again")
                continue
            unread = 0
            if not policy.exists and not policy.found and self._in_grace():
                policy = policy._replace(exists=True, ready=False)  # not listed yet: visibility lags
            if not policy.exists or not policy.ready:
                step = next_without_attempt(policy=policy, kind=target.kind, waited=waited)
                if step.ends:
                    return policy, self._end(step.state, step.error, policy=policy)
                waited += 1
                await self._wait(step.retry_in_s, why=f"the {target.kind.value} is not Ready")
                continue
            waited = 0
            step = await self._attempt(input, policy)
            if step.ends:
                return policy, self._end(step.state, step.error, policy=policy)
            self._publish(self._status._replace(state=InvocationState.Queued, retried=step.retried))
            await self._wait(step.retry_in_s, why=f"backoff after attempt {self._status.attemptCount}")

    def _in_grace(self) -> bool:
        return (workflow.now() - self._input.acceptedAt).total_seconds() < UNLISTED_GRACE_S

    async def _read_target(self, target: Target) -> InvocationPolicy | None:
        try:
            # local: its read rides in the workflow task that then schedules the attempt (one
            # workflow task and one activity task fewer per round; its answer is a marker)
            policy: InvocationPolicy = await workflow.execute_local_activity(
                ACTIVITY_TARGET,
                target,
                result_type=InvocationPolicy,
                start_to_close_timeout=TARGET_TIMEOUT,
                retry_policy=TARGET_RETRY,
                summary=summaries.summary(
                    f"read {target.kind.value} {target.namespace}/{target.name or target.uid}"
                ),
            )
        except (ActivityError, ApplicationError, ActivityTimeout) as err:  # a local one's surfaces bare
            workflow.logger.warning("reading the target failed: %s", failure_type(err))
            return None
        return policy

    async def _attempt(self, input: InvocationInput, policy: InvocationPolicy) -> Next:
        now = workflow.now()
        n = self._status.attemptCount + 1
        started = Attempt(n=n, startedAt=now)
        self._publish(
            self._status._replace(
                state=InvocationState.Running,
                startedAt=self._status.startedAt or now,
                attempts=_keep([*self._status.attempts, started]),
                attemptCount=n,
            )
        )
        timeout = input.timeoutSeconds or float(DEFAULT_INVOKE_TIMEOUT_SECONDS)
        request = AttemptRequest(
            target=input.target,
            invocationId=input.invocationId,
            body=input.body,
            timeoutSeconds=input.timeoutSeconds,
            attempt=n,
            share=policy.share,
            marksDispatch=self._marks,
        )
        try:
            outcome: AttemptOutcome = await workflow.execute_activity(
                ACTIVITY_ATTEMPT,
                request,
                result_type=AttemptOutcome,
                start_to_close_timeout=timedelta(seconds=timeout) + ATTEMPT_MARGIN,
                heartbeat_timeout=ATTEMPT_HEARTBEAT,
                retry_policy=NO_RETRY,
                summary=summaries.summary(f"attempt {n} of {input.invocationId}"),
            )
        except ActivityError as err:  # a worker lost mid-attempt, a timeout: it may have run
            if self._marks and _never_sent(err):
                outcome = AttemptOutcome(httpStatus=0, reason=ATTEMPT_NOT_STARTED, dispatched=False)
                workflow.logger.warning("attempt %d timed out before it was sent: not run", n)
            else:
                outcome = AttemptOutcome(httpStatus=0, reason=ATTEMPT_LOST, dispatched=True)
                workflow.logger.warning("attempt %d lost: %s", n, failure_type(err))
        if outcome.dispatched:
            self._ran += 1
        not_started_before = self._not_started
        if waits_its_turn(outcome, not_started_before):
            self._turns += 1
        if outcome.reason == ATTEMPT_NOT_STARTED:
            self._not_started += 1
        ended = started._replace(
            endedAt=workflow.now(),
            httpStatus=outcome.httpStatus,
            reason=outcome.reason,
            dispatched=outcome.dispatched,
        )
        attempts = [*self._status.attempts[:-1], ended]
        result = outcome.body if outcome.httpStatus == 200 else self._status.result
        self._status = self._status._replace(attempts=attempts, result=result)
        return decide(
            outcome,
            policy=policy,
            kind=input.target.kind,
            attempts=n,
            ran=self._ran,
            waited_turns=self._turns,
            not_started_before=not_started_before,
        )

    async def _wait(self, seconds: float, *, why: str) -> None:
        """Sleep, then continue as new if the history is long: the status carried without its
        result (the memo keeps it), so the input stays one payload within Temporal's bound."""
        await workflow.sleep(seconds, summary=summaries.summary(f"{why}: {seconds:g} s"))
        info = workflow.info()
        if (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > CONTINUE_AFTER_EVENTS
            or info.get_current_history_size() > CONTINUE_AFTER_BYTES
        ):
            carried = self._input._replace(
                carried=self._status._replace(result=None), carriedRan=self._ran, carriedTurns=self._turns
            )
            workflow.continue_as_new(carried, memo=self._carried_memo())

    def _end(
        self, state: InvocationState, error: InvocationError | None, *, policy: InvocationPolicy | None
    ) -> InvocationStatus:
        now = workflow.now()
        retention = (policy or InvocationPolicy(exists=False)).retentionSeconds
        ended = self._status._replace(
            state=state, error=error, endedAt=now, expiresAt=now + timedelta(seconds=retention)
        )
        self._publish(ended)
        return ended

    # -- the callback ----------------------------------------------------------------------------

    async def _deliver(
        self, input: InvocationInput, policy: InvocationPolicy, ended: InvocationStatus
    ) -> InvocationStatus:
        url = input.callbackUrl or policy.callbackUrl
        if url is None:
            return ended
        state = ended.callback or CallbackState(url=callback_origin(url))
        while state.attempts < MAX_CALLBACK_DELIVERIES and not state.delivered:
            n = state.attempts + 1
            request = CallbackRequest(
                url=url,
                namespace=input.target.namespace,
                secretName=policy.callbackSecretName,
                creator=policy.creator,
                status=self._status._replace(callback=None),
                attempt=n,
            )
            final = False
            try:
                outcome: CallbackOutcome = await workflow.execute_activity(
                    ACTIVITY_CALLBACK,
                    request,
                    result_type=CallbackOutcome,
                    start_to_close_timeout=CALLBACK_TIMEOUT,
                    retry_policy=NO_RETRY,
                    summary=summaries.summary(f"callback {n} of {input.invocationId}"),
                )
            except ActivityError as err:
                cause = err.cause
                final = isinstance(cause, ApplicationError) and cause.non_retryable
                outcome = CallbackOutcome(
                    delivered=False, message=f"{failure_type(err)}: {failure_text(err)}"
                )
            failures = state.failures
            if not outcome.delivered:
                reason = f"HTTP{outcome.httpStatus}" if outcome.httpStatus else "NotDelivered"
                failure = InvocationError(reason=reason, message=outcome.message)
                failures = [*failures, failure][-MAX_CALLBACK_FAILURES_KEPT:]
            state = state._replace(delivered=outcome.delivered, attempts=n, failures=failures)
            self._publish(self._status._replace(callback=state))
            if final or state.delivered or n >= MAX_CALLBACK_DELIVERIES:
                break
            seconds = backoff_seconds(n)
            await workflow.sleep(seconds, summary=summaries.summary(f"callback again: {seconds:g} s"))
        return self._status

    # -- what others read ------------------------------------------------------------------------

    def _index_target(self) -> None:
        """The attributes a starter sets, upserted when missing (a start without them: the SDK)."""
        target = self._input.target
        wanted = search_typed.invocation_values(
            namespace=target.namespace,
            target_kind=target.kind.value,
            target_uid=target.uid,
            runtime=target.runtime,
            state=self._status.state.value,
        )
        present = workflow.info().typed_search_attributes
        missing = [key.value_set(value) for key, value in wanted if present.get(key) != value]
        if missing:
            workflow.upsert_search_attributes(missing)
        self._indexed = self._status.state.value

    def _publish(self, status: InvocationStatus) -> None:
        """The status: kept for the query, written to the memo when changed, its state indexed."""
        self._status = status
        if status != self._memo:
            workflow.upsert_memo({INVOCATION_STATUS_MEMO: status})
            self._memo = status
        if status.state.value != self._indexed:
            workflow.upsert_search_attributes([search_typed.KRT_PHASE.value_set(status.state.value)])
            self._indexed = status.state.value
        workflow.set_current_details(_current(status))
