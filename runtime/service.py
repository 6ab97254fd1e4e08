"""The gRPC FunctionRuntime servicer: proto in, domain calls, proto out; errors mapped in one place.

Who may call what is decided before a method runs (`ALLOWED_ROLES`, enforced by the server's
kruntimes.pki.PeerAuthorization from the caller's platform certificate): InvokeFunction only a
gateway, the health service any platform identity, every other method — those listed here and any
added later — only the control plane. RegisterFunction then needs the control plane's signed
assignment naming the run, its attempt and this host (kruntimes.pki.assignments). Every run uid is a
canonical UUID and every name a DNS-1123 label before anything touches a path or a map.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from kruntimes.api.limits import (
    DEFAULT_INVOKE_TIMEOUT_SECONDS,
    MAX_INVOKE_TIMEOUT_SECONDS,
    MAX_LOG_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_TIMEOUT_SECONDS,
)
from kruntimes.api.names import (
    validate_creator_kind,
    validate_dns1123_label,
    validate_invocation_id,
    validate_run_uid,
    validate_subject,
)
from kruntimes.pki import ANY_ROLE, Role
from kruntimes.pki.assignments import AssignmentError, Verifier
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.runtime import errors
from kruntimes.runtime.admission import Concurrency
from kruntimes.runtime.capture import Capture
from kruntimes.runtime.config import HandlerConfig, RunRef
from kruntimes.runtime.outcome import Outcome, Status
from kruntimes.runtime.registry import AsyncPolicy, Registration, Registry, State
from kruntimes.runtime.sandbox.policy import InForce
from kruntimes.runtime.secret_access import RunCreator
from kruntimes.runtime.tasks import Tasks
from kruntimes.runtime.watch import HostWatch
from kruntimes.wire.reasons import HostReason, trailer

log = logging.getLogger(__name__)

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]

SERVICE = "/kruntimes.rpc.v1.FunctionRuntime/"
# The roles that may call each method; a method not listed (a new one too) is the control plane's.
ALLOWED_ROLES: dict[str, frozenset[Role]] = {
    SERVICE + "InvokeFunction": frozenset({Role.GATEWAY}),
    "/grpc.health.v1.Health/Check": ANY_ROLE,
    "/grpc.health.v1.Health/Watch": ANY_ROLE,
}
DEFAULT_ROLES = frozenset({Role.CONTROL_PLANE})

# the catalogue's gRPC code names (kruntimes.wire.reasons) as grpc.StatusCode, resolved once
_CODES: dict[HostReason, grpc.StatusCode] = {r: grpc.StatusCode[r.code] for r in HostReason}

_INVOCATION_STATUS = {
    Status.SUCCEEDED: pb.INVOCATION_STATUS_SUCCEEDED,
    Status.HANDLER_ERROR: pb.INVOCATION_STATUS_HANDLER_ERROR,
    Status.TIMED_OUT: pb.INVOCATION_STATUS_TIMED_OUT,
    Status.PROCESS_EXITED: pb.INVOCATION_STATUS_PROCESS_EXITED,
    Status.INVALID_OUTPUT: pb.INVOCATION_STATUS_INVALID_OUTPUT,
    Status.CANCELLED: pb.INVOCATION_STATUS_PROCESS_EXITED,
}

_TASK_STATUS = {
    Status.SUCCEEDED: pb.TASK_STATUS_SUCCEEDED,
    Status.TIMED_OUT: pb.TASK_STATUS_TIMED_OUT,
    Status.CANCELLED: pb.TASK_STATUS_CANCELLED,
}

_PHASES = {
    State.READY: pb.REGISTRATION_PHASE_READY,
    State.NOT_READY: pb.REGISTRATION_PHASE_NOT_READY,
    State.UNREGISTERING: pb.REGISTRATION_PHASE_UNREGISTERING,
}


async def _abort(context: Context, exc: errors.RuntimeServerError) -> NoReturn:
    kind = exc.kind if isinstance(exc, errors.HandlerLoadFailed) else ""
    await context.abort(status_code(exc), str(exc), trailer(exc.reason, error_class=kind))
    raise AssertionError("unreachable: abort raises")


async def _blocking(context: Context, fn: Callable[[], T]) -> T:
    """Run blocking work in the loop's executor; its `RuntimeServerError` aborts the call."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, fn)
    except errors.RuntimeServerError as exc:
        await _abort(context, exc)


def _timestamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _run_uid(value: str) -> str:
    try:
        return validate_run_uid(value, field="run_uid")
    except ValueError as exc:
        raise errors.InvalidRequest(str(exc)) from exc


