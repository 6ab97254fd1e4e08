"""InvocationWorkflow when an attempt's activity never answers (#44), on the time-skipping test
server: one that timed out on its heartbeat without recording ATTEMPT_SENT never ran, and is tried
again without counting against retry.maxAttempts; one that recorded it may have run, and ends
Unknown as any outcome lost."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from kruntimes.contracts.invocation import InvocationState
from kruntimes.decisions.invocations import ATTEMPT_NOT_STARTED
from kruntimes.workflows import invocation
from kruntimes.workflows.invocation import ATTEMPT_LOST, PATCH_ATTEMPT_NOT_SENT, InvocationWorkflow
from tests.workflows.invocation_lost import LosingStandIns, Lost
from tests.workflows.invocations import answered, new_input, ready, start, time_skipping

# The test server does not skip time while an activity runs: a short heartbeat timeout keeps each
# test to seconds (the workflow reads its module's constant, outside the sandbox here).
HEARTBEAT = timedelta(seconds=2)


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with time_skipping() as env:
        yield env


@pytest.fixture
async def worker(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[LosingStandIns, str]]:
    monkeypatch.setattr(invocation, "ATTEMPT_HEARTBEAT", HEARTBEAT)
    standins = LosingStandIns()
    queue = f"invocations-lost-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[InvocationWorkflow],
        activities=standins.activities(),
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        yield standins, queue


async def test_an_attempt_that_timed_out_before_it_was_sent_is_tried_again_uncounted(
    env: WorkflowEnvironment, worker: tuple[LosingStandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.targets = [ready(retry={"maxAttempts": 1})]  # counted, the lost attempt would use it up
    script.attempts = [Lost.NEVER_RAN, answered()]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert (ended.state, ended.attemptCount, ended.retried) == (InvocationState.Succeeded, 2, "notRun")
    lost, ran = ended.attempts
    assert (lost.httpStatus, lost.reason, lost.dispatched) == (0, ATTEMPT_NOT_STARTED, False)
    assert (ran.httpStatus, ran.dispatched) == (200, True)
    assert lost.endedAt is not None and lost.endedAt - lost.startedAt >= HEARTBEAT
    assert [r.marksDispatch for r in script.asked_attempts] == [True, True]
    timed_out = [
        e.activity_task_timed_out_event_attributes.failure.timeout_failure_info
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
    ]
    assert [t.last_heartbeat_details.payloads for t in timed_out] == [[]], "it never beat"


async def test_an_attempt_lost_after_it_was_sent_is_unknown(
    env: WorkflowEnvironment, worker: tuple[LosingStandIns, str]
) -> None:
    standins, queue = worker
    input = new_input()
    script = standins.script(input.target.uid)
    script.attempts = [Lost.SENT_THEN_LOST, answered()]
    handle = await start(env.client, queue, input)
    ended = await handle.result()
    assert (ended.state, ended.attemptCount) == (InvocationState.Unknown, 1)
    assert ended.error is not None and ended.error.reason == ATTEMPT_LOST
    [lost] = ended.attempts
    assert (lost.reason, lost.dispatched) == (ATTEMPT_LOST, True)
    assert len(script.asked_attempts) == 1, "not tried again: it may have run"
    markers = [
        e.marker_recorded_event_attributes.details["patch-data"]
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert len(markers) == 1 and PATCH_ATTEMPT_NOT_SENT.encode() in markers[0].payloads[0].data
