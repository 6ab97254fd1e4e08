"""GatewayDispatch.AttemptInvocation, an async invocation's attempt, at the real gateway over real
mutual TLS, to functions on real host processes: only the control plane's identity may call it;
an attempt is answered what a sync invoke would have been (status, reason, body) and whether the
function may have run (`dispatched`); a refusal never runs the function; and a target's async
attempts hold at most their share of its concurrency, so sync invocations keep the rest.

What ran is what the functions write to their record files, never a timing; a held handler waits
for its gate file."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from kruntimes.api.limits import MAX_PAYLOAD_BYTES
from kruntimes.gateway.bodies import ErrorBody, InvokeAnswer
from kruntimes.gateway.server import Gateway
from kruntimes.pki import PeerTLS, Role
from kruntimes.rpc.v1 import gateway_dispatch_pb2 as gd
from kruntimes.rpc.v1 import gateway_dispatch_pb2_grpc as gd_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.wire.headers import INVOCATION_ID
from tests.gateway.conftest import HostProcess, Hosts, invoke, lines, recording, wait_for
from tests.gateway.function_invoke_test import HELD, Calls, fresh, ran_on, replica_assignment, replicate
from tests.gateway.queue_test import status
from tests.gateway.scale_from_zero_test import Cold, Temporal, wakes
from tests.gateway.scale_from_zero_test import cold as cold  # the fixtures, shared
from tests.gateway.scale_from_zero_test import temporal as temporal
from tests.support.pki import CONTROL_PLANE, GATEWAY, TestPKI
from tests.support.waiting import eventually

# Writes its tag, then holds until its gate file exists (if it names one); fails if asked to.
GATED = """
import os
import time

def handle(p):
    with open(os.environ["TEST_RECORD"], "a") as f:
        f.write(p.get("tag", "run") + "\\n")
    gate = p.get("gate")
    while gate and not os.path.exists(gate):
        time.sleep(0.005)
    if p.get("fail"):
        raise ValueError("asked to fail")
    return {"tag": p.get("tag", "run")}
"""
WAIT_S = 60.0


def channel_as(gateway: Gateway, tls: PeerTLS | None) -> grpc.aio.Channel:
    """A channel to the gateway's heartbeat server presenting `tls` (None: no client certificate)."""
    if tls is None:
        ca = (gateway.options.peer_tls.directory / "ca.crt").read_bytes()  # type: ignore[union-attr]
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        options = PeerTLS.channel_options(Role.GATEWAY)
    else:
        credentials, options = tls.channel_credentials(), tls.channel_options(Role.GATEWAY)
    return grpc.aio.secure_channel(gateway.heartbeat_address, credentials, options=options)


@pytest.fixture(scope="module")
async def worker(gateway: Gateway, pki: TestPKI) -> AsyncIterator[gd_grpc.GatewayDispatchAsyncStub]:
    """GatewayDispatch as the control plane calls it."""
    gateway.balancer.warm_until = 0.0  # a Function uid never seen is 404 here, not "starting"
    async with channel_as(gateway, pki.control_plane) as channel:
        yield gd_grpc.GatewayDispatchStub(channel)


async def attempt(
    stub: gd_grpc.GatewayDispatchAsyncStub,
    uid: str,
    body: object = None,
    *,
    kind: str = "Run",
    namespace: str = "default",
    runtime: str | None = None,
    inv: str | None = None,
    timeout_ms: int = 0,
    share: int = 0,
    n: int = 1,
) -> gd.AttemptInvocationResponse:
    data = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    request = gd.AttemptInvocationRequest(
        namespace=namespace,
        target_kind=kind,
        target_uid=uid,
        runtime=("python" if kind == "Run" else "") if runtime is None else runtime,
        invocation_id=inv if inv is not None else f"inv-{uuid.uuid4().hex[:12]}",
        body=data,
        timeout_ms=timeout_ms,
        attempt=n,
        share_percent=share,
    )
    answer: gd.AttemptInvocationResponse = await stub.AttemptInvocation(request, timeout=WAIT_S)
    return answer


def refused(answer: gd.AttemptInvocationResponse, status: int, reason: str) -> ErrorBody:
    """An error answer that proves the function did not run."""
    assert (answer.http_status, answer.reason, answer.dispatched) == (status, reason, False), answer
    body = ErrorBody.model_validate_json(answer.body)
    assert body.reason == reason
    return body


