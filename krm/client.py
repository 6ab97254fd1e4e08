"""RemoteEvaluator: the Evaluator interface over gRPC to a running `krt fn-runner`.

The runner's errors come back as the same `kruntimes.krm.errors` classes (by the `krt-reason` trailer),
a failure with what the function produced; gRPC's own errors (unreachable, deadline) map by code.
"""

from __future__ import annotations

import grpc
from google.protobuf.duration_pb2 import Duration

from kruntimes.krm import errors
from kruntimes.krm.evaluation import Evaluation, Request
from kruntimes.krm.protocol import EVALUATION_KEY, REASON_KEY, from_proto
from kruntimes.krm.service import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES
from kruntimes.rpc.v1 import krm_pb2 as pb
from kruntimes.rpc.v1 import krm_pb2_grpc as pb_grpc

# The answer to a call that ran to the deadline needs a moment to arrive.
DEADLINE_SLACK_SECONDS = 2.0

_BY_CODE: dict[grpc.StatusCode, type[errors.KrmError]] = {
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidRequest,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.CANCELLED: errors.Cancelled,
    grpc.StatusCode.FAILED_PRECONDITION: errors.ExecutionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
}


def error_of(e: grpc.aio.AioRpcError) -> errors.KrmError:
    metadata = dict(e.trailing_metadata() or ())
    reason = metadata.get(REASON_KEY)
    cls = errors.REASONS.get(reason) if isinstance(reason, str) else None
    if cls is None:
        cls = _BY_CODE.get(e.code(), errors.SystemError_)
    message = e.details() or e.code().name
    if cls is not None and reason is None:
        message = f"the runner call failed: {e.code().name}: {message}"
    elif message.startswith(f"{reason}: "):
        message = message[len(reason) + 2 :]
    if issubclass(cls, errors.ExecutionError):
        evaluation = None
        raw = metadata.get(EVALUATION_KEY)
        if isinstance(raw, bytes):
            evaluation = from_proto(pb.EvaluateFunctionResponse.FromString(raw))
        return cls(message, evaluation=evaluation)
    return cls(message)


class RemoteEvaluator:
    name = "runner"

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = grpc.aio.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
                ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
            ],
        )
        self._stub = pb_grpc.FunctionEvaluatorStub(self._channel)

    async def evaluate(self, request: Request) -> Evaluation:
        remaining = request.remaining()
        if remaining <= 0:
            raise errors.DeadlineExceeded("the deadline passed before the call")
        timeout = Duration()
        timeout.FromNanoseconds(int(remaining * 1e9))
        message = pb.EvaluateFunctionRequest(
            image=request.image, tag=request.tag, resource_list=request.resource_list, timeout=timeout
        )
        try:
            answer = await self._stub.EvaluateFunction(message, timeout=remaining + DEADLINE_SLACK_SECONDS)
        except grpc.aio.AioRpcError as e:
            raise error_of(e) from e
        return from_proto(answer)

    async def close(self) -> None:
        await self._channel.close()
