"""Recorded histories of every workflow type replay against the current workflow code.

A failure here means a workflow change is not replay-safe for executions already running: guard
it with a patch, or re-record (`python -m tests.replay.record`) where docs/workflow-changes.md
allows it.
"""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import (
    Interceptor,
    Replayer,
    StartChildWorkflowInput,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ChildWorkflowHandle, NondeterminismError

from kruntimes.contracts.run import STATUS_MEMO
from kruntimes.decisions.hostlife import HostEnd
from kruntimes.temporal.connect import DATA_CONVERTER
from kruntimes.wire import search
from tests.replay.changed import ChangedRunWorkflow, UnchangedRunWorkflow
from tests.replay.changed_pool import (
    DrainUnheard,
    FifoQueue,
    Groupless,
    ResumeDecidesNothing,
    TimerInPause,
    UnchangedPool,
    UncoveredPastMaxHosts,
)
from tests.replay.markers import patch_markers
from tests.replay.registered import WORKFLOWS

HISTORIES = Path(__file__).parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def workflow_type(path: Path) -> str:
    started = json.loads(path.read_text())["events"][0]
    return str(started["workflowExecutionStartedEventAttributes"]["workflowType"]["name"])


def test_every_workflow_type_has_a_recorded_history() -> None:
    recorded = {workflow_type(p) for p in FILES}
    assert recorded == {w.__name__ for w in WORKFLOWS}


def _result(path: Path) -> dict[str, object] | None:
    last = json.loads(path.read_text())["events"][-1]
    done = last.get("workflowExecutionCompletedEventAttributes")
    if done is None:
        return None
    result: dict[str, object] = json.loads(base64.b64decode(done["result"]["payloads"][0]["data"]))
    return result


def test_every_ending_of_a_host_has_a_recorded_history() -> None:
    hosts = [p for p in FILES if workflow_type(p) == "HostWorkflow"]
    endings = {str(r["reason"]) for r in map(_result, hosts) if r is not None}
    assert endings == {str(e) for e in HostEnd}
    assert any(_result(p) is None for p in hosts), "and one of a host still watched"


def test_the_new_run_endings_have_recorded_histories() -> None:
    """Runs that moved off a lost or drained host, lost a registration, or ran out of recoveries."""
    names = {p.stem for p in FILES}
    assert names >= {
        "run_host_lost_moved",
        "run_drained_moved",
        "run_registration_lost",
        "run_recoveries_exhausted",
        "run_task_one_shot",
    }


def test_a_run_failed_at_its_first_attempt_by_a_final_refusal_has_a_recorded_history() -> None:
    """A handler that cannot be imported: the Run fails at attempt 1 with HandlerLoadFailed."""
    events = json.loads((HISTORIES / "run_load_failed.json").read_text())["events"]
    scheduled = [e for e in events if e.get("eventType") == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]
    assert not scheduled, "a refused registration takes no activity after the local one"
    assert not [e for e in events if e.get("eventType") == "EVENT_TYPE_TIMER_STARTED"], "no backoff"


def test_every_ending_of_a_function_has_a_recorded_history() -> None:
    """A Function rolled out, scaled, rolled back and deleted (and one still running), one of a
    broken template deleted while it backs off, one whose replica was terminated, one that
    continued as new and the run after it; a replica Run deleted by its Function's rollout, and
    a Run refused as a replica (record.py functions, function_continue)."""
    names = {p.stem for p in FILES}
    assert names >= {
        "function_rolled_out",
        "function_deleted",
        "function_broken_deleted",
        "function_replica_terminated",
        "function_continued",
        "function_continued_deleted",
        "run_replica_deleted",
        "run_replica_refused",
    }
    continued = json.loads((HISTORIES / "function_continued.json").read_text())["events"][-1]
    assert continued["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW"
    for name in ("function_deleted", "function_broken_deleted", "function_replica_terminated"):
        assert _result(HISTORIES / f"{name}.json") is not None, f"{name} completed"


def test_the_autoscaler_paths_of_a_function_have_recorded_histories() -> None:
    """A Function its autoscaler scaled up under load and down after it, and one it scaled to zero
    that a storm of `wake` signals woke with exactly one replica, both deleted (record.py
    autoscale): each decision is an autoscale_function activity's result in the history."""
    for name in ("function_autoscaled_deleted", "function_woken_deleted"):
        events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
        types = {
            e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
            for e in events
            if e.get("eventType") == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
        }
        assert "autoscale_function" in types, name
        assert _result(HISTORIES / f"{name}.json") is not None, f"{name} completed"
    woken = json.loads((HISTORIES / "function_woken_deleted.json").read_text())["events"]
    wakes = [
        e
        for e in woken
        if e.get("eventType") == "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED"
        and e["workflowExecutionSignaledEventAttributes"]["signalName"] == "wake"
    ]
    assert len(wakes) == 5
    started = [
        e for e in woken if e.get("eventType") == "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED"
    ]
    assert len(started) == 2, "the first replica, then exactly one for the five wakes"


def test_a_function_admitting_its_replicas_before_their_start_has_a_recorded_history() -> None:
    """A woken Function that sent each replica's admission before the replica's start, in the
    task that started it (patch function-admit-early), and none after it."""
    events = json.loads((HISTORIES / "function_woken_admit_early.json").read_text())["events"]
    steps = []
    for e in events:
        if e.get("eventType") == "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED":
            steps.append("start")
        elif e.get("eventType") == "EVENT_TYPE_MARKER_RECORDED":
            data = e["markerRecordedEventAttributes"]["details"].get("data", {}).get("payloads", [])
            kind = json.loads(base64.b64decode(data[0]["data"])).get("activity_type") if data else None
            if kind in ("admit_run", "admit_run_early"):
                steps.append(kind)
    assert steps == ["admit_run_early", "start", "admit_run_early", "start"], steps


def test_a_canary_split_of_a_function_has_a_recorded_history() -> None:
    """A Function split between two revisions whose older replica was replaced, then all traffic
    to the latest, deleted (record.py traffic): three replicas started (revision 1, revision 2,
    revision 1 again), the split indexed for the gateways and unset again."""
    path = HISTORIES / "function_split_deleted.json"
    events = json.loads(path.read_text())["events"]
    started = [
        e["startChildWorkflowExecutionInitiatedEventAttributes"]["workflowId"]
        for e in events
        if e.get("eventType") == "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED"
    ]
    assert [w.rsplit("-", 2)[-2] for w in started] == ["r1", "r2", "r1"]
    traffic = [
        e["upsertWorkflowSearchAttributesEventAttributes"]["searchAttributes"]["indexedFields"]["KrtTraffic"]
        for e in events
        if "KrtTraffic"
        in e.get("upsertWorkflowSearchAttributesEventAttributes", {})
        .get("searchAttributes", {})
        .get("indexedFields", {})
    ]
    values = [base64.b64decode(t["data"]).decode() if t.get("data") else "" for t in traffic]
    assert values == ['"1:50,2:50"', ""]
    assert _result(path) is not None, "function_split_deleted completed"


def test_a_split_dividing_the_replicas_wanted_has_a_recorded_history() -> None:
    """A canary that divides the replicas wanted (record.py split_wanted, patch
    function-split-wanted): 4 of revision 1, then 1 of revision 2 (3 of revision 1 kept, one
    deleted), then 3 more of revision 2 once all traffic went to it."""
    path = HISTORIES / "function_split_divided_deleted.json"
    events = json.loads(path.read_text())["events"]
    started = [
        e["startChildWorkflowExecutionInitiatedEventAttributes"]["workflowId"]
        for e in events
        if e.get("eventType") == "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED"
    ]
    assert [w.rsplit("-", 2)[-2] for w in started] == ["r1"] * 4 + ["r2"] * 4
    assert ("function-split-wanted", False) in patch_markers(path)
    assert _result(path) is not None, "function_split_divided_deleted completed"


def test_the_pool_handover_has_recorded_histories() -> None:
    """A pool that handed its hosts' slots over and continued as new, the run that read them back,
    and a HostWorkflow that was handed them (tests/replay/record.py scale)."""
    assert {p.stem for p in FILES} >= {"pool_slots_handed_over", "pool_slots_read_back", "host_slots"}


def test_a_pool_with_one_alarm_has_a_recorded_history() -> None:
    """A pool that keeps one timer for its next look without a signal and moved that timer
    earlier for a scale-in (record.py alarm)."""
    history = json.loads((HISTORIES / "pool_one_alarm.json").read_text())
    kinds = [e["eventType"] for e in history["events"]]
    assert "EVENT_TYPE_TIMER_CANCELED" in kinds and "EVENT_TYPE_TIMER_FIRED" in kinds


def _upserted(path: Path) -> list[dict[str, Any]]:
    return [
        e["upsertWorkflowSearchAttributesEventAttributes"]["searchAttributes"]["indexedFields"]
        for e in json.loads(path.read_text())["events"]
        if e["eventType"] == "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"
    ]


def test_a_run_indexing_when_its_phase_changed_has_a_recorded_history() -> None:
    """A Run whose every phase upsert carries KrtPhaseSince (record.py since)."""
    phased = [u for u in _upserted(HISTORIES / "run_phase_since.json") if search.PHASE in u]
    assert phased and all(search.PHASE_SINCE in u for u in phased)


def test_a_handover_with_the_hosts_slots_digests_has_recorded_histories() -> None:
    """A pool whose continue-as-new carried the digest of each host's slots: the run that read
    them back started with a digest for every host whose slots it read (record.py scale)."""
    read_back = json.loads((HISTORIES / "pool_slots_read_back.json").read_text())
    started = read_back["events"][0]["workflowExecutionStartedEventAttributes"]
    state = json.loads(base64.b64decode(started["input"]["payloads"][0]["data"]))["state"]
    assert state["slotsOnHosts"] and set(state["slotsDigests"]) == set(state["slotsOnHosts"])


def test_runs_that_write_their_status_with_each_phase_have_recorded_histories() -> None:
    """Runs started by the SDK, with RunInput.statusMemo (record.py endings): each KrtPhase
    upsert follows the status memo of that phase, in the same task."""
    names = [
        "run_closed_cancelled",
        "run_closed_failed",
        "run_closed_succeeded",
        "run_deleted_marked",
    ]
    assert {p.stem for p in FILES} >= set(names)
    for name in names:
        events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
        phases = 0
        for before, event in itertools.pairwise(events):
            fields = event.get("upsertWorkflowSearchAttributesEventAttributes", {})
            phase = fields.get("searchAttributes", {}).get("indexedFields", {}).get(search.PHASE)
            value = None if phase is None else json.loads(base64.b64decode(phase["data"]))
            value = value[0] if isinstance(value, list) else value
            if value is None or value == search.DELETED:
                continue
            memo = before["workflowPropertiesModifiedEventAttributes"]["upsertedMemo"]["fields"]
            status = json.loads(base64.b64decode(memo[STATUS_MEMO]["data"]))
            assert status["phase"] == value, name
            phases += 1
        assert phases, name


def test_the_handover_apart_and_slow_registrations_have_recorded_histories() -> None:
    """A pool that continued as new in a task after its handover's (record.py apart), and Runs
    whose registration outlasted their workflow task and went to an ordinary activity, after the
    handoff gave it up or after the local activity's bound (record.py slow)."""
    assert {p.stem for p in FILES} >= {
        "pool_handover_apart",
        "run_register_slow_handoff",
        "run_register_slow_local",
    }


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_a_recorded_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    result = await replayer.replay_workflow(load(path))
    assert result.replay_failure is None


RUN_HISTORY = HISTORIES / "run_function_cancelled.json"


async def test_an_incompatible_change_is_caught_as_nondeterminism() -> None:
    replayer = Replayer(workflows=[ChangedRunWorkflow], data_converter=DATA_CONVERTER)
    with pytest.raises(NondeterminismError, match="Nondeterminism error"):
        await replayer.replay_workflow(load(RUN_HISTORY))


async def test_the_same_workflow_through_a_subclass_still_replays() -> None:
    """The control of the test above: the subclassing alone is not what fails the replay."""
    replayer = Replayer(workflows=[UnchangedRunWorkflow], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(load(RUN_HISTORY))


ADMISSION = HISTORIES / "pool_queue_paused_drained_resumed.json"
GROUP_SHARED = HISTORIES / "pool_group_host_shared.json"
GROUP_UNCOVERED = HISTORIES / "pool_group_uncovered.json"
FAIR_QUEUE = HISTORIES / "pool_fair_queue.json"
FAIR_BEHIND = HISTORIES / "pool_fair_behind_queue.json"


def test_admission_control_has_recorded_histories() -> None:
    """A pool paused, drained and resumed by an operator, each Update in its history, and a Run
    its drain ended QueueDrained (record.py queues)."""
    events = json.loads(ADMISSION.read_text())["events"]
    key = "workflowExecutionUpdateAcceptedEventAttributes"
    updates = [e[key]["acceptedRequest"]["input"]["name"] for e in events if key in e]
    assert updates == ["pause_queue", "drain_queue", "resume_queue"]
    last = json.loads((HISTORIES / "run_queue_drained.json").read_text())["events"][-1]
    failure = last["workflowExecutionFailedEventAttributes"]["failure"]
    assert failure["applicationFailureInfo"]["type"] == "QueueDrained"


def test_a_host_scaled_out_for_a_tenant_group_has_recorded_histories() -> None:
    """A pool whose one host, scaled out for one tenant of a group, took the group's other tenant
    (record.py tenants): one scale-out each, the host's group in its host_ready."""
    for path in (GROUP_SHARED, GROUP_UNCOVERED):
        events = json.loads(path.read_text())["events"]
        assert len(recorded_child_queues(path)) == 1, path.stem
        key = "workflowExecutionSignaledEventAttributes"
        [ready] = [e[key] for e in events if e.get(key, {}).get("signalName") == "host_ready"]
        host = json.loads(base64.b64decode(ready["input"]["payloads"][0]["data"]))["host"]
        assert (host["tenant"], host["tenantGroup"]) == ("first", "grp"), path.stem


def test_a_queue_placed_fairly_across_tenants_has_a_recorded_history() -> None:
    """One tenant's backlog and another tenant's Run placed ahead of it (record.py fair), under the
    pool-fair-queue patch; the pool histories recorded before it have no marker (placed FIFO)."""
    assert patch_markers(FAIR_QUEUE) == [("pool-fair-queue", False)]
    assert patch_markers(FAIR_BEHIND) == [("pool-fair-queue", False)]
    assert patch_markers(GROUP_SHARED) == []


@pytest.mark.parametrize(
    ("changed", "path"),
    [
        (TimerInPause, ADMISSION),
        (DrainUnheard, ADMISSION),
        (ResumeDecidesNothing, ADMISSION),
        (Groupless, GROUP_SHARED),
        (UncoveredPastMaxHosts, GROUP_UNCOVERED),
        (FifoQueue, FAIR_QUEUE),
    ],
    ids=lambda x: x.stem if isinstance(x, Path) else x.__name__,
)
async def test_a_changed_pool_does_not_replay_the_path_it_changed(changed: type, path: Path) -> None:
    """Each variant (tests/replay/changed_pool.py) changes the commands of the path the history
    recorded: the recorded history is what catches it."""
    replayer = Replayer(workflows=[changed], data_converter=DATA_CONVERTER)
    with pytest.raises(NondeterminismError, match="Nondeterminism error"):
        await replayer.replay_workflow(load(path))


@pytest.mark.parametrize(
    "path", [ADMISSION, GROUP_SHARED, GROUP_UNCOVERED, FAIR_QUEUE, FAIR_BEHIND], ids=lambda p: p.stem
)
async def test_the_same_pool_through_a_subclass_still_replays(path: Path) -> None:
    """The control of the test above: the subclassing alone is not what fails the replay."""
    replayer = Replayer(workflows=[UnchangedPool], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(load(path))


# The replayer compares a child workflow's command by type and id, not by its task queue, so that
# each child still starts on the queue its history recorded is checked here by watching them. The
# replayer runs workflows on a task queue of its own: a child recorded on its parent's queue must
# start on the parent's queue, any other by its recorded name.
CHILD_QUEUES: list[tuple[str, str]] = []  # (the child's queue, its parent's), as replayed


class _ChildQueueOutbound(WorkflowOutboundInterceptor):
    async def start_child_workflow(self, input: StartChildWorkflowInput) -> ChildWorkflowHandle[Any, Any]:
        parent = workflow.info().task_queue
        CHILD_QUEUES.append((input.task_queue or parent, parent))
        return await super().start_child_workflow(input)


class _ChildQueueInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_ChildQueueOutbound(outbound))


class _WatchChildQueues(Interceptor):
    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return _ChildQueueInbound


def _as_placed(child: str, parent: str) -> str:
    return "the parent's queue" if child == parent else child


def recorded_child_queues(path: Path) -> list[str]:
    events = json.loads(path.read_text())["events"]
    parent = events[0]["workflowExecutionStartedEventAttributes"]["taskQueue"]["name"]
    key = "startChildWorkflowExecutionInitiatedEventAttributes"
    return [_as_placed(str(e[key]["taskQueue"]["name"]), parent) for e in events if key in e]


WITH_CHILDREN = [p for p in FILES if recorded_child_queues(p)]


def test_the_histories_record_child_workflows_of_runs_pools_scale_outs_and_functions() -> None:
    assert {workflow_type(p) for p in WITH_CHILDREN} == {
        "FunctionWorkflow",
        "RunWorkflow",
        "RuntimePoolWorkflow",
        "ScaleOutWorkflow",
        "ScheduledRunWorkflow",
    }


@pytest.mark.parametrize("path", WITH_CHILDREN, ids=[p.stem for p in WITH_CHILDREN])
async def test_child_workflows_start_on_the_task_queue_their_history_recorded(path: Path) -> None:
    """Cleanup runs on its Run's own queue, scale-outs on the queue the pool's config names (its
    default for configs recorded without one), a HostWorkflow on its scale-out's queue."""
    CHILD_QUEUES.clear()
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=DATA_CONVERTER,
        interceptors=[_WatchChildQueues()],
        workflow_runner=UnsandboxedWorkflowRunner(),  # the interceptor writes to this module
    )
    result = await replayer.replay_workflow(load(path))
    assert result.replay_failure is None
    recorded = recorded_child_queues(path)
    replayed = [_as_placed(child, parent) for child, parent in CHILD_QUEUES]
    assert replayed[: len(recorded)] == recorded
