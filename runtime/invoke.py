"""The invoke port: InvokeFunction over a raw framed TCP protocol, the gateway's data plane.

gRPC costs the gateway and the host several hundred µs of CPU per call; this listener carries
the same request and answer with almost none of that. One persistent TCP connection per
gateway, many requests in flight on it; the frames, their size rules and the error answer's
body are kruntimes.wire.frames. An error answer carries the gRPC status name, reason and details
the gRPC InvokeFunction would have answered, so callers map both alike.

The request goes through `kruntimes.runtime.service.begin_invoke`, exactly what the gRPC servicer runs
(validation, payload bound, fence, registry one-in-flight rule, timeouts), on the host's event
loop, the one that serves gRPC too: the exchange with the function process runs on that loop,
so a request costs no thread hop. A frame length outside the request bounds closes that
connection (the framing can no longer be trusted); other connections are unaffected. A
connection with `MAX_IN_FLIGHT` requests running stops reading until some finish. A connection
that closes withdraws what it still waits for: an invocation queued for its turn leaves the queue
and never runs; one already running runs to its end. A cancel frame (kruntimes.wire.frames, sent
when the gateway's caller hung up or its deadline passed) does the same for one request of this
connection: withdrawn if it still waits its turn (no answer then), else ignored — a running
handler is not interrupted, as its effects may already be half done (the host kills a handler only
at its own timeout). An id this connection did not send, or that is over, is ignored. All of these,
and a cancelled gRPC InvokeFunction, withdraw through one function: `Registry.withdraw`.

The port is TLS with the host's platform certificate and requires a client certificate of the
platform CA naming a gateway (kruntimes.pki), signed by a CA of the host's current `ca.crt` (a CA
removed from it is refused at once, though the ssl context's store still holds it); any other
peer is disconnected before it can send a request. An accepted connection first gets the accept
frame (kruntimes.wire.frames), so the gateway knows a request it writes is read by a host that
took it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from typing import cast

from google.protobuf.message import DecodeError

from kruntimes.pki import PeerTLS, Role, identity_of_peercert
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime import errors
from kruntimes.runtime.outcome import Outcome
from kruntimes.runtime.registry import Registry
from kruntimes.runtime.service import begin_invoke, invoke_response
from kruntimes.wire import frames
from kruntimes.wire.reasons import HostReason

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 1024  # per connection; beyond it the connection stops reading
HANDSHAKE_TIMEOUT_S = 10.0
_ACCEPTED = frames.encode_accepted()


def _error(reason: HostReason, message: str) -> bytes:
    """An error answer's body: the reason with its gRPC code, as the gRPC servicer answers it."""
    return frames.encode_error(code=reason.code, reason=reason, message=message)


def _error_of(exc: BaseException) -> bytes:
    if isinstance(exc, errors.RuntimeServerError):
        return _error(exc.reason, str(exc))
    log.error("raw invoke failed", exc_info=exc)
    return _error(HostReason.INTERNAL, "internal error")


