"""The gateway's connections: accepted here, bounded here, before and around aiohttp's HTTP/1.1.

    HttpLimits       the bounds, each a flag of `krt gateway` with a safe default
    Listener         the listening socket and its accept loop: a connection over a cap is closed
                     at accept, before any TLS work; the others get their TLS handshake (bounded
                     by the header timeout) and then a GatewayProtocol
    GatewayProtocol  aiohttp's RequestHandler with the header timeout and the gateway's own answer
                     to a request the HTTP parser refuses

The rules, per connection:
- a new connection completes its TLS handshake within `header_timeout_s`, and then the headers of
  its first request within `header_timeout_s`;
- on a kept-alive connection, the first byte of the next request comes within `idle_timeout_s`
  of the previous answer (aiohttp's keep-alive timeout), and its headers are complete within
  `header_timeout_s` of that byte;
- a request's body arrives at `body_min_rate` bytes per second at least, once `body_timeout_s`
  have passed since the gateway started reading it (gateway/invoke.py reads it; a body that is
  too slow is answered 408 RequestBodyTimeout and the connection closed after the answer);
- at most `max_connections` connections are open at once, and at most
  `max_connections_per_client` from one client address; a connection beyond either is closed as
  soon as it is accepted, while the open ones are served as before.

A cut connection is aborted (no TLS close handshake to wait for) and counted
(krt_gateway_connections_cut_total{reason}, krt_gateway_connections_refused_total{limit}).

The HTTP parser's refusals (a malformed request line or header, an oversized header, broken body
framing) are answered 400 MalformedRequest as an ErrorBody and the connection closed: never with
aiohttp's own text, which quotes the bytes it refused (an `Authorization` header among them), and
never logged with those bytes.

`Expect` is the gateway's, not aiohttp's router's (whose 417 answer quotes the header in plain
text, outside the middleware, and whose `100 Continue` goes out before the request is even
authenticated): an expectation other than `100-continue` is ignored (RFC 9110 allows it), and
`100 Continue` is sent by the application only when it is about to read the body
(`send_continue`), so a request refused before (401, 403, 404, 413, ...) never invites its body.

aiohttp has no header timeout of its own. The seam is its RequestHandler: a timer armed when the
connection is made (or when the first byte of a kept-alive connection's next request arrives) and
cancelled when the parser has emitted the request (`_request_count` grew in `data_received`). The
handler's state is read through `_request_count` and `_waiter`, and an answer that closes its
connection at once sets `_lingering_time` (aiohttp's RequestHandler internals;
tests/gateway/limits_test.py pins the behaviour against the installed version).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server
from multidict import CIMultiDict

from kruntimes.gateway.errors import BadRequest, BodyTimeout, GatewayError, PayloadTooLarge
from kruntimes.gateway.metrics import GatewayMetrics
from kruntimes.gateway.replies import gateway_error_answer
from kruntimes.wire.reasons import GatewayReason as R

log = logging.getLogger("gateway.http")

# set on a request that asked for `100 Continue` (its Expect header taken off, see the docstring)
EXPECTS_CONTINUE = web.RequestKey("expects_continue", bool)

# How long an answer sent before the body was read may keep reading (and dropping) the rest, so
# that the client sees the answer rather than a reset connection.
LINGERING_S = 10.0
# How long the accept loop waits when the process is out of file descriptors or memory.
ACCEPT_BACKOFF_S = 0.1
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(frozen=True)
class HttpLimits:
    """The gateway's connection and request bounds (see the module docstring for the rules)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_rate: int = 4096  # bytes per second
    idle_timeout_s: float = 60.0
    max_connections: int = 4096
    max_connections_per_client: int = 256

    def __post_init__(self) -> None:
        for name, low, high in (
            ("header_timeout_s", 0.0, 300.0),
            ("body_timeout_s", 0.0, 900.0),
            ("idle_timeout_s", 0.0, 3600.0),
        ):
            value = getattr(self, name)
            if not low < value <= high:
                raise ValueError(f"{name} must be in ({low:g}, {high:g}] seconds, got {value!r}")
        if not 1 <= self.body_min_rate <= 1024 * 1024 * 1024:
            raise ValueError(f"body_min_rate must be 1 to 2**30 bytes per second, got {self.body_min_rate}")
        if not 1 <= self.max_connections <= 1_000_000:
            raise ValueError(f"max_connections must be 1 to 1000000, got {self.max_connections}")
        if not 1 <= self.max_connections_per_client <= self.max_connections:
            raise ValueError(
                "max_connections_per_client must be 1 to max_connections "
                f"({self.max_connections}), got {self.max_connections_per_client}"
            )

    def body_deadline(self, started: float, received: int) -> float:
        """When the body must have grown past `received` bytes, having started at `started`."""
        return started + max(self.body_timeout_s, received / self.body_min_rate)


