"""The gRPC FunctionEvaluator servicer: proto in, an Evaluator call, proto out. Errors are mapped
to gRPC codes here and nowhere else (`CODES`), with the stable reason in the trailing metadata
`krt-reason` and, for an ExecutionError, what the function produced in `krt-evaluation-bin`."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kruntimes.krm import errors
from kruntimes.krm.evaluation import Request
from kruntimes.krm.evaluator import Evaluator
from kruntimes.krm.limits import (
    DEFAULT_TIMEOUT_SECONDS,
    MAX_LOG_BYTES,
    MAX_RESOURCE_LIST_BYTES,
    MAX_TIMEOUT_SECONDS,
)
from kruntimes.krm.protocol import EVALUATION_KEY, REASON_KEY, failure_trailer, to_proto
from kruntimes.rpc.v1 import krm_pb2 as pb
from kruntimes.rpc.v1 import krm_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = "kruntimes.rpc.v1.FunctionEvaluator"
# A request over this is refused by gRPC itself (RESOURCE_EXHAUSTED); one just over the
# ResourceList bound still arrives and gets InputTooLarge, which says which bound.
MAX_REQUEST_BYTES = MAX_RESOURCE_LIST_BYTES + 64 * 1024
MAX_RESPONSE_BYTES = MAX_RESOURCE_LIST_BYTES + MAX_LOG_BYTES + 1024 * 1024

CODES: dict[type[errors.KrmError], grpc.StatusCode] = {
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
    errors.ExecutionError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.SystemError_: grpc.StatusCode.UNAVAILABLE,
}


def status_code(exc: errors.KrmError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return grpc.StatusCode.UNAVAILABLE


def request_of(message: pb.EvaluateFunctionRequest, context: Context) -> Request:
    timeout = message.timeout.ToTimedelta().total_seconds() if message.HasField("timeout") else None
    if timeout is not None and not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise errors.InvalidRequest(f"timeout must be in (0, {MAX_TIMEOUT_SECONDS:g}] seconds")
    remaining = context.time_remaining()
    if remaining is not None:
        timeout = min(timeout if timeout is not None else DEFAULT_TIMEOUT_SECONDS, max(remaining, 1e-3))
    return Request.new(
        image=message.image, tag=message.tag, resource_list=message.resource_list, timeout=timeout
    )


class FunctionEvaluatorService(pb_grpc.FunctionEvaluatorServicer):
    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    async def EvaluateFunction(
        self, request: pb.EvaluateFunctionRequest, context: Context
    ) -> pb.EvaluateFunctionResponse:
        try:
            evaluation = await self.evaluator.evaluate(request_of(request, context))
        except errors.KrmError as e:
            await _abort(context, e)
        except Exception as e:  # a bug, not the function: say so without internals
            log.exception("EvaluateFunction failed unexpectedly")
            await _abort(context, errors.SystemError_(f"internal error ({type(e).__name__})"))
        return to_proto(evaluation)


async def _abort(context: Context, exc: errors.KrmError) -> NoReturn:
    metadata: list[tuple[str, str | bytes]] = [(REASON_KEY, exc.reason)]
    if isinstance(exc, errors.ExecutionError) and exc.evaluation is not None:
        metadata.append((EVALUATION_KEY, failure_trailer(exc.evaluation)))
    await context.abort(status_code(exc), str(exc), tuple(metadata))
    raise AssertionError("unreachable: abort raises")


class EvaluatorServer:
    """The gRPC server with the FunctionEvaluator and health services on `listen`."""

    def __init__(self, evaluator: Evaluator, *, listen: str) -> None:
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
            ]
        )
        pb_grpc.add_FunctionEvaluatorServicer_to_server(FunctionEvaluatorService(evaluator), self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")

    async def start(self) -> None:
        await self.server.start()
        for name in (SERVICE_NAME, ""):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