class _Connection(asyncio.Protocol):
    def __init__(self, listener: InvokeListener) -> None:
        self.listener = listener
        self.registry = listener.registry
        self.decoder = frames.RequestDecoder(self._request, max_length=listener.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.in_flight = 0
        self.paused = False
        self.pending: set[asyncio.Future[Outcome]] = set()
        self.requests: dict[int, asyncio.Future[Outcome]] = {}  # by request id: what a cancel names
        self.silenced: set[asyncio.Future[Outcome]] = set()  # withdrawn: their _done answers nothing

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        if self.listener.tls is not None:
            peer = identity_of_peercert(transport.get_extra_info("peercert"))
            if peer is None or peer.role is not Role.GATEWAY:
                log.warning("invoke connection refused: not a gateway", extra={"peer": str(peer)})
                self.transport.abort()
                return
            ssl_object = transport.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            if not self.listener.tls.issued_by_current_ca(der):
                log.warning(
                    "invoke connection refused: its CA is no longer trusted", extra={"peer": str(peer)}
                )
                self.transport.abort()
                return
        self.listener.connections.add(self)
        self.transport.write(_ACCEPTED)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.connections.discard(self)
        self.decoder.buffer.clear()
        for pending in list(self.pending):  # nobody reads their answers: as a cancel frame each
            self.registry.withdraw(pending)

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        try:
            self.decoder.feed(data)
        except frames.FrameError as exc:
            log.warning("invoke connection closed: bad frame length", extra={"length": exc.length})
            transport.abort()
            return
        if self.in_flight >= MAX_IN_FLIGHT and not self.paused:
            self.paused = True
            transport.pause_reading()

    def _request(self, request_id: int, body: bytes) -> None:
        if request_id == frames.CONTROL_ID:
            self._control(body)
            return
        try:
            request = pb.InvokeFunctionRequest.FromString(body)
        except DecodeError:
            error = _error(HostReason.INVALID_REQUEST, "malformed InvokeFunctionRequest")
            self._write(request_id, frames.KIND_ERROR, error)
            return
        try:
            invocation_id, pending = begin_invoke(self.registry, request)
        except Exception as exc:
            self._write(request_id, frames.KIND_ERROR, _error_of(exc))
            return
        self.in_flight += 1
        self.pending.add(pending)
        self.requests[request_id] = pending
        pending.add_done_callback(functools.partial(self._done, request_id, invocation_id))

    def _done(self, request_id: int, invocation_id: str, pending: asyncio.Future[Outcome]) -> None:
        self.in_flight -= 1
        self.pending.discard(pending)
        if self.requests.get(request_id) is pending:
            del self.requests[request_id]
        transport = self.transport
        assert transport is not None
        if self.paused and self.in_flight < MAX_IN_FLIGHT // 2 and not transport.is_closing():
            self.paused = False
            transport.resume_reading()
        if pending.cancelled():
            if pending in self.silenced:  # its gateway stopped waiting: nobody reads an answer
                self.silenced.discard(pending)
                return
            error = _error(HostReason.HOST_UNAVAILABLE, "the host is stopping")
            self._write(request_id, frames.KIND_ERROR, error)
        elif (exc := pending.exception()) is not None:
            self._write(request_id, frames.KIND_ERROR, _error_of(exc))
        else:
            response = invoke_response(invocation_id, pending.result())
            self._write(request_id, frames.KIND_RESPONSE, response.SerializeToString())

    def _control(self, body: bytes) -> None:
        """A control frame: a cancel withdraws its request if it still waits its turn; anything
        else (another kind, an id unknown here, a request running or over) is ignored."""
        request_id = frames.decode_cancel(body)
        pending = self.requests.get(request_id) if request_id is not None else None
        if pending is None:
            return
        if self.registry.withdraw(pending):  # its _done (a callback soon) writes nothing
            self.silenced.add(pending)

    def _write(self, request_id: int, kind: int, body: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            try:
                frame = frames.encode_answer(request_id, kind, body)
            except frames.FrameError:  # bounded well below by the outputs and capture limits
                log.error("raw invoke answer too large", extra={"length": len(body)})
                error = _error(HostReason.INTERNAL, "the answer is too large")
                frame = frames.encode_answer(request_id, frames.KIND_ERROR, error)
            transport.write(frame)


class InvokeListener:
    """The invoke port of one host, served on the host's event loop (the same as its gRPC server)."""

    def __init__(self, registry: Registry, *, tls: PeerTLS | None, max_frame_bytes: int) -> None:
        """`tls` None serves plaintext: only the invoke bench's baseline does (see HostOptions)."""
        self.registry = registry
        self.tls = tls
        self.max_frame_bytes = max_frame_bytes
        self.connections: set[_Connection] = set()
        self.address = ""
        self._server: asyncio.AbstractServer | None = None

    async def start(self, listen: str) -> str:
        """Bind `host:port` (port 0 picks one) on the running loop; returns the bound address."""
        host, _, port = listen.rpartition(":")
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if self.tls is None:
            log.warning("the invoke port serves WITHOUT TLS: any local process may invoke functions")
        else:
            context = self.tls.server_context()
        server = await loop.create_server(
            self._accept,
            host.strip("[]") or None,
            int(port),
            reuse_address=True,
            ssl=context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if context is not None else None,
        )
        self._server = server
        bound = server.sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"
        return self.address

    def _accept(self) -> _Connection:
        if self.tls is not None:
            self.tls.server_context()  # new files, if any, for the handshake that follows
        return _Connection(self)

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


__all__ = ["InvokeListener"]