class _Slot:
    """One accepted connection's place under the caps, given back exactly once."""

    __slots__ = ("_listener", "client", "_held")

    def __init__(self, listener: Listener, client: str) -> None:
        self._listener = listener
        self.client = client
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._listener._release(self.client)


async def _expectations_taken_off(
    application: Callable[[BaseRequest], Awaitable[web.StreamResponse]], request: BaseRequest
) -> web.StreamResponse:
    """`request` to `application` without its Expect header, marked EXPECTS_CONTINUE when it
    asked for `100 Continue` (HTTP/1.1 only, as aiohttp's own handling)."""
    expect = request.headers.get(hdrs.EXPECT)
    if expect is None:
        return await application(request)
    kept = CIMultiDict(request.headers)
    kept.popall(hdrs.EXPECT)
    plain = request.clone(headers=kept)
    if expect.strip().lower() == "100-continue" and request.version >= HttpVersion11:
        plain[EXPECTS_CONTINUE] = True
    return await application(plain)


async def send_continue(request: BaseRequest) -> None:
    """`100 Continue` to a caller that asked for it (EXPECTS_CONTINUE) and has not sent its body
    yet: what an application calls when it is about to read a body it will take."""
    if request.get(EXPECTS_CONTINUE) and not request.content.is_eof():
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer itself has not started


async def receive_body(request: BaseRequest, limits: HttpLimits, *, max_bytes: int) -> bytes:
    """The body as it arrives: at most `max_bytes` (413 PayloadTooLarge), at the minimum rate of
    `limits` once its grace has passed (408 RequestBodyTimeout)."""
    content = request.content
    if content.is_eof():  # it came whole with the headers: nothing to wait for
        data = content.read_nowait()
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"the body is larger than {max_bytes} bytes")
        return data
    loop = asyncio.get_running_loop()
    started = loop.time()
    body = bytearray()
    while True:
        try:
            async with asyncio.timeout_at(limits.body_deadline(started, len(body))):
                chunk = await content.read(65536)
        except TimeoutError:
            raise BodyTimeout(
                f"the body arrived slower than {limits.body_min_rate} bytes/s "
                f"after {limits.body_timeout_s:g}s",
                reason=R.REQUEST_BODY_TIMEOUT,
            ) from None
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"the body is larger than {max_bytes} bytes")


