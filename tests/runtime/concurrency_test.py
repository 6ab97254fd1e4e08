"""A registration's concurrency and queue on a real host: up to `concurrency` invocations run at
once (a warm process each for a sync handler, one process for an async one, a lane each for
bash), up to `queue` more wait their turn in order, each at most its queue timeout; the rest are
refused at once. The host's bound on running invocations refuses past it, and the counts are in
FunctionStatus, the supervision stream and the gateways' heartbeats.

Every handler here holds until the test creates a file: "at once" is proven by all of them
having started while none has been let go, never by timing."""

from __future__ import annotations

import asyncio
import json
import queue
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from temporalio.testing import ActivityEnvironment

from kruntimes.activities.runtime_host import RuntimeHostActivities
from kruntimes.contracts.hostcalls import FunctionState, StatusInput
from kruntimes.decisions.runlife import IdleRearm, idle_verdict
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.runtime.admission import default_max_invocations
from kruntimes.runtime.limits import ProcessLimits
from kruntimes.runtime.sandbox.policy import SandboxSettings
from kruntimes.runtime.warm_pool import IDLE_S
from tests.runtime.conftest import Host, inline, reason, serving
from tests.runtime.raw_invoke_test import Conn
from tests.support.pki import TestPKI
from tests.support.runtime_hosts import loopback_host
from tests.support.waiting import eventually_blocking

BOUND_S = 60.0  # how long anything here may take at most; never what a test asserts
WAITING_BYTES = 64 * 1024  # the `bounded` host's bound on what waiting invocations hold

# Writes started-<n> (and, asked to, appends n to `order`), then holds until `go` exists. Its
# `process` names the process that ran it (a pid is no name: each is 2 in its PID namespace).
HELD = """
import os, time, uuid
PROCESS = uuid.uuid4().hex
def handle(p):
    d = p["dir"]
    open(os.path.join(d, f"started-{p['n']}"), "w").close()
    if p.get("order"):
        with open(os.path.join(d, "order"), "a") as f:
            f.write(f"{p['n']}\\n")
    while not os.path.exists(os.path.join(d, p.get("gate", "go"))):
        time.sleep(0.005)
    return {"n": p["n"], "process": PROCESS}
"""

HELD_ASYNC = """
import asyncio, os, sys, uuid
PROCESS = uuid.uuid4().hex
async def handle(p):
    d = p["dir"]
    open(os.path.join(d, f"started-{p['n']}"), "w").close()
    print(f"out {p['n']}")
    print(f"err {p['n']}", file=sys.stderr)
    while not os.path.exists(os.path.join(d, p.get("gate", "go"))):
        await asyncio.sleep(0.005)
    print(f"done {p['n']}")
    return {"n": p["n"], "process": PROCESS}
"""

HELD_BASH = """read -r line
me=$(mktemp "$DIR/started-XXXXXXXX")
while [ ! -e "$DIR/go" ]; do sleep 0.01; done
echo "{\\"process\\": \\"$me\\"}"
"""


def register(
    host: Host,
    source: dict[str, str],
    *,
    concurrency: int = 0,
    queue: int = 0,
    queue_timeout_ms: int = 0,
    adapter: str = "python",
    handler: str = "main:handle",
    env: dict[str, str] | None = None,
) -> str:
    run = pb.RunRef(
        run_uid=str(uuid.uuid4()),
        attempt=1,
        namespace="default",
        name="fn",
        runtime=host.runtime.options.runtime,
    )
    config = pb.FunctionConfig(
        adapter=adapter,
        handler=handler,
        env=env or {},
        inline=inline(source, executable=tuple(n for n in source if n.endswith(".sh"))),
        concurrency=concurrency,
        queue=queue,
        queue_timeout_ms=queue_timeout_ms,
    )
    return host.stub.RegisterFunction(host.register_request(run, config)).registration_id


