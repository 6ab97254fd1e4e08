"""InvocationWorkflow's recorded histories (tests/replay/record_invocations.py): one per ending,
each replayed by replay_test.py against the registered workflows; here, that the set of endings is
complete and that a change to the workflow's commands is caught on them (#44)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from kruntimes.temporal.connect import DATA_CONVERTER
from tests.replay.changed_invocation import AttemptsBlind, UnchangedInvocation

HISTORIES = Path(__file__).parent / "histories"
ENDINGS = {
    "invocation_succeeded_callback": ("Succeeded", None, 1),
    "invocation_failed_handler": ("Failed", "HandlerError", 1),
    "invocation_failed_target_gone": ("Failed", "TargetGone", 1),
    "invocation_unknown": ("Unknown", "OwnerUnreachable", 1),
    "invocation_retried_succeeded": ("Succeeded", None, 5),
    "invocation_continued_ended": ("Succeeded", None, 132),
}


def _events(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
    return events


def _result(name: str) -> dict[str, Any]:
    done = _events(name)[-1]["workflowExecutionCompletedEventAttributes"]
    result: dict[str, Any] = json.loads(base64.b64decode(done["result"]["payloads"][0]["data"]))
    return result


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_every_ending_of_an_invocation_has_a_completed_history(name: str) -> None:
    state, reason, attempts = ENDINGS[name]
    result = _result(name)
    assert (result["state"], (result["error"] or {}).get("reason"), result["attemptCount"]) == (
        state,
        reason,
        attempts,
    )


def test_the_continued_run_started_from_the_status_carried_and_the_memo_named_in_full() -> None:
    started = _events("invocation_continued_ended")[0]["workflowExecutionStartedEventAttributes"]
    carried = json.loads(base64.b64decode(started["input"]["payloads"][0]["data"]))
    assert carried["carried"]["attemptCount"] == 125 and carried["carried"]["result"] is None
    assert set(started["memo"]["fields"]) == {"krtStatus", "krtDigest"}
    assert _result("invocation_continued_ended")["result"] is not None


def test_the_retried_history_retried_for_every_reason_and_the_callback_was_retried() -> None:
    kinds = [
        e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for e in _events("invocation_retried_succeeded")
        if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
    ]
    assert kinds.count("attempt_invocation") == 5
    memos = [
        json.loads(
            base64.b64decode(
                e["workflowPropertiesModifiedEventAttributes"]["upsertedMemo"]["fields"]["krtStatus"]["data"]
            )
        )
        for e in _events("invocation_retried_succeeded")
        if e["eventType"] == "EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED"
    ]
    assert {m["retried"] for m in memos} >= {"notRun", "failure", "unknownOutcome"}
    callback = _result("invocation_succeeded_callback")["callback"]
    assert (callback["delivered"], callback["attempts"]) == (True, 2)


def _history(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(name, (HISTORIES / f"{name}.json").read_text())


async def test_a_change_of_the_workflows_commands_is_caught_on_its_histories() -> None:
    replayer = Replayer(workflows=[AttemptsBlind], data_converter=DATA_CONVERTER)
    with pytest.raises(NondeterminismError, match="Nondeterminism error"):
        await replayer.replay_workflow(_history("invocation_succeeded_callback"))


async def test_the_same_workflow_through_a_subclass_still_replays() -> None:
    replayer = Replayer(workflows=[UnchangedInvocation], data_converter=DATA_CONVERTER)
    for name in ENDINGS:
        await replayer.replay_workflow(_history(name))
