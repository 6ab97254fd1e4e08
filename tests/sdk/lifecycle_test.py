"""The SDK's Run lifecycle against the whole platform: create, wait, get, list, cancel, delete."""

from __future__ import annotations

import collections
import uuid
from typing import Any

import pytest
import temporalio.client

from kruntimes.api.ids import RuntimeName
from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.contracts.names import TASK_QUEUE, pool_workflow_id, run_workflow_id
from kruntimes.contracts.run import RunInput
from kruntimes.sdk.client import (
    Client,
    HostNotFound,
    RunAlreadyExists,
    RunFailed,
    RunNotFound,
    SpecConflict,
    WaitTimeout,
)
from kruntimes.sdk.runs import Runs
from tests.sdk.moves import moved_off
from tests.sdk.stack import TASK, Platform, manifest, unique
from tests.support.waiting import eventually


async def test_a_created_function_run_becomes_ready_and_answers(krt: Client) -> None:
    name = unique("hello")
    created = await krt.create(Run.from_dict(manifest(name)))
    assert created.status.phase is RunPhase.Pending and created.uid
    seen: list[RunPhase] = []
    ready = await krt.wait(name, timeout=60, on_status=lambda s: seen.append(s.phase))
    assert ready.status.phase is RunPhase.Ready and seen[-1] is RunPhase.Ready
    assert ready.uid == created.uid
    assert ready.status.endpoint is not None and created.uid in ready.status.endpoint.url
    answer = await krt.invoke(name, {"hi": 1})
    assert answer.ok and answer.outputs["echo"] == {"hi": 1}
    assert (await krt.status(name)).phase is RunPhase.Ready


async def test_get_returns_the_manifest_it_was_created_with_and_its_status(krt: Client) -> None:
    name = unique("get")
    created = await krt.create(Run.from_dict(manifest(name, env={"GREETING": "hi"})))
    await krt.wait(name)
    got = await krt.get(name)
    assert got.spec == created.spec and got.metadata == created.metadata
    assert got.status.attempt == 1 and got.status.assignedHost
    assert got.created is not None and not got.closed


async def test_list_finds_runs_by_namespace_and_phase(krt: Client) -> None:
    namespace = unique("ns")
    name = unique("listed")
    await krt.create(Run.from_dict(manifest(name, namespace=namespace)))
    await krt.wait(name, namespace)

    # list reads the visibility index, which follows the Run's start and its phase a moment later
    async def both() -> tuple[list[str], list[str]]:
        listed = [r.metadata.name for r in await krt.list(namespace=namespace)]
        ready = [r.metadata.name for r in await krt.list(namespace=namespace, phase=RunPhase.Ready)]
        return listed, ready

    listed, ready = await eventually(both, until=all, every=0.05, what="the Run listed, and listed as Ready")
    assert listed == [name]
    assert ready == [name]
    assert await krt.list(namespace=namespace, phase=RunPhase.Pending) == []
    assert name in [r.metadata.name for r in await krt.list()]


async def test_creating_a_running_name_again_fails_with_already_exists(krt: Client) -> None:
    name = unique("twice")
    await krt.create(Run.from_dict(manifest(name)))
    with pytest.raises(RunAlreadyExists, match="already exists"):
        await krt.create(Run.from_dict(manifest(name)))


async def test_apply_is_a_no_op_for_the_same_spec_and_refuses_another(krt: Client) -> None:
    name = unique("applied")
    first = await krt.apply(Run.from_dict(manifest(name)))
    assert first.created
    again = await krt.apply(Run.from_dict(manifest(name)))
    assert not again.created and again.run.uid == first.run.uid
    with pytest.raises(SpecConflict, match="spec.env") as conflict:
        await krt.apply(Run.from_dict(manifest(name, env={"A": "1"})))
    assert conflict.value.fields == ("spec.env",)


async def test_a_task_run_waits_until_succeeded_with_its_outputs(krt: Client) -> None:
    name = unique("task")
    await krt.create(Run.from_dict(manifest(name, source=TASK, mode={"task": {}})))
    done = await krt.wait(name, timeout=60)
    assert done.status.phase is RunPhase.Succeeded and done.status.outputs == {"answer": 42}


