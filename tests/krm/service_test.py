"""The FunctionEvaluator gRPC service end to end on a real port, every error code."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from kruntimes.krm import errors
from kruntimes.krm.client import RemoteEvaluator
from kruntimes.krm.executable import ExecEvaluator
from kruntimes.krm.limits import MAX_RESOURCE_LIST_BYTES
from kruntimes.krm.multi import MultiEvaluator
from kruntimes.krm.pod import PodEvaluator
from kruntimes.krm.protocol import EVALUATION_KEY, REASON_KEY
from kruntimes.krm.resources import parse_resource_list
from kruntimes.krm.service import EvaluatorServer
from kruntimes.rpc.v1 import krm_pb2 as pb
from kruntimes.rpc.v1 import krm_pb2_grpc as pb_grpc
from tests.krm import programs
from tests.krm.conftest import eventually, request, store_with
from tests.support.procs import alive

BINARIES = ("set-labels", "validator", "garbage", "missing", "sleeper", "stubborn")


@pytest.fixture
async def address(functions: Path) -> AsyncIterator[str]:
    """The service on a Unix socket of its own (a short path: at most 107 bytes)."""
    executor = ExecEvaluator(store_with(functions, *BINARIES), max_parallel=1, max_waiting=0)
    with tempfile.TemporaryDirectory(prefix="krt-service-") as sockets:
        server = EvaluatorServer(
            MultiEvaluator([executor, PodEvaluator(executor.store, client=None)]),
            listen=f"unix:{sockets}/fn.sock",
        )
        await server.start()
        yield server.address
        await server.stop(0.5)


@pytest.fixture
async def stub(address: str) -> AsyncIterator[pb_grpc.FunctionEvaluatorStub]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield pb_grpc.FunctionEvaluatorStub(channel)


def message(
    image: str, *, data: bytes | None = None, timeout: float | None = 30.0
) -> pb.EvaluateFunctionRequest:
    msg = pb.EvaluateFunctionRequest(
        image=image, resource_list=data if data is not None else request().resource_list
    )
    if timeout is not None:
        msg.timeout.CopyFrom(Duration(seconds=int(timeout), nanos=int((timeout % 1) * 1e9)))
    return msg


async def status_of(stub, msg: pb.EvaluateFunctionRequest) -> tuple[grpc.StatusCode, str, dict]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.EvaluateFunction(msg, timeout=30)
    return caught.value.code(), caught.value.details(), dict(caught.value.trailing_metadata() or ())


async def test_an_evaluation_answers_the_output_log_and_exit_code(stub) -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"tier": "db"}}
    answer = await stub.EvaluateFunction(
        message("example.com/fn/set-labels:v1.0.0", data=request(config=config).resource_list)
    )
    items = parse_resource_list(answer.resource_list)["items"]
    assert {i["metadata"]["labels"]["tier"] for i in items} == {"db"}
    assert (answer.log, answer.log_truncated, answer.exit_code) == (b"labelled 2 resources\n", False, 0)


async def test_an_unknown_image_is_not_found(stub) -> None:
    code, details, metadata = await status_of(stub, message("example.com/fn/unknown:v1.0.0"))
    assert (code, metadata[REASON_KEY]) == (grpc.StatusCode.NOT_FOUND, "NotFound")
    assert "no evaluator has example.com/fn/unknown" in details


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (message(""), "InvalidRequest"),
        (message("with space"), "InvalidRequest"),
        (message("example.com/fn/set-labels:v1.0.0", timeout=10_000), "InvalidRequest"),
        (
            message("example.com/fn/set-labels:v1.0.0", data=b"x" * (MAX_RESOURCE_LIST_BYTES + 1)),
            "InputTooLarge",
        ),
    ],
)
async def test_a_bad_request_is_invalid_argument(stub, msg, reason: str) -> None:
    code, _, metadata = await status_of(stub, msg)
    assert (code, metadata[REASON_KEY]) == (grpc.StatusCode.INVALID_ARGUMENT, reason)


async def test_a_function_past_its_deadline_is_deadline_exceeded(stub, pid_file: Path) -> None:
    code, details, metadata = await status_of(stub, message("example.com/fn/sleeper:v1.0.0", timeout=0.5))
    assert (code, metadata[REASON_KEY]) == (grpc.StatusCode.DEADLINE_EXCEEDED, "DeadlineExceeded")
    assert "exec evaluator" in details
    for pid in programs.pids(pid_file):  # none when it was killed before it got to write one
        await eventually(lambda pid=pid: not alive(pid), timeout=5)


async def test_a_failing_function_is_failed_precondition_with_its_results(stub) -> None:
    code, details, metadata = await status_of(stub, message("example.com/fn/validator:v1.0.0"))
    assert (code, metadata[REASON_KEY]) == (grpc.StatusCode.FAILED_PRECONDITION, "FunctionFailed")
    evaluation = pb.EvaluateFunctionResponse.FromString(metadata[EVALUATION_KEY])
    assert evaluation.exit_code == 1 and evaluation.log == b"validation failed\n"
    (result,) = evaluation.results
    assert (result.severity, result.resource_ref.name, result.field.path) == (
        "error",
        "one",
        "metadata.labels.owner",
    )
    assert result.field.proposed_value.string_value == "team-a"


async def test_output_that_is_not_a_resource_list_is_failed_precondition(stub) -> None:
    code, _, metadata = await status_of(stub, message("example.com/fn/garbage:v1.0.0"))
    assert (code, metadata[REASON_KEY]) == (grpc.StatusCode.FAILED_PRECONDITION, "InvalidOutput")


async def test_a_binary_that_cannot_start_is_unavailable(stub) -> None:
    code, _, metadata = await status_of(stub, message("example.com/fn/missing:v1.0.0"))
    assert (code, metadata[REASON_KEY]) == (grpc.StatusCode.UNAVAILABLE, "SystemError")


async def test_past_the_bound_of_evaluations_a_request_is_resource_exhausted(stub, pid_file: Path) -> None:
    busy = asyncio.ensure_future(stub.EvaluateFunction(message("example.com/fn/sleeper:v1.0.0"), timeout=30))
    await eventually(lambda: len(programs.pids(pid_file)) == 1, timeout=20, what="the first is running")
    code, _, metadata = await status_of(stub, message("example.com/fn/set-labels:v1.0.0"))
    assert (code, metadata[REASON_KEY]) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "ResourceExhausted")
    busy.cancel()
    await asyncio.gather(busy, return_exceptions=True)


async def test_a_client_that_cancels_leaves_no_process_behind(stub, pid_file: Path) -> None:
    call = stub.EvaluateFunction(message("example.com/fn/stubborn:v1.0.0"), timeout=30)
    waiting = asyncio.ensure_future(call)
    await eventually(lambda: len(programs.pids(pid_file)) == 2, timeout=20, what="the function started")
    call.cancel()
    assert (await asyncio.gather(waiting, return_exceptions=True))[0] is not None
    for pid in programs.pids(pid_file):
        await eventually(lambda pid=pid: not alive(pid), timeout=5, what=f"pid {pid} gone")


async def test_the_remote_evaluator_raises_the_runners_errors_as_they_were(address: str) -> None:
    remote = RemoteEvaluator(address)
    try:
        evaluation = await remote.evaluate(request("example.com/fn/set-labels:v1.0.0"))
        assert evaluation.exit_code == 0
        with pytest.raises(errors.FunctionFailed) as caught:
            await remote.evaluate(request("example.com/fn/validator:v1.0.0"))
        assert caught.value.evaluation is not None
        assert caught.value.evaluation.results[0].message == "every resource needs an owner label"
        with pytest.raises(errors.NotFound):
            await remote.evaluate(request("example.com/fn/unknown:v1.0.0"))
        with pytest.raises(errors.DeadlineExceeded):
            await remote.evaluate(request("example.com/fn/sleeper:v1.0.0", timeout=0.5))
    finally:
        await remote.close()


async def test_an_unreachable_runner_is_a_system_error(tmp_path: Path) -> None:
    remote = RemoteEvaluator(f"unix:{tmp_path / 'nobody-listens.sock'}")
    try:
        with pytest.raises(errors.SystemError_, match="UNAVAILABLE"):
            await remote.evaluate(request(timeout=5))
    finally:
        await remote.close()
