"""`krt worker` options: which task queues a process serves, and the sandbox switch."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from workers.worker import parse_args, settings_from, worker_tuning


def _settings(tmp_path: Path, *extra: str) -> object:
    return settings_from(parse_args(["--state-dir", str(tmp_path), *extra]))


def test_by_default_a_worker_serves_both_queues_outside_the_sandbox(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert settings.queues == frozenset({"runs", "pools"})  # type: ignore[attr-defined]
    assert isinstance(worker_tuning(settings.sandboxed)["workflow_runner"], UnsandboxedWorkflowRunner)  # type: ignore[attr-defined]


def test_queues_and_sandbox_are_chosen_on_the_command_line(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "--queues", "pools", "--sandbox")
    assert settings.queues == frozenset({"pools"})  # type: ignore[attr-defined]
    assert isinstance(worker_tuning(settings.sandboxed)["workflow_runner"], SandboxedWorkflowRunner)  # type: ignore[attr-defined]
    assert _settings(tmp_path, "--queues", " runs , pools ").queues == frozenset({"runs", "pools"})  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", ["", "tasks", "runs,tasks", ","])
def test_an_unknown_queue_is_refused_with_a_clear_message(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SystemExit, match="--queues takes runs, pools or both"):
        _settings(tmp_path, "--queues", bad)
