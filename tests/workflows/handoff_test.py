"""kruntimes.activities.handoff.HandoffActivities: the pool's answer and attempt 1's registration in-process."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from kruntimes.activities.handoff import REGISTER_SLOW, HandoffActivities, Mailbox, pools_polled_only_by
from kruntimes.api.phases import RunPhase
from kruntimes.contracts.function import ReplicaOf
from kruntimes.contracts.hostcalls import RegisterInput, RegisterResult
from kruntimes.contracts.names import POOL_TASK_QUEUE
from kruntimes.contracts.run import AwaitAssignmentInput
from kruntimes.temporal.connect import connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.workers.assembly import POOL_WORKFLOWS
from tests.support.waiting import eventually
from tests.workflows.conftest import run_manifest
from tests.workflows.handoffs import assignment, until_waiting


class Registrations:
    def __init__(self, fail: str | None = None, *, hold: bool = False) -> None:
        self.calls: list[RegisterInput] = []
        self.fail = fail
        self.hold = hold
        self.cancelled = False

    async def __call__(self, request: RegisterInput) -> RegisterResult:
        self.calls.append(request)
        if self.hold:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.fail:
            raise ApplicationError("it did not load", type=self.fail, non_retryable=True)
        return RegisterResult(registrationId="reg-1", hostUid="host-uid", created=True)


def _request(with_run: bool, replica_of: ReplicaOf | None = None) -> AwaitAssignmentInput:
    run = run_manifest("handed", runtime="py")
    return AwaitAssignmentInput(
        workflowId="run/default/a",
        runUid="uid-1",
        runtime="py",
        timeoutSeconds=5,
        run=run if with_run else None,
        replicaOf=replica_of,
    )


async def _handed(
    registrations: Registrations,
    *,
    with_run: bool = True,
    limit: timedelta = timedelta(seconds=30),
    replica_of: ReplicaOf | None = None,
) -> object:
    """The activity run as the Run runs it (start-to-close `limit`), its answer delivered."""
    mailbox = Mailbox()
    mailbox.pool_answered("py")
    activities = HandoffActivities(mailbox, register=registrations)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, is_local=True, start_to_close_timeout=limit)
    waiting = asyncio.ensure_future(env.run(activities.await_assignment, _request(with_run, replica_of)))
    await until_waiting(mailbox, "run/default/a")
    assert mailbox.deliver("run/default/a", assignment())
    return await waiting


async def test_the_handed_over_assignment_comes_with_attempt_one_registered_on_its_host() -> None:
    registrations = Registrations()
    handoff = await _handed(registrations)
    assert handoff.assignment == assignment()  # type: ignore[attr-defined]
    assert handoff.registration == RegisterResult(registrationId="reg-1", hostUid="host-uid", created=True)  # type: ignore[attr-defined]
    [call] = registrations.calls
    assert (call.address, call.attempt, call.runUid, call.adapter) == ("127.0.0.1:1", 1, "uid-1", "python")
    assert call.replicaOf is None


async def test_a_replicas_attempt_one_is_registered_as_its_functions_replica() -> None:
    """A Function's replica is registered in-process too, and its registration names the
    Function (its signed assignment is what the gateway routes the Function's traffic by)."""
    registrations = Registrations()
    replica_of = ReplicaOf(functionUid=str(uuid.uuid4()), functionName="echo", revision=3)
    handoff = await _handed(registrations, replica_of=replica_of)
    assert handoff.registration is not None  # type: ignore[attr-defined]
    [call] = registrations.calls
    assert call.replicaOf == replica_of


async def test_a_failed_registration_is_reported_not_raised_so_the_run_registers_again() -> None:
    handoff = await _handed(Registrations(fail="HandlerLoadFailed"))
    assert handoff.assignment == assignment()  # type: ignore[attr-defined]
    assert handoff.registration is None  # type: ignore[attr-defined]
    assert handoff.registerError.startswith("HandlerLoadFailed")  # type: ignore[attr-defined]


async def test_a_registration_that_outlasts_the_activitys_timeout_is_given_up_before_it() -> None:
    """The handoff holds the Run's workflow task open: a registration still running when the
    activity's time is nearly up is cancelled and reported, and the assignment still returned,
    so the activity ends on its own and the Run registers in an ordinary activity."""
    registrations = Registrations(hold=True)
    handoff = await asyncio.wait_for(_handed(registrations, limit=timedelta(seconds=1)), 5)
    assert handoff.assignment == assignment()  # type: ignore[attr-defined]
    assert handoff.registration is None  # type: ignore[attr-defined]
    assert handoff.registerError.startswith(REGISTER_SLOW)  # type: ignore[attr-defined]
    assert registrations.cancelled


async def test_a_task_run_gets_the_assignment_only() -> None:
    registrations = Registrations()
    handoff = await _handed(registrations, with_run=False)
    assert handoff.assignment == assignment() and handoff.registration is None  # type: ignore[attr-defined]
    assert registrations.calls == []


async def test_pools_count_as_local_only_while_this_process_alone_polls_their_queue(
    dev_server: DevServer,
) -> None:
    """A Run waits for an in-process answer only when no other worker can run its pool's tasks."""
    ours = await connect(dev_server.address)
    other = await Client.connect(dev_server.address, identity="another-worker@elsewhere")
    queue = f"{POOL_TASK_QUEUE}-{uuid.uuid4().hex[:8]}"  # no other test's pollers on it
    assert not await pools_polled_only_by(ours, ours.identity, queue)  # nobody polls yet
    async with Worker(ours, task_queue=queue, workflows=POOL_WORKFLOWS):
        await _eventually(lambda: pools_polled_only_by(ours, ours.identity, queue), True)
        async with Worker(other, task_queue=queue, workflows=POOL_WORKFLOWS):
            await _eventually(lambda: pools_polled_only_by(ours, ours.identity, queue), False)


async def _eventually(check: Callable[[], Awaitable[bool]], want: bool) -> None:
    # pollers show up in DescribeTaskQueue once they have polled
    await eventually(check, until=lambda got: got is want, every=0.1, what=f"the check to be {want}")


SLOW_LOAD_S = 8  # longer than the Run's workflow task timeout (kruntimes.sdk.starting: 5 s)
SLOW = f"import time\ntime.sleep({SLOW_LOAD_S})\ndef handle(p):\n    return p\n"


@pytest.mark.parametrize("by_sdk", [True, False], ids=["handoff", "signalled"])
async def test_a_slow_registration_on_a_real_host_never_holds_the_runs_workflow_task_open(
    platform_factory, by_sdk: bool
) -> None:  # type: ignore[no-untyped-def]
    """A Run whose registration on a real host takes longer than its workflow task timeout (the
    handler's module loads slowly). Created as the SDK does, the handoff gives the registration
    up and its task completes; asking the pool itself, the registration's local activity gives
    up after its bound. Either way an ordinary activity registers (no task is held open for it),
    no task of the Run timed out, and the Run is Ready on attempt 1."""
    async with platform_factory() as platform:
        warm = await platform.start(run_manifest("warm", runtime=platform.runtime()), by_sdk=True)
        await platform.wait_phase(warm, RunPhase.Ready, timeout=90)  # its host is up
        slow = run_manifest("slow", runtime=platform.runtime(), source=SLOW)
        handle = await platform.start(slow, by_sdk=by_sdk)
        status = await platform.wait_phase(handle, RunPhase.Ready, timeout=120)
        assert status.attempt == 1
        events = [e async for e in handle.fetch_history_events()]
        kinds = [e.event_type for e in events]
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT not in kinds
        scheduled = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert scheduled == ["register_function"]
