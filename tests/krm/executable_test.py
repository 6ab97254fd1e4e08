"""The exec evaluator on real function processes."""

from __future__ import annotations

import asyncio
import resource
import signal
from pathlib import Path

import pytest

from kruntimes.krm import errors, process
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.limits import MAX_LOG_BYTES
from kruntimes.krm.resources import parse_resource_list
from tests.krm import programs
from tests.krm.conftest import eventually, request, store_with
from tests.support.procs import alive

CONFIG = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "in"}, "data": {"app": "web"}}


async def test_set_labels_transforms_the_items_with_its_function_config(functions: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "set-labels"))
    evaluation = await evaluator.evaluate(request("example.com/fn/set-labels:v1.2.0", config=CONFIG))
    output = parse_resource_list(evaluation.resource_list)
    assert [i["metadata"]["labels"]["app"] for i in output["items"]] == ["web", "web"]
    assert evaluation.log == b"labelled 2 resources\n"
    assert (evaluation.exit_code, evaluation.results, evaluation.log_truncated) == (0, (), False)


async def test_a_validator_fails_with_its_results_kept(functions: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "validator"))
    with pytest.raises(errors.FunctionFailed) as caught:
        await evaluator.evaluate(request("example.com/fn/validator:v1.0.0"))
    assert "every resource needs an owner label" in str(caught.value)
    evaluation = caught.value.evaluation
    assert evaluation is not None and evaluation.exit_code == 1
    (result,) = evaluation.results
    assert result.severity == "error"
    assert result.resourceRef is not None and (result.resourceRef.kind, result.resourceRef.name) == (
        "ConfigMap",
        "one",
    )
    assert result.field is not None and (result.field.path, result.field.proposedValue) == (
        "metadata.labels.owner",
        "team-a",
    )
    assert result.file is not None and result.file.index == 0
    assert result.tags == {"rule": "owner"}
    assert evaluation.log == b"validation failed\n"


async def test_a_non_zero_exit_without_output_is_a_failure_with_its_log(functions: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "exit-1"))
    with pytest.raises(errors.FunctionFailed, match="exited with code 1") as caught:
        await evaluator.evaluate(request("example.com/fn/exit-1:v1.0.0"))
    assert caught.value.evaluation is not None
    assert (caught.value.evaluation.exit_code, caught.value.evaluation.results) == (1, ())
    assert caught.value.evaluation.log == b"something went wrong\n"


async def test_output_that_is_not_a_resource_list_is_invalid_output(functions: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "garbage"))
    with pytest.raises(errors.InvalidOutput, match="not a ResourceList") as caught:
        await evaluator.evaluate(request("example.com/fn/garbage:v1.0.0"))
    assert caught.value.__cause__ is not None  # the parse error it wraps
    assert caught.value.evaluation is not None and caught.value.evaluation.exit_code == 0


async def test_the_log_is_bounded_and_marked_truncated(functions: Path) -> None:
    evaluation = await ExecEvaluator(store_with(functions, "noisy")).evaluate(
        request("example.com/fn/noisy:v1.0.0")
    )
    assert len(evaluation.log) == MAX_LOG_BYTES and evaluation.log_truncated


async def test_a_binary_that_cannot_start_is_a_system_error(functions: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "missing"))
    with pytest.raises(errors.SystemError_, match="cannot start"):
        await evaluator.evaluate(request("example.com/fn/missing:v1.0.0"))
    (functions / "not-executable").write_text("#!/bin/sh\n")
    with pytest.raises(errors.SystemError_, match="cannot start"):
        await ExecEvaluator(store_with(functions, "not-executable")).evaluate(
            request("example.com/fn/not-executable:v1.0.0")
        )


async def test_an_image_without_a_binary_is_not_found(functions: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "set-labels"))
    with pytest.raises(errors.NotFound):
        await evaluator.evaluate(request("example.com/fn/set-labels:v2.0.0"))
    with pytest.raises(errors.NotFound):
        await evaluator.evaluate(request("example.com/fn/other:v1.0.0"))


async def deadline_leaves_nothing(evaluator: ExecEvaluator, image: str, pid_file: Path, started: int) -> None:
    # The deadline is long enough for a loaded machine to start the program and record its pids.
    task = asyncio.create_task(evaluator.evaluate(request(image, timeout=4.0)))
    await eventually(lambda: len(programs.pids(pid_file)) == started, timeout=4, what="the function started")
    with pytest.raises(errors.DeadlineExceeded):
        await task
    for pid in programs.pids(pid_file):
        await eventually(lambda pid=pid: not alive(pid), timeout=5, what=f"pid {pid} gone")


async def test_a_deadline_kills_the_function_and_leaves_no_process(functions: Path, pid_file: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "sleeper"))
    await deadline_leaves_nothing(evaluator, "example.com/fn/sleeper:v1.0.0", pid_file, 1)


async def test_a_deadline_kills_a_sigterm_ignoring_function_and_its_child(
    functions: Path, pid_file: Path
) -> None:
    evaluator = ExecEvaluator(store_with(functions, "stubborn"))
    await deadline_leaves_nothing(evaluator, "example.com/fn/stubborn:v1.0.0", pid_file, 2)