def succeeded(answer: gd.AttemptInvocationResponse) -> InvokeAnswer:
    assert (answer.http_status, answer.reason, answer.dispatched) == (200, "", True), answer
    return InvokeAnswer.model_validate_json(answer.body)


async def test_only_the_control_planes_identity_may_run_an_attempt(
    gateway: Gateway,
    main_host: HostProcess,
    records_dir: Path,
    pki: TestPKI,
    worker: gd_grpc.GatewayDispatchAsyncStub,
    tmp_path: Path,
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, GATED)
    request = gd.AttemptInvocationRequest(
        namespace="default",
        target_kind="Run",
        target_uid=fn.uid,
        runtime="python",
        invocation_id="inv-intruder",
        body=b"{}",
        attempt=1,
    )
    # a genuine host's certificate (the one the route names) and the gateway's own
    for tls in (pki.host_tls(main_host.host_id), pki.peer(GATEWAY)):
        async with channel_as(gateway, tls) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gd_grpc.GatewayDispatchStub(channel).AttemptInvocation(request, timeout=WAIT_S)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED, tls.identity
    # no client certificate, or the control plane's identity from another CA: no handshake
    for tls_or_none in (None, pki.impostor(TestPKI.create(tmp_path / "other-ca"), CONTROL_PLANE)):
        async with channel_as(gateway, tls_or_none) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gd_grpc.GatewayDispatchStub(channel).AttemptInvocation(request, timeout=WAIT_S)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert lines(path) == []
    # the same request as the control plane runs
    assert succeeded(await worker.AttemptInvocation(request, timeout=WAIT_S)).invocationId == "inv-intruder"
    assert lines(path) == ["run"]


async def test_an_attempt_is_answered_as_a_sync_invoke_and_a_handler_error_is_a_result(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    records_dir: Path,
    worker: gd_grpc.GatewayDispatchAsyncStub,
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, GATED)
    answer = succeeded(await attempt(worker, fn.uid, {"tag": "async"}, inv="inv-async", n=3))
    sync = (
        await invoke(client, gateway, fn.uid, {"tag": "sync"}, headers={INVOCATION_ID: "inv-sync"})
    ).expect(200)
    synced = InvokeAnswer.model_validate_json(sync.body)
    assert (answer.invocationId, answer.status, answer.outputs) == (
        "inv-async",
        "Succeeded",
        {"tag": "async"},
    )
    assert (synced.status, synced.outputs) == ("Succeeded", {"tag": "sync"})
    failed = succeeded(await attempt(worker, fn.uid, {"tag": "fails", "fail": True}))
    assert failed.status == "HandlerError" and failed.error is not None and failed.outputs is None
    assert lines(path) == ["async", "sync", "fails"]


async def test_refusals_are_a_sync_invokes_and_never_run_the_function(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    records_dir: Path,
    worker: gd_grpc.GatewayDispatchAsyncStub,
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, GATED)
    for uid in ("not-a-uid", "../../etc", str(uuid.uuid4())):
        refused(await attempt(worker, uid), 404, "RunNotFound")
        refused(await attempt(worker, uid, kind="Function"), 404, "FunctionNotFound")
    refused(await attempt(worker, fn.uid, runtime="other"), 404, "RunNotFound")
    refused(await attempt(worker, fn.uid, namespace="other"), 404, "RunNotFound")
    # over 1 MiB: refused before it is parsed, whatever it holds
    oversized = b'{"tag": "' + b"x" * MAX_PAYLOAD_BYTES + b'"}'
    assert "larger than" in refused(await attempt(worker, fn.uid, oversized), 413, "PayloadTooLarge").message
    refused(await attempt(worker, fn.uid, b'{"tag": '), 400, "MalformedJSON")
    for bad in ("", "a" * 129, "tab\there", "caf\u00e9"):
        assert refused(await attempt(worker, fn.uid, inv=bad), 400, "InvalidInvocationId").invocationId == ""
    refused(await attempt(worker, fn.uid, timeout_ms=900_001), 400, "InvalidTimeout")
    # what no sync request could carry: the caller's bug, not an HTTP answer
    malformed = [
        {"kind": "Job"},
        {"namespace": "Not_A_Label"},
        {"namespace": "x" * 64},
        {"runtime": ""},
        {"kind": "Function", "runtime": "python"},
        {"share": 101},
        {"n": 0},
    ]
    for fields in malformed:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await attempt(worker, fn.uid, **fields)  # type: ignore[arg-type]
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, fields
    assert lines(path) == []
    succeeded(await attempt(worker, fn.uid, timeout_ms=900_000))  # the bound itself is taken
    assert lines(path) == ["run"]


