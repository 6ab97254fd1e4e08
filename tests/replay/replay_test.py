"""Recorded histories of every workflow type replay against the current workflow code.

A failure here means a workflow change is not replay-safe for executions already running: guard
it with workflow.patched() or, when it is meant to break, re-record (`python -m tests.replay.record`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from kruntimes.temporal import DATA_CONVERTER
from tests.replay.changed import ChangedRunWorkflow, UnchangedRunWorkflow
from workers.worker import POOL_WORKFLOWS, RUN_WORKFLOWS
from workflows.cleanup import CleanupWorkflow
from workflows.pool import RuntimePoolWorkflow
from workflows.run import RunWorkflow
from workflows.scaleout import ScaleOutWorkflow

HISTORIES = Path(__file__).parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))
WORKFLOWS = [RunWorkflow, RuntimePoolWorkflow, ScaleOutWorkflow, CleanupWorkflow]


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def workflow_type(path: Path) -> str:
    started = json.loads(path.read_text())["events"][0]
    return str(started["workflowExecutionStartedEventAttributes"]["workflowType"]["name"])


def test_the_replayed_workflows_are_the_ones_the_worker_registers() -> None:
    assert {w.__name__ for w in WORKFLOWS} == {w.__name__ for w in RUN_WORKFLOWS + POOL_WORKFLOWS}


def test_every_workflow_type_has_a_recorded_history() -> None:
    recorded = {workflow_type(p) for p in FILES}
    assert recorded >= {"RunWorkflow", "RuntimePoolWorkflow", "ScaleOutWorkflow", "CleanupWorkflow"}


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