async def test_wait_raises_run_failed_when_the_run_ends_otherwise(krt: Client) -> None:
    name = unique("nowhere")
    await krt.create(Run.from_dict(manifest(name, source="import nowhere_to_be_found\n")))
    with pytest.raises(RunFailed) as failed:
        await krt.wait(name, timeout=30)
    assert failed.value.phase is RunPhase.Failed and "nowhere_to_be_found" in failed.value.message


async def test_wait_gives_up_with_a_typed_timeout(krt: Client) -> None:
    name = unique("slow")
    await krt.create(Run.from_dict(manifest(name)))
    with pytest.raises(WaitTimeout, match="waiting for Succeeded") as timed_out:
        await krt.wait(name, until=RunPhase.Succeeded, timeout=0.3)
    assert timed_out.value.phase is not None


async def test_cancel_ends_the_run_and_delete_removes_it(krt: Client) -> None:
    name = unique("bye")
    await krt.create(Run.from_dict(manifest(name)))
    await krt.wait(name)
    await krt.cancel(name)
    await krt.cancel(name)  # idempotent
    cancelled = await krt.wait(name, until=RunPhase.Cancelled, timeout=30)
    assert cancelled.status.phase is RunPhase.Cancelled and cancelled.status.endpoint is None
    final = await krt.delete(name)
    assert final.phase is RunPhase.Cancelled
    assert name not in [r.metadata.name for r in await krt.list()], "gone from the list once deleted"
    with pytest.raises(RunNotFound):
        await krt.get(name)
    with pytest.raises(RunNotFound):
        await krt.delete(name)  # deleted already
    await krt.create(Run.from_dict(manifest(name)))  # the name is free again


async def test_an_unknown_run_is_not_found_everywhere(krt: Client) -> None:
    name = unique("ghost")
    for call in (krt.get(name), krt.status(name), krt.cancel(name), krt.delete(name), krt.wait(name)):
        with pytest.raises(RunNotFound, match=f"run '{name}' not found in namespace 'default'"):
            await call


async def _start_plainly(platform: Platform, name: str) -> dict[str, Any]:
    """Start the Run `name` with the plain Temporal SDK (no kruntimes starter); its manifest."""
    data = manifest(name)
    data["metadata"]["uid"] = str(uuid.uuid4())
    await platform.temporal.start_workflow(
        "RunWorkflow",
        RunInput(run=Run.from_dict(data)),
        id=run_workflow_id("default", name),
        task_queue=TASK_QUEUE,
    )
    return data


async def test_a_run_started_with_the_plain_temporal_sdk_is_a_run_too(
    krt: Client, platform: Platform
) -> None:
    name = unique("plain")
    data = await _start_plainly(platform, name)
    ready = await krt.wait(name)
    assert ready.uid == data["metadata"]["uid"]
    assert (await krt.invoke(ready, [1, 2])).outputs["echo"] == [1, 2]


async def test_hosts_lists_the_pool_hosts_with_their_used_slots(krt: Client) -> None:
    name = unique("hosted")
    await krt.create(Run.from_dict(manifest(name)))
    ready = await krt.wait(name)
    hosts = {v.host.hostId: v for v in await krt.hosts()}
    view = hosts[ready.status.assignedHost or ""]
    assert view.host.runtime == "python" and view.host.address and 1 <= view.used <= view.host.capacity


async def test_an_operator_drains_a_host_through_the_sdk_and_the_run_moves(krt: Client) -> None:
    name = unique("drained")
    await krt.create(Run.from_dict(manifest(name)))
    before = (await krt.wait(name)).status
    result = await krt.drain_host(before.assignedHost or "", message="sdk", requested_by="tests")
    assert result.accepted and result.state == "Draining" and result.runtime == "python"
    after = await moved_off(krt, name, before.assignedHostUID or "")
    assert after.endpoint == before.endpoint, "the same URL"
    assert (await krt.invoke(name, {"moved": True})).outputs["echo"] == {"moved": True}


