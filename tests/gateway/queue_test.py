"""A function's concurrency and queue through real HTTPS: N run at once, Q more wait their turn in
the order they came, the rest get 429 FunctionBusy at once; one that waited its queue timeout gets
429 QueueTimeout; past its host's --max-invocations, 429 HostBusy. Every 429 carries Retry-After
and says the function did not run.

The handlers hold until the test creates a file: "at once" and "waiting" are what the handlers
and the host report while they are held, never timings."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiohttp

from kruntimes.gateway.server import Gateway
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.gateway.conftest import Answer, Function, HostProcess, Hosts, invoke
from tests.support.waiting import eventually

HELD = """
import os, time

def handle(p):
    d = p["dir"]
    open(os.path.join(d, f"started-{p['n']}"), "w").close()
    while not os.path.exists(os.path.join(d, p.get("gate", "go"))):
        time.sleep(0.005)
    return {"n": p["n"]}
"""


def fresh(records_dir: Path) -> Path:
    """A directory the test and its functions (their own uid) share."""
    path = records_dir / uuid.uuid4().hex[:12]
    path.mkdir()
    path.chmod(0o1777)
    return path


def started(path: Path) -> int:
    return len(list(path.glob("started-*")))


async def status(fn: Function) -> pb.FunctionStatusResponse:
    answer: pb.FunctionStatusResponse = await fn.host.stub.FunctionStatus(
        pb.FunctionStatusRequest(registration_id=fn.registration_id)
    )
    return answer


def call(
    client: aiohttp.ClientSession, gateway: Gateway, fn: Function, path: Path, n: int, gate: str = "go"
) -> asyncio.Task[Answer]:
    return asyncio.create_task(invoke(client, gateway, fn.uid, {"dir": str(path), "n": n, "gate": gate}))


def assert_refused(answer: Answer, reason: str) -> None:
    answer.expect(429, reason)
    assert answer.headers.get("Retry-After") == "1"
    assert "did not run" in answer.json["message"] or "retry later" in answer.json["message"]


async def test_two_run_at_once_two_wait_their_turn_in_order_and_the_fifth_is_refused(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path = fresh(records_dir)
    fn = await main_host.register(gateway, HELD, concurrency=2, queue=2)
    tasks = [call(client, gateway, fn, path, n, gate=f"go-{n}") for n in range(2)]
    await eventually(lambda: started(path) == 2, within=60, what="two running at once")
    for n in (2, 3):  # each waiting before the next is sent: their order is known
        tasks.append(call(client, gateway, fn, path, n, gate=f"go-{n}"))
        await eventually(lambda n=n: status(fn), within=60, until=lambda s, n=n: s.waiting == n - 1)
    state = await status(fn)
    assert (state.in_flight, state.waiting, state.concurrency, state.queue) == (2, 2, 2, 2)

    assert_refused(await invoke(client, gateway, fn.uid, {"dir": str(path), "n": 4}), "FunctionBusy")
    assert not any(task.done() for task in tasks), "refused at once, while the others were held"
    assert started(path) == 2

    # one place frees at a time: the first waiting takes it, then the second
    (path / "go-0").touch()
    await eventually(lambda: (path / "started-2").exists(), within=60, what="the first waiting running")
    assert not (path / "started-3").exists(), "the second waits while 1 and 2 hold both places"
    (path / "go-1").touch()
    await eventually(lambda: (path / "started-3").exists(), within=60, what="the second waiting running")
    for n in (2, 3):
        (path / f"go-{n}").touch()
    answers = await asyncio.gather(*tasks)
    assert [answer.expect(200).json["outputs"]["n"] for answer in answers] == [0, 1, 2, 3]


async def test_an_invocation_that_waited_its_queue_timeout_gets_429_and_never_ran(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, records_dir: Path
) -> None:
    path = fresh(records_dir)
    fn = await main_host.register(gateway, HELD, concurrency=1, queue=1, queue_timeout_ms=200)
    first = call(client, gateway, fn, path, 0)
    await eventually(lambda: started(path) == 1, within=60, what="the first running")
    assert_refused(await invoke(client, gateway, fn.uid, {"dir": str(path), "n": 1}), "QueueTimeout")
    assert not first.done() and started(path) == 1
    (path / "go").touch()
    assert (await first).expect(200).json["outputs"] == {"n": 0}


async def test_past_its_hosts_bound_an_invocation_gets_429_host_busy(
    gateway: Gateway, client: aiohttp.ClientSession, hosts: Hosts, records_dir: Path
) -> None:
    host = await hosts.start("gw-bounded", args=("--max-invocations", "1"))
    try:
        path = fresh(records_dir)
        fn = await host.register(gateway, HELD, concurrency=2)
        first = call(client, gateway, fn, path, 0)
        await eventually(lambda: started(path) == 1, within=60, what="the host's one invocation running")
        assert_refused(await invoke(client, gateway, fn.uid, {"dir": str(path), "n": 1}), "HostBusy")
        assert (await status(fn)).in_flight == 1, "the function had room: the host refused it"
        (path / "go").touch()
        assert (await first).expect(200).json["outputs"] == {"n": 0}
    finally:
        await host.stop()
