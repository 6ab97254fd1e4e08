"""InvocationWorkflow's histories of an attempt whose activity timed out (#44): both branches of
the patch `invocation-attempt-not-sent` replay against the current code, and each ends as its
branch decides. The new branch's were written by tests/replay/record_invocation_lost.py;
invocation_attempt_timed_out by the same stand-ins with the code before the patch."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from kruntimes.temporal.connect import DATA_CONVERTER
from kruntimes.workflows.invocation import PATCH_ATTEMPT_NOT_SENT, InvocationWorkflow
from tests.replay.markers import patch_markers

HISTORIES = Path(__file__).parent / "histories"
# name: (state, error reason, attempts, attempts' reasons, patched)
ENDINGS = {
    "invocation_attempt_timed_out": ("Unknown", "AttemptLost", 1, ["AttemptLost"], False),
    "invocation_not_started_retried": ("Succeeded", None, 2, ["AttemptNotStarted", ""], True),
    "invocation_sent_lost_unknown": ("Unknown", "AttemptLost", 1, ["AttemptLost"], True),
}


def _result(name: str) -> dict[str, Any]:
    events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
    done = events[-1]["workflowExecutionCompletedEventAttributes"]
    result: dict[str, Any] = json.loads(base64.b64decode(done["result"]["payloads"][0]["data"]))
    return result


@pytest.mark.parametrize("name", sorted(ENDINGS))
async def test_a_timed_out_attempt_replays_and_ends_as_its_branch_decides(name: str) -> None:
    state, reason, attempts, reasons, patched = ENDINGS[name]
    result = _result(name)
    assert (result["state"], (result["error"] or {}).get("reason"), result["attemptCount"]) == (
        state,
        reason,
        attempts,
    )
    assert [a["reason"] for a in result["attempts"]] == reasons
    markers = [(PATCH_ATTEMPT_NOT_SENT, False)] if patched else []
    assert patch_markers(HISTORIES / f"{name}.json") == markers
    history = WorkflowHistory.from_json(name, (HISTORIES / f"{name}.json").read_text())
    replayer = Replayer(workflows=[InvocationWorkflow], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(history)
