"""A Function's URL through the real gateway over real HTTPS, to replicas on a real host: the
replicas are Runs registered as the control plane registers a Function's (their signed
assignments name the Function's uid and revision), and the gateway learns them from the host's
heartbeats. The least loaded replica takes each invocation, none is refused while one has room,
the rest wait at the gateway first-in-first-out up to its bound (then 429 ReplicasFull) and their
timeout (then 429 QueueTimeout), a caller that hangs up leaves the wait, a Function without a
Ready replica is 503 and a uid never seen in the namespace 404, and a heartbeat cannot claim a
Function without the control plane's assignment.

The handlers hold until the test creates their gate file, and write which replica runs them:
where an invocation went is what the replicas say, never a timing."""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kruntimes.gateway.server import Gateway
from kruntimes.pki.assignments import SignedAssignment
from kruntimes.pki.local import TlsFiles
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import runtime_pb2 as pb
from tests.gateway.conftest import ALICE, BOB, Answer, Function, HostProcess, LogCapture, invoke, wait_for
from tests.gateway.heartbeat_trust_test import host, send
from tests.support.pki import TestPKI
from tests.support.waiting import eventually

HELD = """
import os, time

def handle(p):
    d = p["dir"]
    with open(os.path.join(d, f"started-{p['n']}"), "w") as f:
        f.write(os.environ["REPLICA"])
    while not os.path.exists(os.path.join(d, p.get("gate", "go"))):
        time.sleep(0.005)
    return {"n": p["n"], "replica": os.environ["REPLICA"]}
"""
CONCURRENCY = 2  # each replica's
WAIT_S = 60.0


@dataclass
class Replicated:
    uid: str  # the Function's
    replicas: list[Function]
    names: list[str]  # the replicas' Run names, as their handlers say where they run


def replica_assignment(
    host_: HostProcess, *, run_uid: str, name: str, function_uid: str, revision: int = 1
) -> pb.SignedAssignment:
    return host_.pki.signer.sign(
        SignedAssignment(
            run_uid=run_uid,
            attempt=1,
            host_id=host_.host_id,
            host_uid=host_.host_uid,
            namespace="default",
            name=name,
            runtime="python",
            function_uid=function_uid,
            revision=revision,
        )
    )


async def replicate(gateway: Gateway, host_: HostProcess, count: int, *, source: str = HELD) -> Replicated:
    """A Function of `count` replicas (concurrency CONCURRENCY each, no queue at the host) on `host_`."""
    function_uid = str(uuid.uuid4())
    replicas, names = [], []
    for _ in range(count):
        run_uid = str(uuid.uuid4())
        name = f"web-r1-{run_uid[:5]}"
        fn = await host_.register(
            gateway,
            source,
            uid=run_uid,
            name=name,
            env={"REPLICA": name},
            concurrency=CONCURRENCY,
            assignment=replica_assignment(host_, run_uid=run_uid, name=name, function_uid=function_uid),
        )
        replicas.append(fn)
        names.append(name)
    await wait_for(
        lambda: len([r for r in gateway.routes.function_routes(function_uid) if r.ready]) == count,
        "the Function's replicas routed",
    )
    return Replicated(function_uid, replicas, names)


@pytest.fixture(scope="module")
async def web(gateway: Gateway, main_host: HostProcess) -> Replicated:
    # A fresh gateway answers unseen Functions 503 while it has not heard every host: not the
    # subject here (the session's hosts are all heard by the time a replica is routed).
    gateway.balancer.warm_until = 0.0
    return await replicate(gateway, main_host, 2)


def function_url(gw: Gateway, uid: str, namespace: str = "default") -> str:
    return f"{gw.url}/v1/namespaces/{namespace}/functions/{uid}:invoke"


async def invoke_function(
    client: aiohttp.ClientSession,
    gw: Gateway,
    uid: str,
    body: Any = b"{}",
    *,
    token: str | None = ALICE,
    namespace: str = "default",
    headers: dict[str, str] | None = None,
) -> Answer:
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    async with client.post(function_url(gw, uid, namespace), data=data, headers=sent) as response:
        return Answer(
            response.status,
            dict(response.headers),
            await response.read(),
            dict(response.request_info.headers),
        )


