"""activities.handoff.HandoffActivities: the pool's answer and attempt 1's registration in-process."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.handoff import HandoffActivities, Mailbox, pools_polled_only_by
from kruntimes.devserver import DevServer
from kruntimes.lifecycle import POOL_TASK_QUEUE, AwaitAssignmentInput, RegisterInput, RegisterResult
from kruntimes.temporal import connect
from tests.workflows.conftest import run_manifest
from tests.workflows.handoffs import assignment, until_waiting
from workers.worker import POOL_WORKFLOWS


class Registrations:
    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[RegisterInput] = []
        self.fail = fail

    async def __call__(self, request: RegisterInput) -> RegisterResult:
        self.calls.append(request)
        if self.fail:
            raise ApplicationError("it did not load", type=self.fail, non_retryable=True)
        return RegisterResult(registrationId="reg-1", hostUid="host-uid", created=True)


def _request(with_run: bool) -> AwaitAssignmentInput:
    run = run_manifest("handed", runtime="py")
    return AwaitAssignmentInput(
        workflowId="run/default/a",
        runUid="uid-1",
        runtime="py",
        timeoutSeconds=5,
        run=run if with_run else None,
    )


async def _handed(registrations: Registrations, *, with_run: bool = True) -> object:
    mailbox = Mailbox()
    mailbox.pool_answered("py")
    activities = HandoffActivities(mailbox, register=registrations)
    waiting = asyncio.ensure_future(
        ActivityEnvironment().run(activities.await_assignment, _request(with_run))
    )
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


async def test_a_failed_registration_is_reported_not_raised_so_the_run_registers_again() -> None:
    handoff = await _handed(Registrations(fail="HandlerLoadFailed"))
    assert handoff.assignment == assignment()  # type: ignore[attr-defined]
    assert handoff.registration is None  # type: ignore[attr-defined]
    assert handoff.registerError.startswith("HandlerLoadFailed")  # type: ignore[attr-defined]


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
    for _ in range(100):  # pollers show up in DescribeTaskQueue once they have polled
        if await check() is want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never {want}")
