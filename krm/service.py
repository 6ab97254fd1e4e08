"""The gRPC FunctionEvaluator servicer: proto in, an Evaluator call, proto out. Errors are mapped
to gRPC codes here and nowhere else (`CODES`), with the stable reason in the trailing metadata
`krt-reason` and, for an ExecutionError, what the function produced in `krt-evaluation-bin`.

Who may call: the server listens either on a TCP port with mutual TLS, where every caller
presents a certificate of the platform CA naming a platform identity (UNAUTHENTICATED without
one; any role), or on a Unix socket only its owner can open (mode 0600 in a directory others
cannot write). A plaintext TCP port is refused: any local user could evaluate functions there.
Each caller (its identity; the socket's owner) has at most `CallerBounds.running` evaluations
running and `CallerBounds.waiting` more queued; past that it gets ResourceExhausted at once, so
one caller's slow requests cannot keep another waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
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
from kruntimes.pki import ANY_ROLE, PeerAuthorization, PeerTLS, peer_identity
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


UNIX = "unix:"
LOCAL_CALLER = "local"  # the owner of the Unix socket, the one who can open it


def caller_of(context: Context) -> str:
    """Whom a call counts against: the platform identity of its certificate, or the socket's owner."""
    identity = peer_identity(context)
    return str(identity) if identity is not None else LOCAL_CALLER


@dataclass
class _Caller:
    running: asyncio.Semaphore
    admitted: int = 0


@dataclass
class CallerBounds:
    """Each caller's share: `running` evaluations at once, `waiting` more queued behind them."""

    running: int = 4
    waiting: int = 4
    _callers: dict[str, _Caller] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.running < 1 or self.waiting < 0:
            raise ValueError("a caller runs at least one evaluation and waits with none or more")

    @contextlib.asynccontextmanager
    async def admit(self, caller: str, request: Request) -> AsyncIterator[None]:
        """Run the body as one of `caller`'s evaluations; ResourceExhausted past its share,
        DeadlineExceeded when the request's deadline passes while it waits for its turn."""
        entry = self._callers.get(caller)
        if entry is None:
            entry = self._callers[caller] = _Caller(asyncio.Semaphore(self.running))
        if entry.admitted >= self.running + self.waiting:
            raise errors.ResourceExhausted(
                f"{caller} has {entry.admitted} evaluations running or waiting, its bound; retry later"
            )
        entry.admitted += 1
        try:
            try:
                async with asyncio.timeout(request.remaining()):
                    await entry.running.acquire()
            except TimeoutError as e:
                raise errors.DeadlineExceeded(
                    "the deadline passed while waiting for this caller's turn"
                ) from e
            try:
                yield
            finally:
                entry.running.release()
        finally:
            entry.admitted -= 1
            if entry.admitted == 0:
                del self._callers[caller]

    def admitted(self, caller: str) -> int:
        entry = self._callers.get(caller)
        return entry.admitted if entry is not None else 0


class FunctionEvaluatorService(pb_grpc.FunctionEvaluatorServicer):
    def __init__(self, evaluator: Evaluator, bounds: CallerBounds | None = None) -> None:
        self.evaluator = evaluator
        self.bounds = bounds or CallerBounds()

    async def EvaluateFunction(
        self, request: pb.EvaluateFunctionRequest, context: Context
    ) -> pb.EvaluateFunctionResponse:
        try:
            asked = request_of(request, context)
            async with self.bounds.admit(caller_of(context), asked):
                evaluation = await self.evaluator.evaluate(asked)
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


class ListenRefused(ValueError):
    """A listen address the runner must not serve on as asked (plaintext TCP, an open directory)."""


def check_listen(listen: str, *, tls: bool) -> None:
    """ListenRefused unless `listen` is a Unix socket or it is served with TLS."""
    if not listen.startswith(UNIX) and not tls:
        raise ListenRefused(
            f"--listen {listen} would be a plaintext port any local user could evaluate functions on: "
            "give --tls DIR (mutual TLS with platform identities), or listen on a Unix socket "
            "only you can open (--listen unix:PATH)"
        )


def _private_socket_directory(path: str) -> None:
    """The socket's directory: made mode 0700 when missing; refused when another user could
    write there (and so replace the socket with one of theirs)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ListenRefused(
            f"{directory} is not this user's alone: put the runner's socket in a directory of yours"
        )


class EvaluatorServer:
    """The gRPC server with the FunctionEvaluator and health services on `listen`: a Unix socket
    (`unix:PATH`, mode 0600) or, with `tls` (a platform certificate), a TCP port of mutual TLS
    that any platform identity may call."""

    def __init__(
        self,
        evaluator: Evaluator,
        *,
        listen: str,
        tls: PeerTLS | None = None,
        bounds: CallerBounds | None = None,
    ) -> None:
        check_listen(listen, tls=tls is not None)
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
            ],
            interceptors=[PeerAuthorization({}, default=ANY_ROLE)] if tls is not None else None,
        )
        pb_grpc.add_FunctionEvaluatorServicer_to_server(
            FunctionEvaluatorService(evaluator, bounds), self.server
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.address = listen
        if listen.startswith(UNIX):
            path = listen[len(UNIX) :]
            _private_socket_directory(path)
            mask = os.umask(0o177)  # the socket is made 0600, never open for a moment
            try:
                self.port = self.server.add_insecure_port(listen)
            finally:
                os.umask(mask)
            os.chmod(path, 0o600)
        else:
            assert tls is not None  # check_listen
            self.port = self.server.add_secure_port(listen, tls.server_credentials())
            if self.port:
                self.address = f"{listen.rsplit(':', 1)[0]}:{self.port}"
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")

    async def start(self) -> None:
        await self.server.start()
        for name in (SERVICE_NAME, ""):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