def request(
    reg: str, scratch: Path, n: int, *, timeout_ms: int = 0, **more: object
) -> pb.InvokeFunctionRequest:
    payload = json.dumps({"dir": str(scratch), "n": n, **more}).encode()
    return pb.InvokeFunctionRequest(registration_id=reg, payload=payload, timeout_ms=timeout_ms)


def started(scratch: Path) -> list[str]:
    return sorted(p.name for p in scratch.glob("started-*"))


def refused(host: Host, call: pb.InvokeFunctionRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        host.gateway.InvokeFunction(call, timeout=BOUND_S)
    return err.value


def outputs(answer: pb.InvokeFunctionResponse) -> dict[str, object]:
    assert answer.status == pb.INVOCATION_STATUS_SUCCEEDED, answer
    found: dict[str, object] = json.loads(answer.outputs_json)
    return found


def test_a_sync_handler_runs_exactly_its_concurrency_at_once_each_in_a_warm_process_of_its_own(
    host: Host, scratch: Path
) -> None:
    reg = register(host, {"main.py": HELD}, concurrency=3)
    calls = [host.gateway.InvokeFunction.future(request(reg, scratch, n), timeout=BOUND_S) for n in range(3)]
    eventually_blocking(lambda: len(started(scratch)) == 3, within=BOUND_S, what="three running at once")
    status = host.status(reg)
    assert (status.in_flight, status.waiting, status.concurrency, status.queue) == (3, 0, 3, 0)

    err = refused(host, request(reg, scratch, 3))  # no queue: the fourth is refused at once
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(err) == "ConcurrencyLimit"
    assert not any(call.done() for call in calls), "refused while the three were held"
    assert started(scratch) == ["started-0", "started-1", "started-2"], "the fourth never ran"

    (scratch / "go").touch()
    processes = {outputs(call.result())["process"] for call in calls}
    assert len(processes) == 3, "three warm processes, one per invocation running"
    # the next ones find those processes warm: none is started for them
    again = [host.gateway.InvokeFunction.future(request(reg, scratch, n), timeout=BOUND_S) for n in range(3)]
    assert {outputs(call.result())["process"] for call in again} <= processes
    assert host.status(reg).in_flight == 0
    # idle for a while, all but one end (the sweep's clock given, not waited for)
    registration = host.runtime.registry.get(reg)
    assert registration is not None and registration.pool is not None
    assert registration.pool.count() == 3
    registration.pool.sweep(time.monotonic() + IDLE_S)
    assert registration.pool.count() == 1
    assert (
        outputs(host.gateway.InvokeFunction(request(reg, scratch, 7), timeout=BOUND_S))["process"]
        in processes
    )


def test_queued_invocations_run_in_the_order_they_came_and_one_past_the_queue_is_refused(
    host: Host, scratch: Path
) -> None:
    reg = register(host, {"main.py": HELD}, concurrency=1, queue=3)
    calls = [host.gateway.InvokeFunction.future(request(reg, scratch, 0, order=True), timeout=BOUND_S)]
    eventually_blocking(lambda: started(scratch) == ["started-0"], within=BOUND_S, what="the first running")
    for n in range(1, 4):  # each queued before the next is sent: their order is known
        calls.append(
            host.gateway.InvokeFunction.future(request(reg, scratch, n, order=True), timeout=BOUND_S)
        )
        eventually_blocking(lambda n=n: host.status(reg).waiting == n, within=BOUND_S, what=f"{n} waiting")
    assert host.status(reg).in_flight == 1

    err = refused(host, request(reg, scratch, 4))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(err) == "ConcurrencyLimit"
    assert "3 more are waiting" in (err.details() or "")
    assert started(scratch) == ["started-0"], "the queued wait, the refused never run"

    (scratch / "go").touch()
    assert [outputs(call.result())["n"] for call in calls] == [0, 1, 2, 3]
    assert (scratch / "order").read_text().split() == ["0", "1", "2", "3"]
    status = host.status(reg)
    assert (status.in_flight, status.waiting) == (0, 0)


def test_an_invocation_that_waits_its_queue_timeout_or_its_own_is_refused_and_never_runs(
    host: Host, scratch: Path
) -> None:
    short_queue = register(host, {"main.py": HELD}, concurrency=1, queue=1, queue_timeout_ms=200)
    long_queue = register(host, {"main.py": HELD}, concurrency=1, queue=1, queue_timeout_ms=600_000)
    held = [
        host.gateway.InvokeFunction.future(request(reg, scratch, n, gate=f"go-{n}"), timeout=BOUND_S)
        for n, reg in enumerate((short_queue, long_queue))
    ]
    eventually_blocking(lambda: len(started(scratch)) == 2, within=BOUND_S, what="both running")

    by_queue = refused(host, request(short_queue, scratch, 10))
    by_own = refused(host, request(long_queue, scratch, 11, timeout_ms=300))
    for err in (by_queue, by_own):
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(err) == "QueueTimeout"
    assert "queue timeout" in (by_queue.details() or "") and "whole timeout" in (by_own.details() or "")
    assert not any(call.done() for call in held), "they waited while the first ones held"
    assert len(started(scratch)) == 2, "neither waiting invocation ran"
    for n in range(2):
        (scratch / f"go-{n}").touch()
    assert [outputs(call.result())["n"] for call in held] == [0, 1]
    assert host.status(short_queue).waiting == 0


def test_an_async_handler_takes_its_concurrency_in_one_process_each_with_its_own_output(
    host: Host, scratch: Path
) -> None:
    reg = register(host, {"main.py": HELD_ASYNC}, concurrency=4)
    calls = [host.gateway.InvokeFunction.future(request(reg, scratch, n), timeout=BOUND_S) for n in range(4)]
    eventually_blocking(lambda: len(started(scratch)) == 4, within=BOUND_S, what="four running at once")
    err = refused(host, request(reg, scratch, 4))
    assert reason(err) == "ConcurrencyLimit"
    assert host.status(reg).in_flight == 4

    (scratch / "go").touch()
    answers = [call.result() for call in calls]
    assert len({outputs(answer)["process"] for answer in answers}) == 1, "one process took all four"
    for n, answer in enumerate(answers):
        assert answer.stdout.data == f"out {n}\ndone {n}\n".encode()
        assert answer.stderr.data == f"err {n}\n".encode()
    registration = host.runtime.registry.get(reg)
    assert registration is not None and registration.pool is not None and registration.pool.count() == 1


def test_an_async_invocation_past_its_timeout_is_cancelled_and_the_others_in_its_process_go_on(
    host: Host, scratch: Path
) -> None:
    reg = register(host, {"main.py": HELD_ASYNC}, concurrency=2)
    running = host.gateway.InvokeFunction.future(request(reg, scratch, 0), timeout=BOUND_S)
    eventually_blocking(lambda: started(scratch) == ["started-0"], within=BOUND_S, what="the first running")
    late = host.gateway.InvokeFunction(
        request(reg, scratch, 1, gate="never", timeout_ms=300), timeout=BOUND_S
    )
    assert late.status == pb.INVOCATION_STATUS_TIMED_OUT
    assert not running.done()
    (scratch / "go").touch()
    first = outputs(running.result())
    assert (
        outputs(host.gateway.InvokeFunction(request(reg, scratch, 2), timeout=BOUND_S))["process"]
        == first["process"]
    )


def test_a_bash_function_runs_its_concurrency_at_once_in_lanes(host: Host, scratch: Path) -> None:
    reg = register(
        host,
        {"run.sh": HELD_BASH},
        concurrency=3,
        adapter="bash",
        handler="run.sh",
        env={"DIR": str(scratch)},
    )
    calls = [
        host.gateway.InvokeFunction.future(pb.InvokeFunctionRequest(registration_id=reg, payload=b"{}"))
        for _ in range(3)
    ]
    eventually_blocking(lambda: len(started(scratch)) == 3, within=BOUND_S, what="three scripts at once")
    err = refused(host, pb.InvokeFunctionRequest(registration_id=reg, payload=b"{}"))
    assert reason(err) == "ConcurrencyLimit"
    (scratch / "go").touch()
    assert len({outputs(call.result())["process"] for call in calls}) == 3


def test_invocations_waiting_when_the_registration_goes_are_refused_not_run(
    host: Host, scratch: Path
) -> None:
    reg = register(host, {"main.py": HELD}, concurrency=1, queue=2)
    first = host.gateway.InvokeFunction.future(request(reg, scratch, 0), timeout=BOUND_S)
    eventually_blocking(lambda: started(scratch) == ["started-0"], within=BOUND_S, what="the first running")
    waiting = host.gateway.InvokeFunction.future(request(reg, scratch, 1), timeout=BOUND_S)
    eventually_blocking(lambda: host.status(reg).waiting == 1, within=BOUND_S, what="one waiting")
    host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=reg, grace_ms=1))
    with pytest.raises(grpc.RpcError) as err:
        waiting.result()
    assert reason(err.value) == "NotReady"
    assert first.result().status == pb.INVOCATION_STATUS_PROCESS_EXITED  # killed past the grace
    assert started(scratch) == ["started-0"]


