"""`krt worker` options: which task queues a process serves and their names, and the sandbox switch."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from kruntimes.config.runtimes import RuntimeConfig
from kruntimes.contracts.names import POOL_TASK_QUEUE, TASK_QUEUE
from kruntimes.contracts.pool import PoolConfig
from kruntimes.workers.tuning import DEFAULT_WORKFLOW_CACHE, worker_tuning
from kruntimes.workers.worker import parse_args, settings_from

TRUST = ["--peer-tls", "/pki/control-plane", "--assignment-key", "/pki/assignments.key"]


def _settings(tmp_path: Path, *extra: str) -> object:
    return settings_from(parse_args(["--state-dir", str(tmp_path), *TRUST, *extra]))


def test_the_platform_credentials_are_required_and_read_from_the_flags(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        settings_from(parse_args(["--state-dir", str(tmp_path)]))
    settings = _settings(tmp_path, "--platform-ca", "/pki", "--host-certificate-lifetime", "3600")
    trust = settings.trust  # type: ignore[attr-defined]
    assert (trust.peer_tls, trust.assignment_key, trust.platform_ca) == (
        Path("/pki/control-plane"),
        Path("/pki/assignments.key"),
        Path("/pki"),
    )
    assert trust.host_certificate_lifetime.total_seconds() == 3600
    assert _settings(tmp_path).trust.platform_ca is None  # type: ignore[attr-defined]


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


def test_the_task_queue_names_default_to_the_platforms_own(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert (settings.run_task_queue, settings.pool_task_queue) == (TASK_QUEUE, POOL_TASK_QUEUE)  # type: ignore[attr-defined]


def test_the_task_queue_names_are_chosen_on_the_command_line(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "--task-queue", "runs-b", "--pool-task-queue", "pools-b")
    assert (settings.run_task_queue, settings.pool_task_queue) == ("runs-b", "pools-b")  # type: ignore[attr-defined]


@pytest.mark.parametrize("flag", ["--task-queue", "--pool-task-queue"])
@pytest.mark.parametrize("bad", ["", "  ", "q" * 201])
def test_an_empty_or_overlong_task_queue_name_is_refused(tmp_path: Path, flag: str, bad: str) -> None:
    with pytest.raises(SystemExit, match=f"{flag} takes a name of 1 to 200 characters"):
        _settings(tmp_path, flag, bad)


def test_the_runs_and_the_pools_never_share_a_task_queue(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--task-queue and --pool-task-queue must differ"):
        _settings(tmp_path, "--task-queue", "same", "--pool-task-queue", "same")
    with pytest.raises(SystemExit, match="must differ"):
        _settings(tmp_path, "--task-queue", POOL_TASK_QUEUE)


def test_a_pool_config_recorded_before_the_runs_queue_was_configurable_still_decodes() -> None:
    runtime = RuntimeConfig(name="py", adapter="python")
    recorded = PoolConfig(runtime=runtime).model_dump(mode="json", by_alias=True)
    del recorded["runTaskQueue"]
    assert PoolConfig.model_validate(recorded).runTaskQueue == TASK_QUEUE


def test_the_runs_workflow_cache_defaults_small_and_is_chosen_on_the_command_line(tmp_path: Path) -> None:
    assert _settings(tmp_path).workflow_cache == DEFAULT_WORKFLOW_CACHE == 256  # type: ignore[attr-defined]
    assert _settings(tmp_path, "--workflow-cache", "0").workflow_cache == 0  # type: ignore[attr-defined]
    assert _settings(tmp_path, "--workflow-cache", "5000").workflow_cache == 5000  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", ["-1", "100001"])
def test_a_workflow_cache_out_of_range_is_refused_with_a_clear_message(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SystemExit, match="--workflow-cache takes 0 to 100,000"):
        _settings(tmp_path, "--workflow-cache", bad)
