"""Servers for the activity unit tests: a real Runtime Server, and a FunctionRuntime server on
loopback that answers each call the way a test chose (a response, or a status with a krt-reason
trailer), recording what it was sent. Both serve mutual TLS with host certificates of the test CA,
as every host does."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from kruntimes.api.run import Run
from kruntimes.contracts.hostcalls import RegisterInput, TaskInput
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.wire import reasons
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host

HOLD_BOUND_S = 30.0  # the longest a scripted call waits to be released
SCRIPTED_HOST = "scripted-0"  # the scripted server's host id (its certificate's)


@dataclass(frozen=True)
class Abort:
    """End the call with this status; `reason` goes into the krt-reason trailer when set."""

    code: grpc.StatusCode
    details: str = ""
    reason: str | None = None


@dataclass
class Call:
    """How the scripted server answers one method, and what it was sent."""

    answer: Message | Abort
    requests: list[Any] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event | None = None  # set: the answer waits until the test releases it
    cancelled: bool = False  # the caller went away while the answer was held


class ScriptedRuntime(pb_grpc.FunctionRuntimeServicer):
    def __init__(self) -> None:
        self.calls: dict[str, Call] = {
            "RegisterFunction": Call(pb.RegisterFunctionResponse(registration_id="reg-1", host_uid="uid-1")),
            "FunctionStatus": Call(pb.FunctionStatusResponse()),
            "UnregisterFunction": Call(pb.UnregisterFunctionResponse(existed=True)),
            "ExecuteTask": Call(pb.ExecuteTaskResponse(status=pb.TASK_STATUS_SUCCEEDED)),
            "CancelTask": Call(pb.CancelTaskResponse(existed=True)),
        }

    def script(self, method: str, answer: Message | Abort, *, hold: bool = False) -> Call:
        call = self.calls[method] = Call(answer, release=asyncio.Event() if hold else None)
        return call

    async def _answer(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = self.calls[method]
        call.requests.append(request)
        call.started.set()
        if call.release is not None:
            try:
                await asyncio.wait_for(call.release.wait(), HOLD_BOUND_S)
            except asyncio.CancelledError:
                call.cancelled = True
                raise
        if isinstance(call.answer, Abort):
            trailer = () if call.answer.reason is None else reasons.trailer(call.answer.reason)
            await context.abort(call.answer.code, call.answer.details, trailer)
        return call.answer

    async def RegisterFunction(self, request: Any, context: Any) -> Any:
        return await self._answer("RegisterFunction", request, context)

    async def FunctionStatus(self, request: Any, context: Any) -> Any:
        return await self._answer("FunctionStatus", request, context)

    async def UnregisterFunction(self, request: Any, context: Any) -> Any:
        return await self._answer("UnregisterFunction", request, context)

    async def ExecuteTask(self, request: Any, context: Any) -> Any:
        return await self._answer("ExecuteTask", request, context)

    async def CancelTask(self, request: Any, context: Any) -> Any:
        return await self._answer("CancelTask", request, context)


@dataclass
class Scripted:
    address: str
    runtime: ScriptedRuntime


@pytest.fixture
async def scripted(pki: TestPKI) -> AsyncIterator[Scripted]:
    runtime = ScriptedRuntime()
    server = grpc.aio.server()
    pb_grpc.add_FunctionRuntimeServicer_to_server(runtime, server)
    port = server.add_secure_port("127.0.0.1:0", pki.host_tls(SCRIPTED_HOST).server_credentials())
    await server.start()
    try:
        yield Scripted(f"127.0.0.1:{port}", runtime)
    finally:
        await server.stop(grace=None)


@dataclass
class RealHost:
    address: str
    host_uid: str
    host_id: str = "act-0"


@pytest.fixture(scope="module")
def real_host(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> Iterator[RealHost]:
    """A real Runtime Server (its own thread, zygote and function processes) on loopback."""
    host = loopback_host(pki, tmp_path_factory.mktemp("host"), host_id="act-0", invoke_listen="")
    address = host.start()
    try:
        yield RealHost(address, host.host_uid)
    finally:
        host.stop(grace_s=1)


ECHO = "def handle(p):\n    return p\n"


def python_run(prefix: str, source: str, *, handler: str, **spec: Any) -> Run:
    """A python Run `<prefix>-<random>` with a uid, whose main.py is `source`."""
    return Run.new(
        f"{prefix}-{uuid.uuid4().hex[:6]}",
        runtime="python",
        handler=handler,
        inline={"main.py": source},
        uid=str(uuid.uuid4()),
        **spec,
    )


def function_run(source: str = ECHO, **spec: Any) -> Run:
    return python_run("fn", source, handler="main:handle", **spec)


def task_run(source: str) -> Run:
    return python_run("task", source, handler="main:run", mode={"task": {}})


def register_input(
    address: str, run: Run, *, attempt: int = 1, host_id: str = SCRIPTED_HOST, host_uid: str = "uid-1"
) -> RegisterInput:
    assert run.metadata.uid is not None
    return RegisterInput(
        hostId=host_id,
        hostUid=host_uid,
        address=address,
        runUid=run.metadata.uid,
        attempt=attempt,
        namespace=run.metadata.namespace,
        name=run.metadata.name,
        runtime=run.spec.runtime,
        adapter="python",
        run=run,
    )


def task_input(address: str, run: Run, *, timeout_s: float = 60.0) -> TaskInput:
    assert run.metadata.uid is not None
    return TaskInput(
        address=address,
        runUid=run.metadata.uid,
        attempt=1,
        namespace=run.metadata.namespace,
        name=run.metadata.name,
        runtime=run.spec.runtime,
        adapter="python",
        run=run,
        timeoutSeconds=timeout_s,
    )