def test_a_queued_invocation_whose_grpc_caller_cancels_leaves_the_queue_and_never_runs(
    host: Host, scratch: Path
) -> None:
    reg = register(host, {"main.py": HELD}, concurrency=1, queue=2)
    first = host.gateway.InvokeFunction.future(request(reg, scratch, 0), timeout=BOUND_S)
    eventually_blocking(lambda: started(scratch) == ["started-0"], within=BOUND_S, what="the first running")
    dropped = host.gateway.InvokeFunction.future(request(reg, scratch, 1), timeout=BOUND_S)
    eventually_blocking(lambda: host.status(reg).waiting == 1, within=BOUND_S, what="one waiting")
    assert dropped.cancel()
    eventually_blocking(lambda: host.status(reg).waiting == 0, within=BOUND_S, what="it left the queue")
    after = host.gateway.InvokeFunction.future(request(reg, scratch, 2), timeout=BOUND_S)
    (scratch / "go").touch()
    assert outputs(first.result())["n"] == 0
    assert outputs(after.result())["n"] == 2  # one place, in order: the dropped one would have run first
    assert started(scratch) == ["started-0", "started-2"]


def test_a_queued_invocation_whose_invoke_connection_closes_leaves_the_queue_and_never_runs(
    host: Host, scratch: Path, pki: TestPKI
) -> None:
    reg = register(host, {"main.py": HELD}, concurrency=1, queue=2)
    first = host.gateway.InvokeFunction.future(request(reg, scratch, 0), timeout=BOUND_S)
    eventually_blocking(lambda: started(scratch) == ["started-0"], within=BOUND_S, what="the first running")
    assert host.runtime.invoke_address
    conn = Conn(host.runtime.invoke_address, as_=pki.gateway)
    try:
        conn.send(1, request(reg, scratch, 1))
        eventually_blocking(lambda: host.status(reg).waiting == 1, within=BOUND_S, what="one waiting")
    finally:
        conn.close()
    eventually_blocking(lambda: host.status(reg).waiting == 0, within=BOUND_S, what="it left the queue")
    after = host.gateway.InvokeFunction.future(request(reg, scratch, 2), timeout=BOUND_S)
    (scratch / "go").touch()
    assert outputs(first.result())["n"] == 0
    assert outputs(after.result())["n"] == 2
    assert started(scratch) == ["started-0", "started-2"]


