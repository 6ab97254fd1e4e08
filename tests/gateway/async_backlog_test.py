"""A target's own asyncInvocations.backlog, enforced by the real gateway of the shared platform
(#44 item 5): the worker registers the Run with it, its host carries it in its heartbeats'
registrations, and the gateway's accept bounds the target's Queued invocations by the smaller of
it and `--max-async-target-backlog` (10,000 here). A target whose one slot a sync call holds
busy keeps its async invocations Queued: at its own backlog of 3 the next is 429
AsyncBacklogFull with Retry-After and is not recorded, while a Run with a larger backlog still
accepts; a Function's replicas carry their template's backlog the same way. The route cache
(gateway/routes.py) keeps a registration's backlog and share as the host says them, follows a
change without a new assignment, takes a value past its bound or an older host's silence for
"not said" (the gateway's own bounds), and gives a Function its Ready replicas' latest revision's.
An async attempt holds the share its route says, whatever larger share the worker's request claims;
a host refuses a registration whose bounds are past theirs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from kruntimes.api.function import Function
from kruntimes.api.limits import MAX_ASYNC_BACKLOG
from kruntimes.api.run import Run
from kruntimes.gateway.async_invoke import DEFAULT_MAX_TARGET_BACKLOG, AsyncInvocations
from kruntimes.gateway.routes import RouteCache
from kruntimes.gateway.server import Gateway
from kruntimes.pki import Identity
from kruntimes.pki.assignments import Verifier
from kruntimes.rpc.v1 import gateway_dispatch_pb2_grpc as gd_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.sdk.client import Client
from kruntimes.wire import headers
from tests.gateway.async_accept_test import call, recorded
from tests.gateway.async_worker_test import HOLDING
from tests.gateway.conftest import REGISTERED, HostProcess, lines, wait_route
from tests.gateway.dispatch_test import GATED, attempt, refused, succeeded
from tests.gateway.dispatch_test import worker as worker  # the fixture, shared
from tests.sdk.stack import Platform, manifest, unique
from tests.support.beats import heartbeat, registration
from tests.support.pki import TestPKI
from tests.support.waiting import eventually
from tests.trust.function_routes_test import replica, snapshot

ASYNC = {headers.PREFER: "respond-async"}
OWN = 3  # the held target's asyncInvocations.backlog


@pytest.fixture
async def http(platform: Platform) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(platform.tls.ca_cert))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=90)
    ) as session:
        yield session


@pytest.fixture
def frozen(platform: Platform) -> Iterator[AsyncInvocations]:
    """The gateway's async accept with its backlog counted once from visibility, then by its own
    accepts (no recount while the test looks: an attempt's Running moment would lower it)."""
    found = platform.gateway.async_invocations
    assert found is not None
    backlog = found.backlog
    assert backlog.per_target == DEFAULT_MAX_TARGET_BACKLOG, "the gateway's flag is far above the targets'"
    saved = backlog.cache_s, backlog.per_target
    backlog.cache_s = 3600.0
    backlog._counts.clear()
    try:
        yield found
    finally:
        backlog.cache_s, backlog.per_target = saved
        backlog._counts.clear()


def _exchange(platform: Platform) -> tuple[Path, Path]:
    """A directory the function sees too: the file its calls are logged in, and the one that
    releases them."""
    exchange = platform.shared / unique("backlog")
    exchange.mkdir()
    exchange.chmod(0o1777)
    return exchange / "calls", exchange / "release"


@contextlib.asynccontextmanager
async def _held(http: aiohttp.ClientSession, invoke: str, calls: Path, release: Path) -> AsyncIterator[None]:
    """The target's one slot held by a sync call until the block ends (the release file)."""
    body = json.dumps({"log": str(calls), "release": str(release), "n": "holder"}).encode()
    holder = asyncio.ensure_future(call(http, "POST", invoke, body=body, sent={headers.TIMEOUT: "80"}))
    try:
        await eventually(calls.exists, within=60, what="the holding call runs")
        yield
    finally:
        release.touch()
        status, _, doc = await asyncio.wait_for(holder, timeout=90)
        assert status == 200, doc


async def _accept(
    http: aiohttp.ClientSession, invoke: str, inv: str, body: bytes
) -> tuple[int, dict[str, str], Any]:
    return await call(http, "POST", invoke, body=body, sent={**ASYNC, headers.INVOCATION_ID: inv})


async def _fill(http: aiohttp.ClientSession, invoke: str, calls: Path, release: Path, n: int) -> list[str]:
    """`n` invocations accepted (202): each waits Queued behind the held slot."""
    accepted = []
    for i in range(n):
        inv = f"q{i}-{uuid.uuid4().hex[:6]}"
        body = json.dumps({"log": str(calls), "release": str(release), "n": inv}).encode()
        status, _, doc = await _accept(http, invoke, inv, body)
        assert status == 202, (i, doc)
        accepted.append(inv)
    return accepted


async def _refused(
    platform: Platform, http: aiohttp.ClientSession, invoke: str, uid: str, bound: int = OWN
) -> None:
    refused = f"over-{uuid.uuid4().hex[:6]}"
    status, answer_headers, doc = await _accept(http, invoke, refused, b"{}")
    assert (status, doc["reason"]) == (429, "AsyncBacklogFull"), doc
    assert answer_headers[headers.RETRY_AFTER] == "5"
    assert f"has {bound} or more invocations waiting" in doc["message"], doc
    assert not await recorded(platform, uid, refused), "a refused invocation is not recorded"


async def test_a_runs_own_backlog_refuses_past_it_while_a_larger_one_accepts(
    platform: Platform, http: aiohttp.ClientSession, frozen: AsyncInvocations
) -> None:
    calls, release = _exchange(platform)
    async with Client(platform.config) as krt:
        targets = {}
        for backlog in (OWN, 10):
            mode = {"function": {"concurrency": 1, "asyncInvocations": {"backlog": backlog}}}
            name = unique(f"backlog{backlog}")
            await krt.create(Run.from_dict(manifest(name, source=HOLDING, mode=mode)))
            targets[backlog] = name
        small = await krt.wait(targets[OWN], timeout=60)
        large = await krt.wait(targets[10], timeout=60)
    assert small.status.endpoint is not None and large.status.endpoint is not None
    assert small.metadata.uid is not None
    route = platform.gateway.routes.route(small.metadata.uid)
    assert route is not None and route.async_backlog == OWN, "the host's heartbeat carries the spec's"
    invoke = small.status.endpoint.url
    async with _held(http, invoke, calls, release):
        await _fill(http, invoke, calls, release, OWN)
        await _refused(platform, http, invoke, small.metadata.uid)
        # another target's backlog is its own: more than OWN of its invocations are accepted
        await _fill(http, large.status.endpoint.url, calls, release, OWN + 1)
        # the gateway's flag bounds a target whose own backlog is above it
        frozen.backlog.per_target = OWN + 1
        assert large.metadata.uid is not None
        await _refused(platform, http, large.status.endpoint.url, large.metadata.uid, OWN + 1)


async def test_a_functions_replicas_carry_its_templates_backlog(
    platform: Platform, http: aiohttp.ClientSession, frozen: AsyncInvocations
) -> None:
    calls, release = _exchange(platform)
    mode = {"function": {"concurrency": 1, "asyncInvocations": {"backlog": OWN}}}
    async with Client(platform.config) as krt:
        name = unique("backlog-fn")
        await krt.functions.apply(
            Function.from_dict({**manifest(name, source=HOLDING, mode=mode), "kind": "Function"})
        )
        try:
            function = await krt.functions.wait_ready(name, timeout=90)
            assert function.status.endpoint is not None
            invoke = function.status.endpoint.url
            uid = urllib.parse.urlsplit(invoke).path.split("/")[-1].removesuffix(":invoke")
            assert platform.gateway.routes.function_async_policy(uid)[0] == OWN
            async with _held(http, invoke, calls, release):
                await _fill(http, invoke, calls, release, OWN)
                await _refused(platform, http, invoke, uid)
        finally:
            await krt.functions.delete(name, timeout=120)


HOST = Identity.host(runtime="python", host_id="h-0")


def _said(reg: pb.RegistrationState, backlog: int, share: int) -> pb.RegistrationState:
    reg.async_backlog, reg.async_share = backlog, share
    return reg


async def test_a_route_keeps_its_registrations_async_bounds_as_the_host_says_them(pki: TestPKI) -> None:
    routes = RouteCache(verifier=Verifier([pki.signer.public_key]))
    host_uid = str(uuid.uuid4())
    said, older, past = (str(uuid.uuid4()) for _ in range(3))

    def beat(backlog: int) -> Any:
        return heartbeat(
            host_uid=host_uid,
            address="127.0.0.1:1",
            registrations=[
                _said(registration(pki, said, host_uid=host_uid), backlog, 80),
                registration(pki, older, host_uid=host_uid),  # a host older than the fields
                _said(registration(pki, past, host_uid=host_uid), MAX_ASYNC_BACKLOG + 1, 101),
            ],
        )

    assert await routes.apply(beat(3), peer=HOST) == 0
    policies = {uid: routes.route(uid) for uid in (said, older, past)}
    assert {uid: (r.async_backlog, r.async_share) for uid, r in policies.items() if r is not None} == {
        said: (3, 80),
        older: (0, 0),
        past: (0, 0),  # past its bound: the host's bug, not said
    }
    assert await routes.apply(beat(7), peer=HOST) == 0  # the same assignment, another value
    changed = routes.route(said)
    assert changed is not None and changed.async_backlog == 7


async def test_a_function_takes_its_ready_replicas_latest_revisions_bounds(pki: TestPKI) -> None:
    routes = RouteCache(verifier=Verifier([pki.signer.public_key]))
    host_uid = str(uuid.uuid4())
    function = str(uuid.uuid4())
    r1, r2, waking = (str(uuid.uuid4()) for _ in range(3))
    regs = [
        _said(replica(pki, r1, host_id="h-0", host_uid=host_uid, function_uid=function), 5, 40),
        _said(replica(pki, r2, host_id="h-0", host_uid=host_uid, function_uid=function, revision=2), 6, 60),
        _said(
            replica(
                pki, waking, host_id="h-0", host_uid=host_uid, function_uid=function, revision=3, ready=False
            ),
            9,
            90,
        ),
    ]
    assert await routes.apply(snapshot("h-0", host_uid, *regs), peer=HOST) == 0
    assert routes.function_async_policy(function) == (6, 60), "Ready replicas only, the latest revision"
    assert routes.function_async_policy(str(uuid.uuid4())) == (0, 0)


async def test_an_attempt_holds_its_routes_share_not_the_larger_one_its_request_claims(
    gateway: Gateway,
    main_host: HostProcess,
    records_dir: Path,
    worker: gd_grpc.GatewayDispatchAsyncStub,
) -> None:
    uid, record = str(uuid.uuid4()), records_dir / f"{uuid.uuid4().hex}.txt"
    REGISTERED.append(uid)  # as every run uid the suite registers: no metric names it

    def config(share: int, backlog: int = 4) -> pb.FunctionConfig:
        return pb.FunctionConfig(
            adapter="python",
            handler="main:handle",
            env={"TEST_RECORD": str(record)},
            inline=pb.InlineSource(files=[pb.InlineFile(name="main.py", content=GATED.encode())]),
            concurrency=2,
            async_backlog=backlog,
            async_share=share,
        )

    def register(config: pb.FunctionConfig) -> Any:
        run = pb.RunRef(run_uid=uid, attempt=1, namespace="default", name="fn", runtime="python")
        request = pb.RegisterFunctionRequest(run=run, assignment=main_host.signed(uid), config=config)
        return main_host.stub.RegisterFunction(request, timeout=30)

    for past in (config(101), config(50, MAX_ASYNC_BACKLOG + 1)):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await register(past)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    await register(config(50))
    await wait_route(gateway, uid, host_uid=main_host.host_uid)
    route = gateway.routes.route(uid)
    assert route is not None and (route.async_backlog, route.async_share) == (4, 50)
    gate = records_dir / uuid.uuid4().hex
    held = asyncio.ensure_future(attempt(worker, uid, {"tag": "held", "gate": str(gate)}, share=100))
    try:
        await eventually(
            lambda: lines(record), until=lambda ran: ran == ["held"], what="the first attempt runs"
        )
        # 50 % of 2 is one place, though the request says 100 %
        body = refused(await attempt(worker, uid, {"tag": "past"}, share=100), 429, "AsyncShareFull")
        assert "share" in body.message
    finally:
        gate.touch()
    succeeded(await held)
    assert lines(record) == ["held"], "the attempt past the share never ran"
