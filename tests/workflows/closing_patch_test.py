"""Runs started by the RunWorkflow of before finished Runs closed (tests.replay.changed's
BeforeClosingRunWorkflow: no patch asked), then taken over by the current one on the same task
queue: a Run that finishes after the takeover takes the new ending (its workflow closes, a
RetentionWorkflow keeps it), one that had finished before keeps the old one (its workflow waits
out the retention, open, until deleted)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from kruntimes.api.phases import RunPhase
from kruntimes.api.status import RunStatus
from kruntimes.contracts.names import SIGNAL_CANCEL, UPDATE_DELETE, retention_workflow_id
from kruntimes.workers.worker import RUN_WORKFLOWS, running_workers
from kruntimes.workflows.run import RunWorkflow
from tests.replay.changed import BeforeClosingRunWorkflow
from tests.support.pki import TestPKI
from tests.workflows.conftest import new_platform, run_manifest

KEEP = {"ttlSecondsAfterFinished": 600}


async def _children(handle: WorkflowHandle[Any, Any]) -> list[str]:
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_type.name
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]


async def test_runs_of_the_earlier_code_end_as_their_history_decides(
    client: Client, tmp_path: Path, pki: TestPKI
) -> None:
    suffix = uuid.uuid4().hex[:6]
    p = new_platform(client, tmp_path, pki)
    settings = p.settings
    earlier = [BeforeClosingRunWorkflow if w is RunWorkflow else w for w in RUN_WORKFLOWS]
    try:
        async with running_workers(client, settings, run_workflows=earlier):
            live_run = run_manifest(f"live-{suffix}", runtime=p.runtime(), **KEEP)
            live = await p.start(live_run)
            ended = await p.start(run_manifest(f"ended-{suffix}", runtime=p.runtime(), **KEEP))
            await p.wait_phase(live, RunPhase.Ready)
            await p.wait_phase(ended, RunPhase.Ready)
            await ended.signal(SIGNAL_CANCEL)
            await p.wait_phase(ended, RunPhase.Cancelled)  # finished: it waits out its retention, open

        async with running_workers(client, settings):  # the current code takes both over
            await live.signal(SIGNAL_CANCEL)
            result = await client.get_workflow_handle(live.id, result_type=RunStatus).result()
            assert result.phase is RunPhase.Cancelled
            assert (await live.describe()).status == WorkflowExecutionStatus.COMPLETED
            assert await _children(live) == ["CleanupWorkflow", "RetentionWorkflow"], "the new ending"
            assert live_run.metadata.uid is not None
            retention = await client.get_workflow_handle(
                retention_workflow_id(live_run.metadata.uid)
            ).describe()
            assert retention.status == WorkflowExecutionStatus.RUNNING

            assert (await p.status(ended)).phase is RunPhase.Cancelled  # replayed by the current code
            assert (await ended.describe()).status == WorkflowExecutionStatus.RUNNING, "the old ending"
            deleted = await ended.execute_update(UPDATE_DELETE, result_type=RunStatus)
            assert deleted.phase is RunPhase.Cancelled
            await ended.result()
            assert await _children(ended) == ["CleanupWorkflow"], "no retention: the old ending"
    finally:
        await p.stop()
