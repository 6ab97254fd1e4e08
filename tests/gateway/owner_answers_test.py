"""The gateway owns its answer: whatever the owner of a route answers (here a scripted owner on a
real invoke port, or a real gRPC server), the caller gets the gateway's own InvokeAnswer rebuilt
from checked fields, or 502 MalformedOwnerAnswer — never the owner's bytes as JSON structure."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from kruntimes.api.limits import MAX_LOG_BYTES
from kruntimes.gateway.server import Gateway
from kruntimes.pki import Identity
from kruntimes.pki.local import TlsFiles
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.rpc.v1 import runtime_pb2_grpc as pb_grpc
from kruntimes.wire import frames
from kruntimes.wire.headers import INVOCATION_ID as INVOCATION_HEADER
from tests.gateway.conftest import ALICE, invoke
from tests.gateway.rawhttp import Connection, request
from tests.support.beats import heartbeat, registration
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

MARKER = "owner-injected-" + uuid.uuid4().hex
Script = Callable[[pb.InvokeFunctionRequest], pb.InvokeFunctionResponse]


def succeeded(outputs: bytes, **fields: Any) -> Script:
    def answer(request: pb.InvokeFunctionRequest) -> pb.InvokeFunctionResponse:
        fields.setdefault("invocation_id", request.invocation_id)
        return pb.InvokeFunctionResponse(
            status=pb.INVOCATION_STATUS_SUCCEEDED, outputs_json=outputs, **fields
        )

    return answer


class ScriptedOwner(asyncio.Protocol):
    """An invoke port (kruntimes.wire.frames) answering every request with `owner.script`."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.decoder = frames.RequestDecoder(self._request)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(frames.encode_accepted())  # as a host does once the TLS peer is checked

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)

    def _request(self, request_id: int, body: bytes) -> None:
        answer = self.owner.script(pb.InvokeFunctionRequest.FromString(body))
        assert self.transport is not None
        self.transport.write(
            frames.encode_answer(request_id, frames.KIND_RESPONSE, answer.SerializeToString())
        )


class ScriptedRuntime(pb_grpc.FunctionRuntimeServicer):
    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    async def InvokeFunction(
        self, request: pb.InvokeFunctionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.InvokeFunctionResponse:
        return self.owner.script(request)


OWNER_ID = "scripted-owner"


class Owner:
    """A route's owner at a real invoke port and a real gRPC port, answering as scripted: a host
    with a platform certificate of its own (an owner the gateway trusts, whose answers it still
    checks), and the control plane's signed assignments for the Runs it claims."""

    def __init__(self, pki: TestPKI) -> None:
        self.pki = pki
        self.tls = pki.host_tls(OWNER_ID)
        self.script: Script = succeeded(b"{}")
        self.server: asyncio.Server | None = None
        self.grpc: grpc.aio.Server | None = None
        self.invoke_address = self.grpc_address = ""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: ScriptedOwner(self), "127.0.0.1", 0, ssl=self.tls.server_context()
        )
        self.invoke_address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        self.grpc = grpc.aio.server()
        pb_grpc.add_FunctionRuntimeServicer_to_server(ScriptedRuntime(self), self.grpc)
        port = self.grpc.add_secure_port("127.0.0.1:0", self.tls.server_credentials())
        self.grpc_address = f"127.0.0.1:{port}"
        await self.grpc.start()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.grpc is not None:
            await self.grpc.stop(None)

    async def claim(self, gateway: Gateway, *, raw: bool) -> str:
        """A route to a new function Run owned here (over the invoke port, or gRPC only)."""
        uid = str(uuid.uuid4())
        host_uid = f"scripted-{uid}"
        held = registration(
            self.pki, uid, host_id=OWNER_ID, host_uid=host_uid, name="scripted", registration_id=f"reg-{uid}"
        )
        await gateway.routes.apply(
            heartbeat(
                host_id=OWNER_ID,
                host_uid=host_uid,
                address=self.grpc_address,
                invoke_address=self.invoke_address if raw else "",
                sequence=1,
                interval_ms=60_000,
                registrations=[held],
            ),
            peer=Identity.host(runtime="python", host_id=OWNER_ID),
        )
        return uid


@pytest.fixture(scope="module")
async def owner(pki: TestPKI) -> AsyncIterator[Owner]:
    started = Owner(pki)
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


@pytest.fixture(params=["raw", "grpc"])
async def uid(request: pytest.FixtureRequest, owner: Owner, gateway: Gateway) -> str:
    run_uid = await owner.claim(gateway, raw=request.param == "raw")
    request.addfinalizer(lambda: gateway.routes.forget(f"scripted-{run_uid}"))
    return run_uid


MALFORMED = [
    b"not json",
    b"[1, 2]",
    b'"a string"',
    b"null",
    b"",
    b'{"a": 1}, "status": "Succeeded", "injected": "' + MARKER.encode() + b'"',
    b'{"a": 1}{"injected": "' + MARKER.encode() + b'"}',
    b'{"bad key": "' + MARKER.encode() + b'"}',
    b'{"a": NaN}',
    b'{"a": "' + MARKER.encode() + b'", "b": "' + b"x" * (300 * 1024) + b'"}',
    b"\xff" + MARKER.encode(),
]