def waiting(gateway: Gateway, fn: Replicated, count: int) -> Callable[[], bool]:
    return lambda: gateway.balancer.waiting(fn.uid) == count


def fresh(records_dir: Path) -> Path:
    path = records_dir / uuid.uuid4().hex[:12]
    path.mkdir()
    path.chmod(0o1777)
    return path


def ran_on(path: Path, n: int) -> str:
    """The replica invocation `n` runs on ("" until it started)."""
    started = path / f"started-{n}"
    return started.read_text() if started.exists() else ""


def started(path: Path) -> int:
    return len(list(path.glob("started-*")))


class Calls:
    """Held invocations of a Function, each with its own gate."""

    def __init__(self, client: aiohttp.ClientSession, gateway: Gateway, fn: Replicated, path: Path) -> None:
        self.client, self.gateway, self.fn, self.path = client, gateway, fn, path
        self.tasks: dict[int, asyncio.Task[Answer]] = {}

    def send(self, n: int, headers: dict[str, str] | None = None) -> asyncio.Task[Answer]:
        body = {"dir": str(self.path), "n": n, "gate": f"go-{n}"}
        task = asyncio.create_task(
            invoke_function(self.client, self.gateway, self.fn.uid, body, headers=headers)
        )
        self.tasks[n] = task
        return task

    async def running(self, n: int) -> str:
        await eventually(lambda: ran_on(self.path, n) != "", within=WAIT_S, what=f"invocation {n} running")
        return ran_on(self.path, n)

    def release(self, *ns: int) -> None:
        for n in ns:
            (self.path / f"go-{n}").touch()

    async def answers(self, *ns: int) -> list[Answer]:
        self.release(*ns)
        return list(await asyncio.gather(*(self.tasks[n] for n in ns)))

    async def finish(self) -> None:
        """Release every call (a failed test leaves nothing held for the next)."""
        self.release(*self.tasks)
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


@pytest.fixture
async def calls(
    client: aiohttp.ClientSession, gateway: Gateway, web: Replicated, records_dir: Path
) -> AsyncIterator[Calls]:
    held = Calls(client, gateway, web, fresh(records_dir))
    try:
        yield held
    finally:
        await held.finish()
        bound = gateway.balancer.max_waiting_per_function
        assert gateway.balancer.waiting(web.uid) == 0 and bound > 0
        assert all(gateway.balancer.in_flight(r.uid) == 0 for r in web.replicas)


async def test_the_least_loaded_replica_takes_each_invocation(
    gateway: Gateway, web: Replicated, calls: Calls
) -> None:
    """Loads that taking turns would get wrong: each step's replica is the one with fewer in
    flight, though both have room."""
    calls.send(0)
    first = await calls.running(0)
    calls.send(1)
    second = await calls.running(1)
    assert second != first, "the second went to the replica with fewer in flight"
    (answer,) = await calls.answers(1)  # first 1, second 0
    assert answer.expect(200).json["outputs"]["replica"] == second
    calls.send(2)
    assert await calls.running(2) == second
    (answer,) = await calls.answers(0)  # first 0, second 1
    assert answer.expect(200).json["outputs"]["replica"] == first
    calls.send(3)
    assert await calls.running(3) == first
    assert sorted(gateway.balancer.in_flight(r.uid) for r in web.replicas) == [1, 1]
    answers = await calls.answers(2, 3)
    assert [a.expect(200).json["outputs"]["replica"] for a in answers] == [second, first]