def _run_ref(msg: pb.RunRef) -> RunRef:
    _run_uid(msg.run_uid)
    if msg.attempt < 1:
        raise errors.InvalidRequest("run.attempt must be >= 1")
    try:
        for field in ("namespace", "name", "runtime"):
            validate_dns1123_label(getattr(msg, field), field=f"run.{field}")
    except ValueError as exc:
        raise errors.InvalidRequest(str(exc)) from exc
    return RunRef(msg.run_uid, msg.attempt, msg.namespace, msg.name, msg.runtime)


def _run_fields(run: RunRef) -> dict[str, Any]:
    """The fields of `run` as pb.RunRef names them (pb.RegistrationState has them too)."""
    return dataclasses.asdict(run)


def _config(msg: pb.FunctionConfig) -> HandlerConfig:
    which = msg.WhichOneof("source")
    if which is None:
        raise errors.InvalidRequest("config.source: set source_path or inline")
    return HandlerConfig(
        adapter=msg.adapter,
        handler=msg.handler,
        env=tuple(sorted(msg.env.items())),
        source_path=msg.source_path if which == "source_path" else None,
        inline=tuple((f.name, f.content, f.executable) for f in msg.inline.files)
        if which == "inline"
        else None,
        env_from=tuple((e.secret, e.prefix) for e in msg.env_from),
        creator=_creator(msg),
    )


def _creator(msg: pb.FunctionConfig) -> RunCreator | None:
    """Who started the Run, if the caller said: validated, since audit records name it."""
    if not msg.HasField("creator"):
        return None
    try:
        kind = validate_creator_kind(msg.creator.kind, field="config.creator.kind")
        subject = validate_subject(msg.creator.subject, field="config.creator.subject")
    except ValueError as exc:
        raise errors.InvalidRequest(str(exc)) from exc
    return RunCreator(kind, subject)


_NO_OUTPUT = pb.CapturedOutput()  # copied into a response, never changed
# Generated invocation ids: UUID-shaped, a random prefix per process and a counter (no syscall).
_ID_PREFIX = str(uuid.uuid4())[:24]
_ID_COUNTER = itertools.count()


def _new_invocation_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFF_FFFF_FFFF:012x}"


def captured(capture: Capture) -> pb.CapturedOutput:
    data = capture.data[:MAX_LOG_BYTES]
    return pb.CapturedOutput(data=data, truncated=capture.total > len(data), total_bytes=capture.total)


def _error(outcome: Outcome) -> pb.InvocationError | None:
    if not outcome.error_type:
        return None
    return pb.InvocationError(type=outcome.error_type, message=outcome.error_message[:4096])


def _timeout_s(timeout_ms: int, *, default: float, maximum: float) -> float:
    if timeout_ms == 0:
        return default
    return min(timeout_ms / 1000.0, maximum)


def _concurrency(msg: pb.FunctionConfig) -> Concurrency:
    return Concurrency(
        concurrency=msg.concurrency, queue=msg.queue, queue_timeout_s=msg.queue_timeout_ms / 1000.0
    )


def begin_invoke(
    registry: Registry, request: pb.InvokeFunctionRequest
) -> tuple[str, asyncio.Future[Outcome]]:
    """InvokeFunction up to the running invocation, shared by the gRPC servicer and the raw invoke
    port (runtime/invoke.py): the same validation, fence and registry semantics. Refusals raise
    `errors.RuntimeServerError` at once; the future gets the Outcome (see `Registry.invoke`)."""
    invocation_id = request.invocation_id
    if invocation_id:
        try:
            validate_invocation_id(invocation_id)
        except ValueError as exc:
            raise errors.InvalidRequest(str(exc)) from exc
    else:
        invocation_id = _new_invocation_id()
    if len(request.payload) > MAX_PAYLOAD_BYTES:
        raise errors.InvalidRequest(f"payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    pending = registry.invoke(
        request.registration_id,
        invocation_id=invocation_id,
        payload=request.payload,
        timeout_s=_timeout_s(
            request.timeout_ms,
            default=DEFAULT_INVOKE_TIMEOUT_SECONDS,
            maximum=MAX_INVOKE_TIMEOUT_SECONDS,
        ),
        fence=request.fence,
    )
    return invocation_id, pending


def invoke_response(invocation_id: str, outcome: Outcome) -> pb.InvokeFunctionResponse:
    stdout, stderr = outcome.stdout, outcome.stderr
    return pb.InvokeFunctionResponse(
        invocation_id=invocation_id,
        status=_INVOCATION_STATUS[outcome.status],
        outputs_json=outcome.outputs_json,
        stdout=captured(stdout) if stdout.total else _NO_OUTPUT,
        stderr=captured(stderr) if stderr.total else _NO_OUTPUT,
        error=_error(outcome) if outcome.error_type else None,
        duration_us=outcome.duration_us,
        exit_code=outcome.exit_code,
    )


