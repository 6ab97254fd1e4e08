"""The gateway's known-Functions view (scale from zero's "does this Function exist, and what is its
workflow"): after one full listing, narrow refreshes read the Functions started and ended, a
Function whose workflow continued as new stays known, and a full listing shows one being deleted;
a changed traffic split (KrtTraffic) shows in a narrow refresh. Real dev server (the session's);
stand-in FunctionWorkflows carrying the search attributes the platform's do, read as the gateway
reads them, over gRPC without the SDK."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from kruntimes.contracts.names import function_workflow_id
from kruntimes.gateway.visibility import Visibility
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.temporal.known_functions import KnownFunctions
from kruntimes.wire import search, search_typed
from tests.support.waiting import eventually


@workflow.defn(name="FunctionWorkflow", sandboxed=False)
class _StandIn:
    def __init__(self) -> None:
        self._renew = self._end = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._renew or self._end)
        if self._renew:  # its next run carries the same search attributes (the same Function)
            workflow.continue_as_new()

    @workflow.signal
    def delete(self) -> None:  # as the platform's indexes a Function being deleted
        workflow.upsert_search_attributes([search_typed.KRT_PHASE.value_set(search.DELETED)])

    @workflow.signal
    def split(self, value: str) -> None:  # as the platform's indexes a changed traffic split
        traffic = search_typed.KRT_TRAFFIC
        workflow.upsert_search_attributes(
            [
                traffic.value_set(value) if value else traffic.value_unset(),
                search_typed.KRT_TRAFFIC_SINCE.value_set(workflow.now()),
            ]
        )

    @workflow.signal
    def renew(self) -> None:
        self._renew = True

    @workflow.signal
    def end(self) -> None:
        self._end = True


@pytest.fixture
async def temporal(dev_server: DevServer) -> AsyncIterator[tuple[Client, str, Visibility]]:
    client = await connect(dev_server.address, "default")
    visibility = await Visibility.connect(TemporalSettings(address=dev_server.address))
    queue = f"known-fn-{uuid.uuid4().hex[:8]}"
    try:
        async with Worker(client, task_queue=queue, workflows=[_StandIn]):
            yield client, queue, visibility
    finally:
        await visibility.close()


async def _start(client: Client, queue: str, name: str) -> tuple[str, WorkflowHandle[object, None]]:
    uid = str(uuid.uuid4())
    handle = await client.start_workflow(
        "FunctionWorkflow",
        id=function_workflow_id("default", name),  # type: ignore[arg-type]
        task_queue=queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(search_typed.KRT_FUNCTION, uid),
                SearchAttributePair(search_typed.KRT_NAMESPACE, "default"),
                SearchAttributePair(search_typed.KRT_PHASE, "Ready"),
            ]
        ),
    )
    return uid, handle


async def test_functions_started_renewed_deleted_and_ended_show_in_narrow_refreshes(
    temporal: tuple[Client, str, Visibility],
) -> None:
    client, queue, visibility = temporal
    tag = uuid.uuid4().hex[:6]
    first = [await _start(client, queue, f"fn-{tag}-{i}") for i in range(4)]
    view = KnownFunctions(visibility, full_refresh_s=3600, margin=timedelta(seconds=1), lookback_every=1)

    async def shows(check: object, what: str) -> None:
        async def refreshed() -> bool:
            await view.refresh()
            return bool(check())  # type: ignore[operator]

        await eventually(refreshed, within=30, every=0.1, what=f"the view to show {what}")

    await shows(lambda: all(uid in view.entries for uid, _ in first), "the first Functions")
    known = view.get(first[0][0])
    assert known is not None and (known.namespace, known.name) == ("default", f"fn-{tag}-0")
    assert known.workflow_id == first[0][1].id and not known.deleted
    # once they are older than the margin a refresh reads none of them: narrow, nothing changed
    await shows(lambda: view.listed == 0 and first[0][0] in view.entries, "a narrow refresh")

    later, _ = await _start(client, queue, f"fn-{tag}-later")
    await first[0][1].signal("renew")
    await first[1][1].signal("delete")
    await first[2][1].signal("end")
    await first[3][1].terminate("gone")
    renewed = client.get_workflow_handle(first[0][1].id)

    async def continued() -> bool:
        return (await renewed.describe()).run_id != first[0][1].result_run_id

    await eventually(continued, within=30, every=0.1, what="the renewed Function to continue as new")
    await shows(
        lambda: later in view.entries and first[2][0] not in view.entries and first[3][0] not in view.entries,
        "the changes",
    )
    assert first[0][0] in view.entries, "a Function that continued as new is still known"
    view.full_refresh_s = 0  # the phase of one being deleted comes with a full listing
    await shows(lambda: getattr(view.get(first[1][0]), "deleted", False), "the Function being deleted")
    view.full_refresh_s = 3600
    await first[1][1].signal("end")
    await shows(lambda: first[1][0] not in view.entries, "the deleted Function gone")
    for name in ("0", "later"):  # nothing left running on the worker's queue
        await client.get_workflow_handle(function_workflow_id("default", f"fn-{tag}-{name}")).signal("end")  # type: ignore[arg-type]


async def test_a_changed_traffic_split_shows_in_a_narrow_refresh(
    temporal: tuple[Client, str, Visibility],
) -> None:
    client, queue, visibility = temporal
    uid, handle = await _start(client, queue, f"fn-{uuid.uuid4().hex[:6]}-split")
    view = KnownFunctions(visibility, full_refresh_s=3600, margin=timedelta(seconds=1), lookback_every=1)

    async def shows(check: object, what: str) -> None:
        async def refreshed() -> bool:
            await view.refresh()
            return bool(check())  # type: ignore[operator]

        await eventually(refreshed, within=30, every=0.1, what=f"the view to show {what}")

    await shows(lambda: getattr(view.get(uid), "traffic", None) == (), "the Function without a split")
    await shows(lambda: view.listed == 0, "a narrow refresh with nothing changed")
    await handle.signal("split", "3:90,4:10")
    await shows(lambda: getattr(view.get(uid), "traffic", None) == ((3, 90), (4, 10)), "the split")
    await handle.signal("split", "")
    await shows(lambda: getattr(view.get(uid), "traffic", None) == (), "the split removed")
    await handle.signal("end")