async def test_no_refusal_while_a_replica_has_room_then_a_fifo_wait_then_429_at_its_bound(
    gateway: Gateway, web: Replicated, calls: Calls
) -> None:
    # as many at once as the replicas take together: none refused (the hosts queue none)
    for n in range(4):
        calls.send(n)
    assert sorted([await calls.running(n) for n in range(4)]) == sorted(web.names * 2)
    balancer = gateway.balancer
    bound = balancer.max_waiting_per_function
    balancer.max_waiting_per_function = 2
    try:
        for n in (4, 5):  # each waiting before the next is sent: their order is known
            calls.send(n)
            await eventually(waiting(gateway, web, n - 3), within=WAIT_S, what=f"{n} waiting")
        full = await invoke_function(calls.client, gateway, web.uid, {"dir": str(calls.path), "n": 6})
        full.expect(429, "ReplicasFull")
        assert full.headers.get("Retry-After") == "1"
        assert "did not run" in full.json["message"]
    finally:
        balancer.max_waiting_per_function = bound
    # past its own timeout waiting: 429 QueueTimeout, and it never ran
    timed_out = await invoke_function(
        calls.client,
        gateway,
        web.uid,
        {"dir": str(calls.path), "n": 7},
        headers={"X-Kruntime-Timeout": "0.3"},
    )
    timed_out.expect(429, "QueueTimeout")
    assert started(calls.path) == 4 and not calls.tasks[4].done() and not calls.tasks[5].done()

    # one slot frees: the first waiting takes it, the second still waits
    (answer,) = await calls.answers(0)
    answer.expect(200)
    assert await calls.running(4) == ran_on(calls.path, 0)
    assert ran_on(calls.path, 5) == "" and balancer.waiting(web.uid) == 1
    calls.release(1)
    await calls.running(5)
    answers = await calls.answers(1, 2, 3, 4, 5)
    assert [a.expect(200).json["outputs"]["n"] for a in answers] == [1, 2, 3, 4, 5]
    assert ran_on(calls.path, 6) == "" and ran_on(calls.path, 7) == ""


async def test_a_caller_that_hangs_up_while_waiting_leaves_the_wait(
    gateway: Gateway, web: Replicated, calls: Calls, tls: TlsFiles, client: aiohttp.ClientSession
) -> None:
    for n in range(4):
        calls.send(n)
    for n in range(4):
        await calls.running(n)
    # its own connection, closed while it waits: the gateway sees the caller gone
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as own:
        body = {"dir": str(calls.path), "n": 4, "gate": "go-4"}
        gone = asyncio.create_task(invoke_function(own, gateway, web.uid, body))
        await eventually(
            lambda: gateway.balancer.waiting(web.uid) == 1, within=WAIT_S, what="the caller waiting"
        )
        gone.cancel()
    await eventually(lambda: gateway.balancer.waiting(web.uid) == 0, within=WAIT_S, what="the wait withdrawn")
    calls.release(4)
    answers = await calls.answers(0, 1, 2, 3)
    assert all(a.expect(200).status == 200 for a in answers)
    assert ran_on(calls.path, 4) == "", "the withdrawn invocation never ran"
    async with client.get(f"{gateway.url}/metrics") as response:
        text = await response.text()
    assert 'krt_gateway_function_waits_total{outcome="withdrawn"}' in text
    assert "krt_gateway_function_in_flight 0.0" in text and "krt_gateway_function_waiting 0.0" in text
    assert web.uid not in text and all(r.uid not in text for r in web.replicas)


async def test_no_ready_replica_is_503_and_a_uid_never_seen_is_404(
    gateway: Gateway, client: aiohttp.ClientSession, main_host: HostProcess, web: Replicated
) -> None:
    for uid in (str(uuid.uuid4()), "not-a-uid"):
        (await invoke_function(client, gateway, uid)).expect(404, "FunctionNotFound")
    lone = await replicate(gateway, main_host, 1, source="def handle(p):\n    return {'ok': True}\n")
    (await invoke_function(client, gateway, lone.uid)).expect(200)
    (replica,) = lone.replicas
    await main_host.stub.UnregisterFunction(
        pb.UnregisterFunctionRequest(registration_id=replica.registration_id)
    )
    await wait_for(lambda: not gateway.routes.function_routes(lone.uid), "the replica's route gone")
    gone = (await invoke_function(client, gateway, lone.uid)).expect(503, "NoReadyReplica")
    assert gone.headers.get("Retry-After") == "2"


