"""What an operator sees in Temporal, read through the APIs the Temporal UI uses (describe:
execution status, user metadata, search attributes; visibility queries): each ending of a Run
gives its Temporal status, a closed Run stays readable and its name can be reused."""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from kruntimes.api.phases import RunPhase
from kruntimes.api.run import Run
from kruntimes.api.status import RunStatus
from kruntimes.contracts.names import QUERY_STATUS, retention_workflow_id, run_workflow_id
from kruntimes.sdk.client import Client, RunNotFound
from kruntimes.temporal.codec import ENCODING
from kruntimes.temporal.devserver import temporal_binary
from tests.sdk.stack import TASK, Platform, manifest, unique
from tests.support.waiting import eventually

KEEP = {"ttlSecondsAfterFinished": 120}


async def _closed(platform: Platform, name: str, within: float = 60.0) -> Any:
    handle = platform.temporal.get_workflow_handle(run_workflow_id("default", name))
    return await eventually(
        handle.describe,
        until=lambda description: description.status != WorkflowExecutionStatus.RUNNING,
        within=within,
        every=0.05,
        what=f"{name}'s workflow to close",
    )


async def _failure(platform: Platform, name: str) -> ApplicationError:
    handle = platform.temporal.get_workflow_handle(run_workflow_id("default", name))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert isinstance(failed.value.cause, ApplicationError)
    return failed.value.cause


async def _listed(platform: Platform, query: str, within: float = 30.0) -> list[str]:
    async def found() -> list[str]:
        return [w.id async for w in platform.temporal.list_workflows(query)]

    listed: list[str] = await eventually(
        found, within=within, every=0.1, what=f"a workflow listed by {query}"
    )
    return listed


