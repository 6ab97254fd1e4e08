"""The invoke port (runtime/invoke.py): framing on a real TLS socket, bounds, errors as gRPC
answers them, multiplexing, and the gateway's client of it (gateway/raw.py). The codec itself is
tested in tests/wire/frames_test.py; who may connect, in tests/runtime/peers_test.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.gateway.raw import RawClient, RawError
from kruntimes.gateway.routes import RouteCache
from kruntimes.pki import Identity, PeerTLS
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime.server import MAX_MESSAGE_BYTES
from kruntimes.wire import frames
from kruntimes.wire.reasons import HostReason, trailer
from tests.runtime.conftest import Host, reason
from tests.support.beats import heartbeat, registration
from tests.support.pki import TestPKI

TEST_HOST = Identity.host(runtime="python", host_id="test-0")  # the conftest's host
FAKE_HOST = Identity.host(runtime="python", host_id="fake-0")

ECHO = """
def handle(payload):
    return payload
"""

# Waits at a rendezvous the test holds (a Unix socket in the shared directory: a function's
# network reaches no listener of the machine): it answers once the test lets every waiter go.
RENDEZVOUS = """
import socket
def handle(payload):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(payload["path"])
        s.sendall(b"w")
        return {"released": s.recv(1) == b"g"}
"""


class Conn:
    """A blocking client of the invoke port, presenting `as_`'s certificate (a gateway's unless
    told otherwise); it reads the host's accept frame first."""

    def __init__(self, address: str, *, as_: PeerTLS, expect: Identity = TEST_HOST) -> None:
        host, _, port = address.rpartition(":")
        raw = socket.create_connection((host, int(port)), timeout=10)
        self.sock: socket.socket = as_.client_context().wrap_socket(raw, server_hostname=expect.dns_name)
        assert self.recv() == (frames.ACCEPTED_ID, bytes((frames.KIND_RESPONSE,)))

    def send_frame(self, request_id: int, body: bytes) -> None:
        self.sock.sendall(frames.encode_request(request_id, body))

    def send(self, request_id: int, request: pb.InvokeFunctionRequest) -> None:
        self.send_frame(request_id, request.SerializeToString())

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def recv(self) -> tuple[int, bytes]:
        """One answer frame as its (request id, kind byte + body), read and checked by the codec."""
        header = self._exactly(4)
        frame = header + self._exactly(int.from_bytes(header, "big"))
        got: list[tuple[int, bytes]] = []
        frames.AnswerDecoder(
            lambda request_id, kind, body: got.append((request_id, bytes((kind,)) + body))
        ).feed(frame)
        (answer,) = got
        return answer

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def close(self) -> None:
        self.sock.close()


def decode(payload: bytes) -> pb.InvokeFunctionResponse | dict[str, str]:
    if payload[0] == frames.KIND_RESPONSE:
        return pb.InvokeFunctionResponse.FromString(payload[1:])
    assert payload[0] == frames.KIND_ERROR
    error = json.loads(payload[1:])
    assert set(error) == {"code", "reason", "message"}
    assert frames.decode_error(payload[1:]) == (error["code"], error["reason"], error["message"])
    return dict(error)


@pytest.fixture
def conn(host: Host, pki: TestPKI) -> Conn:
    assert host.runtime.invoke_address
    c = Conn(host.runtime.invoke_address, as_=pki.gateway)
    yield c  # type: ignore[misc]
    c.close()


def test_a_raw_invoke_answers_like_grpc(host: Host, conn: Conn) -> None:
    reg = host.register(ECHO)
    request = pb.InvokeFunctionRequest(
        registration_id=reg.registration_id, payload=b'{"a": 1}', invocation_id="inv-raw-1"
    )
    conn.send(7, request)
    request_id, payload = conn.recv()
    assert request_id == 7
    answer = decode(payload)
    assert isinstance(answer, pb.InvokeFunctionResponse)
    via_grpc = host.gateway.InvokeFunction(request)
    assert answer.status == via_grpc.status == pb.INVOCATION_STATUS_SUCCEEDED
    assert answer.invocation_id == "inv-raw-1"
    assert json.loads(answer.outputs_json) == json.loads(via_grpc.outputs_json) == {"a": 1}