async def test_a_functions_uid_is_not_found_in_another_namespace_nor_at_a_runs_path(
    gateway: Gateway, client: aiohttp.ClientSession, web: Replicated
) -> None:
    # bob may invoke in "other" only; alice in "default" only: neither learns that the uid lives
    # in "default" by asking in "other"
    for token in (BOB, ALICE):
        answer = await invoke_function(client, gateway, web.uid, namespace="other", token=token)
        answer.expect(404, "FunctionNotFound")
    forbidden = (await invoke_function(client, gateway, web.uid, token=BOB)).expect(403, "Forbidden")
    assert "may not invoke Functions in namespace 'default'" in forbidden.json["message"]
    assert (await invoke_function(client, gateway, web.uid, token=None)).status == 401
    # a Function's uid at a Run's path, and a replica's Run uid at a Function's, are not found
    (await invoke(client, gateway, web.uid)).expect(404, "RunNotFound")
    (await invoke_function(client, gateway, web.replicas[0].uid)).expect(404, "FunctionNotFound")


async def test_a_heartbeat_cannot_claim_a_function_without_the_control_planes_assignment(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    web: Replicated,
    pki: TestPKI,
    tmp_path: Path,
) -> None:
    """A genuine host (the platform's certificate) announcing registrations that claim the web
    Function, and a Function of its own: one signed by another key, one of the Function's real
    assignments (another host's), one of its own Run's assignments with the Function's uid
    written in. None becomes a route."""
    other = TestPKI.create(tmp_path / "other-ca")
    host_id, host_uid = "gw-fn-forger", str(uuid.uuid4())
    claimed = str(uuid.uuid4())  # a Function nobody made
    stolen = main_host.host_id, main_host.host_uid

    def registration(run_uid: str, assignment: pb.SignedAssignment) -> pb.RegistrationState:
        return pb.RegistrationState(
            run_uid=run_uid,
            attempt=1,
            namespace="default",
            name=f"web-r1-{run_uid[:5]}",
            runtime="python",
            registration_id=f"reg-{run_uid[:8]}",
            phase=pb.REGISTRATION_PHASE_READY,
            concurrency=1000,
            assignment=assignment,
        )

    def assignment(
        run_uid: str, function_uid: str, *, by: TestPKI, on: tuple[str, str]
    ) -> pb.SignedAssignment:
        return by.signer.sign(
            SignedAssignment(
                run_uid=run_uid,
                attempt=1,
                host_id=on[0],
                host_uid=on[1],
                namespace="default",
                name=f"web-r1-{run_uid[:5]}",
                runtime="python",
                function_uid=function_uid,
                revision=1,
            )
        )

    forged_runs = [str(uuid.uuid4()) for _ in range(5)]
    own = (host_id, host_uid)
    tampered = []
    for run_uid, function_uid in ((forged_runs[3], web.uid), (forged_runs[4], claimed)):
        signed = pki.signer.sign(
            SignedAssignment(
                run_uid=run_uid,
                attempt=1,
                host_id=host_id,
                host_uid=host_uid,
                namespace="default",
                name=f"web-r1-{run_uid[:5]}",
                runtime="python",
            )
        )
        inner = pb.Assignment.FromString(signed.assignment)
        inner.function_uid, inner.revision = function_uid, 1
        tampered.append(pb.SignedAssignment(assignment=inner.SerializeToString(), signature=signed.signature))
    beat = hb.HostHeartbeat(
        host_id=host_id,
        host_uid=host_uid,
        runtime="python",
        address="127.0.0.1:1",
        invoke_address="127.0.0.1:1",
        sequence=1,
        interval_ms=3_600_000,
        registrations=[
            registration(forged_runs[0], assignment(forged_runs[0], web.uid, by=other, on=own)),
            registration(forged_runs[1], assignment(forged_runs[1], claimed, by=other, on=own)),
            registration(forged_runs[2], assignment(forged_runs[2], web.uid, by=pki, on=stolen)),
            registration(forged_runs[3], tampered[0]),
            registration(forged_runs[4], tampered[1]),
        ],
    )
    try:
        assert (await send(gateway, host(pki, host_id), beat)).last_sequence == 1
        assert host_uid in gateway.routes._hosts  # the beat was taken, its registrations not
        routed = {r.run_uid for r in gateway.routes.function_routes(web.uid)}
        assert routed == {r.uid for r in web.replicas}
        assert gateway.routes.function_routes(claimed) == []
        assert all(gateway.routes.route(uid) is None for uid in forged_runs)
        (await invoke_function(client, gateway, claimed)).expect(404, "FunctionNotFound")
    finally:
        gateway.routes.forget(host_uid)


