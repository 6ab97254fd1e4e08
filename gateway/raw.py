"""The gateway's client of a host's invoke port (runtime/invoke.py serves it; kruntimes.wire.frames
is the protocol).

One multiplexed TCP connection per host invoke address, opened on first use and reopened after
it breaks. Requests carry an id; answers resolve the waiting future with that id. A connection
that breaks fails every request in flight on it (`UNAVAILABLE`: the function may have run, and
nothing is retried); a request that gets no answer within its timeout fails with
`DEADLINE_EXCEEDED`. Errors carry the gRPC status name and krt reason the host answered, so the
invoke handler maps them exactly as it maps gRPC errors.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import grpc
from google.protobuf.message import DecodeError

from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire import frames
from kruntimes.wire.reasons import HostReason

log = logging.getLogger("gateway.raw")

CONNECT_TIMEOUT_S = 5.0


class RawError(Exception):
    """`dispatched`: the request may have reached the host (False: it cannot have, e.g. no
    connection could be made), so a failure may or may not have run the function."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str, *, dispatched: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.dispatched = dispatched


def _status(name: str) -> grpc.StatusCode:
    try:
        return grpc.StatusCode[name]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


def _host_error(body: bytes) -> RawError:
    code, reason, message = frames.decode_error(body)
    return RawError(_status(code), reason, message)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[bytes]] = {}
        self.decoder = frames.AnswerDecoder(self._answer)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.next_id = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
        except frames.FrameError as exc:
            log.warning("invoke connection closed: bad frame length", extra={"length": exc.length})
            assert self.transport is not None
            self.transport.abort()  # connection_lost fails what is in flight

    def _answer(self, request_id: int, kind: int, body: bytes) -> None:
        """The waiting request gets the response's bytes, or the host's error raised."""
        future = self.pending.pop(request_id, None)
        if future is not None and not future.done():
            if kind == frames.KIND_RESPONSE:
                future.set_result(body)
            else:
                future.set_exception(_host_error(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.decoder.buffer.clear()
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"the invoke connection broke: {exc or 'closed'}"))

    def send(self, body: bytes) -> asyncio.Future[bytes]:
        """The future of the answer to `body` (at most frames.MAX_REQUEST_BODY bytes)."""
        assert self.transport is not None
        self.next_id = request_id = (self.next_id + 1) & 0xFFFFFFFF
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        self.transport.write(frames.encode_request(request_id, body))
        future.add_done_callback(lambda _: self.pending.pop(request_id, None))
        return future


class RawClient:
    """One host invoke address."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> _Connection:
        async with self._lock:
            connection = self._connection
            if connection is None or connection.closed:
                loop = asyncio.get_running_loop()
                try:
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        _, connection = await loop.create_connection(_Connection, self.host, self.port)
                except TimeoutError:  # this one, not the caller's deadline: the host is unreachable
                    raise ConnectionError(f"cannot connect within {CONNECT_TIMEOUT_S:g}s") from None
                self._connection = connection
            return connection

    async def invoke(self, request: pb.InvokeFunctionRequest, timeout: float) -> pb.InvokeFunctionResponse:
        body = request.SerializeToString()
        if len(body) > frames.MAX_REQUEST_BODY:
            raise RawError(
                grpc.StatusCode.INVALID_ARGUMENT, HostReason.INVALID_REQUEST, "the request is too large"
            )
        sent = False
        try:
            async with asyncio.timeout(timeout):
                connection = self._connection
                if connection is None or connection.closed:
                    connection = await self._connect()
                sent = True
                answer = await connection.send(body)  # a timeout cancels it: a late answer is dropped
        except TimeoutError:
            raise RawError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "", "the host did not answer in time", dispatched=sent
            ) from None
        except OSError as exc:  # cannot connect (not sent), or the connection broke (sent)
            raise RawError(grpc.StatusCode.UNAVAILABLE, "", str(exc), dispatched=sent) from None
        try:
            return pb.InvokeFunctionResponse.FromString(answer)
        except DecodeError:
            raise RawError(grpc.StatusCode.INTERNAL, "", "malformed InvokeFunctionResponse") from None

    def close(self) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()


class RawUpstreams:
    """One `RawClient` per host invoke address."""

    def __init__(self) -> None:
        self._clients: dict[str, RawClient] = {}

    def client(self, address: str) -> RawClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = RawClient(address)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