@pytest.mark.parametrize("outputs", MALFORMED, ids=[f"malformed-{i}" for i in range(len(MALFORMED))])
async def test_malformed_outputs_get_the_caller_a_502_never_a_spliced_body(
    gateway: Gateway, client: aiohttp.ClientSession, owner: Owner, uid: str, outputs: bytes
) -> None:
    owner.script = succeeded(outputs)
    answer = await invoke(client, gateway, uid, headers={INVOCATION_HEADER: "inv-malformed"})
    answer.expect(502, "MalformedOwnerAnswer")
    assert set(answer.json) == {"reason", "message", "invocationId"}
    assert answer.json["invocationId"] == "inv-malformed"
    assert MARKER.encode() not in answer.body


async def test_an_answer_about_another_invocation_or_of_no_known_status_is_malformed(
    gateway: Gateway, client: aiohttp.ClientSession, owner: Owner, uid: str
) -> None:
    owner.script = succeeded(b'{"a": 1}', invocation_id=MARKER)
    answer = await invoke(client, gateway, uid)
    answer.expect(502, "MalformedOwnerAnswer")
    assert MARKER.encode() not in answer.body

    def unknown(request: pb.InvokeFunctionRequest) -> pb.InvokeFunctionResponse:
        return pb.InvokeFunctionResponse(invocation_id=request.invocation_id, status=77)

    owner.script = unknown
    (await invoke(client, gateway, uid)).expect(502, "MalformedOwnerAnswer")


async def test_valid_outputs_are_rebuilt_and_the_other_fields_bounded(
    gateway: Gateway, client: aiohttp.ClientSession, owner: Owner, uid: str
) -> None:
    owner.script = succeeded(
        b'  {"b": [1, {"c": null}], "a": "\\u00e9"}  ',
        stdout=pb.CapturedOutput(data=b"o" * (MAX_LOG_BYTES + 100) + b"\xff", truncated=False, total_bytes=3),
        stderr=pb.CapturedOutput(data=b"bad \xff utf-8", truncated=False, total_bytes=2**64 - 1),
        error=pb.InvocationError(type="Injected", message=MARKER),  # an error is not a success's
        duration_us=1500,
    )
    answer = await invoke(client, gateway, uid, headers={INVOCATION_HEADER: "inv-rebuilt"})
    doc = answer.expect(200).json
    assert answer.body.startswith(b'{"invocationId":"inv-rebuilt","status":"Succeeded","outputs":{"b":')
    assert doc["outputs"] == {"b": [1, {"c": None}], "a": "é"}
    assert doc["stdout"] == {
        "data": "o" * MAX_LOG_BYTES,
        "truncated": True,
        "totalBytes": MAX_LOG_BYTES + 101,
    }
    assert doc["stderr"] == {"data": "bad \ufffd utf-8", "truncated": True, "totalBytes": 2**53 - 1}
    assert "error" not in doc and MARKER.encode() not in answer.body
    assert doc["durationMs"] == 1.5


async def test_a_handler_errors_fields_are_checked_and_its_outputs_dropped(
    gateway: Gateway, client: aiohttp.ClientSession, owner: Owner, uid: str
) -> None:
    def failed(request: pb.InvokeFunctionRequest) -> pb.InvokeFunctionResponse:
        return pb.InvokeFunctionResponse(
            invocation_id=request.invocation_id,
            status=pb.INVOCATION_STATUS_HANDLER_ERROR,
            outputs_json=b'{"injected": "' + MARKER.encode() + b'"}',
            error=pb.InvocationError(type='x", "status": "Succeeded', message="m" * 10_000),
        )

    owner.script = failed
    answer = await invoke(client, gateway, uid)
    doc = answer.expect(200).json
    assert doc["status"] == "HandlerError" and doc["outputs"] is None
    assert doc["error"]["type"] == "HandlerError"
    assert len(doc["error"]["message"].encode()) <= 4096
    assert MARKER.encode() not in answer.body
    assert json.loads(answer.body) == doc