def test_errors_carry_the_grpc_code_reason_and_details(host: Host, conn: Conn) -> None:
    reg = host.register(ECHO)
    uid = host.status(reg.registration_id).run.run_uid
    requests = [
        pb.InvokeFunctionRequest(registration_id="reg-nope"),
        pb.InvokeFunctionRequest(registration_id=reg.registration_id, fence=pb.Fence(run_uid="other")),
        pb.InvokeFunctionRequest(registration_id=reg.registration_id, fence=pb.Fence(run_uid=uid, attempt=2)),
        pb.InvokeFunctionRequest(registration_id=reg.registration_id, invocation_id="x" * 200),
        pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=b"x" * (MAX_PAYLOAD_BYTES + 1)),
    ]
    for i, request in enumerate(requests, 1):  # requests use ids from 1: 0 is a control frame's
        conn.send(i, request)
        request_id, payload = conn.recv()
        assert request_id == i
        error = decode(payload)
        assert isinstance(error, dict), error
        with pytest.raises(grpc.RpcError) as err:
            host.gateway.InvokeFunction(request)
        assert error["code"] == err.value.code().name  # type: ignore[attr-defined]
        assert error["reason"] == reason(err.value)
        assert error["message"] == err.value.details()  # type: ignore[attr-defined]
    # the connection still serves after all those errors
    conn.send(99, pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=b"{}"))
    assert isinstance(decode(conn.recv()[1]), pb.InvokeFunctionResponse)


def test_an_undecodable_request_is_invalid_argument_and_keeps_the_connection(host: Host, conn: Conn) -> None:
    conn.send_frame(3, b"\xff\xff\xff")
    request_id, payload = conn.recv()
    error = decode(payload)
    assert request_id == 3
    assert isinstance(error, dict) and error["code"] == "INVALID_ARGUMENT"
    assert error["reason"] == "InvalidRequest"
    conn.send(4, pb.InvokeFunctionRequest(registration_id="reg-nope"))
    assert decode(conn.recv()[1])["code"] == "NOT_FOUND"  # type: ignore[index]


def test_many_requests_in_flight_on_one_connection_one_per_function(
    host: Host, conn: Conn, scratch: Path
) -> None:
    """Four functions' invocations on one connection all run at once: each waits at a rendezvous
    that lets them go only when all four are there (run one after another, the second never
    arrives and the rendezvous gives up)."""
    regs = [host.register(RENDEZVOUS) for _ in range(4)]
    with socket.socket(socket.AF_UNIX) as rendezvous:
        path = scratch / "rendezvous"
        rendezvous.bind(str(path))
        path.chmod(0o666)  # the functions' uids connect to it
        rendezvous.listen(8)
        rendezvous.settimeout(60)  # a bound, not a timing: four arrive at once or never
        payload = json.dumps({"path": str(path)}).encode()
        for i, reg in enumerate(regs, 1):
            conn.send(i, pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=payload))
        # a second request for a busy function is refused at once, not queued
        conn.send(10, pb.InvokeFunctionRequest(registration_id=regs[0].registration_id, payload=b"{}"))
        waiting = []
        try:
            for _ in regs:
                waiter, _ = rendezvous.accept()
                waiting.append(waiter)
                assert waiter.recv(1) == b"w"
        except TimeoutError:
            pytest.fail(f"only {len(waiting)} of the four invocations ran at once")
        busy_id, busy_payload = conn.recv()
        assert busy_id == 10, "the busy function's refusal comes while the four still run"
        busy = decode(busy_payload)
        assert isinstance(busy, dict)
        assert (busy["code"], busy["reason"]) == ("RESOURCE_EXHAUSTED", "ConcurrencyLimit")
        for waiter in waiting:
            waiter.sendall(b"g")
            waiter.close()
    answers = dict(conn.recv() for _ in regs)
    assert sorted(answers) == [1, 2, 3, 4]
    for answer_payload in answers.values():
        answer = decode(answer_payload)
        assert isinstance(answer, pb.InvokeFunctionResponse)
        assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED
        assert json.loads(answer.outputs_json) == {"released": True}


def test_a_frame_split_into_single_bytes_is_reassembled(host: Host, conn: Conn) -> None:
    reg = host.register(ECHO)
    body = pb.InvokeFunctionRequest(
        registration_id=reg.registration_id, payload=b'{"b": 2}'
    ).SerializeToString()
    frame = frames.encode_request(5, body)
    for byte in frame:
        conn.sock.sendall(bytes((byte,)))
    request_id, payload = conn.recv()
    answer = decode(payload)
    assert request_id == 5 and isinstance(answer, pb.InvokeFunctionResponse)
    assert json.loads(answer.outputs_json) == {"b": 2}