# -- the host's bound, and what it reports -------------------------------------------------------


class Receiver(hb_grpc.RouteHeartbeatServicer):
    """A gateway's heartbeat end: keeps every beat."""

    def __init__(self) -> None:
        self.beats: queue.Queue[hb.HostHeartbeat] = queue.Queue()

    def Heartbeats(self, request_iterator, context):  # type: ignore[no-untyped-def]
        for beat in request_iterator:
            self.beats.put(beat)
        return hb.HeartbeatAck()


@pytest.fixture(scope="module")
def receiver(pki: TestPKI) -> Iterator[tuple[Receiver, str]]:
    got = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    hb_grpc.add_RouteHeartbeatServicer_to_server(got, server)
    port = server.add_secure_port("127.0.0.1:0", pki.gateway.server_credentials())
    server.start()
    try:
        yield got, f"127.0.0.1:{port}"
    finally:
        server.stop(1).wait()


@pytest.fixture(scope="module")
def bounded(
    tmp_path_factory: pytest.TempPathFactory, pki: TestPKI, shared: Path, receiver: tuple[Receiver, str]
) -> Iterator[Host]:
    """A host that runs at most two invocations at once and holds at most three waiting in
    WAITING_BYTES, heartbeating to `receiver`."""
    runtime = loopback_host(
        pki,
        tmp_path_factory.mktemp("bounded"),
        host_id="bounded-0",
        sandbox=SandboxSettings(shared=(str(shared),)),
        max_invocations=2,
        max_waiting=3,
        max_waiting_bytes=WAITING_BYTES,
        gateways=(receiver[1],),
        heartbeat_interval_s=0.2,
    )
    with serving(runtime, pki) as served:
        yield served