async def test_host_actions_on_an_unknown_host_raise_host_not_found(krt: Client) -> None:
    with pytest.raises(HostNotFound, match="python-404"):
        await krt.delete_host("python-404")


async def test_reconcile_runs_a_round_for_every_runtime_and_reports_it(krt: Client) -> None:
    [report] = await krt.reconcile()
    assert report.runtime == "python" and report.errors == []
    assert [r.runtime for r in await krt.reconcile("python")] == ["python"]


async def test_create_starts_the_run_on_the_configured_task_queue(platform: Platform) -> None:
    # No worker polls this queue, and the runtime's pool is a stand-in on it: nothing runs or
    # holds a slot.
    name = unique("queued")
    queue = unique("krt-test-queue")
    runtime = unique("standin")
    data = manifest(name)
    data["spec"]["runtime"] = runtime
    pool = await platform.temporal.start_workflow(
        "RuntimePoolWorkflow", id=pool_workflow_id(RuntimeName(runtime)), task_queue=queue
    )
    try:
        async with Client(platform.config.model_copy(update={"taskQueue": queue})) as krt:
            await krt.create(Run.from_dict(data))
        handle = platform.temporal.get_workflow_handle(run_workflow_id("default", name))
        try:
            assert (await handle.describe()).task_queue == queue
        finally:
            await handle.terminate("test done")
    finally:
        await pool.terminate("test done")


class _Counting(temporalio.client.Interceptor):
    """Counts the status queries and describes the SDK sends."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    def intercept_client(
        self, next: temporalio.client.OutboundInterceptor
    ) -> temporalio.client.OutboundInterceptor:
        calls = self.calls

        class Outbound(temporalio.client.OutboundInterceptor):
            async def query_workflow(self, input: temporalio.client.QueryWorkflowInput) -> Any:
                calls["query"] += 1
                return await super().query_workflow(input)

            async def describe_workflow(
                self, input: temporalio.client.DescribeWorkflowInput
            ) -> temporalio.client.WorkflowExecutionDescription:
                calls["describe"] += 1
                return await super().describe_workflow(input)

        return Outbound(next)


async def test_wait_asks_the_status_once_when_the_run_is_ready_not_at_each_phase(
    platform: Platform,
) -> None:
    counting = _Counting()
    temporal = temporalio.client.Client(**{**platform.temporal.config(), "interceptors": [counting]})
    runs = Runs(platform.config, temporal=temporal)
    name = unique("once")
    created = await runs.create(Run.from_dict(manifest(name)))
    assert counting.calls.pop("describe") == 1  # create asks once whether the runtime's pool runs
    ready = await runs.wait(name, "default", until=None, timeout=60, interval=0.1, on_status=None)
    assert ready.status.phase is RunPhase.Ready and ready.uid == created.uid
    assert ready.status.endpoint is not None and ready.created is not None and not ready.closed
    # The manifest, the phases and the status the Run wrote with its Ready all come from the
    # history: no status query (one would wait behind whatever task the worker runs first).
    assert counting.calls == {}
    assert ready.status == await runs._query(
        await runs._handle(name, "default"), namespace="default", name=name
    )
    assert counting.calls == {"query": 1}
    # A Run Ready long before is found in the history read from its start, with its status.
    again = await runs.wait(name, "default", until=RunPhase.Ready, timeout=60, interval=0.1, on_status=None)
    assert again.status == ready.status and counting.calls == {"query": 1}


async def test_wait_asks_the_status_of_a_run_that_writes_none_to_its_history(platform: Platform) -> None:
    """A Run started without RunInput.statusMemo (by the plain Temporal SDK, or before the memo
    existed) writes no status to its history: `wait` asks it once it is Ready."""
    counting = _Counting()
    temporal = temporalio.client.Client(**{**platform.temporal.config(), "interceptors": [counting]})
    runs = Runs(platform.config, temporal=temporal)
    name = unique("nomemo")
    await _start_plainly(platform, name)
    ready = await runs.wait(name, "default", until=None, timeout=60, interval=0.1, on_status=None)
    assert ready.status.phase is RunPhase.Ready and ready.status.endpoint is not None
    assert counting.calls == {"query": 1}
