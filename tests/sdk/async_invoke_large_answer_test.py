"""The SDK reads a gateway's answer whole however it arrives: a list page or a status with a large
result comes in many chunks, and reading only what the first chunk brought made it a
MalformedAnswer (bench/async_invoke.py's list of 300 invocations). A real HTTP server on loopback
sends the answer in pieces with a pause between them."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from kruntimes.sdk.client import Client
from kruntimes.sdk.config import ClientConfig

TOKEN = "krt-test-token-large"
UID = str(uuid.uuid4())
RUN_PATH = f"/v1/namespaces/default/runtimes/python/functions/{UID}"
RESULT = json.dumps({"invocationId": "big", "status": "Succeeded", "outputs": {"x": "y" * 600_000}})


def _status(inv: str) -> dict[str, Any]:
    return {
        "invocationId": inv,
        "target": {"kind": "Run", "namespace": "default", "name": "fn", "uid": UID, "runtime": "python"},
        "state": "Succeeded",
        "acceptedAt": "2026-01-01T00:00:00Z",
        "attemptCount": 1,
        "result": RESULT if inv == "big" else None,
    }


async def _trickle(request: web.Request, document: dict[str, Any]) -> web.StreamResponse:
    """The document as JSON in 16 KiB pieces, each sent after a pause."""
    raw = json.dumps(document).encode()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(raw)
    await response.prepare(request)
    for at in range(0, len(raw), 16 * 1024):
        await response.write(raw[at : at + 16 * 1024])
        await asyncio.sleep(0.001)
    await response.write_eof()
    return response


async def _handle(request: web.Request) -> web.StreamResponse:
    path = request.raw_path.split("?", 1)[0]
    if path == f"{RUN_PATH}/invocations":
        items = [_status(f"inv-{n}") for n in range(400)]
        return await _trickle(request, {"items": items, "continue": ""})
    return await _trickle(request, _status(path.rsplit("/", 1)[1]))


@pytest.fixture
async def krt() -> AsyncIterator[Client]:
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", _handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with Client(ClientConfig(gatewayUrl=f"http://127.0.0.1:{port}", token=TOKEN)) as client:
            yield client
    finally:
        await runner.cleanup()


def _url(krt: Client) -> str:
    return f"{krt.config.gatewayUrl}{RUN_PATH}:invoke"


async def test_a_list_page_that_arrives_in_pieces_is_read_whole(krt: Client) -> None:
    listed = [i.invocationId async for i in krt.invocations.list(_url(krt), limit=None, page_size=1000)]
    assert listed == [f"inv-{n}" for n in range(400)]


async def test_a_status_with_a_large_result_that_arrives_in_pieces_is_read_whole(krt: Client) -> None:
    got = await krt.invocations.get(_url(krt), "big")
    answer = got.answer()
    assert answer is not None and answer.outputs == {"x": "y" * 600_000}