RETRIED = "invoke not delivered; another replica tried"


async def test_an_invocation_not_delivered_tries_one_other_replica(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    web: Replicated,
    pki: TestPKI,
    records_dir: Path,
    log_capture: LogCapture,
) -> None:
    """A replica the control plane did assign, on a host that no longer listens (connections
    refused): the invocations the gateway sends it go to another replica instead, all 200."""
    host_id, host_uid = "gw-fn-gone", str(uuid.uuid4())
    run_uid = str(uuid.uuid4())
    name = f"web-r1-{run_uid[:5]}"
    beat = hb.HostHeartbeat(
        host_id=host_id,
        host_uid=host_uid,
        runtime="python",
        address="127.0.0.1:1",
        invoke_address="127.0.0.1:1",
        sequence=1,
        interval_ms=3_600_000,
        registrations=[
            pb.RegistrationState(
                run_uid=run_uid,
                attempt=1,
                namespace="default",
                name=name,
                runtime="python",
                registration_id=f"reg-{run_uid[:8]}",
                phase=pb.REGISTRATION_PHASE_READY,
                concurrency=1,
                assignment=pki.signer.sign(
                    SignedAssignment(
                        run_uid=run_uid,
                        attempt=1,
                        host_id=host_id,
                        host_uid=host_uid,
                        namespace="default",
                        name=name,
                        runtime="python",
                        function_uid=web.uid,
                        revision=1,
                    )
                ),
            )
        ],
    )
    path = fresh(records_dir)
    (path / "go").touch()  # nothing held
    before = len([r for r in log_capture.records if r.getMessage() == RETRIED])
    try:
        await send(gateway, host(pki, host_id), beat)
        assert run_uid in {r.run_uid for r in gateway.routes.function_routes(web.uid)}
        # one after the other, all replicas idle: each is chosen in turn, the unreachable one too
        for n in range(4):
            answer = await invoke_function(client, gateway, web.uid, {"dir": str(path), "n": n})
            assert answer.expect(200).json["outputs"]["replica"] in web.names
        assert len([r for r in log_capture.records if r.getMessage() == RETRIED]) > before
        assert gateway.balancer.in_flight(run_uid) == 0
    finally:
        gateway.routes.forget(host_uid)


async def test_a_replica_that_appears_takes_the_first_waiting_invocation(
    gateway: Gateway, main_host: HostProcess, web: Replicated, calls: Calls
) -> None:
    for n in range(4):
        calls.send(n)
    for n in range(4):
        await calls.running(n)
    calls.send(4)
    await eventually(waiting(gateway, web, 1), within=WAIT_S, what="an invocation waiting")
    run_uid = str(uuid.uuid4())
    name = f"web-r1-{run_uid[:5]}"
    late = await main_host.register(
        gateway,
        HELD,
        uid=run_uid,
        name=name,
        env={"REPLICA": name},
        concurrency=1,
        assignment=replica_assignment(main_host, run_uid=run_uid, name=name, function_uid=web.uid),
    )
    try:
        assert await calls.running(4) == name, "the new replica took it, nothing else had ended"
        answers = await calls.answers(0, 1, 2, 3, 4)
        assert [a.expect(200).json["outputs"]["n"] for a in answers] == [0, 1, 2, 3, 4]
    finally:
        await main_host.stub.UnregisterFunction(
            pb.UnregisterFunctionRequest(registration_id=late.registration_id)
        )
        await wait_for(
            lambda: run_uid not in {r.run_uid for r in gateway.routes.function_routes(web.uid)},
            "the late replica's route gone",
        )