@pytest.mark.parametrize("length", [MAX_MESSAGE_BYTES + 1, 2**32 - 1, frames.MIN_REQUEST_LENGTH - 1, 0])
def test_a_bad_frame_length_closes_only_that_connection(
    host: Host, conn: Conn, pki: TestPKI, length: int
) -> None:
    other = Conn(host.runtime.invoke_address, as_=pki.gateway)
    try:
        conn.sock.sendall(struct.pack(">II", length, 1))
        assert conn.closed_by_peer()
        other.send(2, pb.InvokeFunctionRequest(registration_id="reg-nope"))
        request_id, payload = other.recv()
        assert request_id == 2 and decode(payload)["code"] == "NOT_FOUND"  # type: ignore[index]
    finally:
        other.close()


def test_an_empty_request_is_a_frame_and_is_answered(conn: Conn) -> None:
    """An all-default InvokeFunctionRequest has no bytes: its frame, length 4, is read (and refused
    as the gRPC servicer refuses it), and the connection stays open."""
    conn.send_frame(6, b"")
    request_id, payload = conn.recv()
    error = decode(payload)
    assert request_id == 6 and isinstance(error, dict)
    assert (error["code"], error["reason"]) == ("NOT_FOUND", "UnknownRegistration")
    conn.send(7, pb.InvokeFunctionRequest(registration_id="reg-nope"))
    assert decode(conn.recv()[1])["code"] == "NOT_FOUND"  # type: ignore[index]


def test_a_frame_exactly_at_the_bound_is_read_and_answered(conn: Conn) -> None:
    size = MAX_MESSAGE_BYTES - 4 - 16
    while True:  # the request whose frame length is exactly MAX_MESSAGE_BYTES
        body = pb.InvokeFunctionRequest(registration_id="reg-x", payload=b"x" * size).SerializeToString()
        if 4 + len(body) == MAX_MESSAGE_BYTES:
            break
        size += MAX_MESSAGE_BYTES - 4 - len(body)
    conn.send_frame(1, body)
    request_id, payload = conn.recv()
    error = decode(payload)
    assert request_id == 1 and isinstance(error, dict)
    assert (error["code"], error["reason"]) == ("INVALID_ARGUMENT", "InvalidRequest")  # payload too large
    conn.send(2, pb.InvokeFunctionRequest(registration_id="reg-nope"))
    assert decode(conn.recv()[1])["code"] == "NOT_FOUND"  # type: ignore[index]


async def test_the_route_cache_keeps_the_advertised_invoke_address(pki: TestPKI) -> None:
    routes = RouteCache(verifier=pki.verifier())
    uid = str(uuid.uuid4())

    def beat(host_uid: str, invoke_address: str) -> hb.HostHeartbeat:
        held = registration(pki, uid, host_uid=host_uid, registration_id="reg-1")
        return heartbeat(
            host_uid=host_uid, address="127.0.0.1:1", invoke_address=invoke_address, registrations=[held]
        )

    peer = Identity.host(runtime="python", host_id="h-0")
    assert await routes.apply(beat("u-1", "127.0.0.1:2"), peer=peer) == 0
    route = routes.route(uid)
    assert route is not None and route.invoke_address == "127.0.0.1:2"
    assert await routes.apply(beat("u-2", ""), peer=peer) == 0  # a new incarnation without an invoke port
    route = routes.route(uid)
    assert route is not None and route.invoke_address == "" and route.host_uid == "u-2"


# the gateway's client


