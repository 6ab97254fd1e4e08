"""Scale from zero and the autoscaler's load, at the real gateway over real HTTPS: an invocation of
a Function without a Ready replica is held (not 503) while the gateway asks the Function's
workflow for a replica by its `wake` signal (seen in that workflow's history on the real dev
server: a stand-in FunctionWorkflow, started on a task queue nobody polls, so its history holds
exactly what was sent), and runs on the first replica that becomes Ready (a real host registering
a replica assignment); the hold is bounded (count and time: 503 NoReadyReplica with Retry-After),
a signal that cannot be sent ends the held invocations at once, and many held invocations send at
most one signal a second. GatewayLoad.FunctionLoads tells the control plane's identity, and no
other, what the gateway holds and has in flight per Function.

The session gateway is given Temporal here as Gateway does from its options (a known-Functions
view and a waker over the gateway's Visibility), and given none back at the end."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from kruntimes.contracts.names import SIGNAL_FUNCTION_WAKE, function_workflow_id
from kruntimes.gateway.auth import CachingAuthorizer, EmbeddedAuthorizer, RoleBindings, TokenFile
from kruntimes.gateway.heartbeats import MAX_LOAD_UIDS
from kruntimes.gateway.server import Gateway
from kruntimes.gateway.visibility import IDENTITY, Visibility
from kruntimes.gateway.wake import Waker
from kruntimes.pki import Identity, PeerTLS, Role
from kruntimes.pki.local import TlsFiles
from kruntimes.rpc.v1 import heartbeat_pb2 as hb
from kruntimes.rpc.v1 import heartbeat_pb2_grpc as hb_grpc
from kruntimes.rpc.v1 import runtime_pb2 as pb
from kruntimes.temporal.connect import TemporalSettings, connect
from kruntimes.temporal.devserver import DevServer
from kruntimes.temporal.known_functions import KnownFunction, KnownFunctions
from kruntimes.wire import search_typed
from tests.gateway.conftest import HostProcess, wait_for
from tests.gateway.function_invoke_test import HELD, fresh, invoke_function, ran_on, replica_assignment
from tests.support.pki import CONTROL_PLANE, GATEWAY, TestPKI
from tests.support.stack import local_gateway_options
from tests.support.waiting import eventually

WAIT_S = 30.0
REFRESH_S = 0.2


@dataclass
class Temporal:
    client: Client
    functions: KnownFunctions
    waker: Waker
    queue: str  # nobody polls it: a stand-in's history is what was sent to it


@pytest.fixture(scope="module")
async def temporal(gateway: Gateway, dev_server: DevServer) -> AsyncIterator[Temporal]:
    client = await connect(dev_server.address, "default")
    visibility = await Visibility.connect(TemporalSettings(address=dev_server.address))
    functions = KnownFunctions(visibility, refresh_s=REFRESH_S)
    waker = Waker(visibility)
    balancer = gateway.balancer
    balancer.use_temporal(functions, waker)
    balancer.warm_until = 0.0  # a uid nobody knows is 404 here, not "starting"
    functions.start()
    try:
        yield Temporal(client, functions, waker, f"wake-{uuid.uuid4().hex[:8]}")
    finally:
        balancer.functions = balancer.waker = None
        await functions.stop()
        await waker.stop()
        await visibility.close()


@dataclass
class Cold:
    """A Function that exists (its stand-in workflow runs) and has no replica."""

    uid: str
    name: str
    handle: WorkflowHandle[object, object]


@pytest.fixture
async def cold(temporal: Temporal) -> AsyncIterator[Cold]:
    uid, name = str(uuid.uuid4()), f"cold-{uuid.uuid4().hex[:6]}"
    handle: WorkflowHandle[object, object] = await temporal.client.start_workflow(
        "FunctionWorkflow",
        id=function_workflow_id("default", name),  # type: ignore[arg-type]
        task_queue=temporal.queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(search_typed.KRT_FUNCTION, uid),
                SearchAttributePair(search_typed.KRT_NAMESPACE, "default"),
                SearchAttributePair(search_typed.KRT_PHASE, "Pending"),
            ]
        ),
    )
    await eventually(
        lambda: temporal.functions.get(uid) is not None, within=WAIT_S, what="the Function known"
    )
    try:
        yield Cold(uid, name, handle)
    finally:
        with contextlib.suppress(RPCError):  # a test may have ended it already
            await handle.terminate()


async def wakes(handle: WorkflowHandle[object, object]) -> list[float]:
    """When each wake signal the gateway sent reached the workflow (seconds, history time)."""
    found = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            assert attrs.identity == IDENTITY
            if attrs.signal_name == SIGNAL_FUNCTION_WAKE:
                found.append(event.event_time.ToMicroseconds() / 1e6)
    return found


async def loads(gateway: Gateway, tls: PeerTLS | None, *uids: str) -> list[hb.FunctionLoad]:
    """GatewayLoad.FunctionLoads as `tls` (None: TLS without a client certificate) asks it."""
    if tls is None:
        ca = (gateway.options.peer_tls.directory / "ca.crt").read_bytes()  # type: ignore[union-attr]
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        options = PeerTLS.channel_options(Role.GATEWAY)
    else:
        credentials, options = tls.channel_credentials(), tls.channel_options(Role.GATEWAY)
    async with grpc.aio.secure_channel(gateway.heartbeat_address, credentials, options=options) as channel:
        answer = await hb_grpc.GatewayLoadStub(channel).FunctionLoads(
            hb.FunctionLoadsRequest(function_uids=uids), timeout=10
        )
    return list(answer.loads)


async def load_of(gateway: Gateway, pki: TestPKI, uid: str) -> tuple[int, int]:
    (load,) = await loads(gateway, pki.control_plane, uid)
    assert load.function_uid == uid
    return load.in_flight, load.waiting


async def test_a_held_invocation_wakes_the_workflow_and_runs_on_the_first_ready_replica(
    gateway: Gateway,
    client: aiohttp.ClientSession,
    main_host: HostProcess,
    temporal: Temporal,
    cold: Cold,
    pki: TestPKI,
    records_dir: Path,
) -> None:
    path = fresh(records_dir)
    body = {"dir": str(path), "n": 0, "gate": "go-0"}
    held = asyncio.create_task(invoke_function(client, gateway, cold.uid, body))
    replica: str | None = None
    try:
        await eventually(lambda: gateway.balancer.waiting(cold.uid) == 1, within=WAIT_S, what="held")
        assert await load_of(gateway, pki, cold.uid) == (0, 1)
        signals: list[float] = []

        async def signalled() -> bool:
            signals[:] = await wakes(cold.handle)
            return len(signals) == 1

        await eventually(signalled, within=WAIT_S, what="the wake signal in the workflow's history")
        assert not held.done()
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
        await eventually(lambda: ran_on(path, 0) == name, within=WAIT_S, what="the held invocation running")
        assert await load_of(gateway, pki, cold.uid) == (1, 0)
        (path / "go-0").touch()
        answer = (await held).expect(200)
        assert answer.json["outputs"] == {"n": 0, "replica": name}
        assert await load_of(gateway, pki, cold.uid) == (0, 0)
        assert len(await wakes(cold.handle)) == 1, "a Function with a Ready replica is not woken"
    finally:
        (path / "go-0").touch()
        await asyncio.gather(held, return_exceptions=True)
        if replica is not None:
            await main_host.stub.UnregisterFunction(pb.UnregisterFunctionRequest(registration_id=replica))
            await wait_for(lambda: not gateway.routes.function_routes(cold.uid), "the replica's route gone")


async def test_many_held_invocations_send_at_most_one_signal_a_second(
    gateway: Gateway, client: aiohttp.ClientSession, temporal: Temporal, cold: Cold
) -> None:
    sent_before = temporal.waker.sent
    began = time.monotonic()
    tasks = []
    for _ in range(6):  # six waves of five, 0.3 s apart: held over more than a second
        tasks += [
            asyncio.create_task(
                invoke_function(client, gateway, cold.uid, headers={"X-Kruntime-Timeout": "1"})
            )
            for _ in range(5)
        ]
        await asyncio.sleep(0.3)
    answers = await asyncio.gather(*tasks)
    spent = time.monotonic() - began
    for answer in answers:  # nobody made a replica: each ends at its timeout, having never run
        answer.expect(503, "NoReadyReplica")
        assert answer.headers.get("Retry-After") == "2"
        assert "within the invocation's timeout" in answer.json["message"]
    sent = await wakes(cold.handle)
    # at most one a second since the first (the waker's clock), and the history holds just those
    assert 1 <= len(sent) <= 1 + int(spent), (len(sent), spent)
    assert temporal.waker.sent - sent_before == len(sent)
    assert gateway.balancer.waiting(cold.uid) == 0


async def test_the_hold_is_bounded_and_a_signal_not_sent_ends_it_at_once(
    gateway: Gateway, client: aiohttp.ClientSession, temporal: Temporal, cold: Cold
) -> None:
    balancer = gateway.balancer
    bound = balancer.max_waiting_per_function
    balancer.max_waiting_per_function = 2
    held = [asyncio.create_task(invoke_function(client, gateway, cold.uid)) for _ in range(2)]
    try:
        await eventually(lambda: balancer.waiting(cold.uid) == 2, within=WAIT_S, what="two held")
        over = (await invoke_function(client, gateway, cold.uid)).expect(503, "NoReadyReplica")
        assert over.headers.get("Retry-After") == "2"
        assert "holds as many invocations as it may" in over.json["message"]
    finally:
        balancer.max_waiting_per_function = bound
        await cold.handle.terminate()  # the rest end at their timeout: not waited for here
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
    await eventually(lambda: balancer.waiting(cold.uid) == 0, within=WAIT_S, what="the hold withdrawn")
    # its workflow ended: the view's next refresh drops it, and its uid (never routed) is 404
    await eventually(
        lambda: temporal.functions.get(cold.uid) is None, within=WAIT_S, what="the Function gone"
    )
    (await invoke_function(client, gateway, cold.uid)).expect(404, "FunctionNotFound")
    # A Function the view still lists whose workflow is gone (a real NOT_FOUND from Temporal): the
    # held invocation ends as soon as the signal fails, long before its 30 s timeout.
    gone, name = str(uuid.uuid4()), f"gone-{uuid.uuid4().hex[:6]}"
    temporal.functions.entries[gone] = KnownFunction(namespace="default", name=name, phase="Ready")
    failed = temporal.waker.failed
    try:
        began = time.monotonic()
        answer = (await invoke_function(client, gateway, gone)).expect(503, "NoReadyReplica")
        assert "could not ask for one" in answer.json["message"] and answer.headers.get("Retry-After") == "2"
        assert time.monotonic() - began < 30, "it did not wait for its timeout"
        assert temporal.waker.failed == failed + 1 and balancer.waiting(gone) == 0
    finally:
        temporal.functions.entries.pop(gone, None)
    # a uid neither routed nor known stays 404, Temporal or not
    (await invoke_function(client, gateway, str(uuid.uuid4()))).expect(404, "FunctionNotFound")


async def test_only_the_control_planes_identity_reads_the_loads_and_only_so_many(
    gateway: Gateway, pki: TestPKI
) -> None:
    uid = str(uuid.uuid4())
    assert await load_of(gateway, pki, uid) == (0, 0)  # a Function the gateway never saw: zeros
    for identity in (Identity.host(runtime="python", host_id="load-reader"), GATEWAY):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await loads(gateway, pki.peer(identity), uid)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED, identity
    with pytest.raises(grpc.aio.AioRpcError) as caught:  # no client certificate: no handshake
        await loads(gateway, None, uid)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    for asked in ([str(uuid.uuid4()) for _ in range(MAX_LOAD_UIDS + 1)], ["not-a-uid"]):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await loads(gateway, pki.peer(CONTROL_PLANE), *asked)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    asked = [str(uuid.uuid4()) for _ in range(MAX_LOAD_UIDS)]
    assert [load.function_uid for load in await loads(gateway, pki.control_plane, *asked)] == asked


async def test_a_gateway_given_temporal_in_its_options_holds_and_wakes(
    tls: TlsFiles,
    auth_files: tuple[Path, Path],
    pki: TestPKI,
    dev_server: DevServer,
    client: aiohttp.ClientSession,
    cold: Cold,
) -> None:
    """What `krt gateway --temporal-address` builds: its own views and waker, started and stopped
    with it."""
    tokens, bindings = auth_files
    own = Gateway(
        local_gateway_options(
            tls,
            authorizer=CachingAuthorizer(EmbeddedAuthorizer(TokenFile(tokens), RoleBindings.load(bindings))),
            peer_tls=pki.gateway,
            assignments=pki.verifier(),
            temporal=await Visibility.connect(TemporalSettings(address=dev_server.address)),
            known_refresh_s=REFRESH_S,
            function_warmup_s=0.0,
        )
    )
    await own.start()
    try:
        assert own.waker is not None and own.balancer.waker is own.waker
        await eventually(
            lambda: own.known_functions.get(cold.uid) is not None, within=WAIT_S, what="its view"
        )
        answer = await invoke_function(client, own, cold.uid, headers={"X-Kruntime-Timeout": "0.5"})
        assert "within the invocation's timeout" in answer.expect(503, "NoReadyReplica").json["message"]
        waker = own.waker

        async def woken() -> bool:
            return waker.sent == 1 and len(await wakes(cold.handle)) == 1

        await eventually(woken, within=WAIT_S, what="its wake signal in the workflow's history")
        async with client.get(f"{own.url}/metrics") as response:
            text = await response.text()
        assert 'krt_gateway_function_wakes_total{result="sent"} 1.0' in text and cold.uid not in text
    finally:
        await own.stop()
