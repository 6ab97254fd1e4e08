"""The invoke port: InvokeFunction over a raw framed TCP protocol, the gateway's data plane.

gRPC costs the gateway and the host several hundred µs of CPU per call; this listener carries
the same request and answer with almost none of that. One persistent TCP connection per
gateway, many requests in flight on it, each frame:

    [u32 length][u32 request id][payload]          big-endian; length counts id + payload

Request payload: a serialized `InvokeFunctionRequest`. Response payload (same request id): one
kind byte, then `KIND_RESPONSE` + `InvokeFunctionResponse` bytes, or `KIND_ERROR` + UTF-8 JSON
`{"code": "<grpc status name>", "reason": "<krt reason>", "message": "<gRPC details>"}`: the
status and reason the gRPC InvokeFunction would have answered, so callers map both alike.

The request goes through `runtime.service.begin_invoke`, exactly what the gRPC servicer runs
(validation, payload bound, fence, registry one-in-flight rule, timeouts), on the host's event
loop, the one that serves gRPC too: the exchange with the function process runs on that loop,
so a request costs no thread hop. A frame whose length is below 4 or above
`MAX_MESSAGE_BYTES` closes that connection (the framing can no longer be trusted); other
connections are unaffected. A connection with `MAX_IN_FLIGHT` requests running stops reading
until some finish.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import struct
import time
from typing import cast

from google.protobuf.message import DecodeError

from kruntimes.rpc.v1 import runtime_pb2 as pb
from runtime import errors
from runtime.outcome import Outcome
from runtime.registry import Registry
from runtime.service import begin_invoke, invoke_response, status_code

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
KIND_RESPONSE = 0
KIND_ERROR = 1
MAX_IN_FLIGHT = 1024  # per connection; beyond it the connection stops reading
RESPONSE_KIND = bytes((KIND_RESPONSE,))


def error_payload(code: str, reason: str, message: str) -> bytes:
    body = json.dumps({"code": code, "reason": reason, "message": message}, separators=(",", ":"))
    return bytes((KIND_ERROR,)) + body.encode()


def _error_of(exc: BaseException) -> bytes:
    if isinstance(exc, errors.RuntimeError_):
        return error_payload(status_code(exc).name, exc.reason, str(exc))
    log.error("raw invoke failed", exc_info=exc)
    return error_payload("INTERNAL", "Internal", "internal error")


class _Connection(asyncio.Protocol):
    def __init__(self, listener: InvokeListener) -> None:
        self.listener = listener
        self.registry = listener.registry
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.in_flight = 0
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.listener.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.connections.discard(self)
        self.buffer.clear()

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        buffer = self.buffer
        buffer += data
        max_frame = self.listener.max_frame_bytes
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if size < 4 or size > max_frame:
                log.warning("invoke connection closed: bad frame length", extra={"length": size})
                buffer.clear()
                transport.abort()
                return
            if len(buffer) < 4 + size:
                break
            _, request_id = HEADER.unpack_from(buffer)
            body = bytes(buffer[8 : 4 + size])
            del buffer[: 4 + size]
            self._request(request_id, body)
        if self.in_flight >= MAX_IN_FLIGHT and not self.paused:
            self.paused = True
            transport.pause_reading()

    def _request(self, request_id: int, body: bytes) -> None:
        try:
            request = pb.InvokeFunctionRequest.FromString(body)
        except DecodeError:
            reason = errors.InvalidRequest.reason
            self._write(
                request_id, error_payload("INVALID_ARGUMENT", reason, "malformed InvokeFunctionRequest")
            )
            return
        try:
            invocation_id, pending = begin_invoke(self.registry, request)
        except Exception as exc:
            self._write(request_id, _error_of(exc))
            return
        self.in_flight += 1
        pending.add_done_callback(functools.partial(self._done, request_id, invocation_id))

    def _done(self, request_id: int, invocation_id: str, pending: asyncio.Future[Outcome]) -> None:
        self.in_flight -= 1
        transport = self.transport
        assert transport is not None
        if self.paused and self.in_flight < MAX_IN_FLIGHT // 2 and not transport.is_closing():
            self.paused = False
            transport.resume_reading()
        if pending.cancelled():
            payload = error_payload("UNAVAILABLE", errors.HostUnavailable.reason, "the host is stopping")
        elif (exc := pending.exception()) is not None:
            payload = _error_of(exc)
        else:
            response = invoke_response(invocation_id, pending.result())
            payload = RESPONSE_KIND + response.SerializeToString()
        self._write(request_id, payload)

    def _write(self, request_id: int, payload: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(HEADER.pack(4 + len(payload), request_id) + payload)


class InvokeListener:
    """The invoke port of one host, served on the host's event loop (the same as its gRPC server)."""

    def __init__(self, registry: Registry, *, max_frame_bytes: int) -> None:
        self.registry = registry
        self.max_frame_bytes = max_frame_bytes
        self.connections: set[_Connection] = set()
        self.address = ""
        self._server: asyncio.AbstractServer | None = None

    async def start(self, listen: str) -> str:
        """Bind `host:port` (port 0 picks one) on the running loop; returns the bound address."""
        host, _, port = listen.rpartition(":")
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Connection(self), host.strip("[]") or None, int(port), reuse_address=True
        )
        self._server = server
        bound = server.sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"
        return self.address

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let running invocations answer for up to `grace_s`, then close."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        deadline = time.monotonic() + grace_s
        while any(c.in_flight for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        await asyncio.sleep(0)


__all__ = ["HEADER", "KIND_ERROR", "KIND_RESPONSE", "InvokeListener", "error_payload"]