def beat_of(receiver: Receiver, reg: str, *, in_flight: int, waiting: int) -> pb.RegistrationState:
    """The first heartbeat that says `reg` has `in_flight` invocations running and `waiting` queued."""

    def look() -> pb.RegistrationState | None:
        while True:
            try:
                beat = receiver.beats.get_nowait()
            except queue.Empty:
                return None
            for state in beat.registrations:
                if state.registration_id == reg and (state.in_flight, state.waiting) == (in_flight, waiting):
                    return state

    found: pb.RegistrationState = eventually_blocking(look, within=BOUND_S, what=f"a beat of {reg}")
    return found


async def function_state(pki: TestPKI, address: str, reg: str) -> FunctionState:
    """What the Run's workflow learns of its function from the host (its `function_status` activity)."""
    activities = RuntimeHostActivities(signer=pki.signer)
    try:
        state: FunctionState = await ActivityEnvironment().run(
            activities.function_status, StatusInput(address=address, registrationId=reg)
        )
        return state
    finally:
        await activities.close()


def test_past_the_hosts_bound_an_invocation_is_refused_though_its_function_has_room(
    bounded: Host, scratch: Path, receiver: tuple[Receiver, str], pki: TestPKI
) -> None:
    busy = register(bounded, {"main.py": HELD}, concurrency=2, queue=1)
    idle = register(bounded, {"main.py": HELD}, concurrency=2)
    calls = [
        bounded.gateway.InvokeFunction.future(request(busy, scratch, n), timeout=BOUND_S) for n in range(2)
    ]
    eventually_blocking(lambda: len(started(scratch)) == 2, within=BOUND_S, what="the host's two running")
    queued = bounded.gateway.InvokeFunction.future(request(busy, scratch, 2), timeout=BOUND_S)
    eventually_blocking(lambda: bounded.status(busy).waiting == 1, within=BOUND_S, what="one waiting")

    err = refused(bounded, request(idle, scratch, 9))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(err) == "HostBusy"
    assert bounded.status(idle).in_flight == 0

    # the counts, as the gateways' heartbeats and the supervision stream say them
    state = beat_of(receiver[0], busy, in_flight=2, waiting=1)
    assert (state.concurrency, state.queue) == (2, 1)
    report = next(iter(bounded.stub.WatchHost(pb.WatchHostRequest(), timeout=BOUND_S)))
    assert (report.running_invocations, report.max_invocations) == (2, 2)
    mine = next(r for r in report.registrations if r.registration_id == busy)
    assert (mine.in_flight, mine.waiting) == (2, 1)

    # the idle clock, as the Run's workflow reads it through its activity: not idle
    seen = asyncio.run(function_state(pki, bounded.runtime.address, busy))
    assert (seen.inFlight, seen.waiting) == (2, 1)
    assert seen.lastActivity is not None
    much_later = seen.lastActivity + timedelta(days=1)
    assert isinstance(idle_verdict(idle_seconds=1, now=much_later, state=seen), IdleRearm)

    # the one waiting takes the place of one that ends: the host's bound never refuses it
    (scratch / "go").touch()
    assert sorted(outputs(call.result())["n"] for call in [*calls, queued]) == [0, 1, 2]
    assert outputs(bounded.gateway.InvokeFunction(request(idle, scratch, 9), timeout=BOUND_S))["n"] == 9


