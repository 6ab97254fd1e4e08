"""A Run whose first workflow task was completed before the worker had processed its handoff's
result replays.

The worker may complete a task whose local activity has finished (its marker recorded) before
the workflow reacted to the result; the reaction (the Run's phase, its host) then comes in a
forced task of its own. On replay the result is given back within the first task. A patch asked
for in that reaction would be announced only with the later task, so it would read as absent and
the history would not replay (TMPRL1100 "Non-deprecated patch marker encountered"): patches are
asked for in the first activation (docs/workflow-changes.md). Here the split is made from a real
history: the commands after the handoff's marker moved into a forced task.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from kruntimes.api.phases import RunPhase
from kruntimes.temporal.connect import DATA_CONVERTER
from kruntimes.workers.assembly import running_workers
from tests.replay.registered import WORKFLOWS
from tests.support.pki import TestPKI
from tests.workflows.conftest import new_platform, run_manifest

COMMAND_EVENTS = {
    EventType.EVENT_TYPE_MARKER_RECORDED,
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_TIMER_CANCELED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
}


def _marker(event: HistoryEvent) -> str:
    return event.marker_recorded_event_attributes.marker_name


def split_last_task(history: WorkflowHistory) -> WorkflowHistory:
    """`history` (Ready in its last task) as the worker records it when it completes that task
    before it processed its local activity's result: the commands after the local activity's
    marker in a forced task of their own."""
    events = list(history.events)
    completed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED][-1]
    at = events.index(completed)
    assert all(e.event_type in COMMAND_EVENTS for e in events[at + 1 :]), "the last task's commands"
    la = next(i for i in range(at + 1, len(events)) if _marker(events[i]) == "core_local_activity")
    moved = events[la + 1 :]
    assert moved, "the Run reacted to its handoff in the same task"
    first_id = events[la].event_id + 1
    scheduled, started, done = HistoryEvent(), HistoryEvent(), HistoryEvent()
    scheduled.CopyFrom(events[at - 2])  # the first task's scheduled, started, completed events
    started.CopyFrom(events[at - 1])
    done.CopyFrom(completed)
    scheduled.event_id, started.event_id, done.event_id = first_id, first_id + 1, first_id + 2
    started.workflow_task_started_event_attributes.scheduled_event_id = first_id
    done.workflow_task_completed_event_attributes.scheduled_event_id = first_id
    done.workflow_task_completed_event_attributes.started_event_id = first_id + 1
    renumbered = []
    for n, event in enumerate(moved):
        copy = HistoryEvent()
        copy.CopyFrom(event)
        copy.event_id = first_id + 3 + n
        attributes = getattr(copy, copy.WhichOneof("attributes"))
        if hasattr(attributes, "workflow_task_completed_event_id"):
            attributes.workflow_task_completed_event_id = done.event_id
        renumbered.append(copy)
    return WorkflowHistory(history.workflow_id, [*events[: la + 1], scheduled, started, done, *renumbered])


async def test_a_run_whose_first_task_was_split_from_its_handoff_replays(
    client: Client, tmp_path: Path, pki: TestPKI
) -> None:
    p = new_platform(client, tmp_path, pki)
    try:
        async with running_workers(client, p.settings):
            handle = await p.start(run_manifest("split", runtime=p.runtime()), by_sdk=True)
            await p.wait_phase(handle, RunPhase.Ready)
            history = await handle.fetch_history()
    finally:
        await p.stop()
    # no patch marker after the first task's local activity: nothing asked for in its reaction
    markers = [_marker(e) for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert "core_patch" not in markers[markers.index("core_local_activity") :]
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(history)
    await replayer.replay_workflow(split_last_task(history))
