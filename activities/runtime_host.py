"""Activities that call a runtime host's Runtime Server over gRPC.

Failures become ApplicationErrors whose type is the host's stable reason: transport trouble
(UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED) is retryable, everything the host decided is not.

Registering signs the assignment (kruntimes.pki.assignments) here, in the activity: the signing key
lives in the worker process and never reaches workflow code or Temporal history. The channel for
a registration verifies that the server is exactly the assigned host.

Unregistering and cancelling a task succeed without the host when it is proven gone (`gone`,
asked after transport trouble): what they would stop cannot be running, so nothing is retried
against a dead host.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC

import grpc
from temporalio import activity
from temporalio.exceptions import ApplicationError

from kruntimes.activities.heartbeat import heartbeating
from kruntimes.activities.hosts._rpc import credentials_generation, host_channel
from kruntimes.api.run import Run
from kruntimes.contracts.hostcalls import (
    CancelTaskInput,
    FunctionState,
    HostCall,
    RegisterInput,
    RegisterResult,
    RunOnHost,
    StatusInput,
    TaskInput,
    TaskResult,
    UnregisterInput,
)
from kruntimes.pki import Identity, IdentityError
from kruntimes.pki.assignments import AssignmentError, SignedAssignment, Signer
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.wire.reasons import HostReason, error_class_of, reason_of

RPC_TIMEOUT_S = 30.0
REGISTER_TIMEOUT_S = 90.0  # includes loading the handler module
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}

_TASK_STATUS = {
    pb.TASK_STATUS_SUCCEEDED: "Succeeded",
    pb.TASK_STATUS_FAILED: "Failed",
    pb.TASK_STATUS_TIMED_OUT: "Timeout",
    pb.TASK_STATUS_CANCELLED: "Cancelled",
}


def _reason(err: grpc.aio.AioRpcError) -> str:
    """The host's reason; without one (the call failed before the host decided), HostUnavailable
    for transport trouble, else the gRPC code's name."""
    reason = reason_of(err.trailing_metadata())
    if reason:
        return reason
    return str(HostReason.HOST_UNAVAILABLE) if err.code() in _RETRYABLE else err.code().name


def host_error(err: grpc.aio.AioRpcError, *, address: str) -> ApplicationError:
    """The host's refusal as the activity's error: its reason is the type; the adapter's error
    class behind it, when the host named one, is the one detail (the Run's plain message names it)."""
    reason = _reason(err)
    error_class = error_class_of(err.trailing_metadata())
    return ApplicationError(
        f"runtime host {address}: {err.details() or err.code().name}",
        *((error_class,) if error_class else ()),
        type=reason,
        non_retryable=err.code() not in _RETRYABLE,
    )


def function_config(run: Run, adapter: str) -> pb.FunctionConfig:
    spec = run.spec
    config = pb.FunctionConfig(
        adapter=adapter,
        handler=spec.handler,
        env=dict(spec.env),
        env_from=[pb.EnvFromSecret(secret=e.secretRef.name, prefix=e.prefix) for e in spec.envFrom],
    )
    mode = spec.mode.function
    if mode is not None:  # what it takes at once (0: the adapter's default)
        config.concurrency = mode.concurrency or 0
        config.queue = mode.queue or 0
        if mode.queue:
            config.queue_timeout_ms = round(mode.queue_timeout_seconds * 1000)
        # the gateway enforces them from the host's heartbeats (docs/async-invocations.md)
        policy = mode.async_invocations
        config.async_backlog = policy.backlog
        config.async_share = policy.share
    creator = run.metadata.creator
    if creator is not None:  # the host gives secrets only to a creator bound to use them
        config.creator.CopyFrom(pb.Creator(kind=creator.kind, subject=creator.subject))
    if spec.source.path is not None:
        config.source_path = spec.source.path
    else:
        files = spec.source.inline or []
        config.inline.CopyFrom(
            pb.InlineSource(
                files=[
                    pb.InlineFile(name=f.name, content=f.content.encode(), executable=f.executable)
                    for f in files
                ]
            )
        )
    return config


def _run_ref(input: RunOnHost) -> pb.RunRef:
    return pb.RunRef(
        run_uid=input.runUid,
        attempt=input.attempt,
        namespace=input.namespace,
        name=input.name,
        runtime=input.runtime,
    )


def _assignment(signer: Signer, input: RegisterInput) -> tuple[Identity, pb.SignedAssignment]:
    """The assigned host's identity and the signed assignment of this attempt to it."""
    replica = input.replicaOf
    try:
        host = Identity.host(runtime=input.runtime, host_id=input.hostId)
        signed = signer.sign(
            SignedAssignment(
                run_uid=input.runUid,
                attempt=input.attempt,
                host_id=input.hostId,
                host_uid=input.hostUid,
                namespace=input.namespace,
                name=input.name,
                runtime=input.runtime,
                function_uid=replica.functionUid if replica is not None else "",
                revision=replica.revision if replica is not None else 0,
            )
        )
    except (AssignmentError, IdentityError) as e:
        raise ApplicationError(str(e), type=str(HostReason.ASSIGNMENT_INVALID), non_retryable=True) from e
    return host, signed


