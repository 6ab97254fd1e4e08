"""HTTP/1.1 by hand over a real TLS connection: for requests no HTTP client would send (malformed,
trickled, abandoned) and for watching the connection itself (answered, closed, refused)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

CLOSE_WAIT_S = 10.0  # the bound on waiting for the gateway to close a connection
TRICKLE_S = 0.05  # between the pieces of a trickled request


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes
    head: bytes = field(repr=False, default=b"")  # the status line and headers as received


class Connection:
    """One TLS connection to the gateway: write bytes, read answers, see it closed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, url: str, ca_file: Path, *, tls: bool = True) -> Connection:
        host, port = url.removeprefix("https://").rsplit(":", 1)
        context = ssl.create_default_context(cafile=str(ca_file)) if tls else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port), ssl=context), CLOSE_WAIT_S
        )
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> RawAnswer:
        """The next answer (a Content-Length or chunked body, or none)."""
        async with asyncio.timeout(CLOSE_WAIT_S):
            head = await self.reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            headers: dict[str, str] = {}
            for line in lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while True:
                    size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                    chunk = await self.reader.readexactly(size + 2)
                    if size == 0:
                        break
                    body += chunk[:-2]
            else:
                body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return RawAnswer(int(status_line.split()[1]), headers, body, head)

    async def closed(self, within: float = CLOSE_WAIT_S) -> bytes:
        """Wait until the gateway has closed the connection; returns what it sent before."""
        received = b""
        async with asyncio.timeout(within):
            while True:
                try:
                    data = await self.reader.read(65536)
                except (ConnectionError, ssl.SSLError):
                    return received
                if not data:
                    return received
                received += data

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 2)


def request(
    path: str,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    content_length: int | None = None,
) -> bytes:
    """A request's bytes: headers (with Host and Content-Length), then the body."""
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def trickle(conn: Connection, data: bytes) -> None:
    """Send `data` a byte at a time, TRICKLE_S apart, until it is sent or the connection breaks."""
    for i in range(len(data)):
        try:
            await conn.send(data[i : i + 1])
        except (ConnectionError, ssl.SSLError):
            return
        await asyncio.sleep(TRICKLE_S)


@contextlib.asynccontextmanager
async def trickling(conn: Connection, data: bytes) -> AsyncIterator[asyncio.Task[None]]:
    """While the body runs, `data` is trickled on `conn` (see trickle); stopped when it ends."""
    task = asyncio.create_task(trickle(conn, data))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