def test_the_client_maps_answers_and_errors(host: Host, pki: TestPKI) -> None:
    reg = host.register(ECHO)

    async def run() -> None:
        client = RawClient(host.runtime.invoke_address, tls=pki.gateway, expect=TEST_HOST)
        try:
            answer = await client.invoke(
                pb.InvokeFunctionRequest(registration_id=reg.registration_id, payload=b'{"c": 3}'), 5
            )
            assert json.loads(answer.outputs_json) == {"c": 3}
            with pytest.raises(RawError) as err:
                await client.invoke(pb.InvokeFunctionRequest(registration_id="reg-nope"), 5)
            assert err.value.code == grpc.StatusCode.NOT_FOUND
            assert err.value.reason == "UnknownRegistration"
            many = await asyncio.gather(
                *(
                    client.invoke(
                        pb.InvokeFunctionRequest(registration_id="reg-nope", invocation_id=f"i{i}"), 5
                    )
                    for i in range(50)
                ),
                return_exceptions=True,
            )
            assert all(isinstance(e, RawError) and e.code == grpc.StatusCode.NOT_FOUND for e in many)
        finally:
            client.close()

    asyncio.run(run())


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _connected(pki: TestPKI, serve: Serve) -> AsyncIterator[RawClient]:
    """A client of a TLS server with host FAKE_HOST's certificate that accepts each connection
    (the accept frame) and hands it to `serve`; both closed after."""

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frames.encode_accepted())
        await serve(reader, writer)

    context = pki.peer(FAKE_HOST).server_context()
    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=context)
    client = _client(pki, f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        yield client
    finally:
        client.close()
        server.close()
        await server.wait_closed()


def _client(pki: TestPKI, address: str) -> RawClient:
    return RawClient(address, tls=pki.gateway, expect=FAKE_HOST)


def _fake_host(on_frame: str) -> tuple[Serve, list[int]]:
    """A host that, per request, closes the connection or never answers; and its connections."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await reader.readexactly(8)
            if on_frame == "hang":
                await reader.read()  # until the client goes away
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    return serve, accepted


@pytest.mark.parametrize("length", [frames.MIN_ANSWER_LENGTH - 1, 0, frames.MAX_LENGTH + 1])
def test_an_answer_length_out_of_bounds_closes_the_connection_and_fails_what_is_in_flight(
    pki: TestPKI, length: int
) -> None:
    """An answer always has its kind byte: a host answering length 4 (or beyond the bound) breaks
    the framing; the client fails the call as UNAVAILABLE and reconnects for the next one."""

    async def run() -> None:
        accepted: list[int] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(1)
            try:
                header = await reader.readexactly(8)
                _, request_id = struct.unpack(">II", header)
                writer.write(struct.pack(">II", length, request_id) + b"\x00" * 8)
                await writer.drain()
                await reader.read()  # until the client goes away
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        async with _connected(pki, serve) as client:
            for attempt in (1, 2):
                with pytest.raises(RawError) as err:
                    await client.invoke(pb.InvokeFunctionRequest(registration_id="r"), 5)
                assert err.value.code == grpc.StatusCode.UNAVAILABLE
                assert err.value.sent, "the request was written: the outcome is unknown"
                assert len(accepted) == attempt, "each call on a fresh connection"

    asyncio.run(run())


def test_a_broken_connection_fails_what_is_in_flight_and_the_next_call_reconnects(pki: TestPKI) -> None:
    async def run() -> None:
        serve, accepted = _fake_host("close")
        async with _connected(pki, serve) as client:
            results = await asyncio.gather(
                *(client.invoke(pb.InvokeFunctionRequest(registration_id=f"r{i}"), 5) for i in range(3)),
                return_exceptions=True,
            )
            assert all(isinstance(e, RawError) and e.code == grpc.StatusCode.UNAVAILABLE for e in results)
            assert all(isinstance(e, RawError) and e.sent for e in results), "written, then it broke"
            with pytest.raises(RawError) as err:
                await client.invoke(pb.InvokeFunctionRequest(registration_id="again"), 5)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert len(accepted) == 2, "one connection, then one reconnect"

    asyncio.run(run())


def test_no_answer_in_time_is_deadline_exceeded_and_cannot_connect_is_unavailable(pki: TestPKI) -> None:
    async def run() -> None:
        serve, _ = _fake_host("hang")
        async with _connected(pki, serve) as client:
            with pytest.raises(RawError) as err:  # the host never answers: only the deadline ends it
                await asyncio.wait_for(client.invoke(pb.InvokeFunctionRequest(registration_id="r"), 0.3), 60)
            assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # bound, not listening: connection refused
            nowhere = _client(pki, f"127.0.0.1:{port}")
            with pytest.raises(RawError) as err:
                await nowhere.invoke(pb.InvokeFunctionRequest(registration_id=str(uuid.uuid4())), 5)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert not err.value.sent, "refused: nothing was sent"

    asyncio.run(run())


# the gateway's dispatch: the raw path and the gRPC fallback answer alike


class _FakeRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, reason: str, details: str) -> None:
        trailing = grpc.aio.Metadata(*trailer(reason)) if reason else grpc.aio.Metadata()
        super().__init__(code, grpc.aio.Metadata(), trailing, details)


class _FakeUpstreams:
    """Records which path a dispatch took; both fail with the same (code, reason, details)."""

    def __init__(self, failure: tuple[grpc.StatusCode, str, str] | None) -> None:
        self.failure = failure
        self.calls: list[str] = []
        outer = self

        class Raw:
            def client(self, address: str, *, runtime: str, host_id: str) -> Raw:
                outer.calls.append(f"raw {address} {runtime}/{host_id}")
                return self

            async def invoke(
                self,
                request: pb.InvokeFunctionRequest,
                timeout: float,
                *,
                lost: asyncio.Future[None] | None = None,
            ) -> pb.InvokeFunctionResponse:
                if outer.failure == NOT_SENT:
                    raise RawError(grpc.StatusCode.UNAVAILABLE, "", "refused", sent=False)
                if outer.failure is not None:
                    raise RawError(*outer.failure)
                return pb.InvokeFunctionResponse(invocation_id=request.invocation_id)

        self.raw = Raw()

    async def invoke_grpc(
        self,
        address: str,
        host: Identity,
        request: pb.InvokeFunctionRequest,
        *,
        timeout: float,
        lost: asyncio.Future[None] | None = None,
    ) -> pb.InvokeFunctionResponse:
        from kruntimes.gateway.invoke import NotConnected

        self.calls.append(f"grpc {address} {host.name}")
        if self.failure == NOT_SENT:
            raise NotConnected("refused")
        if self.failure is not None:
            raise _FakeRpcError(*self.failure)
        return pb.InvokeFunctionResponse(invocation_id=request.invocation_id)


NOT_SENT = (grpc.StatusCode.UNAVAILABLE, "", "not sent")  # the connection was never made


@pytest.mark.parametrize(
    "failure",
    [
        None,
        NOT_SENT,
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "ConcurrencyLimit", "ConcurrencyLimit: busy"),
        (grpc.StatusCode.FAILED_PRECONDITION, "FenceMismatch", "FenceMismatch: other run"),
        (grpc.StatusCode.NOT_FOUND, "UnknownRegistration", "UnknownRegistration: none"),
        (grpc.StatusCode.UNAVAILABLE, "NotReady", "NotReady: broken"),
        (grpc.StatusCode.UNAVAILABLE, "", "connection broke"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "", "late"),
        (grpc.StatusCode.INVALID_ARGUMENT, "InvalidRequest", "InvalidRequest: payload is larger"),
        (grpc.StatusCode.INTERNAL, HostReason.INTERNAL, "internal error"),
    ],
)
def test_the_raw_path_and_the_grpc_fallback_answer_alike(
    pki: TestPKI, failure: tuple[grpc.StatusCode, str, str] | None
) -> None:
    from kruntimes.gateway.errors import GatewayError
    from kruntimes.gateway.invoke import InvokeHandler

    uid = str(uuid.uuid4())

    async def dispatch(invoke_address: str) -> tuple[list[str], object, bool]:
        routes = RouteCache(verifier=pki.verifier())
        await routes.apply(
            heartbeat(
                host_uid="u-1",
                address="10.0.0.1:1",
                invoke_address=invoke_address,
                registrations=[registration(pki, uid, host_uid="u-1", registration_id="reg-1")],
            ),
            peer=Identity.host(runtime="python", host_id="h-0"),
        )
        route = routes.route(uid)
        assert route is not None
        upstreams = _FakeUpstreams(failure)
        handler = InvokeHandler(routes=routes, known=None, authorizer=None, upstreams=upstreams)  # type: ignore[arg-type]
        try:
            answer: object = await handler._dispatch(route, "inv-1", b"{}", 1.0)
        except GatewayError as exc:
            answer = (type(exc).__name__, exc.status, exc.reason, str(exc), exc.retry_after)
        return upstreams.calls, answer, routes.route(uid) is None

    raw_calls, raw_answer, raw_dropped = asyncio.run(dispatch("10.0.0.1:2"))
    grpc_calls, grpc_answer, grpc_dropped = asyncio.run(dispatch(""))
    assert raw_calls == ["raw 10.0.0.1:2 python/h-0"]
    assert grpc_calls == ["grpc 10.0.0.1:1 python/h-0"]
    assert raw_answer == grpc_answer
    assert raw_dropped == grpc_dropped
    if failure is not None and failure[0] in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
        assert raw_dropped, "a stale route is dropped"
    if failure == NOT_SENT:  # never delivered: 503, safe to retry, the route kept
        assert raw_answer[:3] == ("OwnerUnavailable", 503, "OwnerUnavailable")  # type: ignore[index]
        assert not raw_dropped