async def test_each_ending_closes_the_workflow_with_its_temporal_status(
    krt: Client, platform: Platform
) -> None:
    ok, bad, idle, cancelled = (unique(p) for p in ("ok", "bad", "idle", "cancelled"))
    await asyncio.gather(
        krt.create(
            Run.from_dict(manifest(ok, source=TASK, mode={"task": {}}, env={"TOKEN": "s3cr3t"}, **KEEP))
        ),
        krt.create(
            Run.from_dict(
                manifest(bad, source="import nowhere_to_be_found\n", retryPolicy={"limit": 1}, **KEEP)
            )
        ),
        krt.create(Run.from_dict(manifest(idle, mode={"function": {"idleTimeoutSeconds": 1}}, **KEEP))),
        krt.create(Run.from_dict(manifest(cancelled, **KEEP))),
    )
    await krt.wait(cancelled)
    await krt.cancel(cancelled)

    done = await _closed(platform, ok)
    assert done.status == WorkflowExecutionStatus.COMPLETED
    result = await platform.temporal.get_workflow_handle(done.id, result_type=RunStatus).result()
    assert result.phase is RunPhase.Succeeded and result.outputs == {"answer": 42}
    assert await done.static_summary() == f"task python default/{ok}"
    details = await done.static_details()
    assert "spec sha256" in details and "`TOKEN`" in details and "s3cr3t" not in details
    assert done.search_attributes["KrtHost"] == [result.assignedHost]
    # KrtPhaseSince: when its last phase (Succeeded) was indexed, what the gateway's view asks by
    (since,) = done.search_attributes["KrtPhaseSince"]
    assert done.close_time is not None and done.start_time <= since <= done.close_time
    queried = await platform.temporal.get_workflow_handle(done.id).query(QUERY_STATUS, result_type=RunStatus)
    assert queried.phase is RunPhase.Succeeded, "the status query answers on a closed Run"

    failed = await _closed(platform, bad)
    assert failed.status == WorkflowExecutionStatus.FAILED
    cause = await _failure(platform, bad)
    # a handler that cannot be imported fails at once; the plain message is the platform's words
    assert cause.type == "HandlerLoadFailed" and "nowhere_to_be_found" not in cause.message
    assert re.fullmatch(
        r"HandlerLoadFailed \(HandlerImportError\) on python-\d+ at attempt 1", cause.message
    ), cause.message
    got = await krt.get(bad)
    assert got.closed and got.status.phase is RunPhase.Failed and "nowhere_to_be_found" in got.status.message
    uid = got.uid
    assert await _listed(platform, f"ExecutionStatus='Failed' AND KrtRunUid='{uid}'") == [failed.id]
    metadata = await platform.temporal.get_workflow_handle(failed.id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert metadata.current_details.startswith("**Failed** — HandlerLoadFailed: cannot import 'main'")

    timed_out = await _closed(platform, idle)
    assert timed_out.status == WorkflowExecutionStatus.FAILED
    assert (await _failure(platform, idle)).type == "IdleTimeout"
    assert (await krt.status(idle)).phase is RunPhase.Timeout

    ended = await _closed(platform, cancelled)
    assert ended.status == WorkflowExecutionStatus.COMPLETED
    assert (await krt.get(cancelled)).status.phase is RunPhase.Cancelled


async def test_a_closed_run_stays_readable_and_its_name_can_be_reused(
    krt: Client, platform: Platform
) -> None:
    name = unique("reused")
    first = await krt.create(Run.from_dict(manifest(name, ttlSecondsAfterFinished=3)))
    ready = await krt.wait(name)
    # docs/operations.md's recipe for the Runs on one host lists it while it runs there.
    host = ready.status.assignedHost
    on_host = f"WorkflowType='RunWorkflow' AND KrtHost='{host}' AND ExecutionStatus='Running'"
    assert run_workflow_id("default", name) in await _listed(
        platform, f"{on_host} AND KrtRunUid='{first.uid}'"
    )
    await krt.cancel(name)
    closed = await _closed(platform, name)
    assert (await krt.get(name)).status.phase is RunPhase.Cancelled  # readable after the close

    again = await krt.create(Run.from_dict(manifest(name)))  # the name is free once closed
    assert again.uid != first.uid
    second = await krt.wait(name)
    assert second.status.endpoint is not None and ready.status.endpoint is not None
    assert second.status.endpoint.url != ready.status.endpoint.url, "a new uid, so a new URL"
    assert (await krt.invoke(name, {"n": 2})).outputs["echo"] == {"n": 2}

    assert (await krt.get(name)).uid == again.uid
    previous = await platform.temporal.get_workflow_handle(closed.id, run_id=closed.run_id).describe()
    assert previous.status == WorkflowExecutionStatus.COMPLETED, "the first one is still readable by run id"


async def test_every_workflow_type_has_a_static_summary(krt: Client, platform: Platform) -> None:
    name = unique("summed")
    await krt.create(Run.from_dict(manifest(name, source=TASK, mode={"task": {}}, **KEEP)))
    await _closed(platform, name)
    summaries: dict[str, str] = {}
    async for execution in platform.temporal.list_workflows():
        if execution.workflow_type in summaries:
            continue
        description = await platform.temporal.get_workflow_handle(
            execution.id, run_id=execution.run_id
        ).describe()
        summary = await description.static_summary()
        if summary:
            summaries[execution.workflow_type] = summary
            # Stored unencrypted (the UI's list and `temporal workflow list` show it without the
            # codec server); the details are encrypted like every other payload.
            metadata = description.raw_description.execution_config.user_metadata
            assert _plain(metadata.summary) == summary, execution.workflow_type
            if metadata.HasField("details"):
                assert metadata.details.metadata["encoding"] == ENCODING, execution.workflow_type
    expected = {
        "RunWorkflow",
        "RuntimePoolWorkflow",
        "ScaleOutWorkflow",
        "HostWorkflow",
        "ReconcileWorkflow",
        "CleanupWorkflow",
        "RetentionWorkflow",
    }
    assert expected <= summaries.keys(), summaries
    assert all(len(s.encode()) <= 200 for s in summaries.values())
    # Activities, timers and child workflows carry plain summaries too ("task on python-0", …).
    run = platform.temporal.get_workflow_handle(run_workflow_id("default", name))
    scheduled = [
        _plain(e.user_metadata.summary)
        async for e in run.fetch_history_events()
        if e.HasField("user_metadata") and e.user_metadata.HasField("summary")
    ]
    assert scheduled and all(scheduled), scheduled
    assert any(s.startswith("task on ") for s in scheduled), scheduled
    # What an operator reads with the `temporal` CLI, without the codec server: the summary as
    # its text, the details encrypted.
    described = await _temporal(
        platform, "workflow", "describe", "--workflow-id", run_workflow_id("default", name)
    )
    summary_line = [line.split(None, 1) for line in described.splitlines() if "StaticSummary" in line]
    assert summary_line == [["StaticSummary", f'"task python default/{name}"']], described
    assert "StaticDetails" in described and "spec sha256" not in described


async def _temporal(platform: Platform, *args: str) -> str:
    """The `temporal` CLI's output for `args` against the platform's dev server."""
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(),
        *args,
        "--address",
        platform.config.temporalAddress,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _plain(payload: Payload) -> str:
    """The text of a summary payload stored as an ordinary json/plain payload, its metadata the
    encoding alone: what `temporal workflow describe/list` and the UI show as text ('' for any
    other payload)."""
    if dict(payload.metadata) != {"encoding": b"json/plain"}:
        return ""
    text = json.loads(payload.data)
    return text if isinstance(text, str) else ""


async def _until_not_found(krt: Client, name: str, within: float) -> None:
    async def not_found() -> bool:
        try:
            await krt.get(name)
        except RunNotFound:
            return True
        return False

    await eventually(not_found, within=within, every=0.1, what=f"{name} to be gone")


async def _listed_names(krt: Client, *, phase: RunPhase | None = None) -> list[str]:
    return [r.metadata.name for r in await krt.list(phase=phase)]


async def test_finished_runs_are_listed_until_deleted_and_a_deleted_run_never_is(
    krt: Client, platform: Platform
) -> None:
    done, serving = unique("listed-done"), unique("listed-ready")
    await krt.create(Run.from_dict(manifest(done, source=TASK, mode={"task": {}}, **KEEP)))
    await krt.create(Run.from_dict(manifest(serving, **KEEP)))
    await krt.wait(serving)
    await _closed(platform, done)

    await eventually(  # visibility follows
        lambda: _listed_names(krt, phase=RunPhase.Succeeded),
        until=lambda names: done in names,
        within=30,
        every=0.1,
        what="the finished Run listed",
    )
    [listed] = [r for r in await krt.list() if r.metadata.name == done]
    assert listed.closed and listed.status.phase is RunPhase.Succeeded
    assert listed.status.outputs == {"answer": 42}

    # A finished Run's delete (its retention) and a running one's (the update): gone at once.
    for name in (done, serving):
        await krt.delete(name)
        assert name not in await _listed_names(krt), f"{name} listed right after its delete"
        with pytest.raises(RunNotFound):
            await krt.get(name)
    for phase in (None, RunPhase.Succeeded, RunPhase.Cancelled):
        names = await _listed_names(krt, phase=phase)
        assert done not in names and serving not in names


async def test_a_finished_run_is_readable_until_its_ttl_then_gone_from_temporal(
    krt: Client, platform: Platform
) -> None:
    name = unique("ttl")
    created = await krt.create(
        Run.from_dict(manifest(name, source=TASK, mode={"task": {}}, ttlSecondsAfterFinished=3))
    )
    closed = await _closed(platform, name)
    got = await krt.get(name)  # readable after the close
    assert got.closed and got.status.phase is RunPhase.Succeeded
    assert (await krt.status(name)).phase is RunPhase.Succeeded

    await _until_not_found(krt, name, within=30)
    assert created.uid is not None
    retention = platform.temporal.get_workflow_handle(retention_workflow_id(created.uid))
    assert await retention.result() is True, "the retention deleted the execution"
    assert name not in await _listed_names(krt)
    # Temporal accepted the delete of that execution (it removes it from its stores a little
    # later: the dev server takes about half a minute, longer under load).
    assert closed.run_id is not None


def test_summaries_stay_within_200_bytes_and_whole_characters() -> None:
    """The longest Run a manifest can name fits a summary; longer text (free text in a summary:
    a multi-byte one too) is cut on a character boundary with `...`, within 200 bytes."""
    from kruntimes.wire.summaries import MAX_SUMMARY_BYTES, run_summary, summary

    longest = Run.from_dict(
        manifest("r" * 63, mode={"function": {"idleTimeoutSeconds": 1}})
        | {"metadata": {"name": "r" * 63, "namespace": "n" * 63}}
    )
    text = run_summary(longest)
    assert text == f"function python {'n' * 63}/{'r' * 63}" and len(text.encode()) <= MAX_SUMMARY_BYTES
    for piece in ("é", "日", "🙂", "a"):
        for length in range(60, 80):
            cut = summary("x" + piece * length * 3)
            data = cut.encode()
            assert len(data) <= MAX_SUMMARY_BYTES and data.decode() == cut
            assert cut.endswith("...") or len(("x" + piece * length * 3).encode()) <= MAX_SUMMARY_BYTES
    assert summary("two\nlines\t here") == "two lines here"
