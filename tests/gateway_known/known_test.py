"""The gateway's known-Runs view refreshes by what changed: after one full listing it reads only
the Runs started, terminated or whose phase changed (KrtPhaseSince) since the last refresh, and a
full listing mends the rest.
Real Temporal dev server; stand-in RunWorkflows carrying the search attributes the platform's do;
the view reads them as the gateway does, over gRPC without the SDK (gateway/visibility.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from kruntimes.contracts.names import run_workflow_id
from kruntimes.gateway.visibility import Visibility, VisibilityError
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer, free_port
from kruntimes.temporal.known_runs import KnownRun, KnownRuns, keyword
from kruntimes.wire import search, search_typed
from tests.support.waiting import eventually


@workflow.defn(name="RunWorkflow", sandboxed=False)
class _StandIn:
    def __init__(self) -> None:
        self._phase: str | None = None
        self._renew = False
        self._close = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._phase is not None or self._renew)
        if self._renew:  # its next run carries the same search attributes (the same Run)
            workflow.continue_as_new()
        workflow.upsert_search_attributes(  # as the platform's RunWorkflow indexes a phase
            [
                search_typed.KRT_PHASE.value_set(self._phase or ""),
                search_typed.KRT_PHASE_SINCE.value_set(workflow.now()),
            ]
        )
        if self._close:  # as a finished Run's workflow closes (its retention lists it then)
            return
        await workflow.wait_condition(lambda: False)

    @workflow.signal
    def finish(self, phase: str) -> None:
        self._phase = phase

    @workflow.signal
    def end(self, phase: str) -> None:
        self._phase, self._close = phase, True

    @workflow.signal
    def renew(self) -> None:
        self._renew = True


@pytest.fixture
async def temporal(tmp_path: Path) -> AsyncIterator[tuple[Client, str, Visibility]]:
    server = DevServer(state_dir=tmp_path / "temporal", persistent=False)
    server.start()
    try:
        client = await connect(server.address, "default")
        visibility = await Visibility.connect(TemporalSettings(address=server.address))
        queue = f"known-{uuid.uuid4().hex[:8]}"
        try:
            async with Worker(client, task_queue=queue, workflows=[_StandIn]):
                yield client, queue, visibility
        finally:
            await visibility.close()
    finally:
        server.stop()


async def _start(client: Client, queue: str, name: str) -> tuple[str, WorkflowHandle[object, None]]:
    uid = str(uuid.uuid4())
    handle = await client.start_workflow(
        "RunWorkflow",
        id=f"run/default/{name}",
        task_queue=queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(search_typed.KRT_RUN_UID, uid),
                SearchAttributePair(search_typed.KRT_NAMESPACE, "default"),
                SearchAttributePair(search_typed.KRT_RUNTIME, "python"),
                SearchAttributePair(search_typed.KRT_PHASE, "Ready"),
            ]
        ),
    )
    return uid, handle  # type: ignore[return-value]


async def _until(
    view: KnownRuns, check: Callable[[], bool], what: str, *, refresh: Callable[[], Awaitable[None]]
) -> None:
    async def refreshed() -> dict[str, KnownRun]:
        await refresh()
        return view.runs

    await eventually(
        refreshed, until=lambda _: check(), within=30, every=0.1, what=f"the view to show {what}"
    )


async def test_a_refresh_reads_what_changed_and_a_full_listing_mends(
    temporal: tuple[Client, str, Visibility],
) -> None:
    client, queue, visibility = temporal
    old = [await _start(client, queue, f"old-{i}") for i in range(12)]
    # The narrow queries look back the margin before the last refresh began (visibility is written
    # a little after the change), here every refresh and 2 s; the first 12 are older than that
    # before the changes start, so a narrow refresh that read them all would show.
    view = KnownRuns(visibility, full_refresh_s=3600, margin=timedelta(seconds=2), lookback_every=1)
    await _until(view, lambda: len(view.runs) == 12, "the first 12 Runs", refresh=view.refresh)
    assert view.listed == 12  # the first refresh is a full listing
    newest = max([(await handle.describe()).start_time for _, handle in old])

    def looks_back_past_the_first() -> bool:
        return view._looked_back is not None and view._looked_back - view.margin > newest

    await _until(
        view, looks_back_past_the_first, "a look back that begins after the first 12", refresh=view.refresh
    )

    # Two more Runs, one of the old ones terminated, one finished while its workflow still runs,
    # one whose workflow continued as new (its first run closed, the next one runs), one
    # finished whose workflow closed.
    new = [await _start(client, queue, f"new-{i}") for i in range(2)]
    await old[0][1].terminate("deleted")
    await old[1][1].signal("finish", "Succeeded")
    await old[2][1].signal("renew")
    await old[3][1].signal("end", "Failed")
    renewed = client.get_workflow_handle(old[2][1].id)  # its latest run

    async def renewed_runs() -> bool:
        return (await renewed.describe()).run_id != old[2][1].result_run_id

    def changed() -> bool:
        return (
            all(uid in view.runs for uid, _ in new)
            and old[0][0] not in view.runs
            and getattr(view.runs.get(old[1][0]), "phase", "") == "Succeeded"
            and old[3][0] not in view.runs
        )

    await eventually(renewed_runs, within=30, every=0.1, what="the renewed Run to continue as new")

    await _until(view, changed, "the changes", refresh=view.refresh)
    # Once visibility shows the renewed Run's first run closed, a refresh reads that too.
    first_closed = f"WorkflowId='{old[2][1].id}' AND ExecutionStatus='ContinuedAsNew'"

    async def first_listed() -> bool:
        return bool([e async for e in visibility.list(first_closed, limit=1)])

    await eventually(
        first_listed, within=30, every=0.1, what="visibility to list the renewed Run's first run"
    )
    await view.refresh()
    # A narrow refresh read the changes, not the 13 Runs it already knew; the Run whose first
    # run closed is still known (its next run runs).
    assert view.listed < 12, view.listed
    assert {uid for uid, _ in (old[2], *old[4:])} <= set(view.runs)
    assert view.runs[new[0][0]].name == "new-0" and view.runs[new[0][0]].runtime == "python"
    assert view.runs[new[0][0]].workflow_id == run_workflow_id("default", "new-0") == new[0][1].id

    # What a narrow query cannot see (here: the view's own copy lost a Run) a full listing mends.
    lost = old[5][0]
    view.runs = {uid: run for uid, run in view.runs.items() if uid != lost}
    await view.refresh()
    assert lost not in view.runs  # a narrow refresh does not bring back what did not change
    view.full_refresh_s = 0
    await view.refresh()
    assert lost in view.runs and view.listed == 12


async def test_a_change_visibility_shows_late_is_read_by_the_next_look_back(
    temporal: tuple[Client, str, Visibility],
) -> None:
    """Between look backs a refresh asks only from a moment before the last one began, so a new
    Run is not listed again and again; a change that reached visibility after the refresh that
    should have read it (here: the view's clock moved past it) is read by the next look back."""
    client, queue, visibility = temporal
    view = KnownRuns(
        visibility,
        full_refresh_s=3600,
        margin=timedelta(seconds=30),
        near_margin=timedelta(0),
        lookback_every=3,
    )
    await view.refresh()  # full
    uid, _ = await _start(client, queue, "late")
    await _until(view, lambda: uid in view.runs, "the new Run", refresh=view.refresh)
    view._near = 0  # a look back just happened: the next two refreshes are near ones
    await view.refresh()
    assert view.listed == 0  # the last refresh read it: this one asks from after its start

    late, _ = await _start(client, queue, "later")
    # As if visibility showed it only after the next refresh had begun: that refresh misses it.
    view._since = datetime.now(UTC) + timedelta(seconds=5)
    await view.refresh()
    assert late not in view.runs and view._near == 2
    await view.refresh()  # the third: a look back
    assert late in view.runs and view._near == 0


async def test_visibility_pages_through_every_match_and_stops_at_the_limit(
    temporal: tuple[Client, str, Visibility],
) -> None:
    client, queue, visibility = temporal
    started = {uid for uid, _ in [await _start(client, queue, f"paged-{i}") for i in range(7)]}
    query = "WorkflowType='RunWorkflow' AND ExecutionStatus='Running'"

    async def listed(**kwargs: int) -> list[str]:
        return [e.search_attributes[search.RUN_UID] async for e in visibility.list(query, **kwargs)]

    await eventually(  # visibility is written a little later
        lambda: listed(limit=100),
        until=lambda found: set(found) == started,
        within=30,
        every=0.1,
        what="visibility to list the 7 Runs",
    )
    every = await listed(limit=100, page_size=3)  # three pages: 3, 3 and 1
    assert sorted(every) == sorted(started) and len(every) == 7
    assert len(await listed(limit=4, page_size=3)) == 4
    sample = [e async for e in visibility.list(query, limit=1)][0]
    assert sample.workflow_id.startswith("run/default/paged-")
    assert sample.search_attributes[search.RUNTIME] == "python"
    assert sample.search_attributes[search.NAMESPACE] == "default"


async def test_visibility_says_why_it_cannot_list(temporal: tuple[Client, str, Visibility]) -> None:
    _, _, visibility = temporal
    with pytest.raises(VisibilityError, match="^INVALID_ARGUMENT: "):
        [e async for e in visibility.list("WorkflowType=", limit=10)]
    nobody = TemporalSettings(address=f"127.0.0.1:{free_port()}")
    with pytest.raises(VisibilityError, match="^UNAVAILABLE: "):
        await Visibility.connect(nobody)


@pytest.mark.parametrize(
    "data",
    [
        b'"abc"',
        b'"a\\"b"',
        b'["x","y"]',
        b"[]",
        b"12",
        b'"\\u00e9"',
        '"é"'.encode(),
        b'"\xff"',
        b'"a\nb"',
        b'""',
        b'"x',
    ],
)
def test_a_keyword_reads_as_json_would(data: bytes) -> None:
    """An unescaped string is read without a JSON parser; every value reads as json.loads reads it."""
    try:
        expected = json.loads(data)
    except ValueError:
        expected = None
    if isinstance(expected, list):
        expected = expected[0] if expected else None
    assert keyword(b"json/plain", data) == (expected if isinstance(expected, str) else None)
    assert keyword(b"binary/plain", data) is None
