"""The gateway's client of a host's invoke port (runtime/invoke.py serves it; kruntimes.wire.frames
is the protocol).

One multiplexed TLS connection per host invoke address, opened on first use and reopened after it
breaks. The connection presents the gateway's platform certificate and verifies the host's: it
must name exactly the host the route says (its DNS name and URI SAN, kruntimes.pki). Requests are
written only once the host sent its accept frame. Requests carry an id; answers resolve the
waiting future with that id.

Every failure says whether the request was sent (`RawError.sent`):
- not sent (`sent=False`, safe to retry): the connection could not be made (refused, timed out,
  TLS failed or the host is not the expected one), the host closed it before accepting it, or it
  was already closed when the request was to be written. The function did not run.
- sent: the connection broke after the request was written (`UNAVAILABLE`: the function may have
  run, and nothing is retried), no answer came within the timeout (`DEADLINE_EXCEEDED`), or the
  host answered an error (its gRPC status name and krt reason, mapped like gRPC errors).

A request whose caller hung up (`lost`) before its answer raises `CallerGone`: the gateway stops
waiting and sends the host a cancel frame for it, so an invocation still waiting its turn in the
host's queue is withdrawn and never runs for nobody (one already running runs to its end). A
request past its deadline gets the same cancel, as a gRPC call past its deadline is withdrawn at
the host. A host without an invoke port gets both as a cancelled gRPC call (gateway/invoke.py).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import cast

import grpc
from google.protobuf.message import DecodeError

from kruntimes.pki import Identity, PeerTLS, identity_of_peercert
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire import frames
from kruntimes.wire.reasons import HostReason

log = logging.getLogger("kruntimes.gateway.raw")

CONNECT_TIMEOUT_S = 5.0  # connecting, the TLS handshake and the host's accept frame together


class RawError(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.sent = sent


class CallerGone(Exception):
    """The caller hung up before the answer; the host was told to withdraw the request."""


class NotSent(ConnectionError):
    """The request was not written: the connection is unusable or was never accepted."""


def _status(name: str) -> grpc.StatusCode:
    try:
        return grpc.StatusCode[name]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


def _host_error(body: bytes) -> RawError:
    code, reason, message = frames.decode_error(body)
    return RawError(_status(code), reason, message)


class _Connection(asyncio.Protocol):
    def __init__(self, expect: Identity | None) -> None:
        self.expect = expect
        self.pending: dict[int, asyncio.Future[bytes]] = {}
        self.decoder = frames.AnswerDecoder(self._answer)
        self.transport: asyncio.Transport | None = None
        self.accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.next_id = 0
        self.retired = False  # closed as soon as no request waits on it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        if self.expect is not None:
            peer = identity_of_peercert(transport.get_extra_info("peercert"))
            if peer != self.expect:
                log.warning(
                    "invoke connection closed: the host is not the expected one",
                    extra={"expected": str(self.expect), "peer": str(peer)},
                )
                self.transport.abort()

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
        except frames.FrameError as exc:
            log.warning("invoke connection closed: bad frame length", extra={"length": exc.length})
            assert self.transport is not None
            self.transport.abort()  # connection_lost fails what is in flight

    def _answer(self, request_id: int, kind: int, body: bytes) -> None:
        """The waiting request gets the response's bytes, or the host's error raised."""
        if request_id == frames.ACCEPTED_ID:
            if not self.accepted.done():
                self.accepted.set_result(None)
            return
        future = self.pending.pop(request_id, None)
        if future is not None and not future.done():
            if kind == frames.KIND_RESPONSE:
                future.set_result(body)
            else:
                future.set_exception(_host_error(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.decoder.buffer.clear()
        if not self.accepted.done():
            self.accepted.set_exception(NotSent(f"the host closed the connection: {exc or 'closed'}"))
            self.accepted.exception()  # retrieved: nobody may be waiting any more
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"the invoke connection broke: {exc or 'closed'}"))

    def send(self, body: bytes) -> tuple[int, asyncio.Future[bytes]]:
        """The request id of `body` (at most frames.MAX_REQUEST_BODY bytes) and the future of its
        answer; NotSent if the connection can no longer take a request."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing() or not self.accepted.done():
            raise NotSent("the invoke connection is closed")
        self.next_id = request_id = self.next_id % frames.MAX_REQUEST_ID + 1  # never ACCEPTED_ID
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        transport.write(frames.encode_request(request_id, body))
        future.add_done_callback(lambda _: self._answered(request_id))
        return request_id, future

    def cancel(self, request_id: int) -> None:
        """Stop waiting for request `request_id` (from `send`) and tell the host to withdraw it
        (frames.CONTROL_CANCEL); its late answer, if any, is dropped. Nothing if it is answered."""
        future = self.pending.get(request_id)
        if future is None or future.done():
            return
        self.withdraw(request_id)
        future.set_exception(CallerGone())

    def withdraw(self, request_id: int) -> None:
        """Tell the host to withdraw request `request_id` (it ignores one it answered or runs)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(frames.encode_cancel(request_id))

    def _answered(self, request_id: int) -> None:
        self.pending.pop(request_id, None)
        if self.retired and not self.pending:
            self.retire()

    def retire(self) -> None:
        """Close once no request waits on it."""
        self.retired = True
        if not self.pending and self.transport is not None:
            self.transport.close()


class RawClient:
    """One host invoke address, where the host `expect` must answer (`tls` None: plaintext, only
    for the invoke bench's baseline; no identity is checked then)."""

    def __init__(self, address: str, *, tls: PeerTLS | None, expect: Identity) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.tls = tls
        self.expect = expect
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()
        self._retired = False

    async def _connect(self) -> _Connection:
        async with self._lock:
            connection = self._connection
            if connection is None or connection.closed:
                if self._retired:
                    raise NotSent("the host's invoke address changed")
                loop = asyncio.get_running_loop()
                context: ssl.SSLContext | None = None
                expect: Identity | None = None
                if self.tls is not None:
                    context, expect = self.tls.client_context(), self.expect
                try:
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        _, connection = await loop.create_connection(
                            lambda: _Connection(expect),
                            self.host,
                            self.port,
                            ssl=context,
                            server_hostname=expect.dns_name if expect is not None else None,
                        )
                        try:
                            await connection.accepted
                        except BaseException:
                            if connection.transport is not None:
                                connection.transport.abort()
                            raise
                except TimeoutError:  # this one, not the caller's deadline: the host is unreachable
                    raise NotSent(f"cannot connect within {CONNECT_TIMEOUT_S:g}s") from None
                except OSError as exc:  # refused, reset, TLS failed, or closed before accepting
                    raise NotSent(f"cannot connect: {exc}") from None
                self._connection = connection
                if self._retired:  # retired while it connected: closed after this request
                    connection.retired = True
            return connection

    async def invoke(
        self,
        request: pb.InvokeFunctionRequest,
        timeout: float,
        *,
        lost: asyncio.Future[None] | None = None,
    ) -> pb.InvokeFunctionResponse:
        """The host's answer; CallerGone once `lost` is done (the caller hung up) before it."""
        body = request.SerializeToString()
        if len(body) > frames.MAX_REQUEST_BODY:
            raise RawError(
                grpc.StatusCode.INVALID_ARGUMENT, HostReason.INVALID_REQUEST, "the request is too large"
            )
        sent: tuple[_Connection, int] | None = None
        try:
            async with asyncio.timeout(timeout):
                connection = self._connection
                if connection is None or connection.closed:
                    connection = await self._connect()
                request_id, pending = connection.send(body)
                sent = (connection, request_id)
                if lost is None:
                    answer = await pending  # a timeout cancels it: a late answer is dropped
                else:
                    answer = await self._unless_lost(connection, request_id, pending, lost)
        except TimeoutError:
            if sent is None:
                raise RawError(
                    grpc.StatusCode.UNAVAILABLE, "", "no connection before the deadline", sent=False
                ) from None
            # as a gRPC deadline does at the host: withdrawn if it still waits its turn
            sent[0].withdraw(sent[1])
            raise RawError(grpc.StatusCode.DEADLINE_EXCEEDED, "", "the host did not answer in time") from None
        except NotSent as exc:
            raise RawError(grpc.StatusCode.UNAVAILABLE, "", str(exc), sent=False) from None
        except OSError as exc:  # the connection broke after the request was written
            raise RawError(grpc.StatusCode.UNAVAILABLE, "", str(exc)) from None
        try:
            return pb.InvokeFunctionResponse.FromString(answer)
        except DecodeError:
            raise RawError(grpc.StatusCode.INTERNAL, "", "malformed InvokeFunctionResponse") from None

    @staticmethod
    async def _unless_lost(
        connection: _Connection, request_id: int, pending: asyncio.Future[bytes], lost: asyncio.Future[None]
    ) -> bytes:
        def hung_up(_: asyncio.Future[None]) -> None:
            connection.cancel(request_id)

        if lost.done():
            hung_up(lost)
        lost.add_done_callback(hung_up)
        try:
            return await pending
        finally:
            lost.remove_done_callback(hung_up)

    def close(self) -> None:
        """Drop the connection now: aborted, not shut down gracefully (a TLS close waits for the
        host's close_notify, and a stopping gateway's loop would end first, leaving the socket
        open)."""
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.abort()

    def retire(self) -> None:
        """Close the connection once the requests on it are answered (see RawUpstreams)."""
        self._retired = True
        if self._connection is not None:
            self._connection.retire()


class RawUpstreams:
    """One `RawClient` per host identity, at the invoke address its routes name now: when a host's
    address changes, the client of the old one is retired (closed once its requests are answered),
    so a host that names another address in every beat cannot make the gateway hold a connection
    for each address it ever named."""

    def __init__(self, *, tls: PeerTLS | None) -> None:
        self.tls = tls
        self._clients: dict[tuple[str, str], RawClient] = {}

    def client(self, address: str, *, runtime: str, host_id: str) -> RawClient:
        key = (runtime, host_id)
        client = self._clients.get(key)
        if client is None or client.address != address:
            if client is not None:
                client.retire()
            expect = Identity.host(runtime=runtime, host_id=host_id)
            client = self._clients[key] = RawClient(address, tls=self.tls, expect=expect)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