async def awaited(registry: Registry, pending: asyncio.Future[Outcome]) -> Outcome:
    """The Outcome of `pending` (from `begin_invoke`) for a caller that may stop waiting: this task
    cancelled (a gRPC call its gateway cancelled when its caller hung up, or past its deadline)
    withdraws the invocation as the invoke port's cancel does (`Registry.withdraw`): it never runs
    if it still waits its turn, else it runs to its end with nobody reading its answer."""
    try:
        return await asyncio.shield(pending)  # not cancelled with this task: withdraw decides
    except asyncio.CancelledError:
        registry.withdraw(pending)
        raise


async def invoke_function(registry: Registry, request: pb.InvokeFunctionRequest) -> pb.InvokeFunctionResponse:
    invocation_id, pending = begin_invoke(registry, request)
    return invoke_response(invocation_id, await awaited(registry, pending))


def status_code(exc: errors.RuntimeServerError) -> grpc.StatusCode:
    """The gRPC status code of `exc`'s reason (kruntimes.wire.reasons.HostReason)."""
    return _CODES[exc.reason]


class FunctionRuntimeService(pb_grpc.FunctionRuntimeServicer):
    """Served by grpc.aio on the host's event loop. InvokeFunction, FunctionStatus and HostInfo run
    on the loop; what blocks (spawning, workspaces, tasks, teardown) runs in the loop's executor."""

    def __init__(
        self,
        *,
        registry: Registry,
        tasks: Tasks,
        host_id: str,
        runtime: str,
        assignments: Verifier,
        isolation: pb.HostIsolation | None = None,
        watch: HostWatch | None = None,
    ) -> None:
        self.registry = registry
        self.tasks = tasks
        self.host_id = host_id
        self.runtime = runtime
        self.isolation = isolation
        self.assignments = assignments
        self.watch = watch

    def _assigned(self, run: RunRef, signed: pb.SignedAssignment) -> bytes:
        """The serialized signed assignment of `run` to this host; AssignmentInvalid unless it
        verifies and names this run, attempt, runtime and host incarnation."""
        try:
            a = self.assignments.verify(signed)
        except AssignmentError as exc:
            raise errors.AssignmentInvalid(str(exc)) from exc
        named = (a.run_uid, a.attempt, a.namespace, a.name, a.runtime, a.host_id, a.host_uid)
        expected = (
            run.run_uid,
            run.attempt,
            run.namespace,
            run.name,
            self.runtime,
            self.host_id,
            self.registry.host_uid,
        )
        if run.runtime != self.runtime or named != expected:
            raise errors.AssignmentInvalid("the assignment names another run, attempt, runtime or host")
        return signed.SerializeToString()

    async def RegisterFunction(
        self, request: pb.RegisterFunctionRequest, context: Context
    ) -> pb.RegisterFunctionResponse:
        def register() -> pb.RegisterFunctionResponse:
            run = _run_ref(request.run)
            assignment = self._assigned(run, request.assignment)
            reg, created = self.registry.register(
                run,
                _config(request.config),
                assignment=assignment,
                concurrency=_concurrency(request.config),
                async_policy=AsyncPolicy(request.config.async_backlog, request.config.async_share),
            )
            return pb.RegisterFunctionResponse(
                registration_id=reg.id,
                created=created,
                host_uid=self.registry.host_uid,
                last_activity=_timestamp(reg.last_activity),
            )

        return await _blocking(context, register)

    async def FunctionStatus(
        self, request: pb.FunctionStatusRequest, context: Context
    ) -> pb.FunctionStatusResponse:
        reg = self.registry.get(request.registration_id)
        if reg is None:
            return pb.FunctionStatusResponse(registered=False, host_uid=self.registry.host_uid)
        return pb.FunctionStatusResponse(
            registered=True,
            ready=reg.state == State.READY,
            fatal_error=reg.fatal_error,
            in_flight=reg.in_flight,
            waiting=reg.waiting,
            concurrency=reg.gate.concurrency,
            queue=reg.gate.queue,
            last_activity=_timestamp(reg.last_activity),
            run=pb.RunRef(**_run_fields(reg.run)),
            host_uid=self.registry.host_uid,
        )

    async def InvokeFunction(
        self, request: pb.InvokeFunctionRequest, context: Context
    ) -> pb.InvokeFunctionResponse:
        try:
            invocation_id, pending = begin_invoke(self.registry, request)
            outcome = await awaited(self.registry, pending)
        except errors.RuntimeServerError as exc:
            await _abort(context, exc)
        return invoke_response(invocation_id, outcome)

    async def UnregisterFunction(
        self, request: pb.UnregisterFunctionRequest, context: Context
    ) -> pb.UnregisterFunctionResponse:
        grace_s = min(request.grace_ms / 1000.0, MAX_INVOKE_TIMEOUT_SECONDS) if request.grace_ms else 5.0
        existed = await _blocking(
            context, lambda: self.registry.unregister(request.registration_id, grace_s=grace_s)
        )
        return pb.UnregisterFunctionResponse(existed=existed)

    async def ExecuteTask(self, request: pb.ExecuteTaskRequest, context: Context) -> pb.ExecuteTaskResponse:
        def execute() -> pb.ExecuteTaskResponse:
            if self.registry.fenced:
                raise errors.HostUnavailable("this host is fenced: it takes no registration and no task")
            if len(request.input) > MAX_PAYLOAD_BYTES:
                raise errors.InvalidRequest(f"input is larger than {MAX_PAYLOAD_BYTES} bytes")
            timeout_s = _timeout_s(
                request.timeout_ms, default=MAX_TIMEOUT_SECONDS, maximum=MAX_TIMEOUT_SECONDS
            )
            outcome = self.tasks.execute(
                _run_ref(request.run), _config(request.config), request.input, timeout_s
            )
            return pb.ExecuteTaskResponse(
                status=_TASK_STATUS.get(outcome.status, pb.TASK_STATUS_FAILED),
                exit_code=outcome.exit_code,
                outputs_json=outcome.outputs_json,
                stdout=captured(outcome.stdout),
                stderr=captured(outcome.stderr),
                error=_error(outcome),
                duration_us=outcome.duration_us,
            )

        return await _blocking(context, execute)

    async def CancelTask(self, request: pb.CancelTaskRequest, context: Context) -> pb.CancelTaskResponse:
        existed = await _blocking(
            context, lambda: self.tasks.cancel(_run_uid(request.run_uid), request.attempt)
        )
        return pb.CancelTaskResponse(existed=existed)

    async def HostInfo(self, request: pb.HostInfoRequest, context: Context) -> pb.HostInfoResponse:
        return pb.HostInfoResponse(
            host_id=self.host_id,
            host_uid=self.registry.host_uid,
            runtime=self.runtime,
            registrations=[registration_state(r) for r in self.registry.snapshot()],
            isolation=self.isolation,
        )

    async def FenceHost(self, request: pb.FenceHostRequest, context: Context) -> pb.FenceHostResponse:
        if request.host_uid != self.registry.host_uid:
            await _abort(context, errors.FenceMismatch("this host is not the incarnation to fence"))
        held = self.registry.fence()
        log.warning("host fenced: it takes no registration and no task", extra={"registrations": held})
        return pb.FenceHostResponse(registrations=held)

    async def WatchHost(self, request: pb.WatchHostRequest, context: Context) -> AsyncIterator[pb.HostReport]:
        if self.watch is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this host cannot be watched")
            return
        try:
            async for report in self.watch.stream(request):
                yield report
        except OverflowError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))