# Whether the host a call went to is proven gone (the call's host, its address).
GoneCheck = Callable[[HostCall, str], Awaitable[bool]]


async def _never_gone(host: HostCall, address: str) -> bool:
    return False


class RuntimeHostActivities:
    """One gRPC channel per host address (and host identity, for registrations), kept for the
    worker's lifetime; replaced once the control plane's certificate files change (the old ones
    are closed at the end, so no call on them is cut)."""

    def __init__(self, *, signer: Signer, gone: GoneCheck = _never_gone) -> None:
        self.signer = signer
        self._channels: dict[tuple[str, Identity | None], tuple[int, grpc.aio.Channel]] = {}
        self._retired: list[grpc.aio.Channel] = []
        self.gone = gone

    async def _proven_gone(self, err: grpc.aio.AioRpcError, host: HostCall | None, address: str) -> bool:
        return err.code() in _RETRYABLE and host is not None and await self.gone(host, address)

    def _stub(self, address: str, host: Identity | None = None) -> pb_grpc.FunctionRuntimeAsyncStub:
        generation = credentials_generation()
        held = self._channels.get((address, host))
        if held is None or held[0] != generation:
            if held is not None:
                self._retired.append(held[1])
            held = self._channels[(address, host)] = (generation, host_channel(address, host=host))
        return pb_grpc.FunctionRuntimeStub(held[1])

    async def close(self) -> None:
        channels = [c for _, c in self._channels.values()] + self._retired
        self._channels, self._retired = {}, []
        for channel in channels:
            await channel.close()

    @activity.defn(name="register_function")
    async def register_function(self, input: RegisterInput) -> RegisterResult:
        host, signed = _assignment(self.signer, input)
        request = pb.RegisterFunctionRequest(
            run=_run_ref(input),
            config=function_config(input.run, input.adapter),
            assignment=signed,
        )
        try:
            answer = await heartbeating(
                self._stub(input.address, host).RegisterFunction(request, timeout=REGISTER_TIMEOUT_S)
            )
        except grpc.aio.AioRpcError as err:
            raise host_error(err, address=input.address) from err
        return RegisterResult(
            registrationId=answer.registration_id, hostUid=answer.host_uid, created=answer.created
        )

    @activity.defn(name="function_status")
    async def function_status(self, input: StatusInput) -> FunctionState:
        request = pb.FunctionStatusRequest(registration_id=input.registrationId)
        try:
            answer = await self._stub(input.address).FunctionStatus(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise host_error(err, address=input.address) from err
        return FunctionState(
            registered=answer.registered,
            ready=answer.ready,
            fatalError=answer.fatal_error,
            inFlight=answer.in_flight,
            waiting=answer.waiting,
            lastActivity=answer.last_activity.ToDatetime(tzinfo=UTC) if answer.registered else None,
            hostUid=answer.host_uid,
        )

    @activity.defn(name="unregister_function")
    async def unregister_function(self, input: UnregisterInput) -> bool:
        request = pb.UnregisterFunctionRequest(
            registration_id=input.registrationId, grace_ms=int(input.graceSeconds * 1000)
        )
        try:
            answer = await self._stub(input.address).UnregisterFunction(
                request, timeout=RPC_TIMEOUT_S + input.graceSeconds
            )
        except grpc.aio.AioRpcError as err:
            if await self._proven_gone(err, input.host, input.address):
                return False
            raise host_error(err, address=input.address) from err
        return bool(answer.existed)

    @activity.defn(name="execute_task")
    async def execute_task(self, input: TaskInput) -> TaskResult:
        """Runs the task on the host, heartbeating; cancelling the activity cancels the task."""
        request = pb.ExecuteTaskRequest(
            run=_run_ref(input),
            config=function_config(input.run, input.adapter),
            input=input.run.spec.mode.task.encoded_input() if input.run.spec.mode.task else b"null",
            timeout_ms=max(1, int(input.timeoutSeconds * 1000)),
        )
        call = self._stub(input.address).ExecuteTask(request, timeout=input.timeoutSeconds + RPC_TIMEOUT_S)
        try:
            answer = await heartbeating(call)
        except asyncio.CancelledError:
            call.cancel()
            await self.cancel_task(
                CancelTaskInput(address=input.address, runUid=input.runUid, attempt=input.attempt)
            )
            raise
        except grpc.aio.AioRpcError as err:
            raise host_error(err, address=input.address) from err
        return TaskResult(
            status=_TASK_STATUS.get(answer.status, "Failed"),
            exitCode=answer.exit_code,
            outputs=json.loads(answer.outputs_json) if answer.outputs_json else None,
            message=answer.error.message if answer.HasField("error") else "",
            errorType=answer.error.type if answer.HasField("error") else "",
        )

    @activity.defn(name="cancel_task")
    async def cancel_task(self, input: CancelTaskInput) -> bool:
        request = pb.CancelTaskRequest(run_uid=input.runUid, attempt=input.attempt)
        try:
            answer = await self._stub(input.address).CancelTask(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            if await self._proven_gone(err, input.host, input.address):
                return False
            raise host_error(err, address=input.address) from err
        return bool(answer.existed)
