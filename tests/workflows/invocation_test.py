"""InvocationWorkflow on the time-skipping test server, its activities replaced by scripted
stand-ins (the gateway's side is tested in tests/gateway): each ending, the retries the decisions
allow and no other, the status in the query and the memo, the callback, the retention (#44)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from kruntimes.contracts.invocation import (
    INVOCATION_STATUS_MEMO,
    MAX_ATTEMPTS_KEPT,
    MAX_CALLBACK_FAILURES_KEPT,
    QUERY_INVOCATION,
    CallbackOutcome,
    InvocationInput,
    InvocationPolicy,
    InvocationState,
    InvocationStatus,
    TargetKind,
)
from kruntimes.wire import search_typed
from kruntimes.workflows.invocation import (
    ATTEMPT_HEARTBEAT,
    ATTEMPT_MARGIN,
    MAX_CALLBACK_DELIVERIES,
    MAX_TARGET_READ_FAILURES,
    UNLISTED_GRACE_S,
)
from tests.workflows.invocations import (
    GONE,
    NOT_READY,
    StandIns,
    answered,
    invocation_worker,
    new_input,
    not_allowed,
    ready,
    refused,
    start,
    time_skipping,
)

HOUR = 3600


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with time_skipping() as env:
        yield env


@pytest.fixture
async def worker(env: WorkflowEnvironment) -> AsyncIterator[tuple[StandIns, str]]:
    standins = StandIns()
    async with invocation_worker(env.client, standins) as queue:
        yield standins, queue


async def timers(handle: WorkflowHandle[Any, Any]) -> list[float]:
    """The durations of the timers the workflow started, in order."""
    seconds = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            seconds.append(
                event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
            )
    return seconds


async def upserted(handle: WorkflowHandle[Any, Any]) -> list[set[str]]:
    """The names of the search attributes of each upsert, in order."""
    names = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            names.append(
                set(event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
            )
    return names


async def memo_status(handle: WorkflowHandle[Any, Any]) -> InvocationStatus:
    described = await handle.describe()
    status = await described.memo_value(INVOCATION_STATUS_MEMO, type_hint=InvocationStatus)
    assert isinstance(status, InvocationStatus)
    return status


async def test_a_success_is_kept_for_the_retention_then_completes_with_its_status(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    standins.script(input.target.uid).targets = [ready(retentionSeconds=HOUR, share=30)]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert ended.state is InvocationState.Succeeded and ended.attemptCount == 1
    assert json.loads(ended.result or "")["status"] == "Succeeded"
    assert ended.endedAt is not None and ended.expiresAt == ended.endedAt + timedelta(seconds=HOUR)
    assert (ended.retried, ended.error, ended.callback) == ("", None, None)
    [attempt] = ended.attempts
    assert (attempt.n, attempt.httpStatus, attempt.dispatched) == (1, 200, True)
    [request] = standins.script(input.target.uid).asked_attempts
    assert (request.body, request.attempt, request.share, request.invocationId) == (
        input.body,
        1,
        30,
        input.invocationId,
    )
    assert await timers(handle) == [HOUR]  # the retention, from its end
    scheduled = {
        e.activity_task_scheduled_event_attributes.activity_type.name: e.activity_task_scheduled_event_attributes
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    attempt_options = scheduled["attempt_invocation"]
    assert attempt_options.retry_policy.maximum_attempts == 1, "Temporal never retries an attempt"
    assert attempt_options.heartbeat_timeout.ToTimedelta() == ATTEMPT_HEARTBEAT, "a silent worker is seen"
    assert attempt_options.start_to_close_timeout.ToTimedelta() == timedelta(seconds=30) + ATTEMPT_MARGIN
    assert await memo_status(handle) == ended
    described = await handle.describe()
    attributes = described.typed_search_attributes
    assert attributes.get(search_typed.KRT_PHASE) == "Succeeded"
    assert attributes.get(search_typed.KRT_RUN_UID) == input.target.uid
    assert attributes.get(search_typed.KRT_NAMESPACE) == "demo"
    assert attributes.get(search_typed.KRT_RUNTIME) == "python"
    assert await upserted(handle) == [{"TemporalChangeVersion"}, {"KrtPhase"}, {"KrtPhase"}], (
        "the SDK's for the patch, then Running, Succeeded: the rest was set at the start"
    )


async def test_it_answers_its_query_while_kept_and_is_open_until_expires(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input(kind=TargetKind.Function)
    handle = await start(env.client, queue, input, as_gateway=False)  # as a plain client: indexed by itself

    async def ended() -> InvocationStatus:
        status: InvocationStatus = await handle.query(QUERY_INVOCATION, result_type=InvocationStatus)
        return status

    # the query waits on the workflow's tasks, not on the clock: it is answered as it ends
    for _ in range(50):
        status = await ended()
        if status.state is InvocationState.Succeeded:
            break
    assert status.state is InvocationState.Succeeded
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert metadata.current_details.startswith("**Succeeded** · 1 attempt · Function demo/echo"), metadata
    assert "kept until" in metadata.current_details
    await env.sleep(timedelta(hours=23))
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    assert (await ended()) == status
    assert (await handle.result()) == status
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(search_typed.KRT_FUNCTION) == input.target.uid
    assert attributes.get(search_typed.KRT_PHASE) == "Succeeded"


async def test_what_did_not_run_is_retried_with_backoff_then_succeeds(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.attempts = [refused(429, "FunctionBusy"), refused(0), refused(503, "RouteStale"), answered()]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert (ended.state, ended.attemptCount, ended.retried) == (InvocationState.Succeeded, 4, "notRun")
    assert [a.httpStatus for a in ended.attempts] == [429, 0, 503, 200]
    assert [r.attempt for r in script.asked_attempts] == [1, 2, 3, 4]
    assert (await timers(handle))[:3] == [1, 2, 4]
    assert len(script.asked_targets) == 4, "the target read before each attempt"


async def test_a_run_that_never_runs_it_fails_after_max_attempts(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.targets = [ready(retry={"maxAttempts": 3}, retentionSeconds=60)]
    script.attempts = [refused(429, "HostBusy")]
    ended = await (await start(env.client, queue, input)).result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Failed, 3)
    assert ended.error is not None and ended.error.reason == "NotRun" and "HostBusy" in ended.error.message
    assert ended.result is None


async def test_a_function_keeps_what_did_not_run_past_max_attempts(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input(kind=TargetKind.Function)
    script = standins.script(input.target.uid)
    script.targets = [ready(retry={"maxAttempts": 1})]
    script.attempts = [refused(503, "NoReadyReplica")] * 6 + [answered()]
    ended = await (await start(env.client, queue, input)).result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Succeeded, 7)


async def test_an_outcome_lost_is_unknown_and_not_retried(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.attempts = [refused(502, "OwnerUnreachable", dispatched=True), answered()]
    ended = await (await start(env.client, queue, input)).result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Unknown, 1)
    assert ended.error is not None and ended.error.reason == "OwnerUnreachable"
    assert len(script.asked_attempts) == 1


async def test_an_idempotent_target_retries_a_lost_outcome(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.targets = [ready(retry={"onUnknownOutcome": True})]
    script.attempts = [refused(504, "OwnerTimeout", dispatched=True), answered()]
    ended = await (await start(env.client, queue, input)).result()
    assert (ended.state, ended.attemptCount, ended.retried) == (
        InvocationState.Succeeded,
        2,
        "unknownOutcome",
    )


async def test_a_failed_attempt_activity_is_an_outcome_lost(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    standins.script(input.target.uid).attempts = [RuntimeError("the worker went away mid-call")]
    ended = await (await start(env.client, queue, input)).result()
    assert ended.state is InvocationState.Unknown and ended.error is not None
    assert ended.error.reason == "AttemptLost"
    assert len(standins.script(input.target.uid).asked_attempts) == 1, "the activity is not retried"


async def test_a_handler_error_fails_unless_the_target_retries_failures(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    failed = answered("HandlerError", error={"type": "ValueError", "message": "no"})
    plain = new_input()
    standins.script(plain.target.uid).attempts = [failed, answered()]
    ended = await (await start(env.client, queue, plain)).result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Failed, 1)
    assert ended.error is not None and (ended.error.reason, ended.error.message) == (
        "HandlerError",
        "ValueError: no",
    )
    assert json.loads(ended.result or "")["status"] == "HandlerError"
    retrying = new_input()
    script = standins.script(retrying.target.uid)
    script.targets = [ready(retry={"onFailure": True, "maxAttempts": 2})]
    script.attempts = [failed]
    again = await (await start(env.client, queue, retrying)).result()
    assert (again.state, again.attemptCount, again.retried) == (InvocationState.Failed, 2, "failure")


async def test_a_run_that_ends_while_it_waits_fails_it_target_gone(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.targets = [ready(), GONE]
    script.attempts = [refused(503, "RunNotReady")]
    ended = await (await start(env.client, queue, input)).result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Failed, 1)
    assert ended.error is not None and ended.error.reason == "TargetGone"
    assert "the Run ended Succeeded" in ended.error.message


async def test_a_run_not_ready_yet_is_waited_for_without_an_attempt(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.targets = [NOT_READY] * 8 + [ready()]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Succeeded, 1)
    assert (await timers(handle))[:8] == [1, 2, 4, 8, 16, 32, 60, 60]


async def test_a_target_that_cannot_be_read_fails_it_after_a_bound(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    down = ApplicationError("visibility down", type="Unavailable", non_retryable=True)  # one try a round
    standins.script(input.target.uid).targets = [down]
    ended = await (await start(env.client, queue, input)).result()
    assert ended.state is InvocationState.Failed and ended.error is not None
    assert ended.error.reason == "TargetUnreadable"
    assert not standins.script(input.target.uid).asked_attempts
    assert len(standins.script(input.target.uid).asked_targets) == MAX_TARGET_READ_FAILURES


async def test_the_status_lists_the_first_and_last_attempts_and_counts_all(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input(kind=TargetKind.Function)
    standins.script(input.target.uid).attempts = [refused(429, "ReplicasFull")] * 24 + [answered()]
    ended = await (await start(env.client, queue, input)).result()
    assert ended.attemptCount == 25 and len(ended.attempts) == MAX_ATTEMPTS_KEPT
    assert [a.n for a in ended.attempts] == [*range(1, 11), *range(16, 26)]


async def test_the_callback_is_retried_until_delivered_and_its_failures_kept(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input(callback="https://hooks.example.com/in")
    script = standins.script(input.target.uid)
    script.targets = [
        ready(callbackUrl="https://target.example.com/", callbackSecretName="hook-key", creator="cli:bob")
    ]
    script.callbacks = [
        CallbackOutcome(delivered=False, httpStatus=500, message="receiver failed"),
        RuntimeError("connection reset"),
        CallbackOutcome(delivered=True, httpStatus=204),
    ]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert ended.callback is not None
    assert (ended.callback.url, ended.callback.delivered, ended.callback.attempts) == (
        "https://hooks.example.com",  # its origin: a path or query may carry the hook's token
        True,
        3,
    )
    assert [f.reason for f in ended.callback.failures] == ["HTTP500", "NotDelivered"]
    first = script.asked_callbacks[0]
    assert (first.url, first.secretName, first.creator, first.namespace, first.attempt) == (
        "https://hooks.example.com/in",
        "hook-key",
        "cli:bob",
        "demo",
        1,
    )
    assert first.status.state is InvocationState.Succeeded and first.status.expiresAt is not None
    assert [r.attempt for r in script.asked_callbacks] == [1, 2, 3]
    assert (await timers(handle))[:2] == [1, 2]
    assert await memo_status(handle) == ended


async def test_a_callback_is_bounded_and_a_final_refusal_stops_it(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    never = new_input()
    script = standins.script(never.target.uid)
    script.targets = [ready(callbackUrl="https://target.example.com/")]
    script.callbacks = [CallbackOutcome(delivered=False, httpStatus=503)]
    ended = await (await start(env.client, queue, never)).result()
    assert ended.callback is not None and not ended.callback.delivered
    assert ended.callback.attempts == MAX_CALLBACK_DELIVERIES
    assert len(ended.callback.failures) == MAX_CALLBACK_FAILURES_KEPT
    assert ended.state is InvocationState.Succeeded, "a callback's failure is not the invocation's"
    refused_secret = new_input(callback="https://hooks.example.com/")
    standins.script(refused_secret.target.uid).callbacks = [not_allowed()]
    stopped = await (await start(env.client, queue, refused_secret)).result()
    assert stopped.callback is not None and stopped.callback.attempts == 1
    assert "SecretNotAllowed" in stopped.callback.failures[0].message


async def test_no_callback_without_a_url(env: WorkflowEnvironment, worker: tuple[StandIns, str]) -> None:
    standins, queue = worker
    input = new_input()
    ended = await (await start(env.client, queue, input)).result()
    assert ended.callback is None and not standins.script(input.target.uid).asked_callbacks


async def test_a_gone_target_keeps_the_default_retention(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    standins.script(input.target.uid).targets = [InvocationPolicy(exists=False, retentionSeconds=120)]
    ended = await (await start(env.client, queue, input)).result()
    assert ended.error is not None and ended.error.reason == "TargetGone" and ended.attemptCount == 0
    assert ended.endedAt is not None and ended.expiresAt == ended.endedAt + timedelta(seconds=120)


async def test_a_long_wait_continues_as_new_with_its_status_carried(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input(kind=TargetKind.Function)
    standins.script(input.target.uid).attempts = [refused(503, "NoReadyReplica")] * 200 + [answered()]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert (ended.state, ended.attemptCount, ended.acceptedAt) == (
        InvocationState.Succeeded,
        201,
        input.acceptedAt,
    )
    assert ended.attempts[0].n == 1 and ended.attempts[-1].n == 201
    latest = await env.client.get_workflow_handle(handle.id).describe()
    assert latest.run_id != handle.first_execution_run_id, "it continued as new"
    assert (await memo_status(env.client.get_workflow_handle(handle.id))) == ended
    assert (await latest.memo_value("krtDigest", type_hint=str)) == input.bodySha256, "the memo carried over"
    assert latest.typed_search_attributes.get(search_typed.KRT_FUNCTION) == input.target.uid


async def test_the_callbacks_of_a_large_result_are_bounded_in_one_run(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input(callback="https://hooks.example.com/in")
    script = standins.script(input.target.uid)
    script.targets = [ready(retentionSeconds=HOUR, callbackSecretName="hook-key")]
    script.attempts = [answered(stdout={"data": "x" * 900_000, "truncated": False, "totalBytes": 900_000})]
    script.callbacks = [CallbackOutcome(delivered=False, httpStatus=502)]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert ended.callback is not None and ended.callback.attempts == MAX_CALLBACK_DELIVERIES
    assert [r.attempt for r in script.asked_callbacks] == list(range(1, MAX_CALLBACK_DELIVERIES + 1))
    assert all(r.status.result == ended.result for r in script.asked_callbacks), "each posts the whole status"
    assert ended.expiresAt == (ended.endedAt or ended.acceptedAt) + timedelta(seconds=HOUR)
    latest = await env.client.get_workflow_handle(handle.id).describe()
    assert latest.run_id == handle.first_execution_run_id, "no continue-as-new carrying a result"
    history = await handle.fetch_history()
    assert len(history.to_json()) < 40 * 1024 * 1024, "well within Temporal's 50 MB"
    assert len(script.asked_attempts) == 1, "never attempted again"


async def test_a_run_waiting_its_turn_behind_other_async_invocations_is_not_failed(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    waiting, exhausted = new_input(), new_input()
    for input in (waiting, exhausted):
        standins.script(input.target.uid).targets = [ready(retry={"maxAttempts": 2})]
    standins.script(waiting.target.uid).attempts = [refused(429, "AsyncShareFull")] * 6 + [answered()]
    standins.script(exhausted.target.uid).attempts = [
        refused(429, "AsyncShareFull"),
        refused(429, "HostBusy"),
    ]
    ended = await (await start(env.client, queue, waiting)).result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Succeeded, 7)
    failed = await (await start(env.client, queue, exhausted)).result()
    assert (failed.state, failed.attemptCount) == (InvocationState.Failed, 3), "two counted, one turn waited"


async def test_a_target_not_listed_yet_is_waited_for_a_grace_then_gone(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    unlisted = InvocationPolicy(exists=False, found=False, reason="no Run of that uid")
    now = await env.get_current_time()  # the test server's clock, skipped ahead by the tests before
    late, missing = new_input()._replace(acceptedAt=now), new_input()._replace(acceptedAt=now)
    standins.script(late.target.uid).targets = [unlisted, unlisted, ready()]
    standins.script(missing.target.uid).targets = [unlisted]
    ended = await (await start(env.client, queue, late)).result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Succeeded, 1)
    gone = await (await start(env.client, queue, missing)).result()
    assert (
        gone.state is InvocationState.Failed and gone.error is not None and gone.error.reason == "TargetGone"
    )
    assert gone.endedAt is not None and (gone.endedAt - now).total_seconds() >= UNLISTED_GRACE_S


async def test_a_continue_as_new_keeps_the_last_result_in_the_memo_not_the_input(
    env: WorkflowEnvironment, worker: tuple[StandIns, str]
) -> None:
    standins, queue = worker
    input = new_input(kind=TargetKind.Function)
    script = standins.script(input.target.uid)
    script.targets = [ready(retry={"onFailure": True, "maxAttempts": 3})]
    failed = answered("HandlerError", error={"type": "KeyError", "message": "n"})
    script.attempts = (
        [failed]
        + [refused(503, "NoReadyReplica")] * 200
        + [refused(502, "OwnerUnreachable", dispatched=True)]
    )
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Unknown, 202)
    assert ended.result == failed.body, "the last answer that ran, carried over the continue-as-new"
    described = await env.client.get_workflow_handle(handle.id).describe()
    assert described.run_id != handle.first_execution_run_id
    history = await env.client.get_workflow_handle(handle.id, run_id=described.run_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    [carried] = await env.client.data_converter.decode(started.input.payloads, [InvocationInput])
    assert carried.carried is not None and carried.carried.result is None, "the input carries no result"
    assert carried.carriedRan == 1
