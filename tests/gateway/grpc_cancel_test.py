"""A caller that hangs up on a Run whose host advertises no invoke port (the gateway calls it over
gRPC InvokeFunction): the gateway cancels the call, and the host withdraws the invocation if it
still waits its turn (it never runs, its place is free at once) or lets it run to its end, as on
the invoke port (tests/gateway/cancel_test.py); real HTTPS clients, a real gateway and host.

The handlers hold until the test creates a file and record each invocation they start and end:
"waiting", "running" and "never ran" are what the host reports and the handlers wrote, and "the
gateway stopped waiting" is its access log line, never timings."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from kruntimes.api.limits import MAX_INVOKE_TIMEOUT_SECONDS
from kruntimes.gateway.invoke import Upstreams
from kruntimes.gateway.raw import RawError
from kruntimes.gateway.routes import Route
from kruntimes.gateway.server import Gateway
from kruntimes.pki.local import TlsFiles
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire.headers import INVOCATION_ID
from tests.gateway.conftest import Answer, Function, HostProcess, Hosts, LogCapture, invoke
from tests.gateway.queue_test import fresh, status
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

BOUND_S = 60.0  # how long anything here may take at most; never what a test asserts
DEADLINE_S = 1.0  # the gateway's deadline of a call in the deadline test (its own timeout is far longer)

# Appends its n to `ran` when it starts and to `done` when it ends; holds until its gate exists.
RECORDED = """
import os, time

def handle(p):
    d = p["dir"]
    with open(os.path.join(d, "ran"), "a") as f:
        f.write(f"{p['n']}\\n")
    while not os.path.exists(os.path.join(d, p["gate"])):
        time.sleep(0.005)
    with open(os.path.join(d, "done"), "a") as f:
        f.write(f"{p['n']}\\n")
    return {"n": p["n"]}
