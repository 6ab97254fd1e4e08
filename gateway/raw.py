"""The gateway's client of a host's invoke port (runtime/invoke.py describes the protocol).

One multiplexed TCP connection per host invoke address, opened on first use and reopened after
it breaks. Requests carry an id; answers resolve the waiting future with that id. A connection
that breaks fails every request in flight on it (`UNAVAILABLE`: the function may have run, and
nothing is retried); a request that gets no answer within its timeout fails with
`DEADLINE_EXCEEDED`. Errors carry the gRPC status name and krt reason the host answered, so the
invoke handler maps them exactly as it maps gRPC errors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from typing import cast

import grpc
from google.protobuf.message import DecodeError

from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.rpc.v1 import runtime_pb2 as pb

log = logging.getLogger("gateway.raw")

HEADER = struct.Struct(">II")
KIND_RESPONSE = 0
KIND_ERROR = 1
MAX_FRAME_BYTES = MAX_PAYLOAD_BYTES + 512 * 1024  # the host's gRPC max message size, too
CONNECT_TIMEOUT_S = 5.0


class RawError(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


def _status(name: object) -> grpc.StatusCode:
    if isinstance(name, str):
        try:
            return grpc.StatusCode[name]
        except KeyError:
            pass
    return grpc.StatusCode.UNKNOWN


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[bytes]] = {}
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.next_id = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if size < 5 or size > MAX_FRAME_BYTES:
                log.warning("invoke connection closed: bad frame length", extra={"length": size})
                buffer.clear()
                assert self.transport is not None
                self.transport.abort()  # connection_lost fails what is in flight
                return
            if len(buffer) < 4 + size:
                break
            _, request_id = HEADER.unpack_from(buffer)
            payload = bytes(buffer[8 : 4 + size])
            del buffer[: 4 + size]
            future = self.pending.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.buffer.clear()
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"the invoke connection broke: {exc or 'closed'}"))

    def send(self, body: bytes) -> asyncio.Future[bytes]:
        assert self.transport is not None
        self.next_id = request_id = (self.next_id + 1) & 0xFFFFFFFF
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        self.transport.write(HEADER.pack(4 + len(body), request_id) + body)
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
        if len(body) + 4 > MAX_FRAME_BYTES:
            raise RawError(grpc.StatusCode.INVALID_ARGUMENT, "InvalidRequest", "the request is too large")
        try:
            async with asyncio.timeout(timeout):
                connection = self._connection
                if connection is None or connection.closed:
                    connection = await self._connect()
                payload = await connection.send(body)  # a timeout cancels it: a late answer is dropped
        except TimeoutError:
            raise RawError(grpc.StatusCode.DEADLINE_EXCEEDED, "", "the host did not answer in time") from None
        except OSError as exc:  # cannot connect, or the connection broke
            raise RawError(grpc.StatusCode.UNAVAILABLE, "", str(exc)) from None
        if payload[0] == KIND_RESPONSE:
            try:
                return pb.InvokeFunctionResponse.FromString(payload[1:])
            except DecodeError:
                raise RawError(grpc.StatusCode.INTERNAL, "", "malformed InvokeFunctionResponse") from None
        try:
            error = json.loads(payload[1:])
        except ValueError:
            error = {}
        if not isinstance(error, dict):
            error = {}
        return self._raise(error)

    @staticmethod
    def _raise(error: dict[str, object]) -> pb.InvokeFunctionResponse:
        raise RawError(
            _status(error.get("code")), str(error.get("reason") or ""), str(error.get("message") or "")
        )

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