def test_past_the_hosts_bound_on_what_waits_an_invocation_is_refused_though_its_queue_has_room(
    bounded: Host, scratch: Path
) -> None:
    reg = register(bounded, {"main.py": HELD}, concurrency=1, queue=10)
    first = bounded.gateway.InvokeFunction.future(request(reg, scratch, 0), timeout=BOUND_S)
    eventually_blocking(lambda: started(scratch) == ["started-0"], within=BOUND_S, what="the first running")
    big = "x" * (WAITING_BYTES // 2)  # two of them hold more than the host may
    waiting = [bounded.gateway.InvokeFunction.future(request(reg, scratch, 1, pad=big), timeout=BOUND_S)]
    eventually_blocking(lambda: bounded.status(reg).waiting == 1, within=BOUND_S, what="one waiting")

    err = refused(bounded, request(reg, scratch, 2, pad=big))  # its bytes
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(err) == "HostBusy"
    assert "waiting" in (err.details() or "")
    for n in (3, 4):  # small ones still fit, up to the count
        waiting.append(bounded.gateway.InvokeFunction.future(request(reg, scratch, n), timeout=BOUND_S))
        eventually_blocking(lambda n=n: bounded.status(reg).waiting == n - 1, within=BOUND_S, what="waiting")
    assert reason(refused(bounded, request(reg, scratch, 5))) == "HostBusy"  # its count

    (scratch / "go").touch()
    assert [outputs(call.result())["n"] for call in [first, *waiting]] == [0, 1, 3, 4]
    assert started(scratch) == ["started-0", "started-1", "started-3", "started-4"]
    # what waited freed its place and bytes: the host queues as much again
    (scratch / "go").unlink()
    again = [bounded.gateway.InvokeFunction.future(request(reg, scratch, n), timeout=BOUND_S) for n in (6, 7)]
    eventually_blocking(lambda: bounded.status(reg).waiting == 1, within=BOUND_S, what="one waiting again")
    (scratch / "go").touch()
    assert [outputs(call.result())["n"] for call in again] == [6, 7]


# -- what a registration may ask for -------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("concurrency", 1001, "concurrency must be in [1, 1000]"),
        ("queue", 10_001, "queue must be in [0, 10000]"),
        ("queue_timeout_ms", 900_001, "the queue timeout must be in (0, 900] s"),
    ],
)
def test_a_registration_asking_past_the_bounds_is_refused_by_name(
    host: Host, field: str, value: int, says: str
) -> None:
    run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python")
    config = pb.FunctionConfig(adapter="python", handler="main:handle", inline=inline({"main.py": HELD}))
    setattr(config, field, value)
    with pytest.raises(grpc.RpcError) as err:
        host.stub.RegisterFunction(host.register_request(run, config))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(err.value) == "InvalidRequest"
    assert says in (err.value.details() or "")


def test_what_a_registration_takes_at_once_is_part_of_its_config(host: Host) -> None:
    run = pb.RunRef(run_uid=str(uuid.uuid4()), attempt=1, namespace="default", name="fn", runtime="python")
    config = pb.FunctionConfig(
        adapter="python", handler="main:handle", inline=inline({"main.py": HELD}), concurrency=2
    )
    first = host.stub.RegisterFunction(host.register_request(run, config))
    again = host.stub.RegisterFunction(host.register_request(run, config))
    assert (again.registration_id, again.created) == (first.registration_id, False)
    config.concurrency = 3
    with pytest.raises(grpc.RpcError) as err:
        host.stub.RegisterFunction(host.register_request(run, config))
    assert reason(err.value) == "RegistrationConflict"


