"""The SDK's async invocation calls used carelessly (issue #44): an invocation named by a location
URL the caller was handed. The client's bearer token must never leave in plain text."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

import kruntimes
from kruntimes.sdk.client import Client
from tests.sdk.stack import TOKEN


class Plain:
    """An HTTP/1.1 listener on 127.0.0.1 that keeps each request's head and answers 404."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
            body = b'{"reason": "InvocationNotFound", "message": "no", "invocationId": "x"}'
            writer.write(
                b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()


@pytest.fixture
async def plain() -> AsyncIterator[Plain]:
    made = Plain()
    server = await asyncio.start_server(made.serve, "127.0.0.1", 0)
    made.port = server.sockets[0].getsockname()[1]
    async with server:
        yield made


async def test_an_http_location_never_gets_the_clients_token(krt: Client, plain: Plain) -> None:
    location = (
        f"http://127.0.0.1:{plain.port}/v1/namespaces/default/runtimes/python/functions/"
        f"{uuid.uuid4()}/invocations/x"
    )
    with pytest.raises(kruntimes.ConfigError, match="not HTTPS"):  # refused before connecting
        await krt.invocations.get(location)
    with pytest.raises(kruntimes.ConfigError, match="not HTTPS"):
        await krt.invoke(location.removesuffix("/invocations/x") + ":invoke", {})
    assert not [head for head in plain.heads if TOKEN.encode() in head], "the token went out in plain text"
