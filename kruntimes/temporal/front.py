"""The embedded platform's way to its Temporal dev server, which has no TLS or authentication of
its own: byte forwarders, bounded.

    Bounds           how many connections, how long a handshake, how much is buffered
    Forwarder        a listening socket whose every connection is piped, byte for byte, to a new
                     connection of `connect` (unix_upstream, tcp_upstream): optionally TLS first
                     (the front: mutual TLS on 127.0.0.1, forwarded to the dev server's Unix
                     socket), or plain (a Unix socket in the dev server's network namespace,
                     forwarded to its loopback port)
    front_context    the front's server side of mutual TLS: a client certificate of the owner's CA
                     is required during the handshake, ALPN h2 (gRPC clients insist on it)
    unix_listener    a Unix socket only its owner may open (0600, in a directory of its own)
    unix_address     a Unix socket's path short enough for sockaddr_un, whatever its directory

The dev server runs in a network namespace of its own (kruntimes.workers.embedded.hidden_temporal)
where nothing of the machine's loopback reaches it; its frontend and UI are reachable through Unix
sockets in the 0700 state directory, and from 127.0.0.1 only through this front, with the owner's
client certificate. The forwarders stop reading a side while the other's write buffer is over
`write_buffer_bytes`, so a connection holds a bounded amount of memory (that and what one read
brings); gRPC keeps its connections open, so no idle timeout is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

log = logging.getLogger("temporal.front")

# sockaddr_un holds 108 bytes with its terminating NUL; a longer path is reached through a
# descriptor of its directory (/proc/self/fd/N/name)
MAX_UNIX_PATH = 100
ACCEPT_BACKOFF_S = 0.1  # how long the accept loop waits when out of descriptors or memory
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(frozen=True)
class Bounds:
    """How much one forwarder takes on."""

    max_connections: int = 256
    # connections accepted whose TLS handshake is not done: a cap of their own, so that the
    # handshakes of others cannot take every place
    max_handshaking: int = 64
    handshake_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    write_buffer_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        if not 1 <= self.max_handshaking <= self.max_connections <= 65536:
            raise ValueError("need 1 <= max_handshaking <= max_connections <= 65536")
        if not 0 < self.handshake_timeout_s <= 300 or not 0 < self.connect_timeout_s <= 300:
            raise ValueError("timeouts are in (0, 300] seconds")
        if not 4096 <= self.write_buffer_bytes <= 64 * 1024 * 1024:
            raise ValueError("need 4096 <= write_buffer_bytes <= 64 MiB")


def front_context(*, cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """The server side of the front's mutual TLS: a client without a certificate of `client_ca`
    is refused during the handshake."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    return context


def unix_address(path: Path) -> str:
    """`path` as a Unix socket address: itself when short enough, else through a descriptor of
    its directory, kept open for the life of the process (sockaddr_un holds 108 bytes)."""
    if len(os.fsencode(path)) <= MAX_UNIX_PATH:
        return str(path)
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{directory}/{path.name}"


def unix_listener(path: Path, *, backlog: int = 128) -> socket.socket:
    """A listening Unix socket at `path` only this user may connect to: its directory is made
    0700, the socket is created 0600 (a stale one from an earlier process is replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)  # created 0600: never open to others, not even for a moment
    try:
        sock.bind(unix_address(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(previous)
    sock.listen(backlog)
    return sock


class _Half(asyncio.Protocol):
    """One side of a piped connection: what it receives is written to the other side; it stops
    reading while the other side's write buffer is over its bound, and when either side ends,
    both do."""

    def __init__(self, ended: asyncio.Future[None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.ended = ended
        self.early: list[bytes] = []  # what came before there was a peer to write it to

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not its subclasses

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:  # kept, and no more read until the peer is there (link)
            self.early.append(data)
            if self.transport is not None:
                self.transport.pause_reading()

    def link(self, peer: _Half) -> None:
        """Write to `peer` from now on, what came before first, and read again."""
        self.peer = peer
        assert peer.transport is not None and self.transport is not None
        for data in self.early:
            peer.transport.write(data)
        self.early.clear()
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False  # close: gRPC needs no half-closed connection

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        if not self.ended.done():
            self.ended.set_result(None)


ProtocolFactory = Callable[[], asyncio.Protocol]
Connect = Callable[[ProtocolFactory], Awaitable[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]]


def unix_upstream(path: Path) -> Connect:
    """Connections to the Unix socket at `path`."""
    address = unix_address(path)
    return lambda factory: asyncio.get_running_loop().create_unix_connection(factory, address)


def tcp_upstream(host: str, port: int) -> Connect:
    return lambda factory: asyncio.get_running_loop().create_connection(factory, host, port)


class Forwarder:
    """Every connection accepted on `sock` piped to a new connection of `connect`, TLS first when
    `tls` is given. Over a cap, a connection is closed as soon as it is accepted, before any TLS
    work."""

    def __init__(
        self,
        sock: socket.socket,
        connect: Connect,
        *,
        tls: ssl.SSLContext | None = None,
        bounds: Bounds | None = None,
        name: str = "front",
    ) -> None:
        self.sock = sock
        self.connect = connect
        self.tls = tls
        self.bounds = bounds or Bounds()
        self.name = name
        self.open = 0
        self.handshaking = 0
        self.refused = 0  # connections closed at accept, over a cap
        self.failed_handshakes = 0
        self._accepting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.sock.setblocking(False)
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        self.sock.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _over_cap(self) -> bool:
        if self.open >= self.bounds.max_connections:
            return True
        return self.tls is not None and self.handshaking >= self.bounds.max_handshaking

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as e:
                if e.errno in _OUT_OF_RESOURCES:
                    log.warning("%s: cannot accept connections: %s", self.name, e.strerror)
                    await asyncio.sleep(ACCEPT_BACKOFF_S)
                continue  # otherwise the client left before it was accepted
            if self._over_cap():
                self.refused += 1
                conn.close()
                continue
            self.open += 1
            if self.tls is not None:
                self.handshaking += 1  # counted now: the next accept must see it
            task = loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.open -= 1
        self._tasks.discard(task)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        client = _Half(ended)
        try:
            # the handshake happens here, before the connection is anyone's
            transport, _ = await loop.connect_accepted_socket(
                lambda: client,
                conn,
                ssl=self.tls,
                ssl_handshake_timeout=self.bounds.handshake_timeout_s if self.tls is not None else None,
            )
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            conn.close()
            self.failed_handshakes += 1
            log.info("%s: a connection failed its TLS handshake: %s", self.name, type(e).__name__)
            return
        finally:
            if self.tls is not None:
                self.handshaking -= 1
        transport.pause_reading()  # until there is somewhere to write what it sends
        upstream = _Half(ended)
        upstream.peer = client  # what the dev server says goes to the client at once
        try:
            try:
                async with asyncio.timeout(self.bounds.connect_timeout_s):
                    up_transport, _ = await self.connect(lambda: upstream)
            except (OSError, TimeoutError) as e:
                log.warning("%s: cannot reach the dev server: %s", self.name, e)
                return
            up_transport = cast(asyncio.Transport, up_transport)
            for one in (transport, up_transport):
                one.set_write_buffer_limits(high=self.bounds.write_buffer_bytes)
            client.link(upstream)
            await ended
        finally:
            transport.abort()
            if upstream.transport is not None:
                upstream.transport.abort()
