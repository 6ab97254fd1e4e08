"""The SDK's async invocation client against a real HTTP server on loopback that answers the shapes
docs/async-invocations.md documents: what it sends (Prefer, the id, the token, the id
percent-encoded in the path), how it reads each answer, and each refusal's typed error. The
platform's own gateway answers the same calls in async_invoke_test.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from kruntimes.sdk.client import (
    AsyncBacklogFull,
    AsyncInvocation,
    AsyncUnavailable,
    Client,
    ConfigError,
    Invocation,
    InvocationConflict,
    InvocationNotFound,
    WaitTimeout,
)
from kruntimes.sdk.config import ClientConfig

TOKEN = "krt-test-token-async"
UID = str(uuid.uuid4())
RUN_PATH = f"/v1/namespaces/default/runtimes/python/functions/{UID}"
ANSWER = {"invocationId": "x", "status": "Succeeded", "outputs": {"n": 1}, "durationMs": 1.0}


def _status(inv: str, state: str) -> dict[str, Any]:
    done = state in ("Succeeded", "Failed", "Unknown")
    return {
        "invocationId": inv,
        "target": {"kind": "Run", "namespace": "default", "name": "fn", "uid": UID, "runtime": "python"},
        "state": state,
        "acceptedAt": "2026-01-01T00:00:00Z",
        "attemptCount": 1 if done else 0,
        # fields a newer gateway adds, at the top and inside: read past, not refused
        "attempts": [{"n": 1, "startedAt": "2026-01-01T00:00:01Z", "httpStatus": 200, "queuedMs": 3}]
        if done
        else [],
        "result": json.dumps({**ANSWER, "invocationId": inv}) if state == "Succeeded" else None,
        "error": {"reason": "HandlerError", "message": "boom"} if state == "Failed" else None,
        "somethingNew": "ignored",  # a field a newer gateway adds
    }


@dataclass
class Gateway:
    """What the server saw, and how it answers: GETs of an id answer Running `running` times."""

    url: str = ""
    seen: list[web.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    running: int = 2
    reads: int = 0
    listed: int = 5  # invocations in the list
    refusals: dict[str, tuple[int, str, str | None]] = field(
        default_factory=dict
    )  # id → status, reason, Retry-After

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request)
        self.bodies.append(await request.read())
        path = request.raw_path.split("?", 1)[0]
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"reason": "Unauthenticated"}, status=401)
        inv = request.headers.get("X-Kruntime-Invocation-ID", "")
        if inv in self.refusals:
            status, reason, retry = self.refusals[inv]
            headers = {"Retry-After": retry} if retry else {}
            return web.json_response({"reason": reason, "message": "no"}, status=status, headers=headers)
        if request.method == "POST" and (path == f"{RUN_PATH}:invoke" or path.endswith(":resubmit")):
            location = f"{RUN_PATH}/invocations/{urllib.parse.quote(inv, safe='')}"
            return web.json_response(
                {"invocationId": inv, "state": "Queued", "location": location},
                status=202,
                headers={"Location": location, "Preference-Applied": "respond-async"},
            )
        if request.method == "GET" and path == f"{RUN_PATH}/invocations":
            offset = int(request.query.get("continue") or 0)
            limit = int(request.query["limit"])
            items = [_status(f"inv-{i}", "Failed") for i in range(offset, min(offset + limit, self.listed))]
            more = offset + limit < self.listed
            return web.json_response({"items": items, "continue": str(offset + limit) if more else ""})
        prefix = f"{RUN_PATH}/invocations/"
        if request.method == "GET" and path.startswith(prefix):
            wanted = urllib.parse.unquote(path.removeprefix(prefix))
            if wanted == "never":
                return web.json_response(
                    {"reason": "InvocationNotFound", "message": "no such id"}, status=404
                )
            self.reads += 1
            state = "Running" if self.reads <= self.running else "Succeeded"
            return web.json_response(_status(wanted, state))
        return web.json_response({"reason": "NotFound"}, status=404)


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    served = Gateway()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", served.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        served.url = f"http://{host}:{port}"
        yield served
    finally:
        await runner.cleanup()


@pytest.fixture
async def krt(gateway: Gateway) -> AsyncIterator[Client]:
    async with Client(ClientConfig(gatewayUrl=gateway.url, token=TOKEN)) as client:
        yield client


def _invoke_url(gateway: Gateway) -> str:
    return f"{gateway.url}{RUN_PATH}:invoke"


async def test_a_submission_asks_for_async_with_its_id_and_reads_the_absolute_location(
    krt: Client, gateway: Gateway
) -> None:
    accepted = await krt.invoke_async(_invoke_url(gateway), {"a": 1}, invocation_id="order 42/b", timeout=5)
    request = gateway.seen[-1]
    assert request.headers["Prefer"] == "respond-async"
    assert request.headers["X-Kruntime-Invocation-ID"] == "order 42/b"
    assert request.headers["X-Kruntime-Timeout"] == "5"
    assert json.loads(gateway.bodies[-1]) == {"a": 1}
    assert accepted == AsyncInvocation(
        invocationId="order 42/b",
        state="Queued",
        location=f"{gateway.url}{RUN_PATH}/invocations/order%2042%2Fb",
    )
    # the location reads it back, its id one path segment
    status = await krt.invocations.get(accepted.location)
    assert gateway.seen[-1].raw_path == f"{RUN_PATH}/invocations/order%2042%2Fb"
    assert status.invocationId == "order 42/b" and status.state == "Running" and not status.done


async def test_wait_reads_until_the_invocation_ends_and_returns_its_answer(
    krt: Client, gateway: Gateway
) -> None:
    gateway.running = 3
    done = await krt.invocations.wait(_invoke_url(gateway), "order-1", timeout=30)
    assert gateway.reads == 4 and done.ok and done.done
    assert [a.httpStatus for a in done.attempts] == [200]
    answer = done.answer()
    assert answer is not None and answer.outputs == {"n": 1} and answer.invocationId == "order-1"


async def test_wait_past_its_timeout_says_which_invocation_and_where_it_is(
    krt: Client, gateway: Gateway
) -> None:
    gateway.running = 10**6
    with pytest.raises(WaitTimeout, match=r"invocation 'slow' is still Running after 0.5 s"):
        await krt.invocations.wait(_invoke_url(gateway), "slow", timeout=0.5)
    assert gateway.reads >= 2, "it read more than once before giving up"


async def test_list_follows_the_continue_token_and_stops_at_the_limit(krt: Client, gateway: Gateway) -> None:
    gateway.listed = 5
    every = [
        i.invocationId async for i in krt.invocations.list(_invoke_url(gateway), state="Failed", page_size=2)
    ]
    assert every == [f"inv-{i}" for i in range(5)]
    queries = [dict(r.query) for r in gateway.seen]
    assert queries == [
        {"limit": "2", "state": "Failed"},
        {"limit": "2", "state": "Failed", "continue": "2"},
        {"limit": "2", "state": "Failed", "continue": "4"},
    ]
    some = [i.invocationId async for i in krt.invocations.list(_invoke_url(gateway), limit=3, page_size=2)]
    assert some == ["inv-0", "inv-1", "inv-2"]
    assert dict(gateway.seen[-1].query) == {"limit": "1", "continue": "2"}


async def test_resubmit_posts_to_the_invocation_with_the_new_id(krt: Client, gateway: Gateway) -> None:
    again = await krt.invocations.resubmit(_invoke_url(gateway), "inv-1", new_id="inv-1-again")
    request = gateway.seen[-1]
    assert request.method == "POST" and request.raw_path == f"{RUN_PATH}/invocations/inv-1:resubmit"
    assert request.headers["X-Kruntime-Invocation-ID"] == "inv-1-again"
    assert again.invocationId == "inv-1-again" and again.location.endswith("/invocations/inv-1-again")


async def test_each_refusal_is_its_typed_error(krt: Client, gateway: Gateway) -> None:
    gateway.refusals = {
        "conflict": (409, "InvocationConflict", None),
        "full": (429, "AsyncBacklogFull", "7"),
        "down": (503, "AsyncUnavailable", "2"),
    }
    with pytest.raises(InvocationConflict) as conflict:
        await krt.invoke_async(_invoke_url(gateway), {}, invocation_id="conflict")
    assert conflict.value.status == 409 and conflict.value.invocation_id == "conflict"
    with pytest.raises(AsyncBacklogFull) as full:
        await krt.invoke_async(_invoke_url(gateway), {}, invocation_id="full")
    assert full.value.retry_after == 7.0
    with pytest.raises(AsyncUnavailable) as down:
        await krt.invoke_async(_invoke_url(gateway), {}, invocation_id="down")
    assert down.value.retry_after == 2.0
    with pytest.raises(InvocationNotFound) as missing:
        await krt.invocations.get(_invoke_url(gateway), "never")
    assert missing.value.status == 404 and missing.value.invocation_id == "never"


async def test_wait_reads_through_a_gateway_that_cuts_its_connections_until_it_answers() -> None:
    """A gateway restarting: the first reads find the port cutting each connection unanswered;
    then it serves on the same socket, and the wait ends with the invocation's status."""
    loop = asyncio.get_running_loop()
    served = Gateway(running=0)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", served.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        served.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

        async def cut(connections: int) -> None:
            for _ in range(connections):
                conn, _ = await loop.sock_accept(sock)
                conn.close()

        async with Client(ClientConfig(gatewayUrl=served.url, token=TOKEN)) as krt:
            cutting = asyncio.ensure_future(cut(3))
            waiting: asyncio.Future[Invocation] | None = None
            try:
                with pytest.raises(ConfigError, match="broke"):  # a single read is not retried
                    await krt.invocations.get(_invoke_url(served), "later")
                waiting = asyncio.ensure_future(
                    krt.invocations.wait(_invoke_url(served), "later", timeout=60)
                )
                await asyncio.wait_for(asyncio.shield(cutting), 30)  # two reads of the wait cut off
                assert not waiting.done(), waiting
                site = web.SockSite(runner, sock)
                await site.start()
                done = await waiting
            finally:
                for task in (cutting, waiting):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                await runner.cleanup()
    assert done.ok and served.reads == 1