"""


@pytest.fixture(scope="module")
async def grpc_host(hosts: Hosts) -> AsyncIterator[HostProcess]:
    """A host that serves no invoke port: the gateway reaches it over gRPC only."""
    host = await hosts.start("gw-grpc-only", args=("--invoke-listen", ""))
    yield host
    await host.stop()


def recorded(path: Path, name: str) -> list[int]:
    record = path / name
    return [int(line) for line in record.read_text().split()] if record.exists() else []


@pytest.fixture(scope="module")
async def upstreams(pki: TestPKI) -> AsyncIterator[Upstreams]:
    """The gateway's clients of hosts, as a gateway's certificate: for a call with a deadline of
    its own."""
    held = Upstreams(tls=pki.gateway)
    yield held
    await held.close()


async def registered(gateway: Gateway, host: HostProcess, *, raw: bool = False) -> tuple[Function, Route]:
    fn = await host.register(gateway, RECORDED, concurrency=1, queue=1)
    route = gateway.routes.route(fn.uid)
    assert route is not None and bool(route.invoke_address) is raw, "the Run is reached as meant"
    return fn, route


def call(
    client: aiohttp.ClientSession, gateway: Gateway, fn: Function, path: Path, n: int, inv: str = ""
) -> asyncio.Task[Answer]:
    payload = {"dir": str(path), "n": n, "gate": f"go-{n}"}
    headers = {INVOCATION_ID: inv} if inv else None
    return asyncio.create_task(invoke(client, gateway, fn.uid, payload, headers=headers))


@contextlib.asynccontextmanager
async def leaving_client(tls: TlsFiles) -> AsyncIterator[aiohttp.ClientSession]:
    """A caller with a connection of its own, closed when it leaves (its hang-up)."""
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session


async def abandon(task: asyncio.Task[Answer]) -> None:
    task.cancel()  # the client closes its connection
    with contextlib.suppress(asyncio.CancelledError):
        await task


def closed_by_caller(log: LogCapture, inv: str) -> bool:
    """The gateway logged the invocation as ended by its caller (499): it stopped waiting for it."""
    return any(
        r.getMessage() == "invoke"
        and getattr(r, "invocation_id", "") == inv
        and getattr(r, "status", 0) == 499
        for r in list(log.records)
    )


async def test_a_caller_that_hangs_up_while_queued_on_a_grpc_host_never_runs_and_frees_its_place(
    gateway: Gateway, client: aiohttp.ClientSession, grpc_host: HostProcess, records_dir: Path, tls: TlsFiles
) -> None:
    path = fresh(records_dir)
    fn, _ = await registered(gateway, grpc_host)
    first = call(client, gateway, fn, path, 0)
    await eventually(lambda: recorded(path, "ran") == [0], within=BOUND_S, what="the first running")

    async with leaving_client(tls) as leaving:
        second = call(leaving, gateway, fn, path, 1)
        await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: s.waiting == 1)
        await abandon(second)

    # out of the host's queue at once, while the first still holds the only place
    await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: s.waiting == 0)
    assert not first.done() and recorded(path, "ran") == [0]
    third = call(client, gateway, fn, path, 2)  # the freed place takes another
    await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: s.waiting == 1)

    (path / "go-0").touch()
    assert (await first).expect(200).json["outputs"] == {"n": 0}
    await eventually(lambda: recorded(path, "ran") == [0, 2], within=BOUND_S, what="the third running next")
    (path / "go-1").touch()  # nothing holds on, should the second run after all
    (path / "go-2").touch()
    assert (await third).expect(200).json["outputs"] == {"n": 2}
    state = await status(fn)
    assert (state.in_flight, state.waiting) == (0, 0)
    assert recorded(path, "ran") == [0, 2], "the withdrawn invocation never ran"


async def test_a_caller_that_hangs_up_while_its_invocation_runs_on_a_grpc_host_lets_it_run_to_its_end(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    grpc_host: HostProcess,
    records_dir: Path,
    tls: TlsFiles,
    log_capture: LogCapture,
) -> None:
    path = fresh(records_dir)
    fn, _ = await registered(gateway, grpc_host)
    inv = str(uuid.uuid4())
    async with leaving_client(tls) as leaving:
        running = call(leaving, gateway, fn, path, 0, inv)
        await eventually(lambda: recorded(path, "ran") == [0], within=BOUND_S, what="it running")
        await abandon(running)

    # the gateway stops waiting at once; the handler, still held, is not interrupted
    await eventually(lambda: closed_by_caller(log_capture, inv), within=BOUND_S, what="the gateway's 499")
    assert recorded(path, "done") == []
    assert (await status(fn)).in_flight == 1

    (path / "go-0").touch()
    await eventually(lambda: recorded(path, "done") == [0], within=BOUND_S, what="it running to its end")
    await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: (s.in_flight, s.waiting) == (0, 0))
    (path / "go-1").touch()
    assert (await call(client, gateway, fn, path, 1)).expect(200).json["outputs"] == {"n": 1}
    assert recorded(path, "ran") == [0, 1] and recorded(path, "done") == [0, 1]


async def past_its_deadline(
    upstreams: Upstreams, route: Route, request: pb.InvokeFunctionRequest
) -> grpc.StatusCode:
    """`request` sent as the gateway sends it to `route`'s host, with a deadline of DEADLINE_S: the
    status it ends with."""
    if route.invoke_address:
        client = upstreams.raw.client(route.invoke_address, runtime=route.runtime, host_id=route.host_id)
        with pytest.raises(RawError) as raw:
            await client.invoke(request, timeout=DEADLINE_S)
        return raw.value.code
    with pytest.raises(grpc.aio.AioRpcError) as rpc:
        await upstreams.invoke_grpc(route.address, route.host, request, timeout=DEADLINE_S)
    return rpc.value.code()


async def test_a_call_past_the_gateways_deadline_while_queued_on_a_grpc_host_never_runs(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    grpc_host: HostProcess,
    records_dir: Path,
    upstreams: Upstreams,
) -> None:
    await deadline_while_queued(gateway, client, grpc_host, records_dir, upstreams, raw=False)


async def test_a_call_past_the_gateways_deadline_while_queued_on_the_invoke_port_never_runs(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    records_dir: Path,
    upstreams: Upstreams,
) -> None:
    await deadline_while_queued(gateway, client, main_host, records_dir, upstreams, raw=True)


async def deadline_while_queued(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    host: HostProcess,
    records_dir: Path,
    upstreams: Upstreams,
    *,
    raw: bool,
) -> None:
    """One call holds the Run's only place, the next one queued is past the gateway's deadline
    (DEADLINE_EXCEEDED) long before its own timeout: it leaves the queue and never runs, alike on
    both paths to a host."""
    path = fresh(records_dir)
    fn, route = await registered(gateway, host, raw=raw)
    first = call(client, gateway, fn, path, 0)
    await eventually(lambda: recorded(path, "ran") == [0], within=BOUND_S, what="the first running")

    late = pb.InvokeFunctionRequest(
        registration_id=route.registration_id,
        payload=json.dumps({"dir": str(path), "n": 1, "gate": "go-1"}).encode(),
        timeout_ms=MAX_INVOKE_TIMEOUT_SECONDS * 1000,  # its own timeout would hold it queued
        fence=pb.Fence(run_uid=route.run_uid, attempt=route.attempt, host_uid=route.host_uid),
    )
    assert await past_its_deadline(upstreams, route, late) == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: s.waiting == 0)
    assert not first.done() and recorded(path, "ran") == [0]

    (path / "go-0").touch()
    (path / "go-1").touch()  # nothing holds on, should the late one run after all
    assert (await first).expect(200).json["outputs"] == {"n": 0}
    (path / "go-2").touch()
    assert (await call(client, gateway, fn, path, 2)).expect(200).json["outputs"] == {"n": 2}
    assert recorded(path, "ran") == [0, 2], "the withdrawn invocation never ran"