def test_the_hosts_default_bound_follows_its_cpus_and_its_memory() -> None:
    gib = 1024**3
    assert default_max_invocations(cpus=2, memory_bytes=None) == 128
    assert default_max_invocations(cpus=2, memory_bytes=64 * gib) == 128  # CPUs bound it
    assert default_max_invocations(cpus=32, memory_bytes=4 * gib) == 128  # memory bounds it
    assert default_max_invocations(cpus=1, memory_bytes=256 * 1024**2) == 16  # never below 16


@pytest.fixture(scope="module")
def cramped(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI, shared: Path) -> Iterator[Host]:
    """A host whose functions may have at most five processes each: a warm process is two (the
    init of its PID namespace and itself), so two fit and a third never does, whichever of two
    starts at once forks first."""
    runtime = loopback_host(
        pki,
        tmp_path_factory.mktemp("cramped"),
        host_id="cramped-0",
        limits=ProcessLimits(processes=5),
        sandbox=SandboxSettings(shared=(str(shared),), max_processes=5),
    )
    with serving(runtime, pki) as served:
        yield served


def test_invocations_past_the_processes_a_function_may_have_wait_for_one_of_its_warm_processes(
    cramped: Host, scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reg = register(cramped, {"main.py": HELD}, concurrency=3)
    calls = [
        cramped.gateway.InvokeFunction.future(request(reg, scratch, n), timeout=BOUND_S) for n in range(3)
    ]
    eventually_blocking(lambda: len(started(scratch)) == 2, within=BOUND_S, what="two warm processes running")
    registration = cramped.runtime.registry.get(reg)
    assert registration is not None and registration.pool is not None
    eventually_blocking(lambda: cramped.status(reg).in_flight == 3, within=BOUND_S, what="three admitted")
    assert registration.pool.count() == 2, "a third process does not fit its limit"
    assert registration.state == "Ready", "a start that does not fit is no failure of the function"
    eventually_blocking(  # the third start fails after it was admitted: its warning comes a moment later
        lambda: any("could not start another warm process" in r.getMessage() for r in caplog.records),
        within=BOUND_S,
        what="the failed third start logged",
    )

    (scratch / "go").touch()
    answers = [outputs(call.result()) for call in calls]
    assert sorted(answer["n"] for answer in answers) == [0, 1, 2]
    assert len({answer["process"] for answer in answers}) == 2, "the third ran in one of the two"


BLOCKING_ASYNC = """
import os, time, uuid
PROCESS = uuid.uuid4().hex
async def handle(p):
    while p.get("block") and not os.path.exists(os.path.join(p["dir"], "go")):
        time.sleep(0.005)  # never awaits: the process's loop is blocked
    return {"process": PROCESS}
"""


def test_an_async_process_whose_loop_never_takes_a_cancel_is_replaced(host: Host, scratch: Path) -> None:
    reg = register(host, {"main.py": BLOCKING_ASYNC}, concurrency=2)
    before = outputs(host.gateway.InvokeFunction(request(reg, scratch, 0), timeout=BOUND_S))["process"]
    late = host.gateway.InvokeFunction(request(reg, scratch, 1, block=True, timeout_ms=300), timeout=BOUND_S)
    assert late.status == pb.INVOCATION_STATUS_TIMED_OUT

    def answered_by_another() -> bool:
        answer = host.gateway.InvokeFunction(request(reg, scratch, 2), timeout=BOUND_S)
        return answer.status == pb.INVOCATION_STATUS_SUCCEEDED and outputs(answer)["process"] != before

    eventually_blocking(answered_by_another, within=BOUND_S, what="a new process, the blocked one killed")
    assert host.status(reg).ready
