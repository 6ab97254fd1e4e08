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
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from kruntimes.gateway.server import Gateway
from kruntimes.pki.local import TlsFiles
from kruntimes.wire.headers import INVOCATION_ID
from tests.gateway.conftest import Answer, Function, HostProcess, Hosts, LogCapture, invoke
from tests.gateway.queue_test import fresh, status
from tests.support.waiting import eventually

BOUND_S = 60.0  # how long anything here may take at most; never what a test asserts

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


async def registered(gateway: Gateway, host: HostProcess) -> Function:
    fn = await host.register(gateway, RECORDED, concurrency=1, queue=1)
    route = gateway.routes.route(fn.uid)
    assert route is not None and route.invoke_address == "", "the Run is reached over gRPC"
    return fn


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
    fn = await registered(gateway, grpc_host)
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
    fn = await registered(gateway, grpc_host)
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