def isolation_message(in_force: InForce) -> pb.HostIsolation:
    return pb.HostIsolation(
        isolation=in_force.isolation.value,
        network=in_force.network.value,
        pid_namespace=in_force.pid_namespace,
        mount_namespace=in_force.mount_namespace,
        cgroup=in_force.cgroup,
        summary=in_force.describe(),
    )


class RegistrationStates:
    """The host's registrations as messages, each built again only when it changed: the streams
    that report them (route heartbeats, the supervision watch) tell an unchanged registration by
    the identity of its message, so an idle host's beat costs a lookup per registration, not a
    message. Safe to call from any thread (a race only builds a message twice)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._built: dict[str, tuple[tuple[object, ...], pb.RegistrationState]] = {}

    def __call__(self) -> list[pb.RegistrationState]:
        built = self._built
        fresh: dict[str, tuple[tuple[object, ...], pb.RegistrationState]] = {}
        for reg in self.registry.snapshot():
            key = (reg.state, reg.in_flight, reg.waiting, reg.last_activity, reg.assignment, reg.run)
            held = built.get(reg.id)
            fresh[reg.id] = held if held is not None and held[0] == key else (key, registration_state(reg))
        self._built = fresh
        return [state for _, state in fresh.values()]


def registration_state(reg: Registration) -> pb.RegistrationState:
    state = pb.RegistrationState(
        **_run_fields(reg.run),
        registration_id=reg.id,
        phase=_PHASES[reg.state],
        in_flight=reg.in_flight,
        waiting=reg.waiting,
        concurrency=reg.gate.concurrency,
        queue=reg.gate.queue,
        async_backlog=reg.async_policy.backlog,
        async_share=reg.async_policy.share,
        last_activity=_timestamp(reg.last_activity),
    )
    if reg.assignment:
        state.assignment.ParseFromString(reg.assignment)
    return state
