"""A caller that hangs up while its invocation waits its turn in the host's queue: the gateway
tells the host (the invoke port's cancel frame), the invocation leaves the queue at once and never
runs, and the next one waiting takes its place; real HTTPS clients, a real gateway and host.

The handlers hold until the test creates a file and record each invocation they run: "waiting"
and "never ran" are what the host reports and the handlers wrote, never timings."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import aiohttp

from kruntimes.gateway.server import Gateway
from kruntimes.pki.local import TlsFiles
from tests.gateway.conftest import HostProcess
from tests.gateway.queue_test import call, fresh, status
from tests.support.waiting import eventually

BOUND_S = 60.0  # how long anything here may take at most; never what a test asserts

# Appends its n to `ran` when it starts, then holds until its gate exists.
RECORDED = """
import os, time

def handle(p):
    d = p["dir"]
    with open(os.path.join(d, "ran"), "a") as f:
        f.write(f"{p['n']}\\n")
    while not os.path.exists(os.path.join(d, p["gate"])):
        time.sleep(0.005)
    return {"n": p["n"]}
"""


def ran(path: Path) -> list[int]:
    record = path / "ran"
    return [int(line) for line in record.read_text().split()] if record.exists() else []


async def test_a_caller_that_hangs_up_while_queued_on_the_host_never_runs_and_frees_its_place(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path, tls: TlsFiles
) -> None:
    path = fresh(records_dir)
    fn = await main_host.register(gateway, RECORDED, concurrency=1, queue=2)
    first = call(client, gateway, fn, path, 0, gate="go-0")
    await eventually(lambda: ran(path) == [0], within=BOUND_S, what="the first running")

    # the second caller has a connection of its own, to hang up
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as leaving:
        second = call(leaving, gateway, fn, path, 1, gate="go-1")
        await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: s.waiting == 1)
        third = call(client, gateway, fn, path, 2, gate="go-2")
        await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: s.waiting == 2)
        second.cancel()  # the client closes its connection
        with contextlib.suppress(asyncio.CancelledError):
            await second

    # out of the host's queue at once, while the first still holds the only place
    await eventually(lambda: status(fn), within=BOUND_S, until=lambda s: s.waiting == 1)
    assert not first.done() and ran(path) == [0]

    (path / "go-0").touch()
    assert (await first).expect(200).json["outputs"] == {"n": 0}
    await eventually(lambda: ran(path) == [0, 2], within=BOUND_S, what="the third running next")
    (path / "go-1").touch()  # nothing holds on, should the second run after all
    (path / "go-2").touch()
    assert (await third).expect(200).json["outputs"] == {"n": 2}
    state = await status(fn)
    assert (state.in_flight, state.waiting) == (0, 0)
    assert ran(path) == [0, 2], "the withdrawn invocation never ran"