async def test_a_busy_run_is_429_not_dispatched_and_never_runs(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    records_dir: Path,
    worker: gd_grpc.GatewayDispatchAsyncStub,
) -> None:
    path, fn = await recording(main_host, gateway, records_dir, GATED)  # concurrency 1, no queue
    gate = fresh(records_dir) / "go"
    first = asyncio.create_task(invoke(client, gateway, fn.uid, {"tag": "first", "gate": str(gate)}))
    try:
        await wait_for(lambda: lines(path) == ["first"], "the sync invocation running")
        body = refused(await attempt(worker, fn.uid, {"tag": "async"}, share=100), 429, "FunctionBusy")
        assert "retry later" in body.message
    finally:
        gate.touch()
    (await first).expect(200)
    dispatch = gateway.heartbeats.dispatch
    bound, dispatch.max_in_flight = dispatch.max_in_flight, 0  # the gateway's own bound, over every target
    try:
        body = refused(await attempt(worker, fn.uid, {"tag": "bounded"}), 429, "AsyncShareFull")
        assert "as many async attempts as it may" in body.message
    finally:
        dispatch.max_in_flight = bound
    succeeded(await attempt(worker, fn.uid, {"tag": "again"}))
    assert lines(path) == ["first", "again"]


async def test_a_worker_that_hangs_up_while_its_attempt_is_queued_on_the_host_withdraws_it(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    records_dir: Path,
    worker: gd_grpc.GatewayDispatchAsyncStub,
) -> None:
    """As a sync caller that hangs up: out of the host's queue at once, and it never runs."""
    path = fresh(records_dir)
    record = {"TEST_RECORD": str(path / "ran")}
    fn = await main_host.register(gateway, GATED, concurrency=1, queue=1, env=record)
    first = asyncio.create_task(invoke(client, gateway, fn.uid, {"tag": "first", "gate": str(path / "go")}))
    try:
        await wait_for(lambda: lines(path / "ran") == ["first"], "the sync invocation running")
        queued = asyncio.create_task(attempt(worker, fn.uid, {"tag": "async"}, share=100))
        await eventually(lambda: status(fn), within=WAIT_S, until=lambda s: s.waiting == 1)
        queued.cancel()  # the worker's call ends: gRPC cancels it at the gateway
        with pytest.raises(asyncio.CancelledError):
            await queued
        await eventually(lambda: status(fn), within=WAIT_S, until=lambda s: s.waiting == 0)
        assert not first.done()
    finally:
        (path / "go").touch()
    (await first).expect(200)
    succeeded(await attempt(worker, fn.uid, {"tag": "next"}))
    assert lines(path / "ran") == ["first", "next"], "the withdrawn attempt never ran"
    await eventually(
        lambda: gateway.heartbeats.dispatch.held(fn.uid) == 0, within=WAIT_S, what="its place freed"
    )


async def test_a_host_killed_mid_call_is_502_and_dispatched(
    gateway: Gateway, hosts: Hosts, records_dir: Path, worker: gd_grpc.GatewayDispatchAsyncStub
) -> None:
    doomed = await hosts.start("gw-dispatch-doomed")
    path, fn = await recording(doomed, gateway, records_dir, GATED)
    never = fresh(records_dir) / "never"  # only the host's death ends the call
    call = asyncio.create_task(attempt(worker, fn.uid, {"tag": "run", "gate": str(never)}))
    await wait_for(lambda: lines(path) == ["run"], "the attempt running")
    doomed.signal(signal.SIGKILL)
    answer = await call
    assert (answer.http_status, answer.reason, answer.dispatched) == (502, "OwnerUnreachable", True)
    assert "may have run" in ErrorBody.model_validate_json(answer.body).message
    assert await doomed.exited(10)