class GatewayProtocol(RequestHandler):
    """aiohttp's RequestHandler with the header timeout, the gateway's answers to the parser's
    refusals, and a way for the application to close the connection after an answer."""

    __slots__ = ("_limits", "_slot", "_metrics", "_header_timer", "_lost")

    def __init__(
        self,
        manager: Server,
        *,
        loop: asyncio.AbstractEventLoop,
        limits: HttpLimits,
        slot: _Slot,
        metrics: GatewayMetrics,
    ) -> None:
        super().__init__(
            manager,
            loop=loop,
            keepalive_timeout=limits.idle_timeout_s,
            logger=log,
            access_log=None,  # type: ignore[arg-type]  # no access log: the middleware logs invokes
            lingering_time=LINGERING_S,
            auto_decompress=False,  # a compressed body would be a decompression bomb; JSON is sent plain
        )
        self._limits = limits
        self._slot = slot
        self._metrics = metrics
        self._header_timer: asyncio.TimerHandle | None = None
        self._lost: asyncio.Future[None] | None = None
        application = self._request_handler
        assert application is not None
        self._request_handler = functools.partial(_expectations_taken_off, application)

    # -- the header timeout ---------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        self._header_timer = self._loop.call_later(self._limits.header_timeout_s, self._headers_late)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        timer = self._header_timer
        if self._request_count != before:  # the parser emitted a request: its headers are complete
            if timer is not None:
                timer.cancel()
                self._header_timer = None
        elif timer is None and data and self._waiter is not None and not self._waiter.done():
            # the first bytes of the next request on a kept-alive connection: the handler waits
            # for a request (during a request's body `_waiter` is None, or done when the request
            # was emitted by an earlier call that the handler has not yet taken up)
            self._arm_header_timer()

    def _headers_late(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is not None:
            self._metrics.connection_cut("header_timeout")
            log.info(
                "connection closed: the request headers were not complete in time",
                extra={"client": self._slot.client, "seconds": self._limits.header_timeout_s},
            )
            transport.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._slot.release()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        super().connection_lost(exc)

    def lost(self) -> asyncio.Future[None]:
        """Done once the connection is lost (the caller hung up): what a request waiting at the
        gateway watches, since aiohttp does not cancel a handler whose caller went away."""
        if self._lost is None:
            self._lost = self._loop.create_future()
            if self.transport is None:
                self._lost.set_result(None)
        return self._lost

    # -- closing after an answer ----------------------------------------------------------------

    def close_after_answer(self) -> None:
        """Close this connection once the current answer is written, reading nothing more of the
        request (aiohttp would otherwise linger, reading the rest of an unread body); the answer
        must say `Connection: close` (its force_close())."""
        self._lingering_time = 0.0

    # -- the parser's refusals ------------------------------------------------------------------

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The gateway's ErrorBody instead of aiohttp's text (which quotes the refused bytes).
        aiohttp calls this for what the parser refuses (400), and for an exception that escaped the
        application (which the middleware answers itself, so here a bug: 500)."""
        if request.writer.output_size > 0:  # an answer is half sent: the connection is broken
            raise ConnectionError("an answer was already being sent")
        err: GatewayError
        if status == 400:
            err = BadRequest("the HTTP request cannot be parsed", reason=R.MALFORMED_REQUEST)
            log.info(
                "malformed HTTP request",
                extra={"client": self._slot.client, "error": type(exc).__name__ if exc else ""},
            )
        else:
            err = GatewayError("internal error")
            log.error(
                "unexpected error in the HTTP server",
                extra={"status": status, "error": type(exc).__name__ if exc else ""},
            )
        self._metrics.observe("unmatched", str(err.status), err.reason, 0.0)
        answer = gateway_error_answer(err, "")
        answer.force_close()
        return answer


ProtocolFactory = Callable[[_Slot], asyncio.Protocol]


class Listener:
    """Accepts connections itself, so the caps apply before any TLS work, and hands each one it
    keeps to a protocol made by `protocol_factory` (TLS first when `ssl_context` is given)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        limits: HttpLimits,
        metrics: GatewayMetrics,
        backlog: int = 1024,
    ) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.limits = limits
        self.metrics = metrics
        self.backlog = backlog
        self.open = 0
        self.per_client: Counter[str] = Counter()
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._factory: ProtocolFactory | None = None

    def protocol_factory(self, server: Server) -> ProtocolFactory:
        """GatewayProtocols of aiohttp `server` (an AppRunner's) under this listener's limits."""
        loop = asyncio.get_running_loop()

        def make(slot: _Slot) -> asyncio.Protocol:
            return GatewayProtocol(server, loop=loop, limits=self.limits, slot=slot, metrics=self.metrics)

        return make

    async def start(self, factory: ProtocolFactory) -> int:
        """Listen and accept; returns the bound port."""
        self._factory = factory
        # "" (as in `--listen :8443`): every address of the first family the resolver offers
        host = self.host.strip("[]") or None
        infos = socket.getaddrinfo(host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, address = infos[0]
        sock = socket.create_server(address, family=family, backlog=self.backlog)
        sock.setblocking(False)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._accepting = asyncio.create_task(self._accept(sock))
        return self.port

    def _refusal(self, client: str) -> str:
        if self.open >= self.limits.max_connections:
            return "total"
        if self.per_client[client] >= self.limits.max_connections_per_client:
            return "per_client"
        return ""

    def _release(self, client: str) -> None:
        self.open -= 1
        left = self.per_client[client] - 1
        if left > 0:
            self.per_client[client] = left
        else:
            del self.per_client[client]
        self.metrics.connections.dec()

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    log.warning("cannot accept connections: %s", exc.strerror)
                    await asyncio.sleep(ACCEPT_BACKOFF_S)
                continue  # otherwise the client left before it was accepted (ECONNABORTED)
            client = str(address[0])
            limit = self._refusal(client)
            if limit:
                conn.close()
                self.metrics.connection_refused(limit)
                continue
            self.open += 1
            self.per_client[client] += 1
            self.metrics.connections.inc()
            slot = _Slot(self, client)
            task = loop.create_task(self._serve(conn, slot))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _serve(self, conn: socket.socket, slot: _Slot) -> None:
        """The TLS handshake (bounded) and the protocol; a connection that fails it is closed."""
        assert self._factory is not None
        factory = self._factory
        loop = asyncio.get_running_loop()
        kwargs: dict[str, Any] = {}
        if self.ssl_context is not None:
            kwargs = {"ssl": self.ssl_context, "ssl_handshake_timeout": self.limits.header_timeout_s}
        try:
            await loop.connect_accepted_socket(lambda: factory(slot), conn, **kwargs)
        except asyncio.CancelledError:
            conn.close()
            slot.release()
            raise
        except Exception as exc:  # the handshake failed or took too long, or the client left
            conn.close()
            slot.release()
            self.metrics.connection_cut("tls_handshake")
            log.debug("connection closed during the TLS handshake", extra={"error": type(exc).__name__})

    def close(self) -> None:
        """Stop accepting; connections still in their TLS handshake are closed."""
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for task in list(self._handshakes):
            task.cancel()


__all__ = ["GatewayProtocol", "HttpLimits", "Listener"]
