"""RemoteEvaluator: the Evaluator interface over gRPC to a running `krt fn-runner`.

The runner's errors come back as the same `kruntimes.krm.errors` classes (by the `krt-reason` trailer),
a failure with what the function produced; gRPC's own errors (unreachable, deadline) map by code.

A runner on a Unix socket (`unix:PATH`) is reached as it is: the socket's mode says who may. One
on a TCP port is reached with mutual TLS, presenting a platform certificate (`runner_tls`: a
directory given, else the embedded platform's control-plane certificate in the client config's
state directory) and expecting the runner's to name a host identity (RUNNER_ROLE).
"""

from __future__ import annotations

from pathlib import Path

import grpc
from cryptography import x509
from google.protobuf.duration_pb2 import Duration

from kruntimes.krm import errors
from kruntimes.krm.evaluation import Evaluation, Request
from kruntimes.krm.protocol import EVALUATION_KEY, REASON_KEY, from_proto
from kruntimes.krm.service import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES, UNIX
from kruntimes.pki import TLS_CERT, IdentityError, PeerTLS, PeerTLSError, Role, identity_of
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


# The embedded platform's control-plane certificate, under the state directory (`krt up` keeps it).
EMBEDDED_TLS = Path("pki") / "control-plane"
# the role of the runner's own certificate: a serving role (control-plane certificates serve nothing),
# the least trusted one; a host certificate of the krm runtime, say
RUNNER_ROLE = Role.HOST


def platform_tls(directory: Path) -> PeerTLS:
    """A platform certificate directory (tls.crt, tls.key, ca.crt) of whatever role it names."""
    try:
        role = identity_of(x509.load_pem_x509_certificate((directory / TLS_CERT).read_bytes())).role
        return PeerTLS(directory, role=role)
    except (OSError, ValueError, IdentityError, PeerTLSError) as e:
        raise errors.SystemError_(f"{directory} is not a platform certificate directory: {e}") from e


def runner_tls(address: str, *, tls_dir: Path | None, state_dir: Path) -> PeerTLS | None:
    """What `address` is reached with: nothing on a Unix socket; else the certificate of
    `tls_dir`, or the embedded platform's under `state_dir`."""
    if address.startswith(UNIX):
        return None
    directory = tls_dir if tls_dir is not None else state_dir / EMBEDDED_TLS
    if tls_dir is None and not (directory / TLS_CERT).is_file():
        raise errors.SystemError_(
            f"a runner on a TCP port ({address}) is reached with mutual TLS: give a platform certificate "
            "directory (--runner-tls DIR), or run where the client config's platform keeps one "
            f"({directory})"
        )
    return platform_tls(directory)


class RemoteEvaluator:
    name = "runner"

    def __init__(self, address: str, *, tls: PeerTLS | None = None) -> None:
        self.address = address
        options = [
            ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
            ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
        ]
        if address.startswith(UNIX):
            self._channel = grpc.aio.insecure_channel(address, options=options)
        elif tls is None:
            raise errors.SystemError_(f"a runner on a TCP port ({address}) is reached with mutual TLS only")
        else:
            self._channel = grpc.aio.secure_channel(
                address, tls.channel_credentials(), options=[*options, *tls.channel_options(RUNNER_ROLE)]
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