async def test_async_attempts_hold_their_share_and_sync_invocations_keep_the_rest(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    records_dir: Path,
    worker: gd_grpc.GatewayDispatchAsyncStub,
) -> None:
    """A Function of two replicas of concurrency 2: its async share (the default 50 %) is two
    invocations at once; the third attempt is 429 AsyncShareFull and never runs, while two sync
    invocations run at once beside the two async ones, none waiting."""
    fn = await replicate(gateway, main_host, 2)
    calls = Calls(client, gateway, fn, fresh(records_dir))
    dispatch = gateway.heartbeats.dispatch

    def held(n: int) -> dict[str, object]:
        return {"dir": str(calls.path), "n": n, "gate": f"go-{n}"}

    attempts = {n: asyncio.create_task(attempt(worker, fn.uid, held(n), kind="Function")) for n in (0, 1)}
    try:
        await calls.running(0)
        await calls.running(1)
        assert dispatch.held(fn.uid) == 2
        full = refused(await attempt(worker, fn.uid, held(2), kind="Function"), 429, "AsyncShareFull")
        assert "share" in full.message
        for n in (3, 4):
            calls.send(n)
        await calls.running(3)
        await calls.running(4)
        assert gateway.balancer.waiting(fn.uid) == 0 and gateway.balancer.function_in_flight(fn.uid) == 4
        # one async attempt ends: its place goes to the next
        calls.release(0)
        assert succeeded(await attempts[0]).outputs == {"n": 0, "replica": ran_on(calls.path, 0)}
        attempts[5] = asyncio.create_task(attempt(worker, fn.uid, held(5), kind="Function"))
        calls.release(5)
        succeeded(await attempts[5])
        calls.release(1)
        succeeded(await attempts[1])
        assert [a.expect(200).json["outputs"]["n"] for a in await calls.answers(3, 4)] == [3, 4]
        assert ran_on(calls.path, 2) == "", "the attempt past the share never ran"
        assert dispatch.held(fn.uid) == 0
    finally:
        await calls.finish()
        for n in attempts:
            calls.release(n)
        await asyncio.gather(*attempts.values(), return_exceptions=True)
    async with client.get(f"{gateway.url}/metrics") as response:
        text = await response.text()
    assert (
        'krt_gateway_async_attempts_total{kind="Function",reason="AsyncShareFull",status="429"} 1.0' in text
    )
    assert "krt_gateway_async_attempts_in_flight 0.0" in text
    assert fn.uid not in text


async def test_an_attempt_on_a_function_without_a_ready_replica_wakes_it_and_runs_on_the_first(
    gateway: Gateway,
    main_host: HostProcess,
    records_dir: Path,
    temporal: Temporal,
    cold: Cold,
    worker: gd_grpc.GatewayDispatchAsyncStub,
) -> None:
    """Held as a sync invoke is, while the gateway signals the Function's workflow for a replica;
    a Function with none Ready has an async share of one, the attempt that wakes it."""
    path = fresh(records_dir)

    def held(n: int) -> dict[str, object]:
        return {"dir": str(path), "n": n, "gate": f"go-{n}"}

    call = asyncio.create_task(attempt(worker, cold.uid, held(0), kind="Function"))
    replica: str | None = None
    try:
        await eventually(lambda: gateway.balancer.waiting(cold.uid) == 1, within=WAIT_S, what="held")
        refused(await attempt(worker, cold.uid, held(1), kind="Function"), 429, "AsyncShareFull")

        async def woken() -> bool:
            return len(await wakes(cold.handle)) == 1

        await eventually(woken, within=WAIT_S, what="the wake signal in the workflow's history")
        run_uid = str(uuid.uuid4())
        name = f"{cold.name}-r1-{run_uid[:5]}"
        registered = await main_host.register(
            gateway,
            HELD,
            uid=run_uid,
            name=name,
            env={"REPLICA": name},
            assignment=replica_assignment(main_host, run_uid=run_uid, name=name, function_uid=cold.uid),
        )
        replica = registered.registration_id
        await eventually(lambda: ran_on(path, 0) == name, within=WAIT_S, what="the held attempt running")
        (path / "go-0").touch()
        assert succeeded(await call).outputs == {"n": 0, "replica": name}
        assert ran_on(path, 1) == "", "the attempt past the share never ran"
    finally:
        (path / "go-0").touch()
        await asyncio.gather(call, return_exceptions=True)
        if replica is not None:
            await main_host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=replica))
            await wait_for(lambda: not gateway.routes.function_routes(cold.uid), "the replica's route gone")
