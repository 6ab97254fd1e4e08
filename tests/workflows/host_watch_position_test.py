"""A HostWorkflow hands each watch of its host the place where the previous one left the host's
loss journal (WatchResult.lostAfter → the next WatchInput.lostAfter), and carries it across
continue-as-new (HostRecord.lostAfter): a loss between two watches is told, not left to the
reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from kruntimes.contracts.host import HostRecord, HostResult, WatchInput, WatchResult
from kruntimes.contracts.names import QUERY_HOST
from kruntimes.workflows.host import HostWorkflow
from tests.support.waiting import eventually
from tests.workflows.platform_hosts import carried_host


class Watches:
    """The `watch_host` activity, played: each watch's input is kept, the answers are given in
    turn, and once they are spent a watch goes on until it is cancelled."""

    def __init__(self, *answers: WatchResult) -> None:
        self.inputs: list[WatchInput] = []
        self.answers = list(answers)

    @activity.defn(name="watch_host")
    async def watch_host(self, input: WatchInput) -> WatchResult:
        self.inputs.append(input)
        if self.answers:
            return self.answers.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def supervising(
    client: Client, tmp_path: Path, watches: Watches, *, carried: int | None = None
) -> AsyncIterator[WorkflowHandle[HostWorkflow, HostResult]]:
    """A Ready host's HostWorkflow, as continued as new with `carried` as the journal's place."""
    workflow_id, input = carried_host("py-watch", tmp_path / "state", lost_after=carried)
    queue = f"hosts-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[HostWorkflow], activities=[watches.watch_host]):
        handle = await client.start_workflow(HostWorkflow.run, input, id=workflow_id, task_queue=queue)
        try:
            yield handle
        finally:
            await handle.terminate("test finished")


async def test_each_watch_resumes_where_the_previous_one_left_the_journal(
    client: Client, tmp_path: Path
) -> None:
    watches = Watches(
        WatchResult(verdict="Renew", lostAfter=7),
        WatchResult(verdict="Renew"),  # a host that reports no losses: the place is kept
        WatchResult(verdict="Renew", lostAfter=9),
    )
    async with supervising(client, tmp_path, watches) as handle:
        await eventually(lambda: len(watches.inputs) == 4, within=30, what="four watches")
        record = await handle.query(QUERY_HOST, result_type=HostRecord)
    assert [w.lostAfter for w in watches.inputs] == [None, 7, 7, 9]
    assert record.lostAfter == 9


@pytest.mark.parametrize("carried", [0, 12])
async def test_a_host_workflow_continued_as_new_resumes_at_the_place_it_carried(
    client: Client, tmp_path: Path, carried: int
) -> None:
    watches = Watches()
    async with supervising(client, tmp_path, watches, carried=carried):
        await eventually(lambda: watches.inputs, within=30, what="the first watch")
    assert watches.inputs[0].lostAfter == carried
