"""The invoke port: InvokeFunction over a raw framed TCP protocol, the gateway's data plane.

gRPC costs the gateway and the host several hundred µs of CPU per call; this listener carries
the same request and answer with almost none of that. One persistent TCP connection per
gateway, many requests in flight on it, each frame:

    [u32 length][u32 request id][payload]          big-endian; length counts id + payload

Request payload: a serialized `InvokeFunctionRequest`. Response payload (same request id): one
kind byte, then `KIND_RESPONSE` + `InvokeFunctionResponse` bytes, or `KIND_ERROR` + UTF-8 JSON
`{"code": "<grpc status name>", "reason": "<krt reason>", "message": "<gRPC details>"}`: the
status and reason the gRPC InvokeFunction would have answered, so callers map both alike.

The request goes through `runtime.service.invoke_function`, exactly what the gRPC servicer
runs (validation, payload bound, fence, registry one-in-flight rule, timeouts), in a thread
pool: it blocks on the function process's pipe. The connections are served by an asyncio event
loop (uvloop when importable) in a dedicated thread. A frame whose length is below 4 or above
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
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import cast

from google.protobuf.message import DecodeError

from kruntimes.rpc.v1 import runtime_pb2 as pb
from runtime import errors
from runtime.registry import Registry
from runtime.service import invoke_function, status_code

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
KIND_RESPONSE = 0
KIND_ERROR = 1
MAX_IN_FLIGHT = 1024  # per connection; beyond it the connection stops reading


def error_payload(code: str, reason: str, message: str) -> bytes:
    body = json.dumps({"code": code, "reason": reason, "message": message}, separators=(",", ":"))
    return bytes((KIND_ERROR,)) + body.encode()


def handle_invoke(registry: Registry, body: bytes) -> bytes:
    """One request payload → one response payload (never raises)."""
    try:
        request = pb.InvokeFunctionRequest.FromString(body)
    except DecodeError:
        return error_payload(
            "INVALID_ARGUMENT", errors.InvalidRequest.reason, "malformed InvokeFunctionRequest"
        )
    try:
        response = invoke_function(registry, request)
    except errors.RuntimeError_ as exc:
        return error_payload(status_code(exc).name, exc.reason, str(exc))
    except Exception:
        log.exception("raw invoke failed")
        return error_payload("INTERNAL", "Internal", "internal error")
    return bytes((KIND_RESPONSE,)) + response.SerializeToString()


class _Connection(asyncio.Protocol):
    def __init__(self, listener: InvokeListener) -> None:
        self.listener = listener
        self.loop = asyncio.get_running_loop()
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
            self.in_flight += 1
            future = self.loop.run_in_executor(self.listener.executor, self.listener.handle, body)
            future.add_done_callback(functools.partial(self._done, request_id))
        if self.in_flight >= MAX_IN_FLIGHT and not self.paused:
            self.paused = True
            transport.pause_reading()

    def _done(self, request_id: int, future: asyncio.Future[bytes]) -> None:
        self.in_flight -= 1
        transport = self.transport
        assert transport is not None
        if self.paused and self.in_flight < MAX_IN_FLIGHT // 2 and not transport.is_closing():
            self.paused = False
            transport.resume_reading()
        if future.cancelled():
            payload = error_payload("UNAVAILABLE", errors.HostUnavailable.reason, "the host is stopping")
        elif future.exception() is not None:
            payload = error_payload("INTERNAL", "Internal", "internal error")
        else:
            payload = future.result()
        if not transport.is_closing():
            transport.write(HEADER.pack(4 + len(payload), request_id) + payload)


class InvokeListener:
    """The invoke port of one host: its own event loop thread plus a pool for the invocations."""

    def __init__(self, handle: Callable[[bytes], bytes], *, max_workers: int, max_frame_bytes: int) -> None:
        self.handle = handle
        self.max_frame_bytes = max_frame_bytes
        self.executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="invoke")
        self.connections: set[_Connection] = set()
        self.address = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, listen: str) -> str:
        """Bind `host:port` (port 0 picks one), serve in a thread; returns the bound address."""
        host, _, port = listen.rpartition(":")
        loop: asyncio.AbstractEventLoop
        try:
            import uvloop  # the leaner event loop, as in the gateway

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        try:
            server = loop.run_until_complete(
                loop.create_server(
                    lambda: _Connection(self), host.strip("[]") or None, int(port), reuse_address=True
                )
            )
        except BaseException:
            loop.close()
            raise
        self._server = server
        bound = server.sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="invoke-loop", daemon=True)
        self._thread.start()
        return self.address

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let running invocations answer for up to `grace_s`, then close."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = None
        future = asyncio.run_coroutine_threadsafe(self._shutdown(grace_s), loop)
        try:
            future.result(timeout=grace_s + 5.0)
        except (futures.TimeoutError, RuntimeError):
            log.warning("invoke listener did not stop cleanly")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5.0)
        if not thread.is_alive():
            loop.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _shutdown(self, grace_s: float) -> None:
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while any(c.in_flight for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        await asyncio.sleep(0)


__all__ = ["HEADER", "KIND_ERROR", "KIND_RESPONSE", "InvokeListener", "error_payload", "handle_invoke"]