async def test_a_cancelled_evaluation_kills_the_whole_group_at_once(functions: Path, pid_file: Path) -> None:
    evaluator = ExecEvaluator(store_with(functions, "stubborn"))
    task = asyncio.create_task(evaluator.evaluate(request("example.com/fn/stubborn:v1.0.0", timeout=60)))
    await eventually(lambda: len(programs.pids(pid_file)) == 2, timeout=20, what="the function started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for pid in programs.pids(pid_file):
        await eventually(lambda pid=pid: not alive(pid), timeout=5, what=f"pid {pid} gone")


async def test_beyond_the_waiting_bound_a_request_is_resource_exhausted(
    functions: Path, pid_file: Path
) -> None:
    evaluator = ExecEvaluator(store_with(functions, "sleeper"), max_parallel=1, max_waiting=1)
    running = asyncio.create_task(evaluator.evaluate(request("example.com/fn/sleeper:v1.0.0", timeout=60)))
    waiting = asyncio.create_task(evaluator.evaluate(request("example.com/fn/sleeper:v1.0.0", timeout=60)))
    await eventually(lambda: len(programs.pids(pid_file)) == 1, timeout=20, what="the first started")
    with pytest.raises(errors.ResourceExhausted):
        await evaluator.evaluate(request("example.com/fn/sleeper:v1.0.0"))
    for task in (running, waiting):
        task.cancel()
    await asyncio.gather(running, waiting, return_exceptions=True)
    assert len(programs.pids(pid_file)) == 1, "the waiting one never started"
    await eventually(lambda: not alive(programs.pids(pid_file)[0]), timeout=5)


async def test_the_process_runs_under_its_limits(tmp_path: Path) -> None:
    script = programs.write(
        tmp_path,
        "limits",
        "import resource, sys\nsys.stdin.read()\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[1], resource.getrlimit(resource.RLIMIT_CORE)[1],"
        " file=sys.stderr)\n"
        "print('apiVersion: config.kubernetes.io/v1\\nkind: ResourceList\\nitems: []')\n",
    )
    limits = process.Limits(open_files=77)
    evaluation = await ExecEvaluator(None, limits=limits).run([str(script)], request())  # type: ignore[arg-type]
    assert evaluation.log.split() == [b"77", b"0"]
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] != 77, "the runner's own limits are untouched"


async def test_a_launcher_that_dies_fails_its_evaluations_kills_their_processes_and_is_replaced(
    functions: Path, pid_file: Path
) -> None:
    evaluator = ExecEvaluator(store_with(functions, "sleeper", "echo"))
    task = asyncio.create_task(evaluator.evaluate(request("example.com/fn/sleeper:v1.0.0", timeout=60)))
    await eventually(lambda: len(programs.pids(pid_file)) == 1, timeout=20, what="the function started")
    launcher = process.Launcher.current(evaluator.limits)
    launcher.process.kill()  # the launcher this test's evaluations started
    with pytest.raises(errors.SystemError_):
        await task
    (pid,) = programs.pids(pid_file)
    await eventually(lambda: not alive(pid), timeout=5, what="the function's process gone")
    evaluation = await evaluator.evaluate(request("example.com/fn/echo:v1.0.0"))
    assert parse_resource_list(evaluation.resource_list)["items"]
    assert process.Launcher.current(evaluator.limits) is not launcher


async def test_a_launcher_is_replaced_after_its_starts_and_ends_when_its_last_process_has(
    functions: Path,
) -> None:
    evaluator = ExecEvaluator(store_with(functions, "echo"))
    first = process.Launcher.current(evaluator.limits)
    first.max_starts = first.starts + 2
    for _ in range(3):
        await evaluator.evaluate(request("example.com/fn/echo:v1.0.0"))
    second = process.Launcher.current(evaluator.limits)
    assert second is not first and second.starts == 1
    await eventually(lambda: first.process.poll() is not None, timeout=10, what="the first launcher ended")


async def test_what_a_function_leaves_in_its_group_ends_with_it(functions: Path, pid_file: Path) -> None:
    """Its child holds its stdout open: the answer comes once the group is killed with it."""
    evaluator = ExecEvaluator(store_with(functions, "leaver"))
    answer = await asyncio.wait_for(evaluator.evaluate(request("example.com/fn/leaver:v1.0.0")), 30)
    assert answer.exit_code == 0 and answer.resource_list
    [child] = programs.pids(pid_file)
    await eventually(lambda: not alive(child), timeout=5, what=f"the child {child} gone")


async def test_a_function_that_exited_is_never_signalled_again() -> None:
    """Its pid is free once the launcher reaped it, and may lead another group by then (a host
    started in its own session, say): a kill after the exit must not reach that group."""
    loop = asyncio.get_running_loop()
    other = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
    try:
        started = process.Started(loop)
        started._started(other.pid)  # as if the function's number were the other group's now
        started.exited.set_result(0)
        started.kill()
        # A SIGKILL takes hold as it is sent: a later SIGTERM ends the process only if none came.
        other.terminate()
        assert await other.wait() == -signal.SIGTERM, "the kill reached the other group"
    finally:
        if other.returncode is None:
            other.kill()
            await other.wait()