class CountedOwner(ScriptedOwner):
    """A ScriptedOwner that keeps the set of its open connections."""

    def __init__(self, owner: Owner, open_now: set[asyncio.BaseTransport]) -> None:
        super().__init__(owner)
        self.open_now = open_now

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.open_now.add(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.open_now.discard(self.transport)


async def test_a_host_that_moves_its_invoke_address_leaves_no_connection_behind(
    gateway: Gateway, client: aiohttp.ClientSession, pki: TestPKI
) -> None:
    """The attack: a host names another invoke address of its own in every beat and its Run is
    invoked at each: the gateway keeps one connection to it, not one per address it ever named."""
    mover = Owner(pki)
    mover.tls = pki.host_tls("mover")
    mover.script = lambda request: pb.InvokeFunctionResponse(
        invocation_id=request.invocation_id, status=pb.INVOCATION_STATUS_SUCCEEDED, outputs_json=b"{}"
    )
    open_now: set[asyncio.BaseTransport] = set()
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(
            lambda: CountedOwner(mover, open_now), "127.0.0.1", 0, ssl=mover.tls.server_context()
        )
        for _ in range(4)
    ]
    uid, host_uid = str(uuid.uuid4()), str(uuid.uuid4())
    held = registration(
        pki, uid, host_id="mover", host_uid=host_uid, name="scripted", registration_id="reg-m"
    )
    try:
        for server in servers:
            await gateway.routes.apply(
                heartbeat(
                    host_id="mover",
                    host_uid=host_uid,
                    address="127.0.0.1:1",
                    invoke_address=f"127.0.0.1:{server.sockets[0].getsockname()[1]}",
                    registrations=[held],
                    interval_ms=60_000,
                ),
                peer=Identity.host(runtime="python", host_id="mover"),
            )
            answer = await invoke(client, gateway, uid)
            assert answer.status == 200, answer.body
        await eventually(lambda: len(open_now) == 1, what="the connections to earlier addresses closed")
        assert (await invoke(client, gateway, uid)).status == 200  # the current one still serves
    finally:
        gateway.routes.forget(host_uid)
        for server in servers:
            server.close()


def established(port: int) -> int:
    """How many TCP connections to local port `port` are established (/proc/net/tcp and tcp6:
    gRPC's sockets are IPv6 ones with IPv4-mapped addresses)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


async def test_a_host_that_moves_its_grpc_address_leaves_no_channel_behind(
    gateway: Gateway, client: aiohttp.ClientSession, pki: TestPKI
) -> None:
    """The same attack on a host without an invoke port: each address gets a gRPC channel, and the
    channel of an address the host no longer names is closed."""
    identity = Identity.host(runtime="python", host_id="grpc-mover")
    mover = Owner(pki)
    mover.tls = pki.host_tls("grpc-mover")
    mover.script = lambda request: pb.InvokeFunctionResponse(
        invocation_id=request.invocation_id, status=pb.INVOCATION_STATUS_SUCCEEDED, outputs_json=b"{}"
    )
    servers = []
    for _ in range(3):
        server = grpc.aio.server()
        pb_grpc.add_FunctionRuntimeServicer_to_server(ScriptedRuntime(mover), server)
        port = server.add_secure_port("127.0.0.1:0", mover.tls.server_credentials())
        await server.start()
        servers.append((server, port))
    uid, host_uid = str(uuid.uuid4()), str(uuid.uuid4())
    held = registration(
        pki, uid, host_id="grpc-mover", host_uid=host_uid, name="scripted", registration_id="reg-g"
    )
    try:
        for _, port in servers:
            beat = heartbeat(
                host_id="grpc-mover",
                host_uid=host_uid,
                address=f"127.0.0.1:{port}",
                registrations=[held],
                interval_ms=60_000,
            )
            await gateway.routes.apply(beat, peer=identity)
            answer = await invoke(client, gateway, uid)
            assert answer.status == 200, answer.body
        earlier, current = [port for _, port in servers[:-1]], servers[-1][1]
        await eventually(
            lambda: not any(established(port) for port in earlier),
            what="the earlier addresses' channels closed",
        )
        assert established(current) == 1
        assert (await invoke(client, gateway, uid)).status == 200
    finally:
        gateway.routes.forget(host_uid)
        for server, _ in servers:
            await server.stop(None)


async def test_a_route_gone_while_the_body_was_read_is_owner_unavailable_and_nothing_is_sent(
    gateway: Gateway, tls: TlsFiles, owner: Owner
) -> None:
    """Not sent is told apart from sent-then-failed: the route goes away after the gateway took the
    request (it asks for the body: 100 Continue) and before the body came; the answer is 503
    OwnerUnavailable with Retry-After, and the owner never gets the request."""
    uid = await owner.claim(gateway, raw=True)
    asked: list[str] = []

    def answer(request: pb.InvokeFunctionRequest) -> pb.InvokeFunctionResponse:
        asked.append(request.invocation_id)
        return pb.InvokeFunctionResponse(
            invocation_id=request.invocation_id, status=pb.INVOCATION_STATUS_SUCCEEDED
        )

    previous, owner.script = owner.script, answer
    conn = await Connection.open(gateway.url, tls.ca_cert)
    try:
        path = f"/v1/namespaces/default/runtimes/python/functions/{uid}:invoke"
        headers = {"Authorization": f"Bearer {ALICE}", "Expect": "100-continue", "Connection": "close"}
        await conn.send(request(path, headers=headers, content_length=2))
        assert (await conn.answer()).status == 100  # past the route and the authorization
        gateway.routes.forget(f"scripted-{uid}")
        await conn.send(b"{}")
        final = await conn.answer()
    finally:
        await conn.close()
        gateway.routes.forget(f"scripted-{uid}")
        owner.script = previous
    assert (final.status, json.loads(final.body)["reason"]) == (503, "OwnerUnavailable")
    assert int(final.headers["retry-after"]) >= 1
    assert asked == []
