"""kruntimes.activities.handoff.Mailbox: the pool's answers handed to Runs waiting in the same process."""

from __future__ import annotations

import asyncio

from kruntimes.activities.handoff import Mailbox
from kruntimes.contracts.run import AwaitAssignmentInput
from tests.workflows.handoffs import assignment, until_waiting


def _request(run_uid: str = "uid-1", timeout: float = 5.0) -> AwaitAssignmentInput:
    return AwaitAssignmentInput(
        workflowId="run/default/a", runUid=run_uid, runtime="py", timeoutSeconds=timeout
    )


async def test_a_waiting_run_gets_the_answer_the_moment_its_pool_sends_it() -> None:
    mailbox = Mailbox()
    mailbox.pool_answered("py")
    waiting = asyncio.ensure_future(mailbox.wait(_request()))
    await until_waiting(mailbox, "run/default/a")
    assert mailbox.deliver("run/default/a", assignment())
    assert await waiting == assignment()


async def test_an_answer_sent_before_the_run_asks_is_kept_for_it_once() -> None:
    mailbox = Mailbox()
    mailbox.pool_answered("py")
    assert not mailbox.deliver("run/default/a", assignment())  # nobody waits yet
    assert await mailbox.wait(_request(timeout=0.01)) == assignment()
    assert await mailbox.wait(_request(timeout=0.01)) is None  # handed over once


async def test_a_run_does_not_wait_for_a_pool_that_answers_from_elsewhere() -> None:
    mailbox = Mailbox()  # no pool answered from this process
    assert await mailbox.wait(_request(timeout=60)) is None  # returns at once, or the test hangs


async def test_another_runs_answer_is_not_handed_over() -> None:
    mailbox = Mailbox()
    mailbox.pool_answered("py")
    waiting = asyncio.ensure_future(mailbox.wait(_request(timeout=5)))
    await until_waiting(mailbox, "run/default/a")
    assert not mailbox.deliver("run/default/a", assignment("uid-2"))
    assert mailbox.waiting("run/default/a", "uid-1"), "still waiting for its own answer"
    assert mailbox.deliver("run/default/a", assignment())
    assert await waiting == assignment()


async def test_after_a_timeout_the_answer_is_kept_not_lost_in_a_dead_waiter() -> None:
    mailbox = Mailbox()
    mailbox.pool_answered("py")
    assert await mailbox.wait(_request(timeout=0.01)) is None
    assert not mailbox.deliver("run/default/a", assignment())
    assert await mailbox.wait(_request(timeout=0.01)) == assignment()


async def test_only_a_few_runs_wait_at_once() -> None:
    mailbox = Mailbox(max_waiters=2)
    mailbox.pool_answered("py")
    first = asyncio.ensure_future(mailbox.wait(_request("a", timeout=5)))
    second = asyncio.ensure_future(mailbox.wait(_request("b", timeout=5)))
    await until_waiting(mailbox, "run/default/a", "a")
    await until_waiting(mailbox, "run/default/a", "b")
    assert await mailbox.wait(_request("c", timeout=60)) is None  # at once: two already wait
    assert mailbox.deliver("run/default/a", assignment("a"))
    assert mailbox.deliver("run/default/a", assignment("b"))
    assert (await first).runUid == "a" and (await second).runUid == "b"


async def test_a_run_waits_when_every_pool_runs_in_this_process_even_before_its_first_answer() -> None:
    mailbox = Mailbox()
    mailbox.pools_local = True  # watch_pool_pollers: only this process polls the pools' queue
    waiting = asyncio.ensure_future(mailbox.wait(_request()))
    await until_waiting(mailbox, "run/default/a")
    assert mailbox.deliver("run/default/a", assignment())
    assert await waiting == assignment()


class Unclaimed:
    """What a Mailbox handed back for signalling: (workflow id, runtime, assignment)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object]] = []
        self.called = asyncio.Event()

    def __call__(self, workflow_id: str, runtime: str, answer: object) -> None:
        self.calls.append((workflow_id, runtime, answer))
        self.called.set()


def _local(**options: float) -> Mailbox:
    mailbox = Mailbox(**options)  # type: ignore[arg-type]
    mailbox.pools_local = mailbox.runs_local = True  # watch_pool_pollers: this process alone polls
    return mailbox


async def test_an_answer_parked_before_the_runs_first_task_asks_is_taken_there_and_never_signalled() -> None:
    mailbox, unclaimed = _local(park_s=0.05), Unclaimed()
    assert mailbox.park("run/default/a", "py", assignment(), unclaimed=unclaimed)
    assert await mailbox.wait(_request(timeout=0.01)) == assignment()
    # Another answer parked after it and never taken: handed back after the first one's time.
    assert mailbox.park("run/default/b", "py", assignment("b"), unclaimed=unclaimed)
    await asyncio.wait_for(unclaimed.called.wait(), 10)
    assert unclaimed.calls == [("run/default/b", "py", assignment("b"))]
    assert mailbox.parked() == 0


async def test_a_parked_answer_nobody_takes_is_handed_back_for_a_signal_once() -> None:
    mailbox, unclaimed = _local(park_s=0.05), Unclaimed()
    assert mailbox.park("run/default/a", "py", assignment(), unclaimed=unclaimed)
    await asyncio.wait_for(unclaimed.called.wait(), 10)
    assert unclaimed.calls == [("run/default/a", "py", assignment())]
    assert await mailbox.wait(_request(timeout=0.01)) is None  # it goes by signal now


async def test_park_hands_the_answer_to_a_run_already_waiting() -> None:
    mailbox, unclaimed = _local(), Unclaimed()
    waiting = asyncio.ensure_future(mailbox.wait(_request()))
    await until_waiting(mailbox, "run/default/a")
    assert mailbox.park("run/default/a", "py", assignment(), unclaimed=unclaimed)
    assert await waiting == assignment()
    assert mailbox.parked() == 0


async def test_no_answer_is_parked_unless_the_runs_and_the_pools_tasks_run_only_here() -> None:
    unclaimed = Unclaimed()
    for pools, runs in ((True, False), (False, True), (False, False)):
        mailbox = Mailbox()
        mailbox.pools_local, mailbox.runs_local = pools, runs
        assert not mailbox.park("run/default/a", "py", assignment(), unclaimed=unclaimed)
    assert unclaimed.calls == []


async def test_the_answer_of_a_run_that_asked_and_left_empty_handed_is_not_parked() -> None:
    """That Run waits for its signal now: parking its answer would only delay it."""
    mailbox, unclaimed = _local(), Unclaimed()
    assert await mailbox.wait(_request(timeout=0.01)) is None
    assert not mailbox.park("run/default/a", "py", assignment(), unclaimed=unclaimed)
    refused = _local(max_waiters=0)
    assert await refused.wait(_request(timeout=60)) is None  # not even allowed to wait
    assert not refused.park("run/default/a", "py", assignment(), unclaimed=unclaimed)


async def test_only_so_many_answers_are_parked_at_once() -> None:
    mailbox, unclaimed = _local(max_parked=2), Unclaimed()
    assert mailbox.park("run/default/a", "py", assignment("a"), unclaimed=unclaimed)
    assert mailbox.park("run/default/a", "py", assignment("b"), unclaimed=unclaimed)
    assert not mailbox.park("run/default/a", "py", assignment("c"), unclaimed=unclaimed)
    assert mailbox.parked() == 2
